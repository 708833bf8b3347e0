"""Procrastinate jobs (design §6, §7): the app, kb's tasks, the periodic tasks, and the worker.

Queues: ``projection`` (``kb.project_changes``), ``index`` (``kb.index_changes``, ``kb.reindex``),
``maintenance`` (the periodic tasks), ``span_fill`` (``kb.span_fill``, design §10) and ``push``
(``kb.push_remote``, design §13: lock ``push:{ws}``, coalesced by the deferring query,
retried with Procrastinate's backoff). A workspace's jobs go to its home node's copy of the queue,
``{queue}@{node}`` (design §15, ``kb.db.nodes``, routed in SQL by ``kb.node_queue``); a node's
worker consumes its own and the node-free ones (``kb.db.nodes.worker_queues``), and a job that
reaches the wrong node re-defers itself (``kb.jobs.routing``). Workspace jobs
take only a workspace id and converge to HEAD, so coalescing them (``queueing_lock="{queue}:{ws}"``,
``"reindex:{ws}"``) and serializing them is always safe. Projection runs under
``lock="projection:{ws}"`` and indexing under ``lock="index:{ws}"``: projection never waits for an
index run (design §7). Jobs are deferred by the store inside the revision's own Postgres transaction
(``kb.store.defer_convergence``); ``defer_reindex``/``defer_index`` here are for callers outside
one. After a run that leaves documents ``failed``, a delayed retry is deferred
(``kb.sweep.defer_failed_retry``: 5 s doubling per attempt, at most 10 min) as a lock-free
``kb.defer_when_due`` that defers the real job once due — a job scheduled for later never holds a
lock a due job needs (design §7). No periodic task takes a workspace's lock.

Every task takes its knowledge base from the job's context (``pass_context=True``:
``context.additional_context["kb"]``, which the worker sets with ``worker_context``), never from a
module global. Periodic tasks (``@app.periodic``, or ``schedule_periodic(settings)`` for those whose
cron is a setting, so that importing this module reads no settings):

- ``kb.sweep`` (``KB_MAINTENANCE_CRON``, default every minute): defers projection/index jobs for
  workspaces whose projection or stamp lags git HEAD, and a delayed retry for those that still have
  failed documents (``kb.sweep``).
- ``kb.retry_stalled_jobs`` (``KB_MAINTENANCE_CRON``): jobs left ``doing`` by a worker that stopped sending
  heartbeats for ``KB_STALLED_JOB_SECONDS`` (killed, OOM, lost host) go back to ``todo``
  (Procrastinate's ``get_stalled_jobs`` / ``retry_job``). Workers heartbeat every
  ``Settings.worker_heartbeat_seconds`` (5 s, or a quarter of that time when less).
- ``kb.remove_old_jobs`` (hourly): succeeded jobs finished more than ``KB_JOB_RETENTION_HOURS``
  ago are deleted (failed ones are kept for the operator), and so are index run rows as old
  (each workspace's latest is kept).
- ``kb.sweep_worktrees`` (every 15 minutes): the turn worktree janitor (design §5); removes
  worktrees idle longer than ``KB_WORKTREE_TTL`` that no open turn holds.
- ``kb.maintain_repositories`` (every 10 minutes): packs the loose objects of busy workspace
  repositories (``kb.git.maintenance``); ``kb.pack_repository`` packs one workspace's, deferred by
  its writers every ``KB_PACK_EVERY_REVISIONS`` revisions.
- ``kb.expire_citations`` (hourly): deletes chats whose citation handles went unused for
  ``KB_CITATION_TTL`` seconds (default 30 days).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import procrastinate

from kb.db import database
from kb.db.nodes import node_queue
from kb.db.sql import queries
from kb.errors import WorkspaceNotFound
from kb.jobs.routing import placement
from kb.jobs.sweep import VECTOR_INDEX_TASK, defer_failed_retry
from kb.store.job_deferral import DEFER_WHEN_DUE_TASK, INDEX_TASK, PACK_TASK, PROJECTION_TASK, defer_job

if TYPE_CHECKING:
    from kb.knowledge_base import KnowledgeBase
    from kb.settings import Settings
    from kb.store.stores import Stores

REINDEX_TASK = "kb.reindex"
CLEANUP_CRON = "17 * * * *"

log = logging.getLogger(__name__)

app = procrastinate.App(connector=procrastinate.PsycopgConnector())
"""kb's Procrastinate app. A worker binds it to a knowledge base with ``connector_for`` (its
database) and ``worker_context`` (what the tasks receive as ``context.additional_context``), and
schedules the periodic tasks from settings with ``schedule_periodic``; nothing here reads settings
at import (design §7, §13)."""


def connector_for(kb: KnowledgeBase) -> procrastinate.PsycopgConnector:
    """A connector to ``kb``'s database for ``app.replace_connector`` (to run a worker, or to defer
    a task from outside a revision's transaction).

    The connector uses ``KB_DIRECT_DATABASE_URL`` when set (a real session, so LISTEN works), else
    kb's URL; its connections pass through ``database.configure_async_connection`` like every kb
    connection, or, behind a transaction-mode pooler, get no prepared statements (design §13).
    """
    url = database.session_database_url(kb.settings, kb.database_url)
    return _ConfiguredConnector(url, database.pool_timeout(url))


def worker_context(kb: KnowledgeBase, progress=None) -> dict:
    """The ``additional_context`` a worker hands every job (``JobContext.additional_context``):
    ``kb``, the knowledge base the tasks act on, and ``progress``, a sink
    ``progress(kind, workspace_id, done, total, report)`` for index runs' progress
    (``kb.jobs.worker.ProgressDisplay.index_progress``) or None."""
    return {"kb": kb, "progress": progress}


def _kb(context: procrastinate.JobContext) -> KnowledgeBase:
    """The knowledge base a job runs against, from its worker's context. Raises ConfigurationError
    for a worker started without ``worker_context`` (not kb's worker)."""
    kb = context.additional_context.get("kb")
    if kb is None:
        from kb.errors import ConfigurationError

        raise ConfigurationError(
            "kb's tasks run in kb's worker (`kb worker`, `kb serve --with-worker`), "
            "which passes the knowledge base as additional_context['kb']"
        )
    return kb


def _progress_for(context: procrastinate.JobContext, kind: str, workspace_id: int):
    """The progress callback of an index run: it forwards to the worker's sink, if any, and is the
    run's checkpoint for stopping now (a second Ctrl-C, design §7): once the worker asks the job
    to abort, it raises JobAborted, the run ends as a killed one would (the batches written stay,
    the next run converges the rest) and the job goes back to the queue (``STOPPED_RETRY``)."""
    sink = context.additional_context.get("progress")

    def progress(done: int, total: int, report) -> None:
        if context.should_abort():
            raise procrastinate.exceptions.JobAborted(f"{kind} of workspace {workspace_id} stopped at {done}/{total}")
        if sink is not None:
            sink(kind, workspace_id, done, total, report)

    return progress


class PutBack(procrastinate.exceptions.JobAborted):
    """A job the worker stopped now (a second Ctrl-C or SIGTERM): it goes back to the queue at
    once (``STOPPED_RETRY``); kb's jobs converge, so running it again is safe (design §7)."""


class StoppedCovered(procrastinate.exceptions.JobAborted):
    """A job the worker stopped now while a waiting job with its queueing lock does its work: it
    is recorded ``aborted`` (it cannot go back to ``todo`` beside that job)."""


class _PutBackWhenStopped(procrastinate.BaseRetryStrategy):
    """Every kb task's retry strategy: a job stopped now (``PutBack``) is retried at once, any
    other failure as ``then`` says (none by default: the sweep re-defers lagging work)."""

    def __init__(self, then: procrastinate.BaseRetryStrategy | None = None) -> None:
        self.then = then

    def get_retry_decision(self, *, exception: BaseException, job) -> procrastinate.RetryDecision | None:
        if isinstance(exception, PutBack):
            return procrastinate.RetryDecision(retry_in={"seconds": 0})
        if isinstance(exception, procrastinate.exceptions.JobAborted) or self.then is None:
            return None
        return self.then.get_retry_decision(exception=exception, job=job)


STOPPED_RETRY = _PutBackWhenStopped()


def worker_listens(kb: KnowledgeBase) -> bool:
    """Whether the worker can LISTEN for new jobs (False behind a transaction-mode pooler without
    ``KB_DIRECT_DATABASE_URL``: it then polls every ``POLL_SECONDS``)."""
    return not database.is_transaction_pooled(database.session_database_url(kb.settings, kb.database_url))


POLL_SECONDS = 1.0


class _ConfiguredConnector(procrastinate.PsycopgConnector):
    """Procrastinate's psycopg connector whose connections, async (worker, LISTEN) and sync
    (``app.open()`` for deferring), pass through kb's connection rule (``kb.db.database``)."""

    def __init__(self, url: str, timeout: float) -> None:
        self._kb_url = url
        # ``timeout``: how long a job's statement waits for a pooled connection (KB_POOL_TIMEOUT)
        # kwargs: kb's connection arguments (application_name; no prepared statements behind a pooler)
        if database.is_transaction_pooled(url):
            super().__init__(conninfo=url, kwargs=database.connection_kwargs(url), timeout=timeout)
        else:
            super().__init__(
                conninfo=url,
                kwargs=database.connection_kwargs(url),
                configure=database.configure_async_connection,
                timeout=timeout,
            )

    def get_sync_connector(self) -> procrastinate.connector.BaseConnector:
        if (
            self._async_pool is None
            and self._sync_connector is None
            and not database.is_transaction_pooled(self._kb_url)
        ):
            self._sync_connector = procrastinate.SyncPsycopgConnector(
                conninfo=self._kb_url,
                kwargs=database.connection_kwargs(self._kb_url),
                configure=database.configure_connection,
            )
        return super().get_sync_connector()


def defer_index(stores: Stores, workspace_id: int) -> int | None:
    """Defer ``kb.index_changes`` for a workspace (coalesced on ``index:{ws}``); returns the job id."""
    with database.transaction(stores.database_url) as conn:
        return defer_job(conn, "index", INDEX_TASK, workspace_id)


def defer_reindex(stores: Stores, workspace_id: int) -> int | None:
    """Defer ``kb.reindex`` for a workspace (coalesced on ``reindex:{ws}``); returns the job id."""
    stores.store(workspace_id).require_exists()
    with database.transaction(stores.database_url) as conn:
        return defer_job(conn, "index", REINDEX_TASK, workspace_id, queueing_lock=f"reindex:{workspace_id}")


def _after_index(kb: KnowledgeBase, workspace_id: int, report) -> dict:
    log.info("%s workspace %s: %s", report.kind, workspace_id, report)
    if report.documents_still_failed:
        with database.transaction(kb.database_url) as conn:
            defer_failed_retry(conn, workspace_id, report.failed_attempts)
    defer_vector_index_if_large(kb.stores, workspace_id)
    return {
        "revision": report.revision,
        "indexed": report.documents_indexed,
        "failed": report.documents_failed,
        "still_failed": report.documents_still_failed,
        "skipped_locked": report.skipped_locked,
        "chunks_written": report.chunks_written,
        "embedded": report.embeddings_computed,
        "cached": report.embeddings_cached,
        "reused": report.chunks_reused,
    }


@app.task(name=PROJECTION_TASK, queue="projection", pass_context=True)
def project_changes(context: procrastinate.JobContext, workspace_id: int) -> dict:
    """Converge ``documents``/``folders`` rows of a workspace to HEAD and announce the changes on
    ``kb_events`` (design §6); returns the counts of rows changed."""
    kb = _kb(context)
    if (elsewhere := placement(kb.stores, workspace_id, "projection", PROJECTION_TASK)) is not None:
        return elsewhere
    return kb.project(workspace_id).counts()


@app.task(name=INDEX_TASK, queue="index", pass_context=True)
def index_changes(context: procrastinate.JobContext, workspace_id: int) -> dict:
    """Converge a workspace's chunks and embeddings to HEAD (design §7); failed documents get a
    delayed retry job."""
    kb = _kb(context)
    if (elsewhere := placement(kb.stores, workspace_id, "index", INDEX_TASK)) is not None:
        return elsewhere
    return _after_index(kb, workspace_id, kb.index(workspace_id, _progress_for(context, "index", workspace_id)))


@app.task(name=REINDEX_TASK, queue="index", pass_context=True)
def reindex(context: procrastinate.JobContext, workspace_id: int) -> dict:
    """Rebuild a workspace's index from git HEAD, resuming an interrupted rebuild (design §7)."""
    kb = _kb(context)
    if (elsewhere := placement(kb.stores, workspace_id, "index", REINDEX_TASK, f"reindex:{workspace_id}")) is not None:
        return elsewhere
    return _after_index(kb, workspace_id, kb.reindex(workspace_id, _progress_for(context, "reindex", workspace_id)))


@app.task(name=DEFER_WHEN_DUE_TASK, queue="index", pass_context=True)
def defer_when_due(context: procrastinate.JobContext, workspace_id: int, task: str, queue: str) -> int | None:
    """A delayed job's stand-in (``kb.store.defer_job`` with ``delay_seconds``): once due, defer
    ``task`` for the workspace with its lock, coalesced with one already waiting (design §7).
    Returns the deferred job's id, or None when a waiting job covers it."""
    with database.transaction(_kb(context).database_url) as conn:
        return defer_job(conn, queue, task, workspace_id)


@app.task(name="kb.sweep", queue="maintenance", pass_context=True)
def sweep(context: procrastinate.JobContext, timestamp: int) -> dict:
    """Defer the work of every workspace that lags git HEAD (design §7)."""
    from kb.jobs.sweep import sweep as run_sweep

    kb = _kb(context)
    report = run_sweep(kb.stores, lambda: kb.embedder)
    return {
        "checked": report.checked,
        "projection": report.projection_deferred,
        "index": report.index_deferred,
        "retry": report.retry_deferred,
        "damaged": sorted(report.damaged),
        "diverged": sorted(report.diverged),
    }


@app.task(name="kb.retry_stalled_jobs", queue="maintenance", pass_context=True)
async def retry_stalled_jobs(context: procrastinate.JobContext, timestamp: int) -> list[int]:
    """Put jobs of workers silent for ``KB_STALLED_JOB_SECONDS`` back to ``todo`` (design §7)."""
    return await retry_stalled(context.app.job_manager, _kb(context).settings.stalled_job_seconds, context.job.id)


async def retry_stalled(manager, seconds: float, own_job_id: int | None = None) -> list[int]:
    """Put back to ``todo`` the jobs of workers silent for ``seconds``; returns their ids.

    A stalled job whose queueing lock a waiting job already holds is recorded ``aborted`` instead:
    kb's jobs converge to HEAD, so the waiting job does its work, and the stalled one must stop
    holding the lock (``projection:N`` / ``index:N``) the waiting job needs.
    """
    stalled = await manager.get_stalled_jobs(seconds_since_heartbeat=seconds)
    return await _put_back(manager, [job for job in stalled if job.id != own_job_id], "stalled")


async def put_back_jobs_of(manager, worker_ids: Iterable[int], stalled_seconds: float) -> list[int]:
    """Put back to ``todo`` the jobs still ``doing`` under ``worker_ids`` — Procrastinate workers
    of this process whose run has ended (a database outage cut it before it could record a job's
    end, design §7) — without waiting for their heartbeat to age, and the stalled ones
    ``retry_stalled`` finds (among them those whose worker row is gone: a run that ended after the
    database came back unregistered its worker, leaving its unrecorded job without one); returns
    their ids. Raises Procrastinate's ConnectorException when the database is away."""
    left = {job.id: job for job in await manager.get_stalled_jobs(seconds_since_heartbeat=stalled_seconds)}
    for worker_id in sorted(set(worker_ids)):
        left.update((job.id, job) for job in await manager.list_jobs_async(status="doing", worker_id=worker_id))
    return await _put_back(manager, list(left.values()), "left running by the worker's earlier run")


async def _put_back(manager, jobs: list, why: str) -> list[int]:
    """Retry each of ``jobs`` now, or record it ``aborted`` when a waiting job already holds its
    queueing lock (that job converges to HEAD and does its work: nothing is left for anybody to
    act on, so it is not ``failed``, design §7); returns their ids."""
    retried = []
    for job in jobs:
        try:
            log.warning("retrying %s job %s (%s %s)", why, job.id, job.task_name, job.task_kwargs)
            await manager.retry_job(job)
        except procrastinate.exceptions.UniqueViolation:
            log.warning(
                "%s job %s is covered by a waiting job (%s), which does its work; recording it aborted",
                why,
                job.id,
                job.queueing_lock,
            )
            await manager.finish_job(job, status=procrastinate.jobs.Status.ABORTED, delete_job=False)
        retried.append(job.id)
    return retried


@app.periodic(cron=CLEANUP_CRON)
@app.task(name="kb.remove_old_jobs", queue="maintenance", pass_context=True)
async def remove_old_jobs(context: procrastinate.JobContext, timestamp: int) -> None:
    """Delete succeeded jobs finished more than ``KB_JOB_RETENTION_HOURS`` ago, and index run rows
    (``kb.index_runs``) as old, keeping each workspace's latest."""
    kb = _kb(context)
    hours = kb.settings.job_retention_hours
    await context.app.job_manager.delete_old_jobs(nb_hours=hours)
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["prune_index_runs"], {"hours": hours})


JANITOR_TASK = "kb.sweep_worktrees"


JANITOR_CRON = "*/15 * * * *"


@app.task(name=JANITOR_TASK, queue="maintenance", queueing_lock="worktree-janitor", pass_context=True)
def sweep_worktrees(context: procrastinate.JobContext, timestamp: int) -> dict:
    """The turn-worktree janitor (design §5), every 15 minutes: remove worktrees no open turn holds
    whose newest file is older than ``KB_WORKTREE_TTL`` seconds (default 24 h)."""
    report = _kb(context).sweep_worktrees()
    if report.removed:
        log.info("janitor removed %d abandoned turn worktrees: %s", len(report.removed), report.removed)
    return {"removed": len(report.removed), "kept_open": len(report.kept_open), "kept_fresh": report.kept_fresh}


# ---- repository maintenance (design §14) ----------------------------------------------
MAINTAIN_TASK = "kb.maintain_repositories"


MAINTAIN_CRON = "*/10 * * * *"


@app.task(name=MAINTAIN_TASK, queue="maintenance", queueing_lock="repository-maintenance", pass_context=True)
def maintain_repositories(context: procrastinate.JobContext, timestamp: int) -> dict:
    """Every 10 minutes: pack the loose objects of workspace repositories that gathered many
    (``kb.git.maintenance``); safe beside concurrent writers. Returns ``{workspace id: objects packed}``."""
    from kb.git.maintenance import maintain_workspaces

    return {str(ws): n for ws, n in maintain_workspaces(_kb(context).settings.knowledge_store).packed.items()}


@app.task(name=PACK_TASK, queue="maintenance", pass_context=True)
def pack_repository(context: procrastinate.JobContext, workspace_id: int) -> dict:
    """Pack one workspace's loose objects, deferred by its writers every ``KB_PACK_EVERY_REVISIONS``
    revisions (``kb.store.job_deferral.defer_packing``, design §14). Returns ``{"packed": n}``;
    on a node that is not the workspace's home (design §15) the job is handed to that node instead."""
    from kb.git.maintenance import pack_workspace

    kb = _kb(context)
    if (elsewhere := placement(kb.stores, workspace_id, "maintenance", PACK_TASK, f"pack:{workspace_id}")) is not None:
        return elsewhere
    packed = pack_workspace(kb.settings.knowledge_store / str(workspace_id))
    return {"packed": packed or 0}


@app.periodic(cron="23 * * * *", periodic_id="citation-expiry")
@app.task(name="kb.expire_citations", queue="maintenance", queueing_lock="citation-expiry", pass_context=True)
def expire_citations(context: procrastinate.JobContext, timestamp: int) -> dict:
    """Hourly: delete chats whose citation handles went unused for ``KB_CITATION_TTL`` seconds
    (design §8)."""
    return {"chats_expired": _kb(context).expire_citations()}


# -- span fill and drift check (design §9, §10) -------------------------------------


@app.task(name="kb.span_fill", queue="span_fill", queueing_lock="span-fill", lock="span-fill", pass_context=True)
def span_fill(context: procrastinate.JobContext, timestamp: int) -> dict:
    """Fill spans of adopted legacy chunks in flipped workspaces, most used first, in batches,
    until the backlog is empty or a DBA pauses it (``kb.span_fill_control``, design §9). One job runs
    at most ``KB_SPAN_FILL_JOB_SECONDS`` and then queues its continuation, so index jobs on the same
    worker are never held up for long."""
    kb = _kb(context)
    fill = kb.span_fill()
    report = fill.run(max_seconds=kb.settings.span_fill_job_seconds)
    if report.yielded:
        fill.defer()
    return report.as_dict()


@app.task(
    name="kb.drift_check", queue="maintenance", queueing_lock="drift-check", lock="drift-check", pass_context=True
)
def drift_check(context: procrastinate.JobContext, timestamp: int) -> list[dict]:
    """Compare git HEAD with document/chunk rows of flipped workspaces; repair Postgres only,
    capped per run (``KB_DRIFT_MAX_REPAIRS``)."""
    return [report.as_dict() for report in _kb(context).drift_check()]


# -- push to a git remote (design §13) ------------------------------------------------------
PUSH_RETRY = _PutBackWhenStopped(procrastinate.RetryStrategy(max_attempts=8, exponential_wait=2))
"""A failed push is retried after 2, 4, 8 … 256 s; then the sweep re-defers it (30 s doubling, ≤ 1 h)."""


@app.task(name="kb.push_remote", queue="push", retry=PUSH_RETRY, pass_context=True)
def push_remote(context: procrastinate.JobContext, workspace_id: int) -> dict:
    """Push the workspace's current HEAD to its remote, fast-forward only (``kb.workspace.remotes``); does
    nothing when the remote is already at HEAD. Deferred with lock ``push:{ws}`` (never ``ws:{ws}``)."""
    from kb.errors import RemoteNotFound

    kb = _kb(context)
    if (elsewhere := placement(kb.stores, workspace_id, "push", "kb.push_remote")) is not None:
        return elsewhere
    try:
        return kb.remote(workspace_id).push().as_dict()
    except RemoteNotFound:  # removed since the job was deferred
        return {"revision": None, "pushed": False, "previous": None}


# ---- per-workspace HNSW indexes (kb/index/vector_index.py) ----


def defer_vector_index_if_large(stores: Stores, workspace_id: int) -> int | None:
    """Defer ``kb.maintain_vector_index`` when the workspace is near or past the HNSW threshold
    (coalesced on ``vector-index:{ws}``); small workspaces never get the job. Returns the job id."""
    from kb.index.vector_index import HNSW_MIN_CHUNKS

    with database.transaction(stores.database_url) as conn:
        chunks = conn.execute(queries["workspace_chunk_total"], {"workspace_id": workspace_id}).fetchone()["n"]
        recorded = conn.execute(queries["workspace_has_vector_index"], {"workspace_id": workspace_id}).fetchone()
        if chunks < HNSW_MIN_CHUNKS and not recorded["any"]:
            return None
        return defer_job(
            conn, "maintenance", VECTOR_INDEX_TASK, workspace_id, queueing_lock=f"vector-index:{workspace_id}"
        )


@app.task(name=VECTOR_INDEX_TASK, queue="maintenance", pass_context=True)
def maintain_vector_index(context: procrastinate.JobContext, workspace_id: int) -> dict:
    """Build, keep or drop the workspace's partial HNSW index for the active model (design §8)."""
    from kb.index.vector_index import maintain

    kb = _kb(context)
    embedder = kb.embedder_for(workspace_id)  # the workspace's own model (design §7)
    change = maintain(kb.database_url, workspace_id, embedder.model, embedder.dim)
    return {"chunks": change.chunks, "action": change.action, "index": change.index_name}


# ---- per-workspace embedding models (kb/index/model_switch.py) ----
SWITCH_MODEL_TASK = "kb.switch_model"


def defer_model_switch(stores: Stores, workspace_id: int, name: str) -> int | None:
    """Record ``name`` as the model ``workspace_id`` switches to and defer ``kb.switch_model``
    (coalesced on ``switch-model:{ws}``; the job reads the target when it runs, so the last
    set-model wins). Returns the job id; None when the workspace already uses ``name`` (the
    target is cleared) or a waiting job covers it. Touches Postgres only, so any node may call it:
    the job is deferred to the home node's queue (design §15). Raises WorkspaceNotFound."""
    with database.transaction(stores.database_url) as conn:
        row = conn.execute(queries["start_model_switch"], {"workspace_id": workspace_id, "embedder": name}).fetchone()
        if row is None:
            raise WorkspaceNotFound(f"workspace {workspace_id} does not exist; `kb workspaces` lists them")
        if row is not None and row["embedder"] == name:
            conn.execute(queries["finish_model_switch"], {"workspace_id": workspace_id, "embedder": name})
            return None
        return defer_job(
            conn, "maintenance", SWITCH_MODEL_TASK, workspace_id, queueing_lock=f"switch-model:{workspace_id}"
        )


@app.task(name=SWITCH_MODEL_TASK, queue="maintenance", pass_context=True)
def switch_model(context: procrastinate.JobContext, workspace_id: int) -> dict:
    """Re-embed a workspace with the model ``kb workspace set-model`` chose and switch to it
    (design §7): search answers from the old vectors until the switch; the old model's HNSW index
    is dropped after it."""
    from kb.index.vector_index import forget_cached, maintain, recorded_index

    kb = _kb(context)
    if elsewhere := placement(
        kb.stores, workspace_id, "maintenance", SWITCH_MODEL_TASK, f"switch-model:{workspace_id}"
    ):
        return elsewhere  # a job on a node that is not the workspace's home is handed there (design §15)
    previous = kb.embedder_for(workspace_id)
    report = kb.switch_model(workspace_id, _progress_for(context, "switch model", workspace_id))
    if report.action == "switched" and previous.model != report.model:
        with database.connect(kb.database_url) as conn:
            had_index = recorded_index(conn, workspace_id, previous.model) is not None
        if had_index:
            forget_cached(workspace_id)
            maintain(kb.database_url, workspace_id, previous.model, previous.dim)  # 0 chunks: dropped
        defer_vector_index_if_large(kb.stores, workspace_id)
    return {
        "action": report.action,
        "model": report.model,
        "swapped": report.chunks_swapped,
        "embedded": report.embeddings_computed,
        "cached": report.embeddings_cached,
        "old_vectors": report.old_vectors,
    }


def _scheduled_from_settings(
    settings: Settings,
) -> list[tuple[procrastinate.tasks.Task, str, str, procrastinate.tasks.ConfigureTaskOptions]]:
    """``(task, cron, periodic_id, configure_kwargs)`` of the periodic tasks scheduled per worker:
    those whose cron is a setting, and the per-node ones (design §15) — the sweep, the worktree
    janitor and repository maintenance look at this node's repositories only, so each node runs
    its own (periodic id, queue and queueing lock carry the node's name)."""
    node = settings.node

    def on_node(name: str) -> procrastinate.tasks.ConfigureTaskOptions:
        return {"queue": node_queue("maintenance", node), "queueing_lock": f"{name}@{node}"}

    return [
        (sweep, settings.maintenance_cron, f"sweep@{node}", on_node("sweep")),
        (sweep_worktrees, JANITOR_CRON, f"worktree-janitor@{node}", on_node("worktree-janitor")),
        (maintain_repositories, MAINTAIN_CRON, f"repository-maintenance@{node}", on_node("repository-maintenance")),
        (retry_stalled_jobs, settings.maintenance_cron, "", {}),
        (span_fill, settings.span_fill_cron, "span-fill", {}),
        (drift_check, settings.drift_cron, "drift-check", {}),
    ]


def schedule_periodic(settings: Settings) -> None:
    """Schedule the periodic tasks whose cron comes from settings (``KB_MAINTENANCE_CRON`` for
    ``kb.sweep`` and ``kb.retry_stalled_jobs``, ``KB_SPAN_FILL_CRON``, ``KB_DRIFT_CRON``) and the
    per-node ones of ``KB_NODE`` (design §15), replacing an earlier schedule; a worker calls it
    before it starts (design §7). The other periodic tasks have fixed schedules, declared with
    their tasks."""
    registry = app.periodic_registry
    scheduled = _scheduled_from_settings(settings)
    names = {task.name for task, *_ in scheduled}
    for key in [key for key in registry.periodic_tasks if key[0] in names]:
        del registry.periodic_tasks[key]
    for task, cron, periodic_id, configure in scheduled:
        registry.register_task(task=task, cron=cron, periodic_id=periodic_id, configure_kwargs=configure)


def periodic_tasks() -> list[procrastinate.tasks.Task]:
    """Every periodic task, scheduled yet or not (those of ``schedule_periodic`` included)."""
    tasks = {t.task.name: t.task for t in app.periodic_registry.periodic_tasks.values()}
    tasks.update(
        {t.name: t for t in (sweep, retry_stalled_jobs, span_fill, drift_check, sweep_worktrees, maintain_repositories)}
    )
    return [tasks[name] for name in sorted(tasks)]


for _task in app.tasks.values():  # every kb task's, unless it has its own (PUSH_RETRY wraps it)
    if _task.name.startswith("kb.") and _task.retry_strategy is None:
        _task.retry_strategy = STOPPED_RETRY
