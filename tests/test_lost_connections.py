"""A connection whose Postgres session ends (``pg_terminate_backend``) wherever kb is using it —
while it is being set up, while a pool commits it, inside a pipeline — is DatabaseUnavailable
naming what was lost, never a raw psycopg error (design §14: no raw error escapes the facade).

The faults are real: the session is ended from a side connection at the chosen moment."""

from __future__ import annotations

import psycopg
import pytest
from support.named_queries import queries

from kb.db import database
from kb.errors import DatabaseUnavailable


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(queries["test_terminate_backend"], {"pid": pid})


def test_a_session_ended_while_it_is_configured_is_database_unavailable(database_url: str, monkeypatch) -> None:
    original = database.configure_connection

    def configure(conn, **kwargs):
        _terminate(database_url, conn.info.backend_pid)  # ended between connect and set-up
        return original(conn, **kwargs)

    monkeypatch.setattr(database, "configure_connection", configure)
    with pytest.raises(DatabaseUnavailable, match="connection to Postgres was lost"):
        database.connect(database_url)


def test_a_pooled_session_ended_before_the_pool_commits_is_database_unavailable(database_url: str) -> None:
    with pytest.raises(DatabaseUnavailable, match="connection to Postgres was lost"):
        with database.pooled_connection(database_url) as conn:
            pid = conn.execute(queries["test_backend_pid"]).fetchone()["pid"]
            _terminate(database_url, pid)  # the block ends cleanly: the pool's COMMIT finds it gone
    database.close_pools()


def test_a_session_ended_before_the_connection_commits_on_exit_is_database_unavailable(database_url: str) -> None:
    """``with database.connect(url) as conn:`` commits as the block ends cleanly (as a read of a
    document does): a session ended just before is DatabaseUnavailable, as inside the block."""
    with pytest.raises(DatabaseUnavailable, match="connection to Postgres was lost"):
        with database.connect(database_url) as conn:
            conn.execute(queries["test_backend_pid"])
            _terminate(database_url, conn.info.backend_pid)


def test_a_session_ended_inside_a_pipeline_is_database_unavailable(database_url: str) -> None:
    with pytest.raises(DatabaseUnavailable, match="connection to Postgres was lost"):
        with database.connect(database_url, autocommit=True) as conn:
            pid = conn.info.backend_pid
            with conn.transaction():
                with conn.pipeline():
                    conn.execute(queries["test_backend_pid"])
                    _terminate(database_url, pid)
                    conn.execute(queries["test_backend_pid"])
            with conn.transaction():  # as the indexer marks a document failed after a lost one
                conn.execute(queries["test_backend_pid"])


def test_a_session_ended_during_executemany_then_reused_is_database_unavailable(database_url: str) -> None:
    """As the indexer does: a document's transaction fails (its executemany runs in pipeline mode)
    and is noted as that document's error, then the next transaction on the connection runs."""
    with pytest.raises(DatabaseUnavailable, match="connection to Postgres was lost"):
        with database.connect(database_url, autocommit=True) as conn:
            try:
                with conn.transaction():
                    conn.execute(queries["test_backend_pid"])
                    _terminate(database_url, conn.info.backend_pid)
                    with conn.cursor() as cur:
                        cur.executemany(queries["test_backend_pid"], [{}] * 5)
            except Exception:  # as the indexer: recorded as the document's error
                pass
            with conn.transaction():
                conn.execute(queries["test_backend_pid"])


def test_connection_lost_tells_a_lost_session_from_a_lock_timeout() -> None:
    assert database.connection_lost(psycopg.errors.AdminShutdown("terminating connection"))
    assert database.connection_lost(psycopg.OperationalError("consuming input failed: server closed"))
    assert not database.connection_lost(psycopg.errors.LockNotAvailable("lock timeout"))
    assert not database.connection_lost(psycopg.errors.QueryCanceled("canceling statement"))
    assert not database.connection_lost(ValueError("not a connection error"))
