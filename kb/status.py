"""``kb status`` (design §7, §10, §13): the database, job counts, and for one workspace its head,
index stamp, document and chunk counts, problems, migration state, drift and remote."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kb.db import database
from kb.db.sql import queries

if TYPE_CHECKING:
    from kb.settings import Settings
    from kb.store.knowledge_store import KnowledgeStore


def status(settings: Settings, database_url: str, store: KnowledgeStore | None = None) -> dict:
    """Head, index stamp, job counts, chunk and document counts of ``store``'s workspace (or only
    what spans every workspace when None). Raises WorkspaceNotFound for a workspace that does not
    exist."""
    workspace_id = None if store is None else store.workspace_id
    result: dict = {
        "database": database.redact(database_url),
        "storage_root": str(settings.storage_root),
        "embedding_model": settings.embedding_model,
    }
    with database.connect(database_url) as conn:
        jobs = conn.execute(queries["job_counts"], {"workspace_id": workspace_id}).fetchall()
        result["jobs"] = [dict(j) for j in jobs]
        if store is not None:
            result["workspace"] = _workspace_status(conn, store)
        result["index_lag"] = conn.execute(queries["index_lag"], {"workspace_id": workspace_id}).fetchall()
        result["job_health"] = conn.execute(queries["job_health"]).fetchall()
        # due jobs something holds back (and what), and jobs scheduled for later
        due = conn.execute(queries["due_jobs"], {"queues": None}).fetchall()
        result["blocked_jobs"] = [
            j for j in due if j["blocker_id"] is not None and workspace_id in (None, j["workspace_id"])
        ]
        result["scheduled_jobs"] = [
            j
            for j in conn.execute(queries["scheduled_jobs"], {"queues": None})
            if workspace_id in (None, j["workspace_id"])
        ]
    return result


def _workspace_status(conn, store: KnowledgeStore) -> dict:
    """The ``workspace`` part of ``status``: rows, counts, migration, drift and remote."""
    from kb.legacy.drift import drift_report
    from kb.workspace.remotes import Remote

    workspace_id = store.workspace_id
    row = conn.execute(queries["get_workspace"], {"workspace_id": workspace_id}).fetchone()
    if row is None or not store.exists():
        store.require_exists()
    remote = Remote(store).status_or_none(conn)  # its URL redacted
    return {
        "id": workspace_id,
        "head": store.head(),
        "recorded_head": row["head_revision"],
        "index_stamp": row["last_indexed_revision"],
        "projected": row["last_projected_revision"],
        "model": row["embedder"],  # None: the default (KB_EMBEDDING_MODEL) until its first index run
        "next_model": row["next_embedder"],  # a switch under way (kb workspace set-model)
        **conn.execute(queries["workspace_counts"], {"workspace_id": workspace_id}).fetchone(),
        "problems": conn.execute(queries["problem_documents"], {"workspace_id": workspace_id}).fetchall(),
        "quarantined_documents": conn.execute(
            queries["quarantined_documents"], {"workspace_id": workspace_id}
        ).fetchall(),
        # seeded from a legacy knowledge base: the seed row with its span backlog (design §10)
        "migration": conn.execute(queries["migration_status"], {"workspace_id": workspace_id}).fetchone(),
        "drift": drift_report(conn, workspace_id),
        "remote": None if remote is None else remote.__dict__,
        "home_node": row["home_node"],  # design §15
    }


FAILED_DOCUMENTS_SHOWN = 200
"""How many failed or quarantined documents ``operator_view`` lists (every workspace together)."""


def operator_view(database_url: str) -> dict:
    """The operator's view (design §17): ``queues`` — per Procrastinate queue the jobs waiting
    and due, running, failed, scheduled for later and the age in seconds of the oldest due one
    (None when none waits) — and ``failed_documents`` (at most FAILED_DOCUMENTS_SHOWN: workspace,
    path, status, attempts, the indexer's error). Raises DatabaseUnavailable."""
    with database.connect(database_url) as conn:
        return {
            "queues": conn.execute(queries["queue_summary"]).fetchall(),
            "failed_documents": conn.execute(queries["failed_documents"], {"limit": FAILED_DOCUMENTS_SHOWN}).fetchall(),
        }
