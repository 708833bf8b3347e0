"""Hybrid search (SPEC §8): one query embedding, a vector leg and a full-text leg over the
workspace's chunks, one global weighted reciprocal-rank fusion, grouped by document into envelopes
whose lines are the document's true lines at the indexed revision.

- Vector leg: exact cosine scan of the workspace's vectors of the active model (vectors are kept
  inline in the heap, so the scan reads no TOAST); it returns its limit whenever the workspace has
  that many chunks. A large workspace gets a partial HNSW index of its own (kb.vector_index),
  used with a fallback to the exact scan whenever it returns fewer rows than asked.
- Full-text leg: Okapi BM25 over Postgres tsvectors with term statistics kept per workspace and
  text configuration (sql/queries/search.sql ``lexical_leg``). The query is prepared like the
  documents (kb.languages: CJK bigrams) and parsed with every text configuration the workspace
  uses; each parse is scored against that configuration's chunks with its own statistics.
- Fusion: ``score = w_vector / (k + rank_vector) + w_text / (k + rank_text)`` with
  ``RRF_K``, ``VECTOR_WEIGHT`` / ``UNCOVERED_VECTOR_WEIGHT`` and ``TEXT_WEIGHT`` chosen on
  ``bin/eval_search.py`` (figures in docs/search-and-citations.md).
- Both legs run side by side, the lexical one on a second pooled connection in a thread, when
  the facade finds one idle (``kb.database.spare_pooled_connection``), else in one statement.
  It pays when a core is idle: facade, 200 queries, same results, interleaved with the
  one-statement path, load under 1.2: 10,000 chunks p50 14.8 → 13.5 ms, 100,000 chunks
  22.0 → 17.5 ms; with the other core busy (bin/bench_search.py right after its index builds,
  load 2.7) the two paths measured the same (15.3 vs 14.8, 18.0 vs 18.2 ms).
- Excerpts come from the document's blob at the indexed revision; blobs are immutable, so their
  lines are kept in a small per-process cache keyed by blob id.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from kb import vector_index
from kb.citations import Envelope, document_lines, excerpt_lines
from kb.embedding import Embedder, vector_literal
from kb.errors import InvalidInput
from kb.languages import language_share, lexical_text
from kb.repository import Repository
from kb.sql import queries

MAX_QUERY_CHARS = 4000
"""Longer queries are refused: Postgres' tsquery parser overflows its stack near 100k characters,
and the embedder reads only its first 256 tokens anyway."""
RRF_K = 10
"""Reciprocal-rank fusion constant (SPEC §8)."""
VECTOR_WEIGHT = 1.0
TEXT_WEIGHT = 0.5
UNCOVERED_VECTOR_WEIGHT = 0.25
"""The vector leg's weight for a query in a language the embedding model does not cover (the
embedder's ``languages``; MiniLM is English-only). Chosen on bin/eval_search.py's tune split
(``--split tune``; figures are reported on ``--split held-out``, never tuned on), BM25 leg of
this module fused at TEXT_WEIGHT 0.5, k 10, recall@5 by vector weight 0.01 / 0.1 / 0.25 / 0.35 /
0.5: German 0.534 / 0.548 / 0.562 / 0.551 / 0.540 (MiniLM still ranks German pages above chance:
vector leg alone 0.405), Russian 0.503 / 0.506 / 0.506 / 0.483 / 0.458. On English (tune split),
k 10 with weights 1.0 / 0.5 was within 0.007 of the best of the grid (k 5) and kept."""
COVERED_SHARE = 0.01
"""A query counts as in a language the model covers when those languages' share of the language
classifier's estimate reaches this. Picking the single likeliest language misread 6 % of the
English tldr queries ("A Python code linter": Latin) and so dropped their vector leg; on the
eval's pairs a share of 0.01 keeps all but 1 of 907 English queries and drops all Russian,
Japanese and Chinese ones and all but 8 of 907 German and 2 of 861 Arabic ones."""
LEG_LIMIT = 100
"""Chunks each leg contributes to the fusion (at least 4 k)."""
EXCERPTS_PER_DOCUMENT = 3

BM25_K1 = 1.2
BM25_B = 0.75
TITLE_WEIGHT = 2.0
"""Term frequency of one occurrence in a chunk's context line (title and heading path, weight A in
its tsvector); one in the body counts 1."""
SELECTIVE_CHUNKS = 200
SELECTIVE_SHARE = 0.005
"""A query term held by at most max(SELECTIVE_CHUNKS, SELECTIVE_SHARE × chunks) chunks selects the
lexical leg's candidates (with the rarest term and the chunks holding every term); commoner terms
only add to the scores. Measured on bin/bench_search.py's 10,000-chunk workspace: 1,000 / 2 %
scored a median of 529 candidates in 26 ms, 200 / 0.5 % scored 169 in 2.2 ms."""


@dataclass
class _Group:
    row: dict
    score: float
    spans: list[tuple[int, int]] = field(default_factory=list)
    unnumbered: list[str] = field(default_factory=list)


def check_query(query: object, k: object) -> None:
    """Raise InvalidInput unless ``query`` is non-blank text of at most MAX_QUERY_CHARS without NUL
    or lone surrogates, and ``k`` an int from 1 to 100."""
    if not isinstance(query, str):
        raise InvalidInput(f"the query must be text, not {type(query).__name__}")
    if not query.strip():
        raise InvalidInput("the query is empty; say what to search for")
    if "\x00" in query:
        raise InvalidInput("the query contains a NUL character; remove it")
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("the query is not valid Unicode (lone surrogate)") from None
    if len(query) > MAX_QUERY_CHARS:
        raise InvalidInput(f"the query has {len(query)} characters; shorten it to {MAX_QUERY_CHARS}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 100:
        raise InvalidInput(f"k must be a whole number from 1 to 100, got {k!r}")


def vector_weight(embedder: Embedder, query: str) -> float:
    """``VECTOR_WEIGHT``, or ``UNCOVERED_VECTOR_WEIGHT`` when the query is almost surely not in a
    language the embedder covers (``embedder.languages``; None or absent: every language): their
    share in the language classifier's estimate is below ``COVERED_SHARE``."""
    covered = getattr(embedder, "languages", None)
    if covered is None or language_share(query, frozenset(covered)) >= COVERED_SHARE:
        return VECTOR_WEIGHT
    return UNCOVERED_VECTOR_WEIGHT


def _vector_statement(conn: psycopg.Connection, workspace_id: int, model: str) -> tuple[sql.Composable, bool]:
    """The vector leg statement for the workspace (approximate when it has a recorded HNSW index)."""
    index = vector_index.recorded_index(conn, workspace_id, model)
    if index is None:
        return sql.SQL(queries["vector_leg"].rstrip().rstrip(";")), False
    return vector_index.approximate_statement(index, workspace_id, model), True


def _lexical_params(query: str) -> dict:
    return {"query": lexical_text(query), "k1": BM25_K1, "b": BM25_B, "title_weight": TITLE_WEIGHT,
            "selective_chunks": SELECTIVE_CHUNKS, "selective_share": SELECTIVE_SHARE}


def vector_leg(conn: psycopg.Connection, workspace_id: int, model: str, vector, limit: int) -> list[int]:
    """Chunk ids of the workspace nearest to ``vector`` (a float array), best first, at most
    ``limit`` (exactly ``limit`` when the workspace has that many chunks of ``model``).

    Through the workspace's HNSW index when one is recorded (kb.vector_index), else — and whenever
    the index returns fewer than ``limit`` rows — by the exact scan.
    """
    params = {"workspace_id": workspace_id, "model": model, "embedding": vector_literal(vector), "limit": limit}
    statement, approximate = _vector_statement(conn, workspace_id, model)
    if approximate:
        with conn.transaction():
            vector_index.scan_settings(conn, limit)
            ids = [row["id"] for row in conn.execute(statement, params)]
        if len(ids) >= limit:
            return ids
    return [row["id"] for row in conn.execute(queries["vector_leg"], params)]


def lexical_leg(conn: psycopg.Connection, workspace_id: int, query: str, limit: int) -> list[int]:
    """Chunk ids of the workspace ranked by BM25 for ``query``, best first, at most ``limit``
    (fewer when fewer chunks hold a query term)."""
    rows = conn.execute(
        queries["lexical_leg"], {"workspace_id": workspace_id, "limit": limit, **_lexical_params(query)},
    ).fetchall()
    return [row["id"] for row in rows]


def fuse(legs: list[tuple[float, list[int]]], rrf_k: float = RRF_K) -> list[tuple[int, float]]:
    """Weighted reciprocal-rank fusion of ranked id lists ``[(weight, ids), ...]``:
    ``score(id) = Σ weight / (rrf_k + rank)`` with 1-based ranks; best first, ties by id."""
    scores: dict[int, float] = {}
    for weight, ids in legs:
        for rank, chunk_id in enumerate(ids, start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weight / (rrf_k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def _candidates(conn: psycopg.Connection, workspace_id: int, model: str, vector_text: str, query: str,
                limit: int) -> list[dict]:
    """Both legs' chunks with their ranks and envelope fields from one statement (``_fetch``); the
    exact vector leg again if the index came back short."""
    params = {"workspace_id": workspace_id, "model": model, "embedding": vector_text, "limit": limit,
              **_lexical_params(query)}
    template = sql.SQL(queries["search_candidates"].rstrip().rstrip(";"))
    lexical = sql.SQL(queries["lexical_leg"].rstrip().rstrip(";"))
    statement, approximate = _vector_statement(conn, workspace_id, model)
    rows = _fetch(conn, template.format(vector_leg=statement, lexical_leg=lexical), params,
                  hnsw_limit=limit if approximate else None)
    if approximate and sum(1 for r in rows if r["vector_rank"] is not None) < limit:
        exact = sql.SQL(queries["vector_leg"].rstrip().rstrip(";"))
        rows = _fetch(conn, template.format(vector_leg=exact, lexical_leg=lexical), params)
    return rows


_VECTOR_ORDER = sql.SQL("l.distance, l.id")
_TEXT_ORDER = sql.SQL("l.score DESC, l.id")


def _leg_rows(conn: psycopg.Connection, leg: sql.Composable, order: sql.Composable, params: dict,
              hnsw_limit: int | None = None) -> list[dict]:
    """One leg's rows (``leg_envelopes``): chunk id, rank in the leg, envelope fields."""
    template = sql.SQL(queries["leg_envelopes"].rstrip().rstrip(";"))
    return _fetch(conn, template.format(leg=leg, order=order), params, hnsw_limit=hnsw_limit)


def _vector_rows(conn: psycopg.Connection, workspace_id: int, model: str, params: dict, limit: int) -> list[dict]:
    """The vector leg's rows, through the workspace's HNSW index when one is recorded and by the
    exact scan when there is none or it came back short."""
    statement, approximate = _vector_statement(conn, workspace_id, model)
    rows = _leg_rows(conn, statement, _VECTOR_ORDER, params, hnsw_limit=limit if approximate else None)
    if approximate and len(rows) < limit:
        exact = sql.SQL(queries["vector_leg"].rstrip().rstrip(";"))
        rows = _leg_rows(conn, exact, _VECTOR_ORDER, params)
    return rows


_executor: ThreadPoolExecutor | None = None
_executor_pid = 0
_executor_lock = threading.Lock()


def _leg_executor() -> ThreadPoolExecutor:
    """The process' threads for the side leg (made again in a forked child, whose copy of the
    parent's executor has no threads)."""
    global _executor, _executor_pid
    with _executor_lock:
        if _executor is None or _executor_pid != os.getpid():
            from kb.database import POOL_MAX_SIZE

            _executor = ThreadPoolExecutor(max_workers=POOL_MAX_SIZE, thread_name_prefix="kb-search-leg")
            _executor_pid = os.getpid()
        return _executor


def _candidates_side_by_side(conn: psycopg.Connection, side: psycopg.Connection, workspace_id: int,
                             model: str, vector_text: str, query: str, limit: int) -> list[dict]:
    """What ``_candidates`` returns, with the lexical leg on ``side`` in a thread while the vector
    leg runs on ``conn``: Postgres runs a statement on one core, so two legs on two connections
    take about as long as the slower one. Each leg reads its own snapshot; ``envelopes`` keeps a
    document's excerpts to the indexed blob of its first row, so a document re-indexed between
    the two reads never mixes line spans of two versions."""
    params = {"workspace_id": workspace_id, "model": model, "embedding": vector_text, "limit": limit,
              **_lexical_params(query)}
    lexical = sql.SQL(queries["lexical_leg"].rstrip().rstrip(";"))
    text_future = _leg_executor().submit(_leg_rows, side, lexical, _TEXT_ORDER, params)
    try:
        vector_rows = _vector_rows(conn, workspace_id, model, params, limit)
    except BaseException:
        text_future.exception()  # wait: ``side`` goes back to the pool only once its leg is done
        raise
    rows: dict[int, dict] = {}
    for r in vector_rows:
        rows[r["chunk_id"]] = {**r, "vector_rank": r["rank"], "text_rank": None}
    for r in text_future.result():
        known = rows.get(r["chunk_id"])
        if known is not None:
            known["text_rank"] = r["rank"]
        else:
            rows[r["chunk_id"]] = {**r, "vector_rank": None, "text_rank": r["rank"]}
    return list(rows.values())


def _fetch(conn: psycopg.Connection, statement: sql.Composable, params: dict,
           hnsw_limit: int | None = None) -> list[dict]:
    """Rows of ``statement`` in a transaction of its own (a savepoint inside an open one), with
    the HNSW settings local to it when ``hnsw_limit`` is given; a pooled connection goes back idle.

    Plain round trips, not a pipeline: on a local socket each costs a fraction of a millisecond,
    and psycopg's pipeline mode measured slower (same run, order rotated per query, load ~12 on
    2 cores, 10,000-chunk workspace: pipelined transaction p50 69.6 ms, plain transaction 62.8 ms,
    settings and statement pipelined then COMMIT 64.2 ms)."""
    with conn.transaction():
        if hnsw_limit is not None:
            vector_index.scan_settings(conn, hnsw_limit)
        return conn.execute(statement, params).fetchall()


class BlobLines:
    """Lines of blobs by (repository, blob id), the most recently used kept up to ``max_chars``
    characters in all (blobs never change, so an entry is never stale). Bounded by size rather
    than count: a search reads up to k blobs, and a process serving searches keeps its hot
    documents (the default, 16 M characters, holds every page of the tldr corpus)."""

    def __init__(self, max_chars: int = 16_000_000) -> None:
        self.max_chars = max_chars
        self._lines: OrderedDict[tuple[str, str], tuple[list[str], int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, repo: Repository, blob_id: str) -> list[str]:
        """``document_lines`` of the blob; raises what ``repo.blob`` raises."""
        key = (str(repo.path), blob_id)
        with self._lock:
            entry = self._lines.get(key)
            if entry is not None:
                self._lines.move_to_end(key)
                return entry[0]
        lines = document_lines(repo.blob(blob_id))
        size = sum(map(len, lines)) + len(lines)
        with self._lock:
            if key not in self._lines and size <= self.max_chars:
                self._lines[key] = (lines, size)
                self._chars += size
                while self._chars > self.max_chars:
                    self._chars -= self._lines.popitem(last=False)[1][1]
        return lines


blob_lines = BlobLines()


def search(
    conn: psycopg.Connection,
    repo: Repository,
    embedder: Embedder,
    workspace_id: int,
    query: str,
    k: int = 5,
    side: psycopg.Connection | None = None,
) -> list[Envelope]:
    """Top ``k`` documents for ``query`` as excerpt envelopes, best first, cites numbered 1..k.

    A document's score is its best chunk's fused score; several chunks of one document collapse
    into one envelope (its best ``EXCERPTS_PER_DOCUMENT`` excerpts). ``side``: a second idle
    connection to the same database; the lexical leg then runs on it while the vector leg runs on
    ``conn`` (``_candidates_side_by_side``), else both run in one statement on ``conn``. Either
    way the connections come back idle. Raises InvalidInput for a bad query or k (``check_query``).
    """
    check_query(query, k)
    vector = embedder.embed([query])[0]
    limit = max(LEG_LIMIT, 4 * k)
    if side is None:
        rows = _candidates(conn, workspace_id, embedder.model, vector_literal(vector), query, limit)
    else:
        rows = _candidates_side_by_side(conn, side, workspace_id, embedder.model, vector_literal(vector),
                                        query, limit)
    by_vector = sorted((r for r in rows if r["vector_rank"] is not None), key=lambda r: r["vector_rank"])
    by_text = sorted((r for r in rows if r["text_rank"] is not None), key=lambda r: r["text_rank"])
    fused = fuse([(vector_weight(embedder, query), [r["chunk_id"] for r in by_vector]),
                  (TEXT_WEIGHT, [r["chunk_id"] for r in by_text])])
    return envelopes(repo, {r["chunk_id"]: r for r in rows}, fused, k)


def envelopes(repo: Repository, rows: dict[int, dict], fused: list[tuple[int, float]], k: int) -> list[Envelope]:
    """Group fused ``(chunk id, score)`` pairs (best first) into the top ``k`` documents'
    excerpt envelopes; ``rows`` holds each chunk's envelope fields by chunk id."""
    groups: dict[int, _Group] = {}
    for chunk_id, score in fused:
        row = rows[chunk_id]
        group = groups.get(row["document_id"])
        if group is None:
            if len(groups) >= k:
                continue
            group = groups[row["document_id"]] = _Group(row, score)
        if len(group.spans) + len(group.unnumbered) >= EXCERPTS_PER_DOCUMENT:
            continue
        if row["indexed_content_id"] != group.row["indexed_content_id"]:
            continue  # read in another snapshot, after the document was re-indexed: other lines
        if row["start_line"] is None:
            group.unnumbered.append(row["text"])
        else:
            group.spans.append((row["start_line"], row["end_line"]))
    result = []
    for cite, group in enumerate(groups.values(), start=1):
        row = group.row
        envelope = Envelope(row["path"], row["title"], row["indexed_revision"], "excerpts",
                            cite=cite, score=round(group.score, 6), content_id=row["indexed_content_id"])
        if group.spans:
            envelope.lines = excerpt_lines(blob_lines.get(repo, row["indexed_content_id"]), group.spans)
        envelope.lines += [(None, line) for text in group.unnumbered for line in text.split("\n")]
        result.append(envelope)
    return result
