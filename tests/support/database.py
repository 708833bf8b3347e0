"""Databases for the tests: URLs, admin statements, private embedded servers and the per-test
copies of the template database that ``tests/conftest.py``'s fixtures hand out."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

from kb.db import database
from kb.db.database import start_embedded, stop_embedded
from kb.db.migrations import apply_migrations
from support.named_queries import queries

TEMPLATE = "kb_test_template"
_counter = itertools.count()


def with_database(url: str, name: str) -> str:
    """``url`` pointed at database ``name``."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


def run_admin(admin_url: str, query: str, **identifiers: str) -> None:
    """Run a named query of tests/sql/testing.sql with its ``{identifiers}`` filled in."""
    statement = sql.SQL(queries[query]).format(**{k: sql.Identifier(v) for k, v in identifiers.items()})
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if query == "drop_database":
            conn.execute(queries["terminate_connections"], {"database": identifiers["database"]})
        conn.execute(statement)


@contextlib.contextmanager
def embedded_server(prefix: str) -> Iterator[str]:
    """A private embedded Postgres 18 + pgvector (``wal_level=logical``) for the block; admin URL."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield start_embedded(root / "data", database="postgres")
    finally:
        stop_embedded(root / "data")
        shutil.rmtree(root, ignore_errors=True)


def make_template(server_url: str) -> str:
    """Create this session's template database (kb's full schema) on ``server_url``; returns its name.

    Named per test process, so several test runs can share one server."""
    name = f"{TEMPLATE}_{os.getpid()}"
    run_admin(server_url, "drop_database", database=name)
    run_admin(server_url, "create_database", database=name)
    with database.connect(with_database(server_url, name)) as conn:
        apply_migrations(conn)
    return name


@contextlib.contextmanager
def fresh_database(server_url: str, template: str) -> Iterator[str]:
    """A new database copied from ``template`` on ``server_url`` for the block; its URL."""
    name = f"kb_test_{os.getpid()}_{next(_counter)}"
    run_admin(server_url, "create_database_from_template", database=name, template=template)
    try:
        yield with_database(server_url, name)
    finally:
        database.close_pools()  # a test's pooled connections would block DROP DATABASE
        run_admin(server_url, "drop_database", database=name)


def wal_level(server_url: str) -> str:
    """The server's ``wal_level``."""
    with psycopg.connect(server_url) as conn:
        return conn.execute(queries["show_wal_level"]).fetchone()[0]
