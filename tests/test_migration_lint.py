"""bin/lint_migrations.py (design §12: migrations are numbered, append-only, parse, and say so when
they destroy data): the repository's migrations pass, and each kind of bad migration is caught."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("lint_migrations", ROOT / "bin" / "lint_migrations.py")
assert _spec is not None and _spec.loader is not None
lint_migrations = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = lint_migrations  # a dataclass looks its module up there
_spec.loader.exec_module(lint_migrations)

LAST = list(lint_migrations.read_checksums(ROOT / "migrations"))[-1]
"""The last recorded migration; the new files below take the numbers after it."""
NEXT = f"{int(LAST[:4]) + 1:04d}"
AFTER_NEXT = f"{int(LAST[:4]) + 2:04d}"


@pytest.fixture
def migrations(tmp_path: Path) -> Path:
    """A copy of migrations/ with its CHECKSUMS, to add bad files to."""
    folder = tmp_path / "migrations"
    shutil.copytree(ROOT / "migrations", folder)
    return folder


def _messages(folder: Path) -> list[str]:
    return [str(finding) for finding in lint_migrations.lint(folder)]


def test_repository_migrations_pass_the_lint():
    assert _messages(ROOT / "migrations") == []
    assert lint_migrations.main([]) == 0


def test_every_migration_file_is_recorded_with_the_checksum_kb_applies_it_by():
    from kb.db.migrations import checksum, migration_files

    recorded = lint_migrations.read_checksums(ROOT / "migrations")
    assert recorded == {path.name: checksum(path) for path in migration_files()}


def test_a_new_well_formed_migration_is_recorded_and_then_passes(migrations: Path):
    (migrations / f"{NEXT}_add_chunk_language.sql").write_text("ALTER TABLE kb.chunks ADD COLUMN language text;\n")
    assert _messages(migrations) == [f"{NEXT}_add_chunk_language.sql: {lint_migrations.UNRECORDED}"]
    assert lint_migrations.main(["--dir", str(migrations), "--record"]) == 0
    assert _messages(migrations) == []


def test_destructive_statement_passes_with_its_marker(migrations: Path):
    (migrations / f"{NEXT}_drop_legacy_table.sql").write_text(
        "-- kb:destructive the table has been empty since 0011; nothing reads it\nDROP TABLE kb.legacy_rows;\n"
    )
    lint_migrations.record(migrations)
    assert _messages(migrations) == []


@pytest.mark.parametrize(
    ("name", "sql", "expected"),
    [
        (f"{NEXT}_drop_documents.sql", "DROP TABLE kb.documents;", "DROP TABLE without a marker"),
        (
            f"{NEXT}_drop_title_column.sql",
            "ALTER TABLE kb.documents DROP COLUMN title;",
            "DROP COLUMN without a marker",
        ),
        (
            f"{NEXT}_alter_position_type.sql",
            "ALTER TABLE kb.chunks ALTER COLUMN position TYPE bigint;",
            "ALTER COLUMN … TYPE without a marker",
        ),
        (f"{NEXT}_remove_stats.sql", "TRUNCATE kb.text_stats;", "TRUNCATE without a marker"),
        (
            f"{NEXT}_remove_jobs.sql",
            "-- empties the queue\nDELETE FROM procrastinate_jobs;",
            "DELETE without WHERE without a marker",
        ),
        (f"{NEXT}_drop_schema.sql", "-- kb:destructive\nDROP SCHEMA kb CASCADE;", "DROP SCHEMA without a marker"),
        (f"{NEXT}_add_broken.sql", "CREATE TABLE kb.x (id int;", "does not parse as postgres SQL"),
        (f"{NEXT}_add_rule.sql", "CREATE RULE r AS ON INSERT TO kb.x DO INSTEAD NOTHING;", "sqlglot cannot parse"),
        (
            f"{NEXT}_index_chunk_paths.sql",
            "CREATE INDEX chunks_path ON kb.chunks (document_id);",
            "CREATE INDEX on kb.chunks",
        ),
        (
            f"{NEXT}_index_chunk_ids.sql",
            "CREATE INDEX CONCURRENTLY chunks_ids ON kb.chunks (id);",
            "CREATE INDEX CONCURRENTLY (it cannot run in the migration's transaction)",
        ),
        (
            f"{NEXT}_add_chunk_weight.sql",
            "ALTER TABLE kb.chunks ADD COLUMN weight integer NOT NULL;",
            "ADD COLUMN … NOT NULL without a default on kb.chunks",
        ),
        (
            f"{NEXT}_add_chunk_uuid.sql",
            "ALTER TABLE kb.chunks ADD COLUMN uid uuid DEFAULT gen_random_uuid();",
            "ADD COLUMN with a volatile default on kb.chunks",
        ),
        (
            f"{NEXT}_add_chunk_length.sql",
            "ALTER TABLE kb.chunks ADD COLUMN n integer GENERATED ALWAYS AS (length(text)) STORED;",
            "ADD COLUMN … GENERATED on kb.chunks",
        ),
        (
            f"{NEXT}_make_title_required.sql",
            "ALTER TABLE kb.documents ALTER COLUMN title SET NOT NULL;",
            "SET NOT NULL on kb.documents",
        ),
        (
            f"{NEXT}_add_position_check.sql",
            "ALTER TABLE kb.chunks ADD CONSTRAINT position_positive CHECK (position >= 0);",
            "ADD CONSTRAINT without NOT VALID on kb.chunks",
        ),
        (
            f"{NEXT}_add_chunk_unique.sql",
            "ALTER TABLE kb.chunks ADD CONSTRAINT chunk_text_unique UNIQUE (document_id, text_sha256);",
            "UNIQUE/PRIMARY KEY on kb.chunks",
        ),
        (f"{NEXT}_backfill_titles.sql", "UPDATE kb.documents SET title = path;", "UPDATE of every row of kb.documents"),
        (f"{NEXT}_rewrite_chunks.sql", "VACUUM FULL kb.chunks;", "VACUUM FULL"),
        (f"{AFTER_NEXT}_add_chunk_language.sql", "SELECT 1;", f"should be number {NEXT}"),
        (f"{NEXT}_chunk_language.sql", "SELECT 1;", "should start with a verb"),
        ("20_add_chunk_language.sql", "SELECT 1;", "not NNNN_verb_object.sql"),
        (f"{LAST[:4]}_add_chunk_language.sql", "SELECT 1;", f"number {LAST[:4]} is already used by {LAST}"),
    ],
)
def test_bad_new_migration_is_caught(migrations: Path, name: str, sql: str, expected: str):
    (migrations / name).write_text(sql + "\n")
    messages = [m for m in _messages(migrations) if not m.endswith(lint_migrations.UNRECORDED)]
    assert any(m.startswith(name) and expected in m for m in messages), messages
    assert lint_migrations.main(["--dir", str(migrations), "--record"]) == 1
    assert name not in lint_migrations.read_checksums(migrations)  # --record refuses a bad file


def test_edited_or_removed_applied_migration_is_caught(migrations: Path):
    with (migrations / "0018_add_document_terms.sql").open("a") as out:
        out.write("-- a later thought\n")
    (migrations / "0019_indexed_path.sql").unlink()
    messages = _messages(migrations)
    assert any(m.startswith("0018_add_document_terms.sql: changed after it was recorded") for m in messages)
    assert any(m.startswith("0019_indexed_path.sql: recorded in CHECKSUMS but missing") for m in messages)


def test_a_long_lock_passes_with_its_marker_or_on_a_table_the_migration_creates(migrations: Path):
    """design §12: a statement that blocks writes to an existing table for as long as it is big
    needs its reason written down; the same statements on a table the migration creates, a fast
    default or a constraint NOT VALID (validated later, under a weaker lock) pass as they are."""
    (migrations / f"{NEXT}_add_chunk_weights.sql").write_text(
        "-- kb:locks kb.chunks is read while the index builds; writes wait about 1 s per 100,000 chunks\n"
        "CREATE INDEX chunks_weight ON kb.chunks (document_id);\n"
        "CREATE TABLE kb.weights (id bigint PRIMARY KEY, weight integer);\n"
        "CREATE INDEX weights_weight ON kb.weights (weight);\n"
        "ALTER TABLE kb.weights ADD COLUMN at timestamptz NOT NULL DEFAULT clock_timestamp();\n"
        "ALTER TABLE kb.chunks ADD COLUMN weight integer NOT NULL DEFAULT 0;\n"
        "ALTER TABLE kb.chunks ADD CONSTRAINT weight_positive CHECK (weight >= 0) NOT VALID;\n"
        "UPDATE kb.documents SET title = path WHERE title IS NULL;\n"
    )
    lint_migrations.record(migrations)
    assert _messages(migrations) == []


def test_every_recorded_migration_excused_from_the_lock_rule_still_needs_it():
    """LOCKING_BEFORE_MARKER lists exactly the recorded migrations the lock rule would flag."""
    import sqlglot

    flagged = set()
    for path in lint_migrations.migration_paths(ROOT / "migrations"):
        statements = [s for s in sqlglot.parse(path.read_text(), read="postgres") if s is not None]
        new_tables = lint_migrations.created_tables(statements)
        if any(lint_migrations.long_locking(s, new_tables) for s in statements):
            flagged.add(path.name)
    assert flagged == set(lint_migrations.LOCKING_BEFORE_MARKER)
