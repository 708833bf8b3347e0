"""design §6 acceptance (design §6): a second Postgres server subscribes to kb_publication and, after an
import, a move, a delete and a folder removal projected by a real Procrastinate worker, holds the
same documents/folders rows (same ids) as the publisher, within a bounded wait."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from support.commands import run_cli
from support.named_queries import queries

from kb.db.database import start_embedded, stop_embedded
from kb.db.migrations import apply_migrations
from kb.db.publication import PUBLICATION, ensure_publication, publication_columns

WAIT_SECONDS = 60
DOCUMENT_COLUMNS = [
    "id",
    "workspace_id",
    "path",
    "title",
    "document_type",
    "metadata",
    "unique_identifier_hash",
    "content_id",
    "revision_id",
    "status",
    "created_at",
    "updated_at",
]
FOLDER_COLUMNS = ["id", "workspace_id", "path", "name", "parent_path", "created_at"]


def _rows_by_id(table: str, columns: list[str]) -> sql.Composed:
    return sql.SQL(queries["test_table_rows_by_id"]).format(
        columns=sql.SQL(", ").join(map(sql.Identifier, columns)), table=sql.Identifier(*table.split("."))
    )


def _rows(url: str) -> tuple[list[tuple], list[tuple]]:
    with psycopg.connect(url) as conn:
        documents = conn.execute(_rows_by_id("kb.documents", DOCUMENT_COLUMNS)).fetchall()
        folders = conn.execute(_rows_by_id("kb.folders", FOLDER_COLUMNS)).fetchall()
    return documents, folders


def _wait_until_equal(publisher: str, subscriber: str) -> tuple[list[tuple], list[tuple]]:
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        expected = _rows(publisher)
        if _rows(subscriber) == expected:
            return expected
        if time.monotonic() > deadline:
            assert _rows(subscriber) == expected, f"subscriber did not converge within {WAIT_SECONDS}s"
        time.sleep(0.2)


@pytest.fixture
def database_url(logical_database_url: str) -> str:
    """These tests publish: their database lives on a wal_level=logical server (conftest)."""
    return logical_database_url


@pytest.fixture
def subscriber_server():
    """A second embedded Postgres (its own data directory and socket), stopped afterwards."""
    root = Path(tempfile.mkdtemp(prefix="kbsub-"))
    url = start_embedded(root / "data", database="subscriber")
    yield url
    stop_embedded(root / "data")
    shutil.rmtree(root, ignore_errors=True)


def test_publication_columns_are_thin_metadata(database_url):
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        columns = publication_columns(conn)
        status = ensure_publication(conn)
    assert columns == {"kb.documents": DOCUMENT_COLUMNS, "kb.folders": FOLDER_COLUMNS}
    assert status.ready and status.wal_level == "logical" and not status.created


def test_subscriber_converges_to_publisher(kb, settings, tmp_path, subscriber_server):
    notes = tmp_path / "notes"
    for rel, text in {
        "Guides/Install.md": "# Install\n",
        "Guides/Deep/Tuning.md": "# Tuning\n",
        "Archive/Old.md": "# Old\n",
        "Archive/2019/Notes.md": "# 2019\n",
        "Todo.md": "- [ ] ship\n",
    }.items():
        (notes / rel).parent.mkdir(parents=True, exist_ok=True)
        (notes / rel).write_text(text)
    kb.import_folder(notes, 1)
    kb.run_worker(until_idle=True)  # the real projection (and index) jobs

    with psycopg.connect(subscriber_server, row_factory=dict_row) as conn:
        apply_migrations(conn)  # the same table definitions on the subscriber
    publisher = psycopg.conninfo.conninfo_to_dict(settings.database_url)
    source = psycopg.conninfo.make_conninfo(
        host=publisher["host"],
        port=publisher.get("port") or 5432,
        user=publisher["user"],
        dbname=publisher["dbname"],
    )
    with psycopg.connect(subscriber_server, autocommit=True) as conn:
        conn.execute(
            sql.SQL(queries["test_subscribe"]).format(
                connection=sql.Literal(source), publication=sql.Identifier(PUBLICATION)
            )
        )
    try:
        documents, folders = _wait_until_equal(settings.database_url, subscriber_server)
        assert len(documents) == 5 and len(folders) == 4  # the initial copy

        ids = {row[2]: row[0] for row in documents}
        with kb.transaction(1, "move, delete, remove a folder") as tx:
            tx.move("/documents/Guides/Install.md", "/documents/Setup/Install.md")
            tx.remove("/documents/Todo.md")
            tx.remove("/documents/Archive")
        kb.run_worker(until_idle=True)
        documents, folders = _wait_until_equal(settings.database_url, subscriber_server)
        assert {row[2]: row[0] for row in documents} == {
            "/documents/Setup/Install.md": ids["/documents/Guides/Install.md"],
            "/documents/Guides/Deep/Tuning.md": ids["/documents/Guides/Deep/Tuning.md"],
        }
        assert sorted(row[2] for row in folders) == ["/documents/Guides", "/documents/Guides/Deep", "/documents/Setup"]
    finally:
        with psycopg.connect(subscriber_server, autocommit=True) as conn:
            conn.execute(queries["test_unsubscribe"])


def test_init_reports_publication(kb_env):
    out = run_cli(kb_env, "init").stdout
    assert f"publication:   {PUBLICATION} present; wal_level=logical, ready for subscribers" in out


def test_role_without_privilege_is_told_what_to_change(pg_server, database_url):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL(queries["test_drop_publication"]).format(publication=sql.Identifier(PUBLICATION)))
        conn.execute(sql.SQL(queries["test_drop_role_if_exists"]).format(role=sql.Identifier("kb_reader")))
        conn.execute(sql.SQL(queries["test_create_login_role"]).format(role=sql.Identifier("kb_reader")))
    try:
        info = psycopg.conninfo.conninfo_to_dict(database_url)
        info["user"] = "kb_reader"
        with psycopg.connect(psycopg.conninfo.make_conninfo(**info), row_factory=dict_row) as conn:
            status = ensure_publication(conn)
        assert not status.exists and not status.ready
        assert "role kb_reader may not create publications" in status.describe()
        assert "run sql/publication.sql as their owner" in status.describe()
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL(queries["test_drop_owned_and_role"]).format(role=sql.Identifier("kb_reader")))
