"""Span fill: converging adopted legacy chunks to true spans (design §9).

Adopted chunks (``kb.seed``) carry vectors but no spans, so search renders them un-numbered. The
span fill aligns each document's stored chunk texts against its git blob at HEAD in position order
— a cursor scan: chunk *k* is looked up at or after the end of chunk *k-1*, so a repeated
paragraph maps to the occurrence in the same order — and writes character offsets and line spans
with kb's one line counter, the chunker's (``kb.lines.line_starts`` / ``line_of``; the span covers the
chunk's non-blank content, as the chunker's spans do).

All or nothing per document: if one chunk is not found in order (the body was edited after the
chunks were cut) the document keeps document-level citations and is recorded in
``kb.span_fill_skips`` at that content, so it is not retried until its content changes (the indexer
then replaces its chunks anyway). A row is only updated while it still lacks spans and its document
is still indexed at the aligned content, so no path writes a confidently wrong line number.

Runs walk flipped workspaces most-used first, in batches of ``batch_documents``, sleeping
``throttle_ms`` between batches; both live in the one-row ``kb.span_fill_control`` table, with
``paused``, re-read before every batch (a DBA's ``UPDATE kb.span_fill_control SET paused = true``
stops a run within one batch). Each batch commits on its own, so a killed run loses at most one
batch and the next run continues where it left off. Progress: ``kb.span_fill_runs``, the view
``kb.span_backlog``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from psycopg.rows import tuple_row

from kb.db import database
from kb.db.locks import chunk_lock
from kb.db.sql import queries
from kb.errors import DocumentNotFound
from kb.lines import line_of, line_starts
from kb.store.homes import own_workspace_ids

if TYPE_CHECKING:
    from kb.store.stores import Stores

SPAN_FILL_TASK = "kb.span_fill"


@dataclass(frozen=True)
class Span:
    """A chunk's place in its document: character offsets (``text[start_char:end_char]`` is the
    chunk) and 1-based inclusive line numbers of its non-blank content."""

    start_char: int
    end_char: int
    start_line: int
    end_line: int


def align_chunks(text: str, chunk_texts: Sequence[str]) -> list[Span] | None:
    """Align ``chunk_texts`` (in position order) against ``text`` with a forward cursor scan.

    Returns one Span per chunk, or None when any chunk is blank or not found at or after the end
    of the previous one (the document is stale: all or nothing).
    """
    starts = line_starts(text)
    cursor = 0
    spans: list[Span] = []
    for chunk in chunk_texts:
        content = chunk.strip()
        if not content:
            return None
        found = text.find(chunk, cursor)
        if found < 0:
            return None
        end = found + len(chunk)
        first = found + (len(chunk) - len(chunk.lstrip()))
        last = first + len(content) - 1
        spans.append(Span(found, end, line_of(starts, first), line_of(starts, last)))
        cursor = end
    return spans


@dataclass
class SpanFillReport:
    """What one run did: per-workspace counts, whether it stopped for a pause, batches written."""

    workspaces: list[int] = field(default_factory=list)
    documents_filled: int = 0
    documents_stale: int = 0
    chunks_filled: int = 0
    batches: int = 0
    paused: bool = False
    yielded: bool = False
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "workspaces": self.workspaces,
            "documents_filled": self.documents_filled,
            "documents_stale": self.documents_stale,
            "chunks_filled": self.chunks_filled,
            "batches": self.batches,
            "paused": self.paused,
            "yielded": self.yielded,
            "seconds": round(self.seconds, 3),
        }


class SpanFill:
    """The span fill of one knowledge base (``kb.span_fill()``; CLI ``kb spans``)."""

    def __init__(self, stores: Stores) -> None:
        self.stores = stores

    def status(self, workspace_id: int | None = None) -> dict:
        """``{"control": {paused, batch_documents, throttle_ms, updated_at}, "backlog": [rows of
        kb.span_backlog]}``."""
        with database.transaction(self.stores.database_url) as conn:
            return {
                "control": conn.execute(queries["span_fill_control"]).fetchone(),
                "backlog": conn.execute(queries["span_backlog"], {"workspace_id": workspace_id}).fetchall(),
            }

    def pause(self) -> dict:
        """Pause: a running fill stops before its next batch (the same as the DBA's UPDATE)."""
        return self._set_paused(True)

    def resume(self) -> dict:
        """Resume: the next run (periodic, ``run()`` or ``kb spans run-once``) continues."""
        return self._set_paused(False)

    def _set_paused(self, paused: bool) -> dict:
        with database.transaction(self.stores.database_url) as conn:
            return conn.execute(queries["set_span_fill_paused"], {"paused": paused}).fetchone()

    def defer(self) -> int | None:
        """Queue one run for a worker (queue ``span_fill``); the job id, None if one is waiting."""
        with database.transaction(self.stores.database_url) as conn:
            row = conn.execute(
                queries["defer_span_fill"],
                {"task": SPAN_FILL_TASK, "args": json.dumps({"timestamp": int(time.time())})},
            ).fetchone()
        return row["id"] if row else None

    def run(
        self,
        workspace_id: int | None = None,
        *,
        max_batches: int | None = None,
        max_seconds: float | None = None,
        progress: Callable[[SpanFillReport], None] | None = None,
    ) -> SpanFillReport:
        """Fill spans of flipped workspaces (or one) until the backlog is empty, a pause, or a
        budget (``max_batches`` batches, ``max_seconds`` seconds) is spent. Returns the counts;
        ``paused`` says it stopped for a pause, ``yielded`` that a budget ran out with work left."""
        started = time.perf_counter()
        self._deadline = None if max_seconds is None else time.monotonic() + max_seconds
        report = SpanFillReport()
        with database.connect(self.stores.database_url, autocommit=True) as conn:
            workspaces = [
                r["workspace_id"] for r in conn.execute(queries["span_fill_workspaces"], {"workspace_id": workspace_id})
            ]
            if workspace_id is None:  # the periodic run: the workspaces homed on this node (design §15)
                own = set(own_workspace_ids(self.stores.settings, self.stores.database_url))
                workspaces = [ws for ws in workspaces if ws in own]
            for ws in workspaces:
                report.workspaces.append(ws)
                if not self._fill_workspace(conn, ws, report, max_batches, progress):
                    break
        report.seconds = time.perf_counter() - started
        return report

    def _fill_workspace(
        self,
        conn,
        ws: int,
        report: SpanFillReport,
        max_batches: int | None,
        progress: Callable[[SpanFillReport], None] | None,
    ) -> bool:
        """One workspace, batch by batch; False when the run must stop (pause, batch budget)."""
        repo = self.stores.store(ws).repository
        with conn.transaction():
            run_id = conn.execute(queries["start_span_fill_run"], {"workspace_id": ws}).fetchone()["id"]
            conn.execute(queries["interrupt_span_fill_runs"], {"workspace_id": ws, "keep_id": run_id})
        after, status, go_on = 0, "finished", True
        while True:
            control = conn.execute(queries["span_fill_control"]).fetchone()
            if control["paused"]:
                report.paused, status, go_on = True, "paused", False
                break
            if (max_batches is not None and report.batches >= max_batches) or (
                self._deadline is not None and time.monotonic() >= self._deadline
            ):
                report.yielded, status, go_on = True, "yielded", False
                break
            batch = conn.execute(
                queries["span_fill_batch"], {"workspace_id": ws, "after_id": after, "limit": control["batch_documents"]}
            ).fetchall()
            if not batch:
                break
            self._fill_batch(conn, ws, repo, batch, run_id, report)
            after = batch[-1]["id"]
            if progress:
                progress(report)
            if control["throttle_ms"]:
                time.sleep(control["throttle_ms"] / 1000)
        conn.execute(queries["finish_span_fill_run"], {"id": run_id, "status": status})
        return go_on

    def _fill_batch(self, conn, ws: int, repo, batch: list[dict], run_id: int, report: SpanFillReport) -> None:
        chunks: dict[int, list[tuple]] = {}  # document id -> [(chunk id, text, start_line)] in order
        with conn.cursor(row_factory=tuple_row) as cur:
            for chunk_id, document_id, _, text, start_line in cur.execute(
                queries["span_fill_chunks"], {"document_ids": [d["id"] for d in batch]}
            ):
                chunks.setdefault(document_id, []).append((chunk_id, text, start_line))
        columns: dict[str, list] = {
            k: [] for k in ("ids", "start_chars", "end_chars", "start_lines", "end_lines", "content_ids")
        }
        stale: list[dict] = []
        filled = 0
        for document in batch:
            rows = chunks.get(document["id"], [])
            reason = None
            try:
                text = repo.blob(document["content_id"]).decode("utf-8")
                spans = align_chunks(text, [r[1] for r in rows])
                if spans is None:
                    reason = "chunk texts no longer match the document in order"
            except (UnicodeDecodeError, DocumentNotFound) as exc:
                reason, spans = f"blob unreadable: {exc}", None
            if spans is None:
                stale.append(
                    {
                        "document_id": document["id"],
                        "workspace_id": ws,
                        "content_id": document["content_id"],
                        "reason": reason,
                    }
                )
                continue
            filled += 1
            for (chunk_id, _, start_line), span in zip(rows, spans):
                if start_line is not None:
                    continue
                columns["ids"].append(chunk_id)
                columns["start_chars"].append(span.start_char)
                columns["end_chars"].append(span.end_char)
                columns["start_lines"].append(span.start_line)
                columns["end_lines"].append(span.end_line)
                columns["content_ids"].append(document["content_id"])
        with conn.transaction():
            # Lock order (kb.locks): the chunk lock first. The fill locks many documents' chunk
            # rows in one statement and a skip then locks (key share) document rows; a projection
            # deletes documents one by one, each cascading to its chunks.
            chunk_lock(conn, ws)
            updated = conn.execute(queries["fill_spans"], columns).rowcount if columns["ids"] else 0
            if stale:
                with conn.cursor() as cur:
                    cur.executemany(queries["skip_stale_document"], stale)
            conn.execute(
                queries["update_span_fill_run"],
                {"id": run_id, "filled": filled, "stale": len(stale), "chunks": updated},
            )
        report.documents_filled += filled
        report.documents_stale += len(stale)
        report.chunks_filled += updated
        report.batches += 1
