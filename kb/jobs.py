"""Procrastinate jobs (SPEC §6, §7): the app, kb's tasks, and the worker.

Queues: ``projection`` (``kb.project_changes``), ``index`` (``kb.index_changes``) and
``maintenance`` (the periodic ``kb.sweep_worktrees`` janitor, SPEC §5). The first two take
only a workspace id and converge to HEAD, so coalescing (``queueing_lock``) and serializing
(``lock="ws:{id}"``) them is always safe. Jobs are deferred by the store inside the revision's own
Postgres transaction (``kb.store.defer_convergence``); ``defer`` here is for callers outside one.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import procrastinate

from kb.store import INDEX_TASK, PROJECTION_TASK

if TYPE_CHECKING:
    from kb.knowledge_base import KnowledgeBase

QUEUES = ["projection", "index", "maintenance"]

log = logging.getLogger(__name__)

app = procrastinate.App(connector=procrastinate.PsycopgConnector())
"""kb's Procrastinate app; ``configure(kb)`` points it at the knowledge base's database."""

_current: "KnowledgeBase | None" = None


def configure(kb: "KnowledgeBase") -> procrastinate.App:
    """Bind the tasks to ``kb`` and its database; returns the app (open it before use)."""
    global _current
    _current = kb
    # Swap the connector of the one app rather than ``with_connector`` (deprecated): tasks keep a
    # link to their app, so the periodic deferrer would otherwise defer through an unopened app.
    connector = procrastinate.PsycopgConnector(conninfo=kb.database_url)
    app.connector = connector
    app.job_manager.connector = connector
    return app


def _kb() -> "KnowledgeBase":
    if _current is None:
        raise RuntimeError("kb.jobs.configure(kb) must be called before running kb's tasks")
    return _current


@app.task(name=PROJECTION_TASK, queue="projection")
def project_changes(workspace_id: int) -> dict:
    """Converge ``documents``/``folders`` rows of a workspace to HEAD (SPEC §6)."""
    result = _kb().project(workspace_id)
    return {"revision": result.revision, "created": len(result.created), "deleted": len(result.deleted)}


@app.task(name=INDEX_TASK, queue="index")
def index_changes(workspace_id: int) -> dict:
    """Converge a workspace's chunks and embeddings to HEAD (SPEC §7)."""
    report = _kb().index(workspace_id)
    log.info("indexed workspace %s: %s", workspace_id, report)
    return {"revision": report.revision, "indexed": report.documents_indexed, "failed": report.documents_failed}


JANITOR_TASK = "kb.sweep_worktrees"


@app.periodic(cron="*/15 * * * *", periodic_id="worktree-janitor")
@app.task(name=JANITOR_TASK, queue="maintenance", queueing_lock="worktree-janitor")
def sweep_worktrees(timestamp: int) -> dict:
    """The turn-worktree janitor (SPEC §5), every 15 minutes: remove worktrees no open turn holds
    whose newest file is older than ``KB_WORKTREE_TTL`` seconds (default 24 h)."""
    report = _kb().sweep_worktrees()
    if report.removed:
        log.info("janitor removed %d abandoned turn worktrees: %s", len(report.removed), report.removed)
    return {"removed": len(report.removed), "kept_open": len(report.kept_open), "kept_fresh": report.kept_fresh}


def run_worker(kb: "KnowledgeBase", until_idle: bool = False, concurrency: int = 1) -> None:
    """Run a worker on kb's queues; with ``until_idle`` return once no job is waiting."""
    import asyncio

    bound = configure(kb)

    async def _run() -> None:
        async with bound.open_async():
            await bound.run_worker_async(
                queues=QUEUES, wait=not until_idle, concurrency=concurrency,
                install_signal_handlers=not until_idle,
            )

    asyncio.run(_run())
