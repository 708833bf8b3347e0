"""design §13 (design §13): kb behind a real PgBouncer in transaction mode (Debian's ``pgbouncer``).

Before the fix every worker job and every concurrent writer failed with
``DuplicatePreparedStatement: prepared statement "_pg3_0" already exists`` (psycopg prepares
statements on server connections that the pooler hands to other clients), and the index lock was a
session lock a pooled connection cannot hold. With ``KB_DATABASE_POOLER=transaction`` the core flow,
a polling worker and concurrent writers all work through the pooler.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support.core_flow import WORKSPACE, assert_converged, run_core_flow
from support.named_queries import queries
from support.pgbouncer import POOL_SIZE, run_pgbouncer

from kb.db import database
from kb.jobs import tasks as jobs
from kb.settings import Settings


@pytest.fixture
def pgbouncer(database_url: str) -> Iterator[str]:
    """A PgBouncer (pool_mode=transaction) in front of the test's database; yields its URL."""
    yield from run_pgbouncer(database_url)


def test_core_flow_through_transaction_pooler(pgbouncer: str, tmp_path) -> None:
    settings = Settings(
        database_url=pgbouncer,
        database_pooler="transaction",
        storage_root=tmp_path / "storage",
        embedding_model="hashing",
    )
    kb = run_core_flow(settings, tmp_path / "notes")
    assert not jobs.worker_listens(kb)  # no direct URL: the worker polls through the pooler
    # the index runs set nothing at session level: every server connection the pooler hands out
    # still waits for the WAL flush (an index run's synchronous_commit=off would land on another
    # client's commits)
    held = [database.connect(pgbouncer) for _ in range(POOL_SIZE)]
    try:
        assert {c.execute(queries["test_synchronous_commit"]).fetchone()["synchronous_commit"] for c in held} == {"on"}
    finally:
        for c in held:
            c.close()

    # Concurrent writers through the pooler (xact advisory locks serialize them), then a worker.
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(3):
                with kb.transaction(WORKSPACE, f"writer {n} note {i}") as tx:
                    tx.write(f"/documents/Concurrent/w{n}-{i}.md", f"# Writer {n} note {i}\n\nbody {n} {i}\n")
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    kb.run_worker(until_idle=True)
    ws = assert_converged(kb)
    assert ws["documents"] == 3 + 12
    paths = kb.list_paths(WORKSPACE)
    assert all(f"/documents/Concurrent/w{n}-{i}.md" in paths for n in range(4) for i in range(3))
    hits = kb.search(WORKSPACE, "Writer 2 note 1")
    assert hits and hits[0].path == "/documents/Concurrent/w2-1.md"


def test_direct_url_gives_the_worker_a_session(pgbouncer: str, database_url: str, tmp_path) -> None:
    settings = Settings(
        database_url=pgbouncer,
        database_pooler="transaction",
        direct_database_url=database_url,
        storage_root=tmp_path / "storage",
        embedding_model="hashing",
    )
    kb = run_core_flow(settings, tmp_path / "notes")
    assert jobs.worker_listens(kb)
    assert database.session_database_url(settings, kb.database_url) == database_url
