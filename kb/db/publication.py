"""The logical-replication publication ``kb_publication`` (design §6).

``ensure_publication(conn)`` is called by the migration runner after the schema: it creates the
publication from ``sql/publication.sql`` when it is missing and the connected role may create it,
and reports in plain words what stops the server from publishing (too old for column lists, no
privilege, ``wal_level`` not ``logical``, no replication slots or WAL senders). A missing privilege
never fails ``kb init``: kb works without the publication, only replication consumers need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import psycopg

from kb.db.sql import queries, sql_root

if TYPE_CHECKING:
    from kb.db.database import Connection

PUBLICATION = "kb_publication"
COLUMN_LIST_MIN_VERSION = 150000


@dataclass
class PublicationStatus:
    """Whether ``kb_publication`` exists and whether the server can stream it.

    ``created``: made by this call. ``problems``: what to change, one sentence each (empty when
    a subscriber can consume the publication).
    """

    exists: bool
    created: bool = False
    wal_level: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """True when a logical-replication subscriber can consume the publication now."""
        return self.exists and not self.problems

    def describe(self) -> str:
        """One line for ``kb init``: the state, then each problem with its fix."""
        state = f"{PUBLICATION} {'created' if self.created else 'present' if self.exists else 'missing'}"
        if self.ready:
            return f"{state}; wal_level={self.wal_level}, ready for subscribers"
        return f"{state}; cannot publish yet: " + " ".join(self.problems)


def publication_sql() -> str:
    """Text of ``sql/publication.sql``."""
    return (sql_root() / "publication.sql").read_text()


def ensure_publication(conn: Connection) -> PublicationStatus:
    """Create ``kb_publication`` if missing and allowed, inside ``conn``'s open transaction.

    Never raises for a missing privilege or an old server: the reasons are in ``problems``.
    Runs the creation in a savepoint, so a refusal leaves the caller's transaction usable.
    """
    caps = conn.execute(queries["publication_capabilities"], {"name": PUBLICATION}).fetchone()
    status = PublicationStatus(exists=caps["exists"], wal_level=caps["wal_level"])
    if not status.exists:
        if caps["server_version_num"] < COLUMN_LIST_MIN_VERSION:
            status.problems.append(
                f"Postgres {caps['server_version_num'] // 10000} cannot publish column lists; "
                f"{PUBLICATION} needs Postgres 15 or newer."
            )
        elif not (caps["can_create"] and caps["owns_tables"]):
            status.problems.append(
                f"role {caps['role']} may not create publications over kb's tables (it needs CREATE "
                "on the database and ownership of kb.documents and kb.folders); run "
                "sql/publication.sql as their owner, or grant those and rerun `kb init`."
            )
        else:
            try:
                with conn.transaction():
                    conn.execute(publication_sql())
                status.exists = status.created = True
            except psycopg.Error as exc:
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                status.problems.append(
                    f"creating {PUBLICATION} failed ({reason}); run sql/publication.sql as the tables' owner."
                )
    if caps["wal_level"] != "logical":
        status.problems.append(
            f"wal_level is {caps['wal_level']}: set wal_level = logical (ALTER SYSTEM SET wal_level = "
            "'logical', or in postgresql.conf) and restart the server so subscribers can stream."
        )
    if caps["max_replication_slots"] < 1 or caps["max_wal_senders"] < 1:
        status.problems.append("max_replication_slots and max_wal_senders must be at least 1 (set them and restart).")
    return status


def publication_columns(conn: Connection) -> dict[str, list[str]]:
    """``{table: [published columns]}`` of ``kb_publication`` (empty when it does not exist)."""
    return {
        r["table_name"]: list(r["attnames"]) for r in conn.execute(queries["publication_tables"], {"name": PUBLICATION})
    }
