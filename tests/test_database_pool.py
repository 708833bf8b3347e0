"""The process-wide connection pool (kb.database.pool): configured connections, reuse, errors."""

from __future__ import annotations

import pytest
from support.named_queries import queries

from kb.db import database
from kb.errors import DatabaseUnavailable


def test_pooled_connections_are_reused_and_give_dict_rows(database_url: str) -> None:
    """One caller at a time is served by the connections the pool keeps open (``POOL_MIN_SIZE``,
    handed out in turn), not by new ones."""
    pids = set()
    for _ in range(6):
        with database.pooled_connection(database_url) as conn:
            pids.add(conn.execute(queries["test_backend_pid"]).fetchone()["pid"])
    assert len(pids) <= database.POOL_MIN_SIZE
    database.close_pools()


def test_pooled_transaction_rolls_back_on_error(database_url: str) -> None:
    with database.pooled_connection(database_url) as conn:
        conn.execute(queries["test_create_pool_probe"])
    with pytest.raises(RuntimeError):
        with database.pooled_transaction(database_url) as conn:
            conn.execute(queries["test_insert_pool_probe"])
            raise RuntimeError("boom")
    with database.pooled_connection(database_url) as conn:
        assert conn.execute(queries["test_count_pool_probe"]).fetchone()["n"] == 0
    database.close_pools()


def test_unreachable_server_is_a_kb_error(tmp_path) -> None:
    url = f"postgresql:///kb?host={tmp_path}&port=1"
    saved, database.POOL_TIMEOUT = database.POOL_TIMEOUT, 2.0
    try:
        with pytest.raises(DatabaseUnavailable, match="cannot connect to Postgres"):
            with database.pooled_connection(url):
                pass
    finally:
        database.POOL_TIMEOUT = saved


def test_a_closed_pool_is_a_kb_error(database_url: str, monkeypatch) -> None:
    """Pools closing while a call starts (at exit, a server shutting down): ``pooled_connection``
    raises DatabaseUnavailable (psycopg_pool's PoolClosed escaped before)."""
    closed = database.pool(database_url)
    closed.close()
    monkeypatch.setattr(database, "pool", lambda url, **_: closed)
    with pytest.raises(DatabaseUnavailable, match="pool was closed"):
        with database.pooled_connection(database_url):
            pass


def test_pooled_connections_whose_backends_ended_are_replaced_not_handed_out(database_url: str) -> None:
    """A server restart or pg_terminate_backend ends idle pooled connections; the pool checks a
    connection before handing it out, so the next callers get live ones instead of failing."""
    connections = database.pool(database_url)
    held = [connections.getconn() for _ in range(database.POOL_MIN_SIZE)]
    pids = [conn.execute(queries["test_backend_pid"]).fetchone()["pid"] for conn in held]
    for conn in held:
        conn.rollback()
        connections.putconn(conn)
    with database.connect(database_url, autocommit=True) as admin:
        for pid in pids:
            admin.execute(queries["test_terminate_backend"], {"pid": pid})
    for _ in range(3):
        with database.pooled_connection(database_url) as conn, database.pooled_connection(database_url) as other:
            assert conn.execute(queries["test_backend_pid"]).fetchone()["pid"] not in pids
            assert other.execute(queries["test_backend_pid"]).fetchone()["pid"] not in pids
    database.close_pools()


def test_a_pool_whose_connections_are_all_busy_says_so(database_url: str, monkeypatch) -> None:
    monkeypatch.setattr(database, "POOL_TIMEOUT", 0.5)
    database.close_pools()
    connections = database.pool(database_url)
    taken = [connections.getconn() for _ in range(database.POOL_MAX_SIZE)]
    try:
        with pytest.raises(DatabaseUnavailable, match=f"all {database.POOL_MAX_SIZE} pooled connections"):
            with database.pooled_connection(database_url):
                pass
    finally:
        for conn in taken:
            connections.putconn(conn)
        database.close_pools()


def test_a_pool_whose_every_connection_ended_serves_the_next_caller_at_once(database_url: str) -> None:
    """A server restart (or ``pg_terminate_backend`` of every kb session) ends all idle pooled
    connections. psycopg_pool checks one per attempt and backs off 1, 2, 4, 8 … s between failed
    checks, so with 8 dead connections the next caller waited 30 s and got DatabaseUnavailable
    (``bin/stress_library.py``'s ``kb fsck`` after its last kill round). One failed check now
    drops every dead idle connection: the caller gets a live one within a few seconds."""
    import time

    connections = database.pool(database_url)
    held = [connections.getconn() for _ in range(database.POOL_MAX_SIZE)]
    pids = [conn.execute(queries["test_backend_pid"]).fetchone()["pid"] for conn in held]
    for conn in held:
        conn.rollback()
        connections.putconn(conn)
    with database.connect(database_url, autocommit=True) as admin:
        for pid in pids:
            admin.execute(queries["test_terminate_backend"], {"pid": pid})
    start = time.monotonic()
    try:
        with database.pooled_connection(database_url) as conn:
            assert conn.execute(queries["test_backend_pid"]).fetchone()["pid"] not in pids
        assert time.monotonic() - start < 5.0
    finally:
        database.close_pools()


def test_kb_pool_timeout_reaches_kbs_pool_and_the_job_queues(settings) -> None:
    """``KB_POOL_TIMEOUT`` (design §13): a KnowledgeBase opened with it gives its database's pool,
    and the job queue's connector a worker binds, that wait — not the 30 s default."""
    import asyncio

    import psycopg_pool

    from kb.jobs import tasks as jobs
    from kb.knowledge_base import KnowledgeBase

    with KnowledgeBase.open(settings.model_copy(update={"pool_timeout": 2.5})) as kb:
        assert database.pool(kb.database_url).timeout == 2.5
        connector = jobs.connector_for(kb)
        made = asyncio.run(connector._create_pool(connector._pool_args))  # made as its open_async makes it
        assert isinstance(made, psycopg_pool.AsyncConnectionPool) and made.timeout == 2.5
    database.close_pools()


@pytest.mark.parametrize("value", ["inf", "1e400", "1e10"])
def test_kb_pool_timeout_past_any_wait_is_a_settings_error(value: str, monkeypatch) -> None:
    """``KB_POOL_TIMEOUT`` (design §13) beyond what a wait can take (``inf``, ``1e400``, ``1e10``
    seconds: past the platform's time_t) is refused as a setting, not met later as an
    OverflowError by the first pooled connection (``kb search``, the worker's loop)."""
    from pydantic import ValidationError

    from kb.settings import Settings

    monkeypatch.setenv("KB_POOL_TIMEOUT", value)
    with pytest.raises(ValidationError, match="pool_timeout"):
        Settings()
    monkeypatch.setenv("KB_POOL_TIMEOUT", "86400")  # a day: the longest wait taken
    assert Settings().pool_timeout == 86400.0


def test_a_pool_timeout_too_short_for_a_reachable_server_names_kb_pool_timeout(database_url: str, monkeypatch) -> None:
    """``KB_POOL_TIMEOUT`` (design §13) set lower than opening the pool's connections takes
    (here a nanosecond) while Postgres answers: the error says so and names the setting; it said
    "cannot connect to Postgres … Check KB_DATABASE_URL", sending the operator after a URL that
    works."""
    database.close_pools()
    monkeypatch.setitem(database._pool_timeouts, database_url, 1e-9)
    try:
        with pytest.raises(DatabaseUnavailable, match="KB_POOL_TIMEOUT") as refused:
            with database.pooled_connection(database_url):
                pass
        assert "KB_DATABASE_URL" not in str(refused.value)
    finally:
        database.close_pools()
