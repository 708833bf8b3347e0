"""Test harness: a real Postgres with pgvector, one fresh database per test.

The server is ``KB_TEST_DATABASE_URL`` (a role allowed to CREATE DATABASE) or, when unset, an
embedded Postgres 18 + pgvector started for the session in a temporary directory. A template
database gets kb's schema once; each test gets ``CREATE DATABASE … TEMPLATE`` (a file copy, a few
milliseconds) and its own storage root, so tests never see each other's rows or repositories.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from kb.db import database
from kb.db.database import start_embedded, stop_embedded
from kb.knowledge_base import KnowledgeBase
from kb.db.migrations import apply_migrations
from kb.settings import Settings
from kb.db.sql import queries

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CORPUS = SHARED / "corpus"
TEMPLATE = "kb_test_template"
_counter = itertools.count()


def corpus_path(*parts: str) -> Path:
    """A folder of ../shared/corpus, or skip the test with the reason."""
    path = CORPUS.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"test corpus {path} is absent (it lives in ../shared/corpus beside the repo)")
    return path


def with_database(url: str, name: str) -> str:
    """``url`` pointed at database ``name``."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


def run_admin(admin_url: str, query: str, **identifiers: str) -> None:
    """Run a named query of sql/queries/testing.sql with its ``{identifiers}`` filled in."""
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the test server (``pg_server``, directly or through
    ``database_url``, ``kb``, …) ``postgres``, so ``-m "not postgres"`` runs the pure tests alone.

    Against ``KB_TEST_DATABASE_URL``, run only those tests: the rest — chunking, paths, CLI
    start-up, private embedded servers — never touch it and already ran in the embedded leg, so
    CI's second leg (Postgres 15, .ci/run) would repeat them unchanged. They are reported as
    deselected."""
    uses_server = [item for item in items if "pg_server" in getattr(item, "fixturenames", ())]
    for item in uses_server:
        item.add_marker(pytest.mark.postgres)
    if not os.environ.get("KB_TEST_DATABASE_URL"):
        return
    if len(uses_server) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in uses_server])
        items[:] = uses_server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """Admin URL of the test Postgres server (database ``postgres``): ``KB_TEST_DATABASE_URL``
    (any Postgres 15+ with pgvector ≥ 0.5 and a role that may CREATE DATABASE), else an embedded
    Postgres 18 started for the session."""
    configured = os.environ.get("KB_TEST_DATABASE_URL")
    if configured:
        yield with_database(configured, "postgres")
        return
    with embedded_server("kbpg-") as url:
        yield url


def make_template(server_url: str) -> str:
    """Create this session's template database (kb's full schema) on ``server_url``; returns its name.

    Named per test process, so several test runs can share one server."""
    name = f"{TEMPLATE}_{os.getpid()}"
    run_admin(server_url, "drop_database", database=name)
    run_admin(server_url, "create_database", database=name)
    with database.connect(with_database(server_url, name)) as conn:
        apply_migrations(conn)
    return name


@pytest.fixture(scope="session")
def template_url(pg_server: str) -> Iterator[str]:
    """A database holding kb's full schema, used as the template of every test database."""
    name = make_template(pg_server)
    yield with_database(pg_server, name)
    database.close_pools()
    run_admin(pg_server, "drop_database", database=name)


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


@pytest.fixture
def database_url(pg_server: str, template_url: str) -> Iterator[str]:
    """URL of a fresh database with kb's schema, dropped after the test."""
    with fresh_database(pg_server, psycopg.conninfo.conninfo_to_dict(template_url)["dbname"]) as url:
        yield url


def wal_level(server_url: str) -> str:
    """The server's ``wal_level``."""
    with psycopg.connect(server_url) as conn:
        return conn.execute(queries["show_wal_level"]).fetchone()[0]


@pytest.fixture(scope="session")
def logical_server(pg_server: str, template_url: str) -> Iterator[tuple[str, str]]:
    """``(admin URL, template name)`` of a server with ``wal_level=logical`` (logical replication
    tests, SPEC §6): the test server when it has it, else a private embedded one (a server's
    wal_level needs a restart, which a shared server must not get from a test)."""
    if wal_level(pg_server) == "logical":
        yield pg_server, psycopg.conninfo.conninfo_to_dict(template_url)["dbname"]
        return
    with embedded_server("kblogical-") as url:
        yield url, make_template(url)


@pytest.fixture
def logical_database_url(logical_server: tuple[str, str]) -> Iterator[str]:
    """URL of a fresh database with kb's schema on a ``wal_level=logical`` server."""
    with fresh_database(*logical_server) as url:
        yield url


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    """Settings for one test: its own database and storage root, the hashing embedder."""
    return Settings(database_url=database_url, storage_root=tmp_path / "storage", embedding_model="hashing")


@pytest.fixture
def kb(settings: Settings) -> KnowledgeBase:
    """A KnowledgeBase over the test's database and storage root."""
    return KnowledgeBase.open(settings)


@pytest.fixture
def kb_env(settings: Settings) -> dict[str, str]:
    """Environment for running the ``kb`` CLI against the test's database and storage root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(
        KB_DATABASE_URL=settings.database_url,
        KB_STORAGE_ROOT=str(settings.storage_root),
        KB_EMBEDDING_MODEL="hashing",
    )
    return env


def run_cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m kb.cli ARGS`` with ``env``; returns the completed process."""
    result = subprocess.run(
        [sys.executable, "-m", "kb.adapters.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kb {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def git(repo: Path, *args: str) -> str:
    """Run the real git CLI in ``repo``; returns stdout (raises on failure)."""
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout
