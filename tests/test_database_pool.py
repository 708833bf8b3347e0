"""The process-wide connection pool (kb.database.pool): configured connections, reuse, errors."""

from __future__ import annotations

import pytest

from kb import database
from kb.errors import DatabaseUnavailable
from kb.sql import queries


def test_pooled_connections_are_reused_and_give_dict_rows(database_url: str) -> None:
    with database.pooled_connection(database_url) as conn:
        first_pid = conn.execute(queries["test_backend_pid"]).fetchone()["pid"]
    with database.pooled_connection(database_url) as conn:
        second_pid = conn.execute(queries["test_backend_pid"]).fetchone()["pid"]
    assert first_pid == second_pid
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
