"""Deferring kb's jobs in a writer's transaction (design §3, §7, §14): the projection and index
jobs every revision owes, packing after a bounded number of revisions, and any job of a queue.

A job is deferred in the transaction that records what it owes (a revision, a seeded workspace),
so it exists exactly when that lands. Procrastinate's queueing locks coalesce waiting jobs (one
waiting job of a concern per workspace covers the next) and its locks serialize due ones per
workspace and concern; the job rows are written by named queries (``sql/queries``), so a
commit pays one round trip, not Procrastinate's per-job API.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from kb.db.sql import queries

if TYPE_CHECKING:
    from kb.db.database import Connection

PROJECTION_TASK = "kb.project_changes"
INDEX_TASK = "kb.index_changes"


def defer_convergence(conn: Connection, workspace_id: int) -> None:
    """Defer the projection and index jobs for a workspace in ``conn``'s transaction (design §3, §7),
    and the push job when the workspace has a git remote (design §13, ``kb.workspace.remotes``).

    Both jobs converge to HEAD, so a waiting job with the same queueing lock already covers this.
    """
    conn.execute(
        queries["defer_convergence_jobs"],
        {  # as defer_job for both, in one statement
            "projection_task": PROJECTION_TASK,
            "projection_lock": job_lock("projection", workspace_id),
            "projection_queueing_lock": f"projection:{workspace_id}",
            "index_task": INDEX_TASK,
            "index_lock": job_lock("index", workspace_id),
            "index_queueing_lock": f"index:{workspace_id}",
            "args": json.dumps({"workspace_id": workspace_id}),
            "workspace_id": workspace_id,
        },
    )
    conn.execute(queries["defer_push_if_remote"], {"workspace_id": workspace_id})  # design §13, if any


DEFER_WHEN_DUE_TASK = "kb.defer_when_due"
PACK_TASK = "kb.pack_repository"


def defer_packing(conn: Connection, workspace_id: int, seqs: list[int], every: int) -> int | None:
    """Defer ``kb.pack_repository`` for the workspace in ``conn``'s transaction when one of the
    revisions ``seqs`` (their 1-based numbers) is a multiple of ``every`` (``KB_PACK_EVERY_REVISIONS``;
    0: never): loose objects stay bounded by what ``every`` revisions write (design §14,
    ``kb.git.maintenance``). One waiting job covers the next (queueing lock ``pack:{ws}``); two never
    run at once (lock ``pack:{ws}``). Returns the job id, or None when none was deferred."""
    if every <= 0 or not any(seq % every == 0 for seq in seqs):
        return None
    lock = f"pack:{workspace_id}"
    return defer_job(conn, "maintenance", PACK_TASK, workspace_id, queueing_lock=lock, lock=lock)


def job_lock(queue: str, workspace_id: int) -> str:
    """The Procrastinate lock a due job of ``queue`` runs under: ``"projection:{ws}"`` or
    ``"index:{ws}"``. Projection and indexing never share a lock, so projection never waits for an
    index run or an index retry (design §7); each job also takes its own advisory lock (design §4)."""
    return f"{'projection' if queue == 'projection' else 'index'}:{workspace_id}"


def defer_job(
    conn,
    queue: str,
    task: str,
    workspace_id: int,
    *,
    queueing_lock: str | None = None,
    delay_seconds: float = 0,
    lock: str | None = None,
) -> int | None:
    """Defer ``task(workspace_id=…)`` on ``queue`` in ``conn``'s transaction; returns the job id,
    or None when a waiting job with the same queueing lock covers it (default ``"{queue}:{ws}"``;
    ``"{queue}-delayed:{ws}"`` for a delayed one, so a job scheduled later never covers a due one).

    A due job runs under ``lock``, by default ``job_lock(queue, ws)`` (serialized per workspace and
    concern, design §7).
    ``delay_seconds > 0`` schedules it for later *without any lock*: Procrastinate's fetch treats
    a waiting job as holding its lock even before its ``scheduled_at``, so a delayed job carrying
    the lock would hold back every due job of the workspace (design §7). The delayed job is a
    ``kb.defer_when_due`` that, once due, defers the real job with its lock (coalesced with one
    already waiting).
    """
    if delay_seconds > 0:
        args = {"workspace_id": workspace_id, "task": task, "queue": queue}
        lock, task = None, DEFER_WHEN_DUE_TASK
        queueing_lock = queueing_lock or f"{queue}-delayed:{workspace_id}"
    else:
        args, lock = {"workspace_id": workspace_id}, lock or job_lock(queue, workspace_id)
    row = conn.execute(
        queries["defer_job"],
        {
            "queue": queue,
            "task": task,
            "lock": lock,
            "queueing_lock": queueing_lock or f"{queue}:{workspace_id}",
            "args": json.dumps(args),
            "delay_seconds": delay_seconds,
            "workspace_id": workspace_id,
        },
    ).fetchone()
    return row["id"] if row else None
