"""design §16: the optional least-privilege roles of sql/roles.sql — kb's processes run as
kb_writer (a revision, the worker indexing it, a search), a `kb psql` view runs as kb_operator,
and kb_reader searches but cannot write. Roles are cluster-wide: roles.sql creates them once and
tolerates a concurrent run (CI's Postgres 15 is shared by test processes); tests never drop them."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from support.commands import run_cli

from kb import KnowledgeBase
from kb.db import database
from kb.errors import PermissionDenied
from kb.settings import Settings

ROLES = Path(__file__).resolve().parents[1] / "sql" / "roles.sql"


def as_role(url: str, role: str) -> str:
    """``url`` whose sessions act as ``role`` (set at connection start-up: ``-c role=…``)."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["options"] = f"-c role={role}"
    return psycopg.conninfo.make_conninfo(**info)


def _apply_roles(url: str) -> None:
    for attempt in range(3):  # another test process may be granting the same memberships at once
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(ROLES.read_text())
            return
        except psycopg.errors.InternalError:  # "tuple concurrently updated" on a cluster-wide catalog
            if attempt == 2:
                raise


def test_writer_runs_kb_reader_searches_operator_views(kb, settings, kb_env, tmp_path):
    _apply_roles(kb.database_url)
    kb.close()
    database.close_pools()
    writer_url = as_role(settings.database_url, "kb_writer")
    writer = KnowledgeBase.open(
        Settings(database_url=writer_url, storage_root=settings.storage_root, embedding_model="hashing")
    )
    writer.create_workspace(1)
    with writer.transaction(1, "zebra notes", "ada") as tx:
        tx.write("/documents/Zebra.md", "# Zebra\n\nzebras get prorated refunds\n")
    writer.run_worker(until_idle=True)  # the projection and index jobs, as kb_writer
    assert writer.search(1, "zebra refunds")[0].path == "/documents/Zebra.md"
    writer.close()

    reader = KnowledgeBase.open(
        Settings(
            database_url=as_role(settings.database_url, "kb_reader"),
            storage_root=settings.storage_root,
            embedding_model="hashing",
        ),
        migrate=False,
    )
    try:
        assert reader.search(1, "zebra refunds")[0].path == "/documents/Zebra.md"
        with pytest.raises(PermissionDenied, match="kb_writer"):
            with reader.transaction(1, "not allowed", "eve") as tx:
                tx.write("/documents/Eve.md", "eve\n")
        with pytest.raises(PermissionDenied, match="kb_writer"):
            reader.tokens().list()  # the token digests are not the reader's
    finally:
        reader.close()

    operator_env = {**kb_env, "KB_DATABASE_URL": as_role(settings.database_url, "kb_operator")}
    views = run_cli(
        operator_env,
        "psql",
        "-tA",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        "SELECT count(*) FROM kb.job_health",
        "-c",
        "SELECT count(*) FROM procrastinate_jobs",
        "-c",
        "DELETE FROM kb.documents",
        check=False,
    )
    health, jobs = views.stdout.split()
    assert health.isdigit() and int(jobs) > 0  # the views and the job queue, as kb_operator
    assert views.returncode != 0 and "permission denied for table documents" in views.stderr
