"""design §12: schema.sql equals all migrations applied; the ledger; every SQL file parses."""

from __future__ import annotations

import re

import psycopg
import pytest
import sqlglot
from support.database import run_admin, with_database
from support.named_queries import queries

from kb.db.migrations import apply_migrations, migration_files
from kb.db.sql import load_queries, sql_root
from kb.errors import MigrationError


def _catalog(url: str) -> list[tuple[str, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(queries["test_schema_catalog"]).fetchall()


def test_fresh_schema_equals_all_migrations(pg_server):
    urls = {}
    for name, replay in (("kb_t_fresh", False), ("kb_t_replay", True)):
        run_admin(pg_server, "drop_database", database=name)
        run_admin(pg_server, "create_database", database=name)
        urls[name] = with_database(pg_server, name)
        with psycopg.connect(urls[name], row_factory=psycopg.rows.dict_row) as conn:
            report = apply_migrations(conn, from_migrations=replay)
            assert report.fresh
    try:
        assert _catalog(urls["kb_t_fresh"]) == _catalog(urls["kb_t_replay"])
    finally:
        for name in urls:
            run_admin(pg_server, "drop_database", database=name)


def test_ledger_is_idempotent_and_detects_edits(database_url, monkeypatch, tmp_path):
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        assert apply_migrations(conn).applied == []
        names = [r["name"] for r in conn.execute(queries["applied_migrations"])]
    assert {p.name for p in migration_files()} <= set(names)
    assert any(n.startswith("procrastinate/") for n in names)

    edited = tmp_path / "migrations"
    edited.mkdir()
    for path in migration_files():
        (edited / path.name).write_text(path.read_text() + "\n-- edited\n")
    monkeypatch.setattr("kb.db.migrations.migrations_dir", lambda: edited)
    with psycopg.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        with pytest.raises(MigrationError, match="changed after it was applied"):
            apply_migrations(conn)


def _sql_files():
    root = sql_root()
    return sorted([*root.glob("*.sql"), *root.glob("queries/*.sql"), *migration_files()])


@pytest.mark.parametrize("path", _sql_files(), ids=lambda p: p.name)
def test_every_sql_file_parses(path):
    text = path.read_text()
    text = re.sub(r"%\((\w+)\)[sbt]", "NULL", text)  # psycopg placeholders (text, binary, automatic)
    text = re.sub(r"\{(\w+)\}", r"\1", text)  # psycopg.sql identifiers
    statements = [s for s in sqlglot.parse(text, read="postgres") if s is not None]
    assert statements, f"{path.name} has no statement"


def test_named_queries_load():
    queries = load_queries()
    assert "lexical_leg" in queries and "defer_job" in queries
