"""design §6, §7: no job scheduled for later holds back work that is due now.

Procrastinate's fetch treats a waiting job as holding its lock even before its ``scheduled_at``.
kb gives delayed jobs no lock (a ``kb.defer_when_due`` stand-in defers the real job once due),
projection and indexing have separate locks, and ``kb worker --until-idle`` waits for convergence
and says what is scheduled for later.
"""

from __future__ import annotations

import asyncio

import pytest
from support.commands import run_cli
from support.named_queries import queries

from kb.db import database
from kb.jobs import tasks as jobs
from kb.jobs.sweep import defer_failed_retry
from kb.knowledge_base import KnowledgeBase
from kb.store.job_deferral import DEFER_WHEN_DUE_TASK, INDEX_TASK, PROJECTION_TASK, defer_job


def _jobs(kb: KnowledgeBase) -> list[dict]:
    with database.connect(kb.database_url, autocommit=True) as conn:
        return conn.execute(queries["test_jobs"]).fetchall()


def _workspace(kb: KnowledgeBase, ws: int = 1) -> dict:
    return next(w for w in kb.workspaces() if w["id"] == ws)


def _write(kb: KnowledgeBase, text: str, ws: int = 1) -> str:
    kb.create_workspace(ws)
    with kb.transaction(ws, f"write {text}", "alice") as tx:
        tx.write("/documents/Doc42.md", f"# Doc 42\n\n{text}\n")
    return tx.revision.id


def _assert_converged_with_new_text(kb: KnowledgeBase, head: str) -> None:
    row = _workspace(kb)
    assert row["last_projected_revision"] == head
    assert row["last_indexed_revision"] == head
    hits = kb.search(1, "zebra", 3)
    assert hits and hits[0].path == "/documents/Doc42.md"
    texts = [text for _, text in hits[0].lines]
    assert "second version zebra" in texts and "first version" not in texts


def test_a_pending_retry_does_not_hold_back_a_new_revision(kb, kb_env):
    """The issue's four steps, with the real `kb worker --until-idle`."""
    _write(kb, "first version")  # 1. indexed at R1
    kb.run_worker(until_idle=True)
    assert _workspace(kb)["last_indexed_revision"] == kb.head(1)
    with database.transaction(kb.database_url) as conn:  # 2. a retry as after repeated failures
        retry = defer_failed_retry(conn, 1, attempts=8)
    assert retry is not None
    head = _write(kb, "second version zebra")  # 3. R2 defers projection and index
    result = run_cli(kb_env, "worker", "--until-idle", "--quiet")  # 4.
    _assert_converged_with_new_text(kb, head)
    waiting = [j for j in _jobs(kb) if j["status"] == "todo"]
    assert [(j["id"], j["task_name"], j["scheduled_later"]) for j in waiting] == [(retry, DEFER_WHEN_DUE_TASK, True)]
    assert "1 job(s) scheduled for later; next: kb.index_changes for workspace 1" in result.stdout
    assert "no job waiting" not in result.stdout
    status = run_cli(kb_env, "status", "--workspace", "1").stdout
    assert f"later:      job {retry} kb.index_changes (workspace 1) due at" in status
    assert "queueing lock index-retry:1" in status


@pytest.mark.parametrize("queue,task", [("projection", PROJECTION_TASK), ("index", INDEX_TASK)])
def test_any_delayed_job_takes_no_lock_and_runs_its_job_once_due(kb, queue, task):
    """Every delayed deferral (whatever the task) is a lock-free stand-in; once due it defers the
    real job under that job's lock, which then converges the workspace."""
    _write(kb, "first version")
    kb.run_worker(until_idle=True)
    with database.transaction(kb.database_url) as conn:
        delayed = defer_job(conn, queue, task, 1, delay_seconds=600)
    head = _write(kb, "second version zebra")
    rows = {j["id"]: j for j in _jobs(kb)}
    assert rows[delayed]["task_name"] == DEFER_WHEN_DUE_TASK and rows[delayed]["scheduled_later"]
    report = kb.run_worker(until_idle=True)
    _assert_converged_with_new_text(kb, head)
    assert [j["id"] for j in report.scheduled] == [delayed] and report.blocked == []
    with database.connect(kb.database_url, autocommit=True) as conn:
        assert conn.execute(queries["test_job_lock"], {"id": delayed}).fetchone()["lock"] is None
        conn.execute(queries["test_make_job_due"], {"id": delayed})  # the backoff has elapsed
    kb.run_worker(until_idle=True)
    done = {j["id"]: j for j in _jobs(kb)}
    assert done[delayed]["status"] == "succeeded"
    deferred = [j for j in done.values() if j["id"] > delayed and j["task_name"] == task]
    assert deferred and deferred[-1]["status"] == "succeeded"


def test_the_sweeps_retry_of_failed_documents_is_lock_free(kb):
    """The sweep's delayed retry (documents still failed) cannot hold back a due job either."""
    _write(kb, "first version")
    kb.run_worker(until_idle=True)
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["test_fail_documents"], {"workspace_id": 1})
    assert kb.sweep().retry_deferred == [1]
    head = _write(kb, "second version zebra")
    kb.run_worker(until_idle=True)
    _assert_converged_with_new_text(kb, head)
    assert [j["task_name"] for j in _jobs(kb) if j["status"] == "todo"] == [DEFER_WHEN_DUE_TASK]


def test_projection_never_waits_for_indexing(kb):
    """A running index job does not hold back projection: they have separate locks."""
    _write(kb, "first version")
    kb.run_worker(until_idle=True)
    head = _write(kb, "second version zebra")
    locks = {j["task_name"]: j for j in _jobs(kb) if j["status"] == "todo"}
    with database.connect(kb.database_url, autocommit=True) as conn:
        assert (
            conn.execute(queries["test_job_lock"], {"id": locks[PROJECTION_TASK]["id"]}).fetchone()["lock"]
            == "projection:1"
        )
        assert conn.execute(queries["test_job_lock"], {"id": locks[INDEX_TASK]["id"]}).fetchone()["lock"] == "index:1"
        conn.execute(queries["test_mark_job_doing"], {"id": locks[INDEX_TASK]["id"]})  # "running" elsewhere
        conn.execute(queries["test_fetch_job"], {"queues": [f"projection@{kb.settings.node}"]})
        fetched = conn.execute(queries["test_job_status"], {"id": locks[PROJECTION_TASK]["id"]}).fetchone()
    assert fetched["status"] == "doing"  # fetchable although an index job of the workspace runs
    assert head


@pytest.mark.parametrize("periodic", [t.name for t in jobs.periodic_tasks()])
def test_periodic_tasks_cannot_delay_a_due_job(kb, periodic):
    """Each periodic task, even waiting with a schedule in the future as Procrastinate's own
    deferral would store it, holds no lock that a workspace's due jobs need."""
    task = next(t for t in jobs.periodic_tasks() if t.name == periodic)
    assert task.lock is None or not task.lock.startswith(("projection:", "index:", "ws:"))  # never a workspace's
    _write(kb, "first version")
    kb.run_worker(until_idle=True)

    async def defer_later() -> int:
        with jobs.app.replace_connector(jobs.connector_for(kb)) as bound:
            async with bound.open_async():
                return await bound.tasks[periodic].configure(schedule_in={"minutes": 10}).defer_async(timestamp=0)

    later = asyncio.run(defer_later())
    head = _write(kb, "second version zebra")
    report = kb.run_worker(until_idle=True)
    _assert_converged_with_new_text(kb, head)
    assert later in [j["id"] for j in report.scheduled]


def test_until_idle_reports_a_due_job_held_back_by_a_foreign_delayed_job(kb, kb_env):
    """A due job held back by a job kb did not defer (a delayed job carrying the lock) is reported
    as blocked, with why, instead of being called idle; `kb status` shows it too."""
    _write(kb, "first version")
    kb.run_worker(until_idle=True)
    with database.connect(kb.database_url, autocommit=True) as conn:
        foreign = conn.execute(queries["test_defer_locked_later"], {"lock": "index:1"}).fetchone()["id"]
    _write(kb, "second version zebra")
    result = run_cli(kb_env, "worker", "--until-idle", "--quiet")
    assert f"waits for job {foreign} kb.index_changes, scheduled for" in result.stdout
    assert "holds lock index:1" in result.stdout
    assert _workspace(kb)["last_projected_revision"] == kb.head(1)  # projection was not held back
    status = run_cli(kb_env, "status").stdout
    assert "blocked:    job" in status and f"waits for job {foreign}" in status
