"""Switching a workspace's embedding model (design §7): ``kb workspace set-model N MODEL``.

A switch records the target in ``kb.workspaces.next_embedder`` and defers the job
``kb.switch_model``, which re-embeds the workspace in two passes, through the embedding cache:

1. Without any lock: every indexed document's chunks are embedded with the new model into the
   cache (no chunk row changes). Search keeps answering from the old vectors, with the old model
   embedding the queries, and index runs go on writing the old model's vectors.
2. Under the workspace's index lock (no index run writes meanwhile): the chunks that pass 1 did
   not cover (documents indexed meanwhile) are embedded too; then one transaction gives every
   chunk its new vector from the cache, deletes the few whose text failed to embed (their
   documents lag, so the next index run embeds them again) and records the new model. Searches
   see the old vectors or the new ones, never a mix, and the workspace ends with 0 vectors of the
   old model.

A switch superseded by another ``set-model`` before it ran does nothing (it re-reads the target).
"""

from __future__ import annotations

from dataclasses import dataclass

from kb.db import database
from kb.db.locks import index_lock
from kb.db.sql import queries
from kb.errors import LockTimeout, WorkspaceNotFound
from kb.git.repository import Repository
from kb.index import models, vector_index
from kb.index.embedding import Embedder
from kb.index.indexer import Indexer, IndexReport
from kb.settings import Settings

LOCK_WAIT_SECONDS = 60.0
"""How long pass 2 waits for a running index run to release the workspace's index lock."""


@dataclass
class SwitchReport:
    """What a switch did. ``action``: switched | superseded (another target was set since) |
    unchanged (the workspace already uses the model). ``old_vectors``: vectors of any other model
    left in the workspace afterwards (0 once switched)."""

    workspace_id: int
    embedder: str
    model: str
    action: str = "switched"
    previous: str | None = None
    documents: int = 0
    embeddings_computed: int = 0
    embeddings_cached: int = 0
    chunks_swapped: int = 0
    documents_dropped: int = 0
    old_vectors: int = 0


def switch(
    settings: Settings,
    database_url: str,
    workspace_id: int,
    name: str,
    embedder: Embedder,
    chunker=None,
    progress=None,
    between_passes=None,
) -> SwitchReport:
    """Re-embed ``workspace_id`` with model ``name`` (its ``embedder``) and make it the
    workspace's model, as described above. ``progress(done, total, report)`` as the indexer's;
    ``between_passes()`` is called after pass 1 (tests search there).

    Returns a SwitchReport. Raises WorkspaceNotFound, LockTimeout when an index run held the index
    lock for LOCK_WAIT_SECONDS (the job is retried; pass 1's vectors stay cached).
    """
    report = SwitchReport(workspace_id, name, embedder.model)
    indexer = Indexer(settings, database_url, embedder, chunker, progress)
    counts = IndexReport(workspace_id, "switch_model")
    try:
        opened = Repository.open(settings.knowledge_store / str(workspace_id))
    except FileNotFoundError:
        raise WorkspaceNotFound(f"workspace {workspace_id} does not exist; `kb workspaces` lists them") from None
    params = {"workspace_id": workspace_id, "model": embedder.model, "dim": embedder.dim}
    with opened as repo, database.connect(database_url, autocommit=True) as conn:
        report.previous, target = models.recorded(conn, workspace_id)
        if target != name:
            report.action = "superseded"
            return report
        todo = conn.execute(queries["documents_to_reembed"], {**params, "uncached": False}).fetchall()
        counts.documents_total = len(todo)
        indexer.embed_into_cache(conn, repo, todo, counts)
        if between_passes is not None:
            between_passes()
        with index_lock(database_url, workspace_id, wait=LOCK_WAIT_SECONDS) as locked:
            if not locked:
                raise LockTimeout(
                    workspace_id,
                    LOCK_WAIT_SECONDS,
                    lock="index",
                    holder="an index run holds it. The model switch is retried; its vectors so far are cached",
                )
            if models.recorded(conn, workspace_id)[1] != name:
                report.action = "superseded"
                return report
            late = conn.execute(queries["documents_to_reembed"], {**params, "uncached": True}).fetchall()
            counts.documents_total += len(late)
            indexer.embed_into_cache(conn, repo, late, counts)
            with conn.transaction():
                report.chunks_swapped = conn.execute(queries["swap_chunk_vectors"], params).rowcount
                dropped = [r["id"] for r in conn.execute(queries["drop_unswapped_chunks"], params).fetchall()]
                if dropped:
                    conn.execute(queries["refresh_document_terms"], {"document_ids": dropped})
                conn.execute(queries["finish_model_switch"], {"workspace_id": workspace_id, "embedder": name})
            report.documents_dropped = len(dropped)
            report.old_vectors = sum(
                r["n"]
                for r in conn.execute(queries["workspace_vector_models"], {"workspace_id": workspace_id})
                if r["model"] != embedder.model
            )
    vector_index.forget_cached(workspace_id)
    report.documents = counts.documents_done
    report.embeddings_computed, report.embeddings_cached = counts.embeddings_computed, counts.embeddings_cached
    return report
