"""Index convergence (design §7): bring a workspace's chunks to git HEAD.

Two runs, both converging to HEAD under the workspace's index lock and neither taking a revision:

- ``Indexer.converge`` (job ``kb.index_changes``): projects rows to HEAD — the projection folds
  every revision between the last projected one and HEAD — then indexes every document whose
  indexed content lags its projected content (``content_id <> indexed_content_id``: exactly the
  documents changed between the stamp and HEAD, plus earlier failures).
- ``Indexer.reindex`` (job ``kb.reindex``): re-compares the whole tree with the rows (upsert +
  prune), then re-derives every document's chunks, and finally converges what changed meanwhile.
  It records its cursor in ``kb.index_runs`` after every batch, so a run killed half-way resumes
  where it stopped.

Runs use autocommit connections: every write is an explicit transaction (one per batch of
documents, one per progress checkpoint). Documents are cut and embedded in batches (the embedder
sees full batches) and a batch is written in one transaction, each statement once for the whole
batch (``Indexer._write_batch``: a few round trips and one commit per batch). The run is a
pipeline (``Indexer._run_documents``): a writer thread writes each batch, and checkpoints it, on a
connection of its own while the run's thread cuts and embeds the next, so Postgres' work on one
batch overlaps the chunker's and the embedder's on the next and a fast embedder, not Postgres,
sets the pace. A big run also cuts its documents in a cutter process of its own, a batch or two
ahead (``_Cuts``, kb.index.cutting), which leaves this interpreter the embedding and the rows. A run's commits do not wait for the WAL flush except its last, which makes them
all durable (``index_session``: a Postgres crash can only lose whole, latest batches, which then
lag and are indexed again). When that transaction fails, the batch is written again document
by document, each in its own transaction: a failure marks that document ``failed`` with the error
and an attempt count (``quarantined`` after ``KB_MAX_ATTEMPTS``) and the others go on. A document with NUL
bytes or invalid UTF-8 is marked ``unindexable`` and is not a failure. The stamp
(``last_indexed_revision``) then moves to HEAD: it advances past successes, and the remaining
failed documents are retried by a follow-up job (``kb.jobs.tasks``) and the sweep until they succeed or
are quarantined, so one poison document never wedges the workspace. A run that writes the chunks of
most of its workspace (at least ``BULK_RUN_DOCUMENTS`` lagging documents and half of them: a first
index, a large import) counts the BM25 term statistics once when it finishes instead of once per batch
(``Indexer._bulk_run``, kb.deferred_term_stats); a run that dies leaves them deferred, and the next
run or the sweep recounts them.

A document's transaction takes the workspace's chunk lock and then the document's row before it
writes chunks (the lock order in ``kb.db.locks``, shared with the projection, which may run at the
same time). A document the projection deleted after the run read it has no row left to lock: it
is settled as gone, not written (its chunks would violate the foreign key) and not failed. One
that a projection moved or changed after the run read it (or the artifact layer revised) is
superseded: not written either — its chunks would describe other content, or its stamp cite a
path the content no longer has — and it lags until the next run, which the change deferred.
The stamp a written document gets, ``(indexed_path, indexed_revision)``, is what a search
envelope cites (design §8): the path it has and a revision where that path holds this content
(``mark_document_indexed``), not the revision the run projected, which predates rows a later
projection brought in.

What a chunk embeds is its text after its context line (document title and heading path,
kb.chunk_context); the full-text index gets the same, in the document's language configuration
(kb.languages). Embeddings come from the chunk-level cache keyed by ``(sha256(text embedded),
model, dim)``; only texts
that no existing chunk row of the document already carries are looked up, and only cache misses
reach the embedder. Unchanged chunk rows are reused in place (same id) with updated positions and
spans.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kb.db import database, vector_wire
from kb.db.locks import chunk_lock, index_lock
from kb.db.sql import queries
from kb.db.vector_wire import VectorBytes, vectors_bytes
from kb.errors import WorkspaceNotFound
from kb.git.repository import BULK_READ_MIN, Repository
from kb.index import vector_index
from kb.index.chunking import Chunker, LazyChunker
from kb.index.cutting import Cut, CutterProcess, cut_document, document_config, error_text, settle_languages
from kb.index.cutting import sha256_text as sha256_text
from kb.index.embedding import Embedder, check_vectors, model_cache
from kb.index.languages import cache_in, lexical_text
from kb.settings import Settings
from kb.store.history import json_column
from kb.store.projection import project

if TYPE_CHECKING:
    from kb.db.database import Connection

log = logging.getLogger(__name__)

DOCUMENT_BATCH = 64
"""Documents cut, embedded and checkpointed together."""
CUTTER_RUN_DOCUMENTS = 32 * DOCUMENT_BATCH
"""With ``KB_INDEX_CUTTER=auto``, a run of at least this many documents cuts them in a cutter
process of its own (``Indexer._cutter_for``, kb.index.cutting)."""
BULK_RUN_DOCUMENTS = 2 * DOCUMENT_BATCH
"""A run that indexes at least this many lagging documents, and at least half of its workspace's,
counts the workspace's term statistics once at its end instead of once per batch
(``Indexer._bulk_run``)."""


@dataclass
class IndexReport:
    """Counts of one run (``kind``: index_changes | reindex). ``documents_gone``: documents a
    projection deleted after the run read them (settled: neither indexed nor failed);
    ``documents_superseded``: documents moved or changed after the run read them (not written;
    the next run indexes what they hold then). ``embeddings_due``: texts the run has found missing
    from the cache so far, to embed (``embeddings_computed`` of them done): within a batch of
    documents, the progress the embedder makes before any of them is stored."""

    workspace_id: int
    kind: str = "index_changes"
    revision: str | None = None
    run_id: int | None = None
    resumed: bool = False
    documents_total: int = 0
    documents_indexed: int = 0
    documents_failed: int = 0
    documents_unindexable: int = 0
    documents_still_failed: int = 0
    documents_gone: int = 0
    documents_superseded: int = 0
    failed_attempts: int = 0
    chunks_written: int = 0
    chunks_reused: int = 0
    embeddings_computed: int = 0
    embeddings_cached: int = 0
    embeddings_due: int = 0
    documents_done: int = 0
    cursor: int | None = None
    skipped_locked: bool = False
    failures: dict[str, str] = field(default_factory=dict)
    attempted: set[int] = field(default_factory=set, repr=False)

    @property
    def cache_hit_ratio(self) -> float:
        """Share of the needed embeddings served by the cache (1.0 when none were needed)."""
        needed = self.embeddings_cached + self.embeddings_computed
        return 1.0 if needed == 0 else self.embeddings_cached / needed


@dataclass
class _Prepared(Cut):
    """A document of a batch: its row, its cut (kb.index.cutting) and its chunk rows (``existing``).
    ``lexically_stable`` False: its text or title is not in Unicode form C, so its chunk rows may
    carry tsvectors of the unnormalized text (indexed before kb.languages normalized) and none is
    reused."""

    row: dict = field(default_factory=dict)
    existing: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, row: dict, cut: Cut) -> _Prepared:
        """``row`` with ``cut``."""
        return cls(**vars(cut), row=row)


UPDATE_COLUMNS = ("id", "position", "start_char", "end_char", "start_line", "end_line")
INSERT_COLUMNS = (
    "document_id",
    "workspace_id",
    "position",
    "text",
    "text_sha256",
    "start_char",
    "end_char",
    "start_line",
    "end_line",
    "token_count",
    "model",
    "embedding",
    "text_config",
    "lexical_context",
    "lexical_text",
)
"""The keys of a chunk update / insert (``Indexer._plan_chunks``), in the order of the arrays the
multi-row statements ``update_chunk_positions`` / ``insert_chunks`` take."""


def _columns(rows: list[dict], keys: tuple[str, ...]) -> dict[str, list]:
    """Rows as parallel arrays, one per key, named as the multi-row statements name them
    (``position`` → ``positions``, ``text_sha256`` → ``text_sha256s``, ``id`` → ``ids``)."""
    return {f"{key}s": [row[key] for row in rows] for key in keys}


def _json_columns(rows: list[dict], keys: tuple[str, ...]) -> dict[str, list | str]:
    """``_columns`` with every column but the vectors as one JSON array text
    (kb.store.history.json_column, what ``insert_chunks`` unpacks): json.dumps is C, where psycopg
    dumps a list into an array value by value in Python (design §14)."""
    return {
        name: values if name == "embeddings" else json_column(values) for name, values in _columns(rows, keys).items()
    }


_WRITE_COUNTS = (
    "documents_gone",
    "documents_superseded",
    "documents_unindexable",
    "documents_indexed",
    "documents_failed",
    "chunks_written",
    "chunks_reused",
)
"""The IndexReport counts a batch's write sets (``Indexer._write_staged``)."""


@dataclass
class _Checkpoint:
    """What the writer thread records in a run's ``kb.index_runs`` row after each batch:
    ``totals``, the run's counts so far, advanced by the writer alone (``Indexer._run_documents``)."""

    run_id: int
    move_cursor: bool
    totals: IndexReport


class _BlobFeed:
    """The blobs of a run's documents, in the run's order, read by one ``git cat-file --batch``
    for the whole run (``Repository.blobs``) instead of one dulwich lookup each: a pack probe and
    inflation in Python per document was the run's third largest Python cost after the chunker
    and the embedder, on the thread that sets the pace (design §7). ``read(row)`` answers
    ``repo.blob(row["content_id"])``; when the stream fails (a missing or damaged object, no git),
    this and every later document is read by ``repo.blob``, which fails that document alone as
    before."""

    def __init__(self, repo: Repository, rows: list[dict]) -> None:
        self._repo = repo
        self._stream: Iterator[tuple[str, bytes]] | None = None
        if len(rows) >= BULK_READ_MIN:  # fewer: a git process costs more than it saves
            self._stream = repo.blobs([row["content_id"] for row in rows])

    def read(self, row: dict) -> bytes:
        """The bytes of ``row``'s blob (the rows must be read in the order the feed was given)."""
        if self._stream is not None:
            try:
                blob_id, data = next(self._stream)
                if blob_id == row["content_id"]:
                    return data
            except Exception as exc:  # read it as before, which fails this document alone
                log.info("reading a run's blobs in bulk stopped (%s); reading them one by one", exc)
            self.close()
        return self._repo.blob(row["content_id"])

    def close(self) -> None:
        """End the stream (and its git process)."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()  # type: ignore[attr-defined]


def _cores() -> int:
    """The cores this process may run on (all of the machine's where the OS does not say)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class _Cuts:
    """The cut documents of a run's batches, in order (``next``). With a cutter process, batches
    go to it up to ``AHEAD`` ahead of the one the run embeds, their bytes read here (``read``) as
    they are handed over, so the child cuts while this process embeds and writes; without one, a
    batch is cut here when it is asked for. Until the child has started (it imports and loads for
    about a second) batches are cut here only when this process has its chunker built already (a
    warm process: ``kb.index`` after another run); a process that has not (a fresh worker) waits
    for the child, up to ``START_SECONDS``: building the chunker here takes about as long as the
    child takes to start, and would hold a second copy of chonkie, the tokenizer and the language
    model's pages in this process for the rest of its life (design §7). A batch the child fails (it
    died, or never started) is cut here again from the bytes handed over, and so is every later one,
    so a dead cutter costs time, never a document (design §7)."""

    AHEAD = 2
    START_SECONDS = 60.0
    """How long a run whose process has no chunker built waits for its child to start before it
    cuts in its own process after all."""

    def __init__(
        self, indexer: Indexer, batches: list[list[dict]], read: Callable[[dict], bytes], cutter: CutterProcess | None
    ) -> None:
        self._indexer, self._batches, self._read, self._cutter = indexer, batches, read, cutter
        self._sent: collections.deque[list[tuple[dict, bytes | str]]] = collections.deque()
        self._next = 0
        """The next batch not yet taken (cut here, or sent to the child)."""
        self._await_child = cutter is not None and not getattr(indexer.chunker, "built", True)
        """Whether to wait for the child to start rather than cut here meanwhile (a LazyChunker
        not built yet; a Chunker is built)."""

    def _documents(self, batch: list[dict]) -> list[tuple[dict, bytes | str]]:
        """``(row, bytes)`` of each of ``batch``'s documents; ``(row, error)`` when its blob cannot
        be read (that document fails alone)."""
        documents: list[tuple[dict, bytes | str]] = []
        for row in batch:
            try:
                documents.append((row, self._read(row)))
            except Exception as exc:
                documents.append((row, error_text(exc)))
        return documents

    def _fill(self) -> None:
        """Hand the started child the batches after those it holds, up to ``AHEAD`` of them."""
        try:
            if self._cutter is None:
                return
            if not self._cutter.ready(self.START_SECONDS if self._await_child else 0.0):
                if self._await_child:  # it never started: cut here (a dead child: receive says so)
                    self._await_child = False
                return
            while self._next < len(self._batches) and len(self._sent) < self.AHEAD:
                documents = self._documents(self._batches[self._next])
                self._next += 1
                self._sent.append(documents)
                self._cutter.send([(row.get("title") or "", data) for row, data in documents])
        except Exception as exc:  # a dead child: what it holds is cut here (next)
            self._stop_cutter(exc)

    def _stop_cutter(self, exc: BaseException) -> None:
        log.warning("the index run's cutter process failed (%s); cutting in the run's process", exc)
        self.close()

    def next(self) -> list[_Prepared]:
        """The next batch's documents, cut."""
        self._fill()
        if self._sent:
            documents = self._sent.popleft()
            cuts: list[Cut] | None = None
            if self._cutter is not None:
                try:
                    cuts = self._cutter.receive()
                except Exception as exc:
                    self._stop_cutter(exc)
            if cuts is not None and len(cuts) == len(documents):
                self._fill()
                return [_Prepared.of(row, cut) for (row, _), cut in zip(documents, cuts)]
        else:
            documents = self._documents(self._batches[self._next])
            self._next += 1
        return [
            self._indexer._cut(row, data) if isinstance(data, bytes) else _Prepared(row=row, error=data)
            for row, data in documents
        ]

    def close(self) -> None:
        """Stop the cutter process, if any (what it holds is cut here when asked for)."""
        if self._cutter is not None:
            cutter, self._cutter = self._cutter, None
            cutter.close()

    def __enter__(self) -> _Cuts:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Indexer:
    """Runs convergence for workspaces with one chunker and one embedder.

    ``progress(done, total, report)`` is called before the first batch of documents, after every
    batch and after every embedder call within one (``report``: the IndexReport so far).
    """

    def __init__(
        self,
        settings: Settings,
        database_url: str,
        embedder: Embedder,
        chunker: Chunker | LazyChunker | None = None,
        progress: Callable[[int, int, IndexReport], None] | None = None,
        embedder_for: Callable[[int, Repository], Embedder] | None = None,
    ) -> None:
        self.settings = settings
        self.database_url = database_url
        self.embedder = embedder
        self.embedder_for = embedder_for
        cache_in(model_cache(settings))  # the documents' language model, unpacked once (design §7)
        self.chunker = chunker or Chunker(settings.chunk_size)
        self.progress = progress
        self._vector_index_suspended = False
        """Whether this run dropped the workspace's HNSW index for its load (``_bulk_run``), or a
        dead run's left dropped (``_dead_run_left_deferral``)."""
        self._deferred_here = False
        """Whether this run deferred the workspace's term statistics (``_bulk_run``)."""
        self._writer: ThreadPoolExecutor | None = None
        self._writer_conn: Connection | None = None
        self._cache_writes: list[Future[None]] | None = None
        """While a run writes through its writer thread (``_run_documents``): the embedding-cache
        writes handed to it, which the run waits for with the batch they belong to."""

    # -- the two runs ------------------------------------------------------------------------
    def converge(self, workspace_id: int) -> IndexReport:
        """Project and index ``workspace_id`` up to its HEAD (job ``kb.index_changes``).

        Returns what was done. If another process holds the workspace's index lock the run is
        skipped (``report.skipped_locked``): that run converges to HEAD itself.
        """
        with self._locked_run(workspace_id, "index_changes", full=False) as (report, repo):
            if repo is not None:
                with self._run_connection() as conn:
                    self._lagging_pass(conn, repo, workspace_id, report.revision, report, start_run=True)
                    self._finish(conn, workspace_id, report.revision, report)
        self._rebuild_vector_index(workspace_id)
        return report

    def _rebuild_vector_index(self, workspace_id: int) -> None:
        """Build the HNSW index the run dropped for its load (``_bulk_run``) over what it wrote,
        once the index lock is released: ``CREATE INDEX CONCURRENTLY`` waits for every older
        snapshot, the lock's open transaction among them (design §7, §8)."""
        if self._vector_index_suspended:
            self._vector_index_suspended = False
            vector_index.maintain(self.database_url, workspace_id, self.embedder.model, self.embedder.dim)

    @contextlib.contextmanager
    def _run_connection(self) -> Iterator[Connection]:
        """An autocommit connection of an index run whose commits skip the WAL flush
        (``index_session``, design §7); behind a transaction-mode pooler a plain one, since a
        session setting there would land on whichever server connection ran it and stop another
        client's commits from waiting for the disk (kb.db.database)."""
        with database.connect(self.database_url, autocommit=True) as conn:
            if not database.is_transaction_pooled(self.database_url):
                conn.execute(queries["index_session"])
            vector_wire.register(conn)  # the run's vectors travel in binary (kb.db.vector_wire)
            yield conn

    @contextlib.contextmanager
    def _locked_run(self, workspace_id: int, kind: str, *, full: bool):
        """Hold the workspace's index lock and project to HEAD; yields ``(report, repo)`` with
        ``report.revision`` = HEAD, or ``(report, None)`` with ``skipped_locked`` set when another
        run holds the lock (that run converges to HEAD itself)."""
        report = IndexReport(workspace_id, kind)
        with index_lock(self.database_url, workspace_id) as locked:
            if not locked:
                report.skipped_locked = True
                yield report, None
                return
            try:
                opened = Repository.open(self.settings.knowledge_store / str(workspace_id))
            except FileNotFoundError:  # never created, or deleted (kb workspace delete) meanwhile
                raise WorkspaceNotFound(
                    f"workspace {workspace_id} does not exist; `kb workspaces` lists them"
                ) from None
            with opened as repo:
                report.revision = self._project(repo, workspace_id, full=full)
                if self.embedder_for is not None:
                    # the workspace's model, read under the index lock: a model switch swaps
                    # vectors under this lock too, so a run never writes the old model's (§7)
                    self.embedder = self.embedder_for(workspace_id, repo)
                yield report, repo

    def reindex(self, workspace_id: int) -> IndexReport:
        """Rebuild ``workspace_id``'s index from git HEAD (job ``kb.reindex``), resumably.

        Re-compares the whole tree with the document rows (upsert + prune), re-derives every
        document's chunks (reusing unchanged chunk rows and cached embeddings: a second reindex
        embeds nothing) and then indexes whatever changed meanwhile. Progress lives in the run's
        ``kb.index_runs`` row; an unfinished reindex of the workspace (a killed worker) is resumed
        after its cursor. Skipped (``skipped_locked``) when another run holds the index lock.
        """
        with self._locked_run(workspace_id, "reindex", full=True) as (report, repo):
            if repo is None:
                return report
            head = report.revision
            with self._run_connection() as conn:
                run = conn.execute(
                    queries["running_index_run"], {"workspace_id": workspace_id, "kind": "reindex"}
                ).fetchone()
                cursor = (run["cursor_document_id"] if run else None) or 0
                todo = conn.execute(
                    queries["documents_to_reindex"], {"workspace_id": workspace_id, "after_id": cursor}
                ).fetchall()
                with conn.transaction():
                    if run:
                        report.resumed = True
                        run = conn.execute(
                            queries["resume_index_run"],
                            {
                                "id": run["id"],
                                "target_revision": head,
                                "documents_total": run["documents_done"] + len(todo),
                            },
                        ).fetchone()
                    else:
                        run = conn.execute(
                            queries["start_index_run"],
                            {
                                "workspace_id": workspace_id,
                                "kind": "reindex",
                                "target_revision": head,
                                "documents_total": len(todo),
                            },
                        ).fetchone()
                    conn.execute(queries["interrupt_index_runs"], {"workspace_id": workspace_id, "keep_id": run["id"]})
                report.run_id = run["id"]
                report.documents_total = run["documents_total"]
                report.documents_done = run["documents_done"]
                report.cursor = run["cursor_document_id"]
                self._run_documents(conn, repo, workspace_id, head, todo, report, run, move_cursor=True)
                # documents whose content changed while the tree pass ran (or a failed retry)
                self._lagging_pass(conn, repo, workspace_id, head, report, start_run=False, run=run)
                self._finish(conn, workspace_id, head, report)
        self._rebuild_vector_index(workspace_id)
        return report

    def embed_into_cache(self, conn, repo: Repository, rows: list[dict], report: IndexReport) -> None:
        """Embed the chunks of documents ``rows`` (``id``, ``path``, ``title``, ``content_id``)
        into the embedding cache with this indexer's embedder, writing no chunk: what a model
        switch (kb.index.model_switch) runs before it swaps vectors. Batch by batch, reported in
        ``report`` (a text that fails to embed is left out; the switch settles it)."""
        for start in range(0, len(rows), DOCUMENT_BATCH):
            prepared = [self._prepare(repo, row) for row in rows[start : start + DOCUMENT_BATCH]]
            texts = {h: e for p in prepared if p.writable for h, e in zip(p.hashes, p.embedded)}
            self._embed(conn, texts, report)
            report.documents_done += len(prepared)
            if self.progress:
                self.progress(report.documents_done, report.documents_total, report)

    # -- pieces of a run -----------------------------------------------------------------------
    def _project(self, repo: Repository, workspace_id: int, *, full: bool) -> str | None:
        with database.transaction(self.database_url) as conn:
            return project(conn, repo, workspace_id, force=full, database_url=self.database_url).revision

    def _lagging_pass(self, conn, repo, workspace_id, head, report, *, start_run: bool, run=None) -> None:
        """Index the documents whose indexed content lags their projected content (not those this
        run already attempted, so a failing document costs one attempt per run)."""
        todo = [
            row
            for row in conn.execute(queries["documents_to_index"], {"workspace_id": workspace_id}).fetchall()
            if row["id"] not in report.attempted
        ]
        if start_run:
            with conn.transaction():
                run = conn.execute(
                    queries["start_index_run"],
                    {
                        "workspace_id": workspace_id,
                        "kind": "index_changes",
                        "target_revision": head,
                        "documents_total": len(todo),
                    },
                ).fetchone()
                conn.execute(
                    queries["interrupt_index_runs_of_kind"],
                    {"workspace_id": workspace_id, "kind": "index_changes", "keep_id": run["id"]},
                )
            report.run_id = run["id"]
        report.documents_total += len(todo)
        self._run_documents(conn, repo, workspace_id, head, todo, report, run, move_cursor=False)

    def _run_documents(self, conn, repo, workspace_id, head, todo, report, run, *, move_cursor: bool) -> None:
        """Index ``todo`` batch by batch, recording progress (and the resume cursor) in ``run``.

        Pipelined (design §7): while a writer thread writes one batch on a connection of its own
        and then checkpoints it in ``run``, this thread cuts and embeds the next, so at most two
        batches are in hand. A checkpoint follows its batch's commit, so a killed run resumes at or
        before the first batch not written. The writer is drained before the run goes on, whether
        the loop ends well or not, so no write outlives the run (nor its index lock)."""
        if not todo:
            return
        self._bulk_run(conn, workspace_id, len(todo))
        if self.progress:  # the work ahead, before the first batch is chunked and embedded
            self.progress(report.documents_done, report.documents_total, report)
        checkpoint = _Checkpoint(run["id"], move_cursor, IndexReport(workspace_id))
        for name in (*_WRITE_COUNTS, "documents_done", "documents_total", "cursor"):
            setattr(checkpoint.totals, name, getattr(report, name))
        with (
            contextlib.ExitStack() as stack,
            self._run_connection() as writer_conn,
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-index-writer") as writer,
        ):
            pending: tuple[list[dict], Future[IndexReport], list[Future[None]]] | None = None
            # each batch's fresh vectors are cached (one statement) by the writer thread too, ahead of
            # the batch's write (one thread: in order), so this thread never waits for Postgres
            # to store them; a stopped run still stores what was handed over (the executor
            # finishes its queue before the block ends)
            self._writer, self._writer_conn, self._cache_writes = writer, writer_conn, []
            feed = _BlobFeed(repo, todo)
            batches = [todo[start : start + DOCUMENT_BATCH] for start in range(0, len(todo), DOCUMENT_BATCH)]
            cuts = stack.enter_context(_Cuts(self, batches, feed.read, self._cutter_for(len(todo))))
            # a batch's chunk rows are read by the writer thread, queued ahead of the previous
            # batch's write, so they are in hand once this thread has cut the batch: no round trip
            # waits on the thread that sets the pace (design §7); a batch's documents are not the
            # previous batch's, so its write changes none of these rows
            rows = writer.submit(self._chunk_rows, writer_conn, batches[0])
            try:
                for number, batch in enumerate(batches):
                    prepared, vectors = self._stage_batch(conn, cuts.next(), report, rows)
                    if number + 1 < len(batches):
                        rows = writer.submit(self._chunk_rows, writer_conn, batches[number + 1])
                    if pending is not None:
                        gone = report.documents_gone
                        self._collect(*pending, report, move_cursor=move_cursor)
                        if report.documents_gone - gone == len(pending[0]):
                            self._stop_if_deleted(conn, workspace_id)
                    cached, self._cache_writes = self._cache_writes, []
                    embedded = (report.embeddings_computed, report.embeddings_cached)
                    write = writer.submit(
                        self._write_and_checkpoint,
                        writer_conn,
                        workspace_id,
                        head,
                        batch,
                        prepared,
                        vectors,
                        checkpoint,
                        embedded,
                    )
                    pending = (batch, write, cached)
                if pending is not None:
                    self._collect(*pending, report, move_cursor=move_cursor)
            finally:
                feed.close()
                self._writer = self._writer_conn = self._cache_writes = None

    def _cutter_for(self, documents: int) -> CutterProcess | None:
        """A cutter process for a run of ``documents`` documents (kb.index.cutting), or None to cut
        in this process: ``KB_INDEX_CUTTER`` ``process`` always, ``inline`` never, ``auto`` for a run
        of at least ``CUTTER_RUN_DOCUMENTS`` documents on a machine with two cores or more, where
        the child's start (about a second) pays for itself and a core is there for it."""
        mode = self.settings.index_cutter
        if mode == "inline" or (mode == "auto" and (documents < CUTTER_RUN_DOCUMENTS or _cores() < 2)):
            return None
        return CutterProcess(
            self.settings.chunk_size,
            self.settings.max_index_bytes,
            self.settings.fts_config,
            model_cache(self.settings),
        )

    def _stop_if_deleted(self, conn, workspace_id: int) -> None:
        """After a batch whose every document was gone: raise WorkspaceNotFound when the workspace
        itself was deleted meanwhile (``kb workspace delete --force`` while the run ran), so the run
        stops instead of cutting and embedding the rest of a workspace that no longer exists (a
        25,000-document run went on for minutes, holding the worker other workspaces wait for)."""
        if conn.execute(queries["get_workspace"], {"workspace_id": workspace_id}).fetchone() is None:
            raise WorkspaceNotFound(
                f"workspace {workspace_id} was deleted while it was being indexed; the index run stopped"
            )

    def _write_and_checkpoint(
        self, conn, workspace_id, head, batch, prepared, vectors, checkpoint: _Checkpoint, embedded: tuple[int, int]
    ) -> IndexReport:
        """The writer thread's part of a batch: write it (``_write_staged``), then record the run's
        totals with it in ``kb.index_runs`` (``embedded``: the run's embedding counts once the batch
        was embedded). Returns the batch's write counts."""
        counts = self._write_staged(conn, workspace_id, head, prepared, vectors)
        totals = checkpoint.totals
        for name in _WRITE_COUNTS:
            setattr(totals, name, getattr(totals, name) + getattr(counts, name))
        totals.documents_done += len(batch)
        if checkpoint.move_cursor:
            totals.cursor = batch[-1]["id"]
        totals.embeddings_computed, totals.embeddings_cached = embedded
        # one statement on the writer's autocommit connection: its own transaction, with no
        # BEGIN and COMMIT round trips around it
        conn.execute(
            queries["update_index_run"],
            {
                "id": checkpoint.run_id,
                "documents_done": totals.documents_done,
                "documents_total": totals.documents_total,
                "documents_failed": totals.documents_failed,
                "cursor_document_id": totals.cursor,
                "chunks_written": totals.chunks_written,
                "chunks_reused": totals.chunks_reused,
                "embeddings_computed": totals.embeddings_computed,
                "embeddings_cached": totals.embeddings_cached,
            },
        )
        return counts

    def _collect(
        self, batch, write: Future[IndexReport], cached: list[Future[None]], report, *, move_cursor: bool
    ) -> None:
        """Wait for ``batch``'s write and checkpoint (``cached``: the cache writes of its vectors,
        queued before it) and add them to ``report`` (then ``progress``). A failed cache write
        fails the run, as it did when the run's thread wrote the cache."""
        for done in cached:
            done.result()
        counts = write.result()
        for name in _WRITE_COUNTS:
            setattr(report, name, getattr(report, name) + getattr(counts, name))
        report.failures.update(counts.failures)
        report.attempted.update(row["id"] for row in batch)
        report.documents_done += len(batch)
        if move_cursor:
            report.cursor = batch[-1]["id"]
        if self.progress:
            self.progress(report.documents_done, report.documents_total, report)

    def _bulk_run(self, conn, workspace_id: int, documents: int) -> None:
        """Defer the workspace's term statistics when this run of ``documents`` documents writes
        the chunks of most of the workspace: at least ``BULK_RUN_DOCUMENTS`` documents whose
        indexed content lags, and half of the workspace's (a first index, a large import). Per
        batch, the statistics triggers upsert every distinct lexeme of the batch, so a lexeme
        common to many batches is upserted again by each; counting the workspace once at the end
        (``_finish``) costs about a third of that (design §7). A run that rewrites few chunks (a
        reindex of an indexed workspace reuses its rows) keeps counting per batch: a recount costs
        the whole workspace. Meanwhile the lexical legs rank with the statistics as they were
        before the run (kb.deferred_term_stats, migration 0029). Such a run also drops the
        workspace's HNSW index of the active model and builds it again when it has finished
        (``vector_index.suspend_for_bulk_load``, ``_rebuild_vector_index``): searches meanwhile
        scan the workspace exactly."""
        if documents < BULK_RUN_DOCUMENTS:
            return
        backlog = conn.execute(queries["workspace_index_backlog"], {"workspace_id": workspace_id}).fetchone()
        if backlog["lagging"] >= BULK_RUN_DOCUMENTS and 2 * backlog["lagging"] >= backlog["documents"]:
            if conn.execute(queries["term_stats_deferred"], {"workspace_id": workspace_id}).fetchone()["deferred"]:
                self._dead_run_left_deferral()
            with conn.transaction():
                conn.execute(queries["defer_term_stats"], {"workspace_id": workspace_id})
            self._deferred_here = True
            # and the workspace's HNSW index, built again once the rows are in
            if vector_index.suspend_for_bulk_load(self.database_url, workspace_id, self.embedder.model):
                self._vector_index_suspended = True

    def _dead_run_left_deferral(self) -> None:
        """A deferral this run did not make, under the index lock: a bulk run died, and it had
        dropped the workspace's HNSW index too. Nothing else builds it when runs are ``kb index``
        (only a worker's index job defers the maintenance job), so this run builds it when it has
        finished (``_rebuild_vector_index``; kept when it is there, design §7, §8)."""
        self._vector_index_suspended = True

    def _finish(self, conn, workspace_id, head, report) -> None:
        with conn.transaction():
            conn.execute(queries["durable_commit"])  # and with it every earlier commit of the run
            if conn.execute(queries["term_stats_deferred"], {"workspace_id": workspace_id}).fetchone()["deferred"]:
                # this run's deferral, or one a run that died left (design §7): counted afresh
                # under the chunk lock, which orders it before the statistics and workspace rows
                chunk_lock(conn, workspace_id)
                self._recount_term_stats(conn, workspace_id)
                if not self._deferred_here:
                    self._dead_run_left_deferral()
            self._deferred_here = False
            conn.execute(queries["set_index_stamp"], {"workspace_id": workspace_id, "revision_id": head})
            if report.run_id is not None:
                conn.execute(queries["finish_index_run"], {"id": report.run_id})
            still = conn.execute(queries["documents_still_failed"], {"workspace_id": workspace_id}).fetchone()
        report.documents_still_failed = still["failed"]
        report.failed_attempts = still["attempts"]

    def _recount_term_stats(self, conn, workspace_id: int) -> None:
        """Count the workspace's term statistics afresh and end their deferral, in ``conn``'s
        transaction, which holds the workspace's chunk lock (``_finish``). The two halves read
        nothing the other writes (migration 0032): the document half runs on a second connection
        of the run, in its own transaction, while this one counts the chunk half, so the serial end
        of a bulk run takes the longer half, not their sum (design §7). The deferral ends here,
        after both: when either half fails nothing ends it, and the next run or the sweep counts
        the workspace again (a document half committed alone is counted afresh then)."""
        params = {"workspace_id": workspace_id}
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-index-recount") as pool:
            documents = pool.submit(self._recount_document_terms, workspace_id)
            conn.execute(queries["recount_chunk_term_stats"], params)
        documents.result()  # the pool's end waited for it: nothing of it outlives the chunk lock
        conn.execute(queries["end_term_stats_deferral"], params)

    def _recount_document_terms(self, workspace_id: int) -> None:
        """The document half of ``_recount_term_stats``, on a connection of its own (opened here,
        off the thread that holds the chunk lock), committed by itself."""
        with self._run_connection() as conn:
            conn.execute(queries["recount_document_term_stats"], {"workspace_id": workspace_id})

    # -- one batch of documents ----------------------------------------------------------
    def _prepare(self, repo: Repository, row: dict, read: Callable[[dict], bytes] | None = None) -> _Prepared:
        """Read (with ``read``, else from ``repo``), cut and hash one document. Its language is
        left to detect (``text``): by ``_existing_rows`` when the document has chunk rows, whose
        reuse depends on it, else by the writer when it builds the rows (``_detect``), off the
        thread that cuts and embeds."""
        try:
            data = read(row) if read is not None else repo.blob(row["content_id"])
        except Exception as exc:  # one document's failure never stops the others (§7)
            return _Prepared(row=row, error=error_text(exc))
        return self._cut(row, data)

    def _cut(self, row: dict, data: bytes) -> _Prepared:
        """Cut and hash one document's bytes in this process (kb.index.cutting)."""
        title = row.get("title") or ""
        return _Prepared.of(row, cut_document(self.chunker, self.settings.max_index_bytes, title, data))

    def _detect(self, prepared: list[_Prepared]) -> None:
        """Settle the text-search configurations ``_prepare`` left to the writer, the batch's
        languages detected together (kb.index.cutting.settle_languages)."""
        settle_languages(self.settings.fts_config, list(prepared))

    def text_config(self, text: str) -> str:
        """The text-search configuration for a document: ``KB_FTS_CONFIG``, or with ``auto`` the
        one of the document's detected language (kb.languages)."""
        return document_config(self.settings.fts_config, text)

    def _reusable(self, p: _Prepared, chunk_row: dict) -> bool:
        """A chunk row can be kept when its vector is of the active model and its tsv of the
        document's configuration, made from text that normalization does not change and with the
        current CJK segmentation (``cjk_current``, kb.languages.lexical_text); other rows are
        written again, their vectors from the cache."""
        return (
            chunk_row["embedding_model"] == self.embedder.model
            and chunk_row["text_config"] == p.text_config
            and p.lexically_stable
            and chunk_row["cjk_current"]
        )

    def _needed_hashes(self, p: _Prepared) -> list[str]:
        """Hashes of the chunks the reconciler must insert (no reusable row carries them)."""
        available = Counter(r["text_sha256"] for r in p.existing if self._reusable(p, r))
        needed = []
        for digest in p.hashes:
            if available[digest] > 0:
                available[digest] -= 1
            else:
                needed.append(digest)
        return needed

    def _embed(
        self, conn, texts_by_hash: dict[str, str], report: IndexReport
    ) -> tuple[dict[str, VectorBytes], dict[str, str]]:
        """``(vectors, errors)`` by hash: vectors (pgvector's binary form, kb.db.vector_wire) from the
        cache, then the embedder.

        Misses are embedded in batches of ``KB_EMBED_BATCH_SIZE`` and cached batch by batch (a
        killed run keeps what it paid for); in a run, the writer thread caches the call's vectors in
        one statement. A batch the embedder rejects is retried text by text,
        so only the poison text fails; NaN/inf rows are rejected per text.
        """
        model, dim = self.embedder.model, self.embedder.dim
        found: dict[str, VectorBytes] = {}
        errors: dict[str, str] = {}
        if not texts_by_hash:
            return found, errors
        vector_wire.register(conn)
        with conn.cursor(binary=True) as cur:  # cached vectors come back as they go in: unparsed
            for r in cur.execute(
                queries["cached_embeddings"], {"model": model, "dim": dim, "hashes": list(texts_by_hash)}
            ):
                found[r["text_sha256"]] = r["embedding"]
        report.embeddings_cached += len(found)
        missing = [h for h in texts_by_hash if h not in found]
        report.embeddings_due += len(missing)
        size = max(1, self.settings.embed_batch_size)
        fresh: list[tuple[str, VectorBytes]] = []
        try:
            for start in range(0, len(missing), size):
                self._embed_batch(missing[start : start + size], texts_by_hash, dim, report, found, errors, fresh)
                if fresh and self._cache_writes is None:  # outside a run: cached batch by batch
                    self._cache(conn, model, dim, fresh)
                    fresh = []
        finally:
            # in a run the writer thread caches the call's vectors, in one statement queued ahead of
            # their batch's write (one thread: in order), so this thread never waits for Postgres to
            # store them; what was paid for is handed over even when an embedder call stops the run
            if fresh and self._cache_writes is not None:
                self._cache_writes.append(self._writer.submit(self._cache, self._writer_conn, model, dim, fresh))
        return found, errors

    def _embed_batch(
        self,
        hashes: list[str],
        texts_by_hash: dict[str, str],
        dim: int,
        report: IndexReport,
        found: dict[str, VectorBytes],
        errors: dict[str, str],
        fresh: list[tuple[str, VectorBytes]],
    ) -> None:
        """One embedder call for the texts of ``hashes`` (text by text when it fails): their vectors
        into ``found`` and ``fresh`` (to cache), their failures into ``errors`` (``_embed``)."""
        try:
            groups = [(hashes, self.embedder.embed([texts_by_hash[h] for h in hashes]))]
            report.embeddings_computed += len(hashes)
        except Exception as exc:
            log.warning("embedding a batch of %d texts failed (%s); retrying one by one", len(hashes), exc)
            groups = []
            for h in hashes:
                report.embeddings_computed += 1
                try:
                    groups.append(([h], self.embedder.embed([texts_by_hash[h]])))
                except Exception as one_exc:
                    errors[h] = error_text(one_exc)
        for group, vectors in groups:
            try:
                problems = check_vectors(np.asarray(vectors), len(group), dim)
            except Exception as exc:
                errors.update({h: error_text(exc) for h in group})
                continue
            for h, packed, problem in zip(group, vectors_bytes(np.asarray(vectors)), problems):
                if problem is None and packed is not None:
                    found[h] = packed
                    fresh.append((h, packed))
                else:
                    errors[h] = f"EmbeddingError: {problem or 'a vector holds NaN or inf (as float4)'}"
        if self.progress:  # a batch of documents can embed for minutes: say so as it goes
            self.progress(report.documents_done, report.documents_total, report)

    @staticmethod
    def _cache(conn, model: str, dim: int, fresh: list[tuple[str, VectorBytes]]) -> None:
        """Cache ``fresh`` vectors (``(hash, vector)``) of ``model``/``dim`` in their own
        transaction on ``conn`` (on an autocommit connection, the one statement's own)."""
        vector_wire.register(conn)
        with contextlib.nullcontext() if conn.autocommit else conn.transaction():
            conn.execute(
                queries["cache_embeddings"],
                {
                    "model": model,
                    "dim": dim,
                    "text_sha256s": [h for h, _ in fresh],
                    "embeddings": [vector for _, vector in fresh],
                },
            )

    @staticmethod
    def _chunk_rows(conn, batch: list[dict]) -> dict[int, list[dict]]:
        """The chunk rows of ``batch``'s documents, by document id, in position order."""
        existing: dict[int, list[dict]] = {}
        for chunk_row in conn.execute(queries["chunks_of_documents"], {"document_ids": [row["id"] for row in batch]}):
            existing.setdefault(chunk_row["document_id"], []).append(chunk_row)
        return existing

    def _existing_rows(self, prepared: list[_Prepared], existing: dict[int, list[dict]]) -> None:
        """Give each cut document its chunk rows (``_chunk_rows``) and, when it has any, its
        text-search configuration now: whether a row can be reused depends on it (``_reusable``)."""
        for p in prepared:
            p.existing = existing.get(p.row["id"], [])
            if p.existing and p.writable and p.text is not None:
                text, p.text = p.text, None
                try:
                    p.text_config = self.text_config(text)
                except Exception as exc:  # fails this document alone (§7)
                    p.error = error_text(exc)

    def _stage_batch(
        self, conn, prepared: list[_Prepared], report: IndexReport, rows: Future[dict[int, list[dict]]]
    ) -> tuple[list[_Prepared], dict[str, VectorBytes]]:
        """Give a batch's cut documents their chunk rows (``rows``: read by the writer thread while
        they were cut, ``_run_documents``) and embed what no row or cache entry carries:
        ``(prepared documents, vectors by hash)``, ready for ``_write_staged`` (a document whose
        text failed to embed carries its error)."""
        self._existing_rows(prepared, rows.result())
        texts: dict[str, str] = {}
        for p in prepared:
            if p.writable:
                needed = set(self._needed_hashes(p))
                texts.update({h: e for h, e in zip(p.hashes, p.embedded) if h in needed})
        vectors, errors = self._embed(conn, texts, report)
        for p in prepared:
            if p.writable:
                bad = next((h for h in self._needed_hashes(p) if h not in vectors), None)
                if bad is not None:
                    p.error = errors.get(bad, "EmbeddingError: no vector for a chunk")
        return prepared, vectors

    def _write_staged(self, conn, workspace_id, head, prepared: list[_Prepared], vectors) -> IndexReport:
        """Write a staged batch on ``conn`` (the writer thread's): in one transaction, or document
        by document when that fails or a document already failed (design §7). Returns the write's
        counts and failures, which the run adds to its report once the write is done."""
        counts = IndexReport(workspace_id)
        self._detect(prepared)
        ready = [p for p in prepared if p.error is None]
        written = len(ready) > 1 and self._write_batch(conn, workspace_id, head, ready, vectors, counts)
        for p in prepared:
            if not written or p.error is not None:
                self._write_document(conn, workspace_id, head, p, vectors, counts)
        return counts

    def _write_batch(self, conn, workspace_id, head, batch: list[_Prepared], vectors, report: IndexReport) -> bool:
        """Write a batch's documents in one transaction, each statement once for the whole batch
        (rows locked together, chunk deletes, position updates and inserts pipelined, terms and
        stamps set together): the common case costs a handful of round trips and one commit per
        batch, not per document (the stamps too: ``mark_documents_indexed``, one statement). Gone and superseded documents are settled as in
        ``_write_document``. Returns False, with nothing written and ``report`` untouched, when
        anything fails: the caller then writes document by document, so one bad document is
        marked failed and the others go on (design §7)."""
        counts = IndexReport(workspace_id)
        try:
            # pipelined: the transaction's statements go out without waiting for each other's
            # answers (BEGIN and the locks wait only for the rows read; the writes, stamps and
            # COMMIT for the block's end), a few round trips per batch instead of one a statement
            with conn.pipeline(), conn.transaction():
                chunk_lock(conn, workspace_id)  # the lock order of _write_document, for every row at once
                now = {
                    r["id"]: (r["content_id"], r["path"])
                    for r in conn.execute(
                        queries["lock_indexed_documents"], {"document_ids": [p.row["id"] for p in batch]}
                    )
                }
                current, emptied = [], []
                for p in batch:
                    row = p.row
                    if row["id"] not in now:
                        counts.documents_gone += 1
                    elif now[row["id"]] != (row["content_id"], row["path"]):
                        counts.documents_superseded += 1
                    else:
                        current.append(p)
                        if p.unindexable is not None:
                            emptied.append(row["id"])
                leftover, updates, inserts = [], [], []
                for p in current:
                    if p.unindexable is None:
                        plan = self._plan_chunks(workspace_id, p, vectors, counts)
                        leftover += plan[0]
                        updates += plan[1]
                        inserts += plan[2]
                if emptied:
                    conn.execute(queries["delete_chunks_of_documents"], {"ids": emptied})
                self._write_chunks(conn, leftover, updates, inserts)
                if current:
                    conn.execute(queries["refresh_document_terms"], {"document_ids": [p.row["id"] for p in current]})
                    conn.execute(
                        queries["mark_documents_indexed"],
                        {
                            "document_ids": [p.row["id"] for p in current],
                            "content_ids": [p.row["content_id"] for p in current],
                            "paths": [p.row["path"] for p in current],
                            "statuses": ["indexed" if p.unindexable is None else "unindexable" for p in current],
                            "errors": [p.unindexable for p in current],
                            "revision_id": head,
                        },
                    )
        except Exception as exc:  # rolled back: document by document now, isolating the failure
            log.info("writing a batch of %d documents failed (%s); writing them one by one", len(batch), exc)
            return False
        counts.documents_unindexable = len(emptied)
        counts.documents_indexed = len(current) - len(emptied)
        for name in _WRITE_COUNTS:
            setattr(report, name, getattr(report, name) + getattr(counts, name))
        return True

    def _write_document(self, conn, workspace_id, head, p: _Prepared, vectors, report) -> None:
        row = p.row
        params = {"document_id": row["id"], "content_id": row["content_id"], "revision_id": head, "path": row["path"]}
        error = p.error
        if error is None:
            try:
                with conn.transaction():
                    # Lock order (kb.locks): chunk lock, this document's row, then its chunks and
                    # their statistics — as the projection, which may delete or change the row.
                    chunk_lock(conn, workspace_id)
                    now = conn.execute(queries["lock_indexed_document"], params).fetchone()
                    if now is None:
                        report.documents_gone += 1  # deleted since the run read it: nothing to index
                        return
                    if (now["content_id"], now["path"]) != (row["content_id"], row["path"]):
                        # moved or changed since the run read it: these chunks would describe
                        # other content or cite a path it no longer has; the document lags
                        # again and the next run (deferred by what changed it) indexes it
                        report.documents_superseded += 1
                        return
                    if p.unindexable is not None:
                        conn.execute(queries["delete_document_chunks"], params)
                        conn.execute(queries["refresh_document_terms"], {"document_ids": [row["id"]]})
                        conn.execute(
                            queries["mark_document_indexed"],
                            {**params, "status": "unindexable", "error": p.unindexable},
                        )
                        report.documents_unindexable += 1
                        return
                    self._reconcile(conn, workspace_id, p, vectors, report)
                    conn.execute(queries["refresh_document_terms"], {"document_ids": [row["id"]]})
                    conn.execute(queries["mark_document_indexed"], {**params, "status": "indexed", "error": None})
                    report.documents_indexed += 1
                    return
            except Exception as exc:  # the document's own transaction rolled back; the rest go on
                error = error_text(exc)
        with conn.transaction():
            marked = conn.execute(
                queries["mark_document_failed"],
                {"document_id": row["id"], "error": error[:2000], "max_attempts": self.settings.max_attempts},
            ).fetchone()
        if marked is None:  # deleted since the run read it: its failure no longer matters
            report.documents_gone += 1
            return
        report.documents_failed += 1
        report.failures[row["path"]] = error

    def _reconcile(self, conn, workspace_id, p: _Prepared, vectors, report) -> None:
        """Reuse chunk rows whose text is unchanged (updating position and spans), insert the new
        ones, delete the rest (design §7)."""
        self._write_chunks(conn, *self._plan_chunks(workspace_id, p, vectors, report))

    @staticmethod
    def _write_chunks(conn, leftover: list[int], updates: list[dict], inserts: list[dict]) -> None:
        """Carry out a plan of ``_plan_chunks`` (of one document or a batch's) in at most three
        statements: a delete, one multi-row update and one multi-row insert (the term-counting
        triggers are per statement, so they run once each, not once per chunk)."""
        if leftover:
            conn.execute(queries["delete_chunks"], {"ids": leftover})
        if updates:  # positions are not unique, so moving rows in any order is safe
            conn.execute(queries["update_chunk_positions"], _columns(updates, UPDATE_COLUMNS))
        if inserts:
            conn.execute(queries["insert_chunks"], _json_columns(inserts, INSERT_COLUMNS))

    def _plan_chunks(self, workspace_id, p: _Prepared, vectors, report) -> tuple[list[int], list[dict], list[dict]]:
        """``(chunk ids to delete, position updates, inserts)`` that bring one document's chunk rows
        to ``p.chunks``; counts ``chunks_reused``/``chunks_written`` into ``report``."""
        existing: dict[str, list[dict]] = {}
        stale: list[int] = []
        for chunk_row in p.existing:
            if self._reusable(p, chunk_row):
                existing.setdefault(chunk_row["text_sha256"], []).append(chunk_row)
            else:
                stale.append(chunk_row["id"])
        updates, inserts = [], []
        for chunk, digest, context in zip(p.chunks, p.hashes, p.contexts):
            span = {
                "position": chunk.position,
                "start_char": chunk.start_char,
                "end_char": chunk.end_char,
                "start_line": chunk.start_line,
                "end_line": chunk.end_line,
            }
            reusable = existing.get(digest)
            if reusable:
                old = reusable.pop(0)
                if any(old[k] != v for k, v in span.items()):
                    updates.append({"id": old["id"], **span})
                report.chunks_reused += 1
            else:
                inserts.append(
                    {
                        **span,
                        "document_id": p.row["id"],
                        "workspace_id": workspace_id,
                        "text": chunk.text,
                        "text_sha256": digest,
                        "token_count": chunk.token_count,
                        "model": self.embedder.model,
                        "embedding": vectors[digest],
                        "text_config": p.text_config,
                        "lexical_context": lexical_text(context),
                        "lexical_text": lexical_text(chunk.text),
                    }
                )
        leftover = stale + [r["id"] for rows in existing.values() for r in rows]
        report.chunks_written += len(inserts)
        return leftover, updates, inserts
