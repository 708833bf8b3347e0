"""The migration runner with a ledger (design §12).

A fresh database gets ``sql/schema.sql`` and every migration file is recorded as applied; an
existing one gets the migrations it lacks, in order. Each file's sha256 is stored in
``kb.schema_migrations``; a changed file that was already applied is a MigrationError (migrations
are append-only). Procrastinate's own schema is applied and recorded by the same runner under the
name ``procrastinate/<version>``. Last, the logical-replication publication ``kb_publication``
(``sql/publication.sql``) is created when missing and the role may create it (``kb.db.publication``).
Everything runs in one transaction under an advisory lock, so
two ``kb init`` at once are safe.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from kb.db.database import JOB_QUEUE_SCHEMA, configure_connection
from kb.db.publication import PUBLICATION, PublicationStatus, ensure_publication
from kb.db.sql import migrations_dir, queries, sql_root
from kb.errors import MigrationError

if TYPE_CHECKING:
    from kb.db.database import Connection

MIGRATION_LOCK_NAMESPACE = 7301
"""Advisory-lock namespace of the migration runner (the write and index locks use others, §4)."""


@dataclass
class MigrationReport:
    """What ``apply_migrations`` did: names applied now, and whether the database was fresh."""

    fresh: bool
    applied: list[str] = field(default_factory=list)
    publication: PublicationStatus | None = None


def checksum(path: Path) -> str:
    """sha256 hex of a migration file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def migration_files() -> list[Path]:
    """Migration files ``NNNN_*.sql`` in order."""
    return sorted(migrations_dir().glob("[0-9][0-9][0-9][0-9]_*.sql"))


def _procrastinate_schema() -> tuple[str, str]:
    import procrastinate
    from procrastinate.schema import SchemaManager

    return f"procrastinate/{procrastinate.__version__}", SchemaManager.get_schema()


def _job_queue_installed(conn: Connection) -> bool:
    """Whether Procrastinate's tables are in ``JOB_QUEUE_SCHEMA``; raises MigrationError when they
    are only elsewhere (an install made under a session ``search_path`` before kb pinned its own)."""
    schemas = [row["schema"] for row in conn.execute(queries["procrastinate_schemas"])]
    if JOB_QUEUE_SCHEMA in schemas:
        return True
    if schemas:
        raise MigrationError(
            f"Procrastinate's tables are in schema {', '.join(schemas)}, not {JOB_QUEUE_SCHEMA} where "
            "kb expects them (an earlier kb init ran under a search_path from PGOPTIONS, ALTER ROLE "
            "or ALTER DATABASE). Drop that schema's procrastinate_* objects (no job is lost that "
            "a sweep does not re-create) and run kb init again."
        )
    return False


def schema_is_current(conn: Connection) -> bool:
    """True when ``apply_migrations`` would do nothing: the ledger records every migration file
    with its checksum, Procrastinate's tables are in ``JOB_QUEUE_SCHEMA``, pgvector is installed
    and the publication exists (design §12).

    Two reads and no lock, so opening kb for a one-shot command costs one round trip more than
    its own work (design §13); anything missing or different sends the caller to the full runner,
    which takes the migration lock and reports what it changed (or raises MigrationError for an
    edited migration). Runs in ``conn``'s current transaction; a statement that fails (a role
    that may not read the catalog, say) answers False, so the full runner says what is wrong.
    """
    try:
        state = conn.execute(
            queries["schema_state"], {"job_schema": JOB_QUEUE_SCHEMA, "publication": PUBLICATION}
        ).fetchone()
        if not (state["has_ledger"] and state["has_job_queue"] and state["has_vector"] and state["has_publication"]):
            return False
        applied = {r["name"]: r["checksum"] for r in conn.execute(queries["applied_migrations"])}
    except psycopg.Error:
        return False
    return all(applied.get(path.name) == checksum(path) for path in migration_files())


def apply_migrations(conn: Connection, *, from_migrations: bool = False) -> MigrationReport:
    """Bring the database to the current schema; returns what was applied.

    ``from_migrations=True`` builds a fresh database by replaying every migration instead of
    ``schema.sql`` (used by the test that proves the two agree). Raises MigrationError when an
    applied migration's file changed, or a statement fails (nothing is applied then).
    """
    report = MigrationReport(fresh=False)
    try:
        with conn.transaction():
            # The same session rule as every kb connection, for this transaction: Procrastinate's
            # schema goes to JOB_QUEUE_SCHEMA whatever search_path the session came with.
            configure_connection(conn, local=True)
            conn.execute(queries["create_ledger"])
            conn.execute(queries["lock_migrations"], {"namespace": MIGRATION_LOCK_NAMESPACE})
            applied = {r["name"]: r["checksum"] for r in conn.execute(queries["applied_migrations"])}
            # Procrastinate's tables first: kb's views over them (kb.job_health, design §7) need them.
            if not _job_queue_installed(conn):
                name, schema = _procrastinate_schema()  # imported only when needed (design §13)
                conn.execute(schema)
                if name not in applied:  # a re-install after its misplaced copy was dropped
                    conn.execute(
                        queries["record_migration"],
                        {"name": name, "checksum": hashlib.sha256(schema.encode()).hexdigest()},
                    )
                report.applied.append(name)
            files = migration_files()
            kb_applied = [name for name in applied if not name.startswith("procrastinate/")]
            if not kb_applied and not from_migrations:
                report.fresh = True
                conn.execute((sql_root() / "schema.sql").read_text())
                for path in files:
                    conn.execute(queries["record_migration"], {"name": path.name, "checksum": checksum(path)})
                report.applied.append("schema.sql")
            else:
                report.fresh = not kb_applied
                for path in files:
                    digest = checksum(path)
                    if path.name in applied:
                        if applied[path.name] != digest:
                            raise MigrationError(
                                f"migration {path.name} changed after it was applied (checksum "
                                f"{applied[path.name][:12]} in the ledger, {digest[:12]} on disk). "
                                "Migrations are append-only: restore the file and add a new one."
                            )
                        continue
                    conn.execute(path.read_text())
                    conn.execute(queries["record_migration"], {"name": path.name, "checksum": digest})
                    report.applied.append(path.name)
            report.publication = ensure_publication(conn)
    except psycopg.Error as exc:
        raise MigrationError(f"applying the schema failed: {exc}".strip()) from exc
    return report
