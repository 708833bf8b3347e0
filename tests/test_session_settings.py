"""design §13 (design §13): kb's behaviour does not depend on the session defaults the environment
(``PGOPTIONS``), the role (``ALTER ROLE … SET``) or the database (``ALTER DATABASE … SET``) sets.

Each kind of hostile default runs the whole core flow (init on an empty database, import, a real
worker, search, move, revert) and checks what kb's connections actually run with. Before the fix
``search_path=kb,public`` put Procrastinate's schema into ``kb`` and broke every later command,
``statement_timeout`` killed the schema set-up, and ``serializable``/``DateStyle``/``TimeZone``
leaked into kb's transactions.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import psycopg
import pytest
from support.core_flow import run_core_flow
from support.database import run_admin, with_database
from support.named_queries import queries

from kb.db import database
from kb.db.migrations import apply_migrations
from kb.errors import MigrationError
from kb.jobs import tasks as jobs
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

HOSTILE = {
    "search_path": "kb, public",
    "TimeZone": "Pacific/Chatham",
    "DateStyle": "SQL, DMY",
    "default_transaction_isolation": "serializable",
    "statement_timeout": "200ms",  # shorter than creating the schema takes
    "lock_timeout": "1ms",
}
PINNED = {
    "search_path": "public",
    "TimeZone": "UTC",
    "DateStyle": "ISO, MDY",
    "default_transaction_isolation": "read committed",
    "transaction_isolation": "read committed",
    "statement_timeout": "0",
    "lock_timeout": "0",
}


@pytest.fixture
def empty_database(pg_server: str) -> Iterator[str]:
    """A database without kb's schema (so `kb init` really creates it under the hostile defaults)."""
    name = f"kb_hostile_{os.getpid()}"
    run_admin(pg_server, "drop_database", database=name)
    run_admin(pg_server, "create_database", database=name)
    try:
        yield with_database(pg_server, name)
    finally:
        database.close_pools()
        run_admin(pg_server, "drop_database", database=name)


def _pgoptions() -> str:
    # PGOPTIONS escapes spaces inside a value with a backslash.
    return " ".join(f"-c {name}={value.replace(' ', chr(92) + ' ')}" for name, value in HOSTILE.items())


@pytest.fixture(params=["PGOPTIONS", "ALTER ROLE", "ALTER DATABASE"])
def hostile_url(request, pg_server: str, empty_database: str, monkeypatch) -> Iterator[str]:
    """The empty database's URL, with every HOSTILE default set by one mechanism."""
    kind = request.param
    admin = psycopg.connect(empty_database, autocommit=True)
    role = f"kb_hostile_{os.getpid()}"
    try:
        if kind == "PGOPTIONS":
            monkeypatch.setenv("PGOPTIONS", _pgoptions())
            yield empty_database
        elif kind == "ALTER ROLE":
            admin.execute(
                psycopg.sql.SQL(queries["test_drop_role_if_exists"]).format(role=psycopg.sql.Identifier(role))
            )
            admin.execute(
                psycopg.sql.SQL(queries["test_create_superuser_role"]).format(role=psycopg.sql.Identifier(role))
            )
            for name, value in HOSTILE.items():
                admin.execute(
                    psycopg.sql.SQL(queries["test_set_role_default"]).format(
                        role=psycopg.sql.Identifier(role),
                        setting=psycopg.sql.Identifier(name),
                        value=psycopg.sql.Literal(value),
                    )
                )
            info = psycopg.conninfo.conninfo_to_dict(empty_database)
            info["user"] = role
            yield psycopg.conninfo.make_conninfo(**info)
        else:
            dbname = psycopg.conninfo.conninfo_to_dict(empty_database)["dbname"]
            for name, value in HOSTILE.items():
                admin.execute(
                    psycopg.sql.SQL(queries["test_set_database_default"]).format(
                        database=psycopg.sql.Identifier(dbname),
                        setting=psycopg.sql.Identifier(name),
                        value=psycopg.sql.Literal(value),
                    )
                )
            yield empty_database
    finally:
        database.close_pools()
        admin.close()
        if kind == "ALTER ROLE":  # the role owns kb's objects: drop its database first
            run_admin(pg_server, "drop_database", database=psycopg.conninfo.conninfo_to_dict(empty_database)["dbname"])
            with psycopg.connect(pg_server, autocommit=True) as conn:
                conn.execute(
                    psycopg.sql.SQL(queries["test_drop_role_if_exists"]).format(role=psycopg.sql.Identifier(role))
                )


def _hostile_defaults_are_in_force(url: str) -> None:
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:  # a connection kb did not configure
        seen = conn.execute(queries["test_session_settings"]).fetchone()
    assert seen["TimeZone"] == HOSTILE["TimeZone"] and seen["statement_timeout"] == HOSTILE["statement_timeout"]


def _settings_of_kb_connections(url: str) -> list[dict]:
    """What each kind of connection kb opens runs with: connect, the pool, Procrastinate's connector."""
    with database.connect(url) as conn:
        seen = [conn.execute(queries["test_session_settings"]).fetchone()]
    with database.pooled_connection(url) as conn:
        seen.append(conn.execute(queries["test_session_settings"]).fetchone())

    async def through_procrastinate() -> dict:
        connector = jobs._ConfiguredConnector(url, 30.0)
        await connector.open_async()
        try:
            async with connector.pool.connection() as conn:
                cur = await conn.execute(queries["test_session_settings"])
                names = [c.name for c in cur.description]
                return dict(zip(names, await cur.fetchone()))
        finally:
            await connector.close_async()

    seen.append(asyncio.run(through_procrastinate()))
    return seen


def test_core_flow_under_hostile_session_defaults(hostile_url: str, tmp_path) -> None:
    _hostile_defaults_are_in_force(hostile_url)
    settings = Settings(database_url=hostile_url, storage_root=tmp_path / "storage", embedding_model="hashing")
    kb = run_core_flow(settings, tmp_path / "notes")

    for seen in _settings_of_kb_connections(hostile_url):
        assert {name: seen[name] for name in PINNED} == PINNED
    with database.connect(hostile_url) as conn:
        schemas = [r["schema"] for r in conn.execute(queries["test_procrastinate_schemas"])]
    assert schemas == [database.JOB_QUEUE_SCHEMA]
    # A second `kb init` (what failed for ever in the issue) finds everything in place.
    assert KnowledgeBase.open(settings).migrate().applied == []
    kb.run_worker(until_idle=True)


def test_misplaced_job_queue_is_a_clear_error(empty_database: str) -> None:
    """A database set up under someone else's search_path before the fix (Procrastinate's tables in
    schema kb) is named with the fix, not a duplicate-key error."""
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(queries["test_schema_kb_first_on_search_path"])
        conn.execute(jobs.procrastinate.schema.SchemaManager.get_schema())
    with database.connect(empty_database) as conn:
        with pytest.raises(MigrationError, match="Procrastinate's tables are in schema kb, not public"):
            apply_migrations(conn)
