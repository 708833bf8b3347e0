"""The periodic sweep (design §3, §7): find workspaces whose Postgres state lags git HEAD and defer
the missing work, so nothing depends on a job having been deferred successfully.

For each workspace the sweep reads git HEAD and compares it with the recorded head, the projected
revision and the index stamp (``kb.index_lag``); it defers ``kb.project_changes`` /
``kb.index_changes`` where they lag, and a delayed ``kb.index_changes`` (backoff by attempts) where
documents are still ``failed`` (retried until they succeed or are quarantined). Deferral is coalesced by the jobs'
queueing locks, so sweeping often is cheap.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kb.db import database
from kb.db.locks import chunk_lock, index_lock
from kb.db.sql import queries
from kb.errors import ConfigurationError, HistoryDiverged, StorageError, WorkspaceMoving, WorkspaceNotFound
from kb.store.authors import default_author
from kb.store.homes import adopt_homeless, own_workspace_ids
from kb.store.job_deferral import INDEX_TASK, PROJECTION_TASK, defer_job
from kb.store.knowledge_store import KnowledgeStore
from kb.workspace.fsck import repair_lost_refreshes

VECTOR_INDEX_TASK = "kb.maintain_vector_index"
"""The job building a workspace's HNSW index (kb.jobs.tasks, which imports this module)."""

if TYPE_CHECKING:
    from collections.abc import Callable

    from kb.index.embedding import Embedder
    from kb.store.stores import Stores

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    """Workspace ids per action taken by one sweep."""

    checked: int = 0
    recorded: list[int] = field(default_factory=list)
    projection_deferred: list[int] = field(default_factory=list)
    index_deferred: list[int] = field(default_factory=list)
    retry_deferred: list[int] = field(default_factory=list)
    blobs_purged: list[int] = field(default_factory=list)
    quarantine_retried: list[int] = field(default_factory=list)
    push_deferred: list[int] = field(default_factory=list)
    term_stats_recounted: list[int] = field(default_factory=list)
    """Workspaces whose term statistics a bulk index run that died had left deferred, recounted."""
    worktree_repaired: list[int] = field(default_factory=list)
    """Workspaces whose working tree a writer killed before its refresh had left behind HEAD, repaired."""
    damaged: dict[int, str] = field(default_factory=dict)
    """Workspaces skipped because their repository cannot be read: id → the error's message."""
    diverged: dict[int, str] = field(default_factory=dict)
    """Workspaces skipped because their repository is not theirs or lacks a revision Postgres
    recorded (HistoryDiverged, design §3): id → the reason. Nothing is deferred for them."""


def retry_delay_seconds(attempts: int) -> float:
    """Backoff before retrying a workspace's failed documents: 5 s × 2^(attempts-1), ≤ 10 min."""
    return min(600.0, 5.0 * 2 ** max(0, attempts - 1))


def defer_failed_retry(conn, workspace_id: int, attempts: int) -> int | None:
    """Defer a delayed ``kb.index_changes`` that retries failed documents, coalesced on
    ``index-retry:{ws}`` so it never delays the immediate job a new revision defers."""
    return defer_job(
        conn,
        "index",
        INDEX_TASK,
        workspace_id,
        queueing_lock=f"index-retry:{workspace_id}",
        delay_seconds=retry_delay_seconds(attempts),
    )


def record_missing_revisions(store: KnowledgeStore) -> bool:
    """Record revisions git has and Postgres lacks (a crash between ref update and Postgres
    commit, design §3) via ``KnowledgeStore.reconcile()`` — the one place the sweep calls it.

    Returns True when any revision was recorded (its jobs are deferred by reconcile).
    """
    return bool(store.reconcile())


def recount_deferred_term_stats(database_url: str, own: set[int], report: SweepReport) -> None:
    """Recount the term statistics of every workspace in ``own`` that a bulk index run left
    deferred when it died (kb.deferred_term_stats, design §7), each under its index lock so no run
    is under way (a running one recounts at its end; the workspace is skipped) and its chunk lock,
    and queue ``kb.maintain_vector_index`` for it (the dead run had dropped its HNSW index, §8);
    adds them to ``report.term_stats_recounted``."""
    with database.connect(database_url, autocommit=True) as conn:
        deferred = [r["workspace_id"] for r in conn.execute(queries["deferred_term_stats_workspaces"])]
    for ws in deferred:
        if ws not in own:
            continue
        with index_lock(database_url, ws) as locked:
            if not locked:
                continue
            with database.transaction(database_url) as conn:
                chunk_lock(conn, ws)
                conn.execute(queries["recount_term_stats"], {"workspace_id": ws})
                # the dead run had dropped the workspace's HNSW index too; the next index run
                # finds no deferral and builds none: the maintenance job does (kept if there)
                defer_job(conn, "maintenance", VECTOR_INDEX_TASK, ws, queueing_lock=f"vector-index:{ws}")
        report.term_stats_recounted.append(ws)


def sweep(stores: Stores, embedder: Callable[[], Embedder]) -> SweepReport:
    """Compare every workspace homed on this node (``KB_NODE``) with git HEAD and defer what lags
    (design §7, §15); returns what it did.

    ``stores``: the workspaces' stores; ``embedder()`` returns the active embedder, called only to
    probe it before quarantined documents are retried. Workspaces without a home node whose
    repository is here are adopted first (``kb.store.homes``); workspaces homed on other nodes are
    their nodes' to sweep (a copy left here by a move is never looked at)."""
    report = SweepReport()
    adopt_homeless(stores.settings, stores.database_url)
    own = set(own_workspace_ids(stores.settings, stores.database_url))
    with database.connect(stores.database_url, autocommit=True) as conn:
        lag = [r for r in conn.execute(queries["index_lag"], {"workspace_id": None}) if r["workspace_id"] in own]
    embedder_answers: list[bool] = []  # probed at most once per sweep, only when needed
    for row in lag:
        if row["documents_quarantined"] > 0 and retry_quarantined(
            stores, embedder, row["workspace_id"], embedder_answers
        ):
            report.quarantine_retried.append(row["workspace_id"])
        ws = row["workspace_id"]
        store = stores.store(ws)
        if not store.exists():
            continue
        report.checked += 1
        try:
            store.check_repository()  # never converge backwards (design §3)
            git_head = store.head()
            if git_head is None:
                continue
            if git_head != row["head"] and record_missing_revisions(store):
                report.recorded.append(ws)
            _repair_lost_refreshes(store, report)
        except HistoryDiverged as exc:  # skipped with the reason; the others go on
            log.error("sweep: workspace %s skipped: %s", ws, exc)
            report.diverged[ws] = str(exc)
            continue
        except WorkspaceMoving as exc:  # design §15: the move records nothing new; next sweep
            log.info("sweep: workspace %s skipped while it moves: %s", ws, exc)
            continue
        except (StorageError, WorkspaceNotFound) as exc:  # one damaged (or vanishing) repository
            # must not stop the sweep of the others
            log.warning("sweep: workspace %s skipped: %s", ws, exc)
            report.damaged[ws] = str(exc)
            continue
        with database.transaction(stores.database_url) as conn:
            if git_head != row["projected"]:
                defer_job(conn, "projection", PROJECTION_TASK, ws)
                report.projection_deferred.append(ws)
            if git_head != row["stamp"]:
                defer_job(conn, "index", INDEX_TASK, ws)
                report.index_deferred.append(ws)
            elif row["documents_failed"] > 0:
                failed = conn.execute(queries["documents_still_failed"], {"workspace_id": ws}).fetchone()
                defer_failed_retry(conn, ws, failed["attempts"])
                report.retry_deferred.append(ws)
    recount_deferred_term_stats(stores.database_url, own, report)
    retry_blob_purges(stores, report, own)
    with database.transaction(stores.database_url) as conn:  # remotes still behind HEAD
        for row in conn.execute(queries["remotes_to_push"]).fetchall():
            if row["workspace_id"] not in own:
                continue
            if conn.execute(queries["defer_push_if_remote"], {"workspace_id": row["workspace_id"]}).fetchone():
                report.push_deferred.append(row["workspace_id"])
    return report


def _repair_lost_refreshes(store: KnowledgeStore, report: SweepReport) -> None:
    """The working tree of a writer killed before its refresh, repaired (design §2.1); a failure
    is logged and tried again at the next sweep: the working tree is a convenience, never the
    reason a workspace's jobs are not deferred."""
    try:
        repaired = repair_lost_refreshes(store)
    except (OSError, ConfigurationError) as exc:
        log.warning(
            "sweep: workspace %s: working tree not repaired (%s); `kb fsck --workspace %s` repairs it",
            store.workspace_id,
            exc,
            store.workspace_id,
        )
        return
    if repaired is not None:
        log.warning(
            "sweep: workspace %s: a writer died before refreshing its working tree; %d paths repaired",
            store.workspace_id,
            len(repaired),
        )
        report.worktree_repaired.append(store.workspace_id)


def _embedder_answers(embedder: Callable[[], Embedder]) -> bool:
    try:
        embedder().embed(["kb: embedder probe"])
    except Exception as exc:  # any failure means "still down": the quarantine stays
        log.info("sweep: embedder probe failed (%s); quarantined documents wait", exc)
        return False
    return True


def retry_quarantined(stores: Stores, embedder: Callable[[], Embedder], workspace_id: int, answers: list[bool]) -> bool:
    """Give a workspace's quarantined documents one more attempt when the embedder answers a probe
    (``answers`` caches the probe for one sweep), at most every ``KB_QUARANTINE_RETRY_SECONDS`` per
    document, and defer the index job; True when any were requeued (design §7)."""
    if not answers:
        answers.append(_embedder_answers(embedder))
    if not answers[0]:
        return False
    with database.transaction(stores.database_url) as conn:
        # Lock order (kb.locks): the chunk lock before the document rows (several in one
        # statement; a projection locks them in path order).
        chunk_lock(conn, workspace_id)
        retried = conn.execute(
            queries["retry_quarantined_documents"],
            {
                "workspace_id": workspace_id,
                "max_attempts": stores.settings.max_attempts,
                "retry_seconds": stores.settings.quarantine_retry_seconds,
            },
        ).fetchall()
        if retried:
            defer_job(conn, "index", INDEX_TASK, workspace_id)
    return bool(retried)


def retry_documents(stores: Stores, workspace_id: int, paths: list[str] | None = None) -> list[str]:
    """A person's retry (design §7, §17): the workspace's failed and quarantined documents (all,
    or those at the virtual ``paths``) become pending with no attempts counted, and the index job
    is deferred in the same transaction; returns the paths requeued, sorted."""
    with database.transaction(stores.database_url) as conn:
        chunk_lock(conn, workspace_id)  # lock order (kb.locks): the chunk lock before document rows
        rows = conn.execute(queries["retry_documents"], {"workspace_id": workspace_id, "paths": paths}).fetchall()
        if rows:
            defer_job(conn, "index", INDEX_TASK, workspace_id)
    return sorted(r["path"] for r in rows)


def retry_blob_purges(stores: Stores, report: SweepReport, own: set[int]) -> None:
    """Retry the artifact blob purges a failed delete left behind (design §11), of the workspaces
    in ``own`` (homed on this node)."""
    from kb.workspace.artifacts import Artifacts

    with database.connect(stores.database_url, autocommit=True) as conn:
        pending = [r["workspace_id"] for r in conn.execute(queries["workspaces_with_blob_purges"])]
    for ws in pending:
        if ws in own and stores.store(ws).exists() and Artifacts(stores.store(ws), default_author).purge():
            report.blobs_purged.append(ws)
