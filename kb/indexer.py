"""Index convergence (SPEC §7): bring a workspace's chunks to git HEAD.

``Indexer.converge(workspace_id)`` projects rows to HEAD, then indexes every document whose
indexed content lags its projected content. Documents are cut and embedded in batches (so the
embedder sees full batches), but each document is written in its own transaction: a failure marks
that document ``failed`` (quarantined after ``KB_MAX_ATTEMPTS``) and the rest go on. The stamp
(``last_indexed_revision``) then moves to HEAD. Embeddings come from the chunk-level cache keyed by
``(sha256(text), model, dim)``; unchanged chunk rows are reused in place with updated positions
and spans.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kb import database
from kb.chunking import Chunk, Chunker
from kb.embedding import Embedder, check_vectors, vector_literal
from kb.errors import KbError, UnindexableDocument
from kb.locks import INDEX_LOCK_NAMESPACE
from kb.projection import project
from kb.repository import Repository
from kb.settings import Settings
from kb.sql import queries

log = logging.getLogger(__name__)

DOCUMENT_BATCH = 64


@dataclass
class IndexReport:
    """Counts of one convergence run."""

    workspace_id: int
    revision: str | None = None
    documents_indexed: int = 0
    documents_failed: int = 0
    documents_unindexable: int = 0
    chunks_written: int = 0
    chunks_reused: int = 0
    embeddings_computed: int = 0
    embeddings_cached: int = 0
    skipped_locked: bool = False
    failures: dict[str, str] = field(default_factory=dict)


def sha256_text(text: str) -> str:
    """Hex sha256 of a chunk's UTF-8 text (the embedding cache key, SPEC §7)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def decode_document(data: bytes) -> str:
    """Decode a blob as UTF-8 text; raises UnindexableDocument for NUL bytes or invalid UTF-8."""
    if b"\x00" in data:
        raise UnindexableDocument("contains NUL bytes (Postgres text cannot hold them)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnindexableDocument(f"not valid UTF-8 (byte {exc.start})") from None


@dataclass
class _Prepared:
    row: dict
    title: str
    chunks: list[Chunk] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    error: str | None = None
    unindexable: str | None = None


class Indexer:
    """Runs convergence for workspaces with one chunker and one embedder."""

    def __init__(
        self,
        settings: Settings,
        database_url: str,
        embedder: Embedder,
        chunker: Chunker | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.database_url = database_url
        self.embedder = embedder
        self.chunker = chunker or Chunker(settings.chunk_size)
        self.progress = progress

    def converge(self, workspace_id: int) -> IndexReport:
        """Project and index ``workspace_id`` up to its HEAD; returns what was done.

        If another process holds the workspace's index lock the run is skipped
        (``report.skipped_locked``): that run converges to HEAD itself.
        """
        report = IndexReport(workspace_id)
        repo = Repository.open(self.settings.knowledge_store / str(workspace_id))
        lock_conn = database.connect(self.database_url, autocommit=True)
        try:
            locked = lock_conn.execute(
                queries["try_index_lock"], {"namespace": INDEX_LOCK_NAMESPACE, "workspace_id": workspace_id}
            ).fetchone()["locked"]
            if not locked:
                report.skipped_locked = True
                return report
            with database.transaction(self.database_url) as conn:
                workspace = conn.execute(queries["get_workspace"], {"workspace_id": workspace_id}).fetchone()
                projection = project(conn, repo, workspace)
            head = projection.revision
            report.revision = head
            with database.connect(self.database_url) as conn:
                todo = conn.execute(queries["documents_to_index"], {"workspace_id": workspace_id}).fetchall()
                conn.commit()
                done = 0
                for start in range(0, len(todo), DOCUMENT_BATCH):
                    batch = todo[start : start + DOCUMENT_BATCH]
                    self._index_batch(conn, repo, workspace_id, head, batch, report)
                    done += len(batch)
                    if self.progress:
                        self.progress(done, len(todo))
                with conn.transaction():
                    conn.execute(queries["set_index_stamp"], {"workspace_id": workspace_id, "revision_id": head})
            return report
        finally:
            lock_conn.execute(queries["index_unlock"], {"namespace": INDEX_LOCK_NAMESPACE, "workspace_id": workspace_id})
            lock_conn.close()

    # -- one batch of documents ----------------------------------------------------------
    def _prepare(self, repo: Repository, row: dict) -> _Prepared:
        prepared = _Prepared(row, title="")
        try:
            text = decode_document(repo.blob(row["content_id"]))
            prepared.chunks = self.chunker.chunk(text)
            prepared.hashes = [sha256_text(c.text) for c in prepared.chunks]
        except UnindexableDocument as exc:
            prepared.unindexable = str(exc)
        except Exception as exc:  # one document's failure never stops the others (§7)
            prepared.error = f"{type(exc).__name__}: {exc}"
        return prepared

    def _embed(self, conn, texts_by_hash: dict[str, str], report: IndexReport) -> dict[str, str]:
        """Vectors (pgvector text) for every hash: cache first, then the embedder in batches."""
        model, dim = self.embedder.model, self.embedder.dim
        found = {
            r["text_sha256"]: r["embedding"]
            for r in conn.execute(
                queries["cached_embeddings"], {"model": model, "dim": dim, "hashes": list(texts_by_hash)}
            )
        }
        report.embeddings_cached += len(found)
        missing = [h for h in texts_by_hash if h not in found]
        size = max(1, self.settings.embed_batch_size)
        fresh: list[dict] = []
        for start in range(0, len(missing), size):
            hashes = missing[start : start + size]
            vectors = self.embedder.embed([texts_by_hash[h] for h in hashes])
            problems = check_vectors(np.asarray(vectors), len(hashes), dim)
            for h, vector, problem in zip(hashes, vectors, problems):
                if problem is None:
                    literal = vector_literal(vector)
                    found[h] = literal
                    fresh.append({"text_sha256": h, "model": model, "dim": dim, "embedding": literal})
            report.embeddings_computed += len(hashes)
        if fresh:
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(queries["cache_embedding"], fresh)
        return found

    def _index_batch(self, conn, repo, workspace_id, head, batch, report: IndexReport) -> None:
        prepared = [self._prepare(repo, row) for row in batch]
        texts = {h: c.text for p in prepared for h, c in zip(p.hashes, p.chunks)}
        try:
            vectors = self._embed(conn, texts, report)
        except Exception as exc:  # a poison text in the batch: isolate per document
            conn.rollback()
            log.warning("batch embedding failed (%s); retrying document by document", exc)
            vectors = {}
            for p in prepared:
                if p.error or p.unindexable:
                    continue
                try:
                    vectors.update(self._embed(conn, {h: c.text for h, c in zip(p.hashes, p.chunks)}, report))
                except Exception as doc_exc:
                    conn.rollback()
                    p.error = f"{type(doc_exc).__name__}: {doc_exc}"
        for p in prepared:
            if p.error is None and p.unindexable is None and any(h not in vectors for h in p.hashes):
                p.error = "EmbeddingError: embedding contains NaN or inf"
            self._write_document(conn, workspace_id, head, p, vectors, report)

    def _write_document(self, conn, workspace_id, head, p: _Prepared, vectors, report) -> None:
        row = p.row
        params = {"document_id": row["id"], "content_id": row["content_id"], "revision_id": head}
        try:
            with conn.transaction():
                if p.unindexable is not None:
                    conn.execute(queries["delete_document_chunks"], params)
                    conn.execute(queries["mark_document_unindexable"], {**params, "error": p.unindexable})
                    report.documents_unindexable += 1
                    return
                if p.error is not None:
                    raise KbError(p.error)
                self._reconcile(conn, workspace_id, p, vectors, report)
                conn.execute(queries["mark_document_indexed"], params)
                report.documents_indexed += 1
        except Exception as exc:
            error = str(exc) if isinstance(exc, KbError) else f"{type(exc).__name__}: {exc}"
            with conn.transaction():
                conn.execute(
                    queries["mark_document_failed"],
                    {"document_id": row["id"], "error": error[:2000], "max_attempts": self.settings.max_attempts},
                )
            report.documents_failed += 1
            report.failures[row["path"]] = error

    def _reconcile(self, conn, workspace_id, p: _Prepared, vectors, report) -> None:
        """Reuse chunk rows whose text is unchanged (updating position and spans), insert the new
        ones, delete the rest (SPEC §7)."""
        title = conn.execute(queries["document_title"], {"document_id": p.row["id"]}).fetchone()["title"]
        existing: dict[str, list[dict]] = {}
        for chunk_row in conn.execute(queries["document_chunks"], {"document_id": p.row["id"]}):
            if chunk_row["embedding_model"] == self.embedder.model:
                existing.setdefault(chunk_row["text_sha256"], []).append(chunk_row)
            else:
                existing.setdefault("stale", []).append(chunk_row)
        updates, inserts = [], []
        for chunk, digest in zip(p.chunks, p.hashes):
            span = {"position": chunk.position, "start_char": chunk.start_char, "end_char": chunk.end_char,
                    "start_line": chunk.start_line, "end_line": chunk.end_line}
            reusable = existing.get(digest)
            if reusable:
                old = reusable.pop(0)
                if any(old[k] != v for k, v in span.items()):
                    updates.append({"id": old["id"], **span})
                report.chunks_reused += 1
            else:
                inserts.append({
                    **span, "document_id": p.row["id"], "workspace_id": workspace_id, "text": chunk.text,
                    "text_sha256": digest, "token_count": chunk.token_count, "model": self.embedder.model,
                    "embedding": vectors[digest], "fts_config": self.settings.fts_config, "title": title,
                })
        leftover = [r["id"] for rows in existing.values() for r in rows]
        with conn.cursor() as cur:
            if leftover:
                cur.execute(queries["delete_chunks"], {"ids": leftover})
            if updates:
                cur.executemany(queries["update_chunk_position"], updates)
            if inserts:
                cur.executemany(queries["insert_chunk"], inserts)
        report.chunks_written += len(inserts)
