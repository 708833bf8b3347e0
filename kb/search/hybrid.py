"""Hybrid search (design §8): one query embedding, a vector leg and two full-text legs (chunks and
whole documents), one weighted reciprocal-rank fusion of the documents they rank, and envelopes
whose lines are the document's true lines at the indexed revision.

- Vector leg: exact cosine scan of the workspace's vectors of the active model (vectors are kept
  inline in the heap, so the scan reads no TOAST); it returns its limit whenever the workspace has
  that many chunks. A large workspace gets a partial HNSW index of its own (kb.vector_index),
  used with a fallback to the exact scan whenever it returns fewer rows than asked.
- Chunk leg: Okapi BM25 over the chunks' Postgres tsvectors with term statistics kept per
  workspace and text configuration (sql/queries/search.sql ``lexical_leg``). The query is
  prepared like the documents (kb.languages.lexical_query: CJK bigrams, and single characters
  for a Chinese query) and parsed with every text
  configuration the workspace uses; each parse is scored against that configuration's chunks with
  its own statistics.
- Document leg: the same BM25 over whole documents (kb.document_terms, built from the chunks,
  with statistics of its own; migration 0018): a query whose words are spread over a page's
  sections matches the page better than any one chunk.
- Fusion, per document: each leg ranks documents (a chunk leg by each document's best chunk), and
  ``score = Σ w_leg / (k + rank_leg)`` with ``RRF_K``, ``VECTOR_WEIGHT`` /
  ``UNCOVERED_VECTOR_WEIGHT``, ``TEXT_WEIGHT`` and ``DOCUMENT_WEIGHT`` chosen on
  ``bin/eval_search.py`` (figures in docs/search-and-citations.md). A document's excerpts are its
  chunks the chunk legs returned, best fused first.
- All legs run in one statement on one pooled connection. Running the lexical legs on a second
  connection in a thread, beside the vector leg, was measured and removed: with each leg one
  round trip of 1–3 ms, the thread and the second checkout cost more than the overlap saved on
  2 cores (bin/bench_search.py, four runs, 10,000 chunks p50 0.6–0.8 ms slower, p95 mixed; at
  100,000 chunks alike), and each search held two of the pool's connections.
- Excerpts come from the document's blob at the indexed revision; blobs are immutable, so their
  lines are kept in a small per-process cache keyed by blob id.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import psycopg
from psycopg import sql

from kb.citations.envelope import Envelope, document_lines, excerpt_lines
from kb.db.sql import composable
from kb.errors import InvalidInput
from kb.git.repository import Repository
from kb.index import vector_index
from kb.index.embedding import Embedder, query_vector, vector_literal
from kb.index.languages import detect_language, language_share, lexical_query

if TYPE_CHECKING:
    from kb.db.database import Connection

MAX_QUERY_CHARS = 4000
"""Longer queries are refused: Postgres' tsquery parser overflows its stack near 100k characters,
and the embedder reads only its first 256 tokens anyway."""
RRF_K = 5
"""Reciprocal-rank fusion constant (design §8)."""
VECTOR_WEIGHT = 1.0
TEXT_WEIGHT = 0.5
DOCUMENT_WEIGHT = 0.5
UNCOVERED_VECTOR_WEIGHT = 0.1
"""The leg weights and k, one setting for every language, chosen on bin/eval_search.py's tune
split (``--split tune --dump DIR``, then a grid of weights and k over the dumped rankings;
figures are reported on ``--split held-out``, never tuned on). UNCOVERED_VECTOR_WEIGHT replaces
VECTOR_WEIGHT for a query in a language the embedding model does not cover (the embedder's
``languages``; MiniLM is English-only: its vector leg alone finds 0.18–0.27 recall@5 on Russian,
Arabic, Japanese and Chinese pages, 0.41 on German). Recall@5 minus the better of BM25 (bm25s)
and the vector leg, tune split, en / de / ru / ar / ja / zh-TW: these settings +0.013 / +0.022 /
+0.020 / +0.020 / +0.003 / +0.022, the best mean of the grid (0.017); text and document 0.25
+0.024 / +0.027 / +0.008 / +0.014 / 0.000 / 0.000 (mean 0.012); without the document leg at its
best (text 0.5, uncovered 0.25, k 10) +0.013 / +0.030 / −0.017 / −0.020 / −0.020 / −0.011.
Weighting scores instead of ranks (min-max or z-normalised BM25 and cosine) did no better.
The two full-text legs together weigh as much as the vector leg: a document that both rank first
(a word found in that document alone) scores at least what the vector leg's first gets, so it
comes first however the model embeds the word; at 0.25 each it could not enter the top 5 of an
English query (a new user's walkthrough: "Zorblaxian", in one page of 347, came 7th)."""
COVERED_SHARE = 0.01
"""A query counts as in a language the model covers when those languages' share of the language
classifier's estimate reaches this. Picking the single likeliest language misread 6 % of the
English tldr queries ("A Python code linter": Latin) and so dropped their vector leg; on the
eval's pairs a share of 0.01 keeps all but 1 of 907 English queries and drops all Russian,
Japanese and Chinese ones and all but 8 of 907 German and 2 of 861 Arabic ones."""
LEG_LIMIT = 100
"""Chunks each leg contributes to the fusion (at least 4 k)."""
WIDEN_FACTOR = 4
"""When the legs' chunks name fewer than k documents and the workspace has more vectors, the
search asks again for this many times more (design §8: k results)."""
EXCERPTS_PER_DOCUMENT = 3

BM25_K1 = 1.2
BM25_B = 0.75
TITLE_WEIGHT = 2.0
"""Term frequency of one occurrence in a chunk's context line (title and heading path, weight A in
its tsvector); one in the body counts 1."""
MAX_QUERY_TERMS = 64
"""A lexical leg scores a query's rarest terms, at most this many per text configuration (the
common ones of a very long query add little to BM25 and cost much: Lucene's MoreLikeThis keeps 25).
The eval's queries (sentences) stay under it."""
SELECTIVE_UNITS = 200
SELECTIVE_SHARE = 0.005
"""A query term held by at most max(SELECTIVE_UNITS, SELECTIVE_SHARE × units) chunks (documents in
the document leg) selects the lexical leg's candidates (with the rarest term and the units holding
every term); commoner terms only add to the scores. Measured on bin/bench_search.py's 10,000-chunk workspace: 1,000 / 2 %
scored a median of 529 candidates in 26 ms, 200 / 0.5 % scored 169 in 2.2 ms."""


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


@dataclass(frozen=True)
class Fusion:
    """The weights of one search's legs and its reciprocal-rank constant."""

    vector: float = VECTOR_WEIGHT
    text: float = TEXT_WEIGHT
    document: float = DOCUMENT_WEIGHT
    rrf_k: float = RRF_K


DEFAULT_FUSION = Fusion()
LANGUAGE_FUSION: dict[str, dict[str, Fusion]] = {
    "usem3-": {
        "en": Fusion(0.5, 0.25, 0.5, 2),
        "de": Fusion(0.5, 0.5, 0.25, 5),
        "ar": Fusion(1.0, 0.25, 0.75, 20),
        "ja": Fusion(0.5, 0.25, 0.75, 20),
    },
}
"""Fusion per model and query language (design §8): ``{model prefix: {language: Fusion}}``, the
rows bin/eval_search.py chose (``--model use-m3 --split tune --grid``, all tune pairs; a
language's row is the grid's best among those whose full-text legs together weigh at least the
vector leg — the rule of the defaults, so a word only one document holds still puts it first —
where it beats the defaults there by at least ``MIN_FUSION_GAIN`` of recall@5, ties to the first
in grid order). USE, tune split, recall@5 with the defaults → with its row: en .835 → .856, de
.573 → .600, ar .527 → .541; ru's best gained .009 (defaults kept). Chosen again for ja and zh-TW
after their pages gained CJK characters beside the bigrams (kb.languages.lexical_text): ja .552 →
.580 with its new row (the earlier row .570), zh-TW .674 with the defaults, which its earlier row
only tied and the grid's best (.681) did not beat by MIN_FUSION_GAIN, so it has none. MiniLM's best English row within the rule is the defaults' .914 (they were chosen on it).
Figures on the held-out split in docs/search-and-citations.md. A model or language absent here
uses DEFAULT_FUSION."""
MIN_FUSION_GAIN = 0.01


def fusion_for(embedder: Embedder, query: str) -> Fusion:
    """The fusion for ``query`` searched with ``embedder``'s vectors: where the model covers the
    query's language (``vector_weight``), the LANGUAGE_FUSION row of the model and the query's
    detected language, else DEFAULT_FUSION; where it does not, the vector leg at
    UNCOVERED_VECTOR_WEIGHT and the lexical legs lead."""
    weight = vector_weight(embedder, query)
    if weight != VECTOR_WEIGHT:
        return Fusion(vector=weight)
    table = next((rows for prefix, rows in LANGUAGE_FUSION.items() if embedder.model.startswith(prefix)), None)
    if not table:
        return DEFAULT_FUSION
    return table.get(detect_language(query), DEFAULT_FUSION)


_UNITS = {
    "chunk": {
        "units": ("kb", "chunks"),
        "unit_id": ("id",),
        "length": ("tsv_tokens",),
        "lexeme_stats": ("kb", "lexeme_stats"),
        "text_stats": ("kb", "text_stats"),
        "count": ("chunk_count",),
    },
    "document": {
        "units": ("kb", "document_terms"),
        "unit_id": ("document_id",),
        "length": ("tokens",),
        "lexeme_stats": ("kb", "document_lexeme_stats"),
        "text_stats": ("kb", "document_text_stats"),
        "count": ("document_count",),
    },
}


@functools.cache
def lexical_statement(unit: str) -> sql.Composed:
    """The ``lexical_leg`` statement ranking ``unit``: ``"chunk"`` (kb.chunks) or ``"document"``
    (kb.document_terms), each with its own BM25 statistics. Raises KeyError for another unit."""
    return composable("lexical_leg").format(**{name: sql.Identifier(*parts) for name, parts in _UNITS[unit].items()})


def _params(workspace_id: int, model: str, vector_text: str, query: str, limit: int) -> dict:
    """The parameters every leg statement takes."""
    return {
        "workspace_id": workspace_id,
        "model": model,
        "embedding": vector_text,
        "limit": limit,
        "query": lexical_query(query),
        "k1": BM25_K1,
        "b": BM25_B,
        "title_weight": TITLE_WEIGHT,
        "selective_units": SELECTIVE_UNITS,
        "selective_share": SELECTIVE_SHARE,
        "max_terms": MAX_QUERY_TERMS,
    }


def _with_exact_fallback(
    conn: Connection,
    workspace_id: int,
    model: str,
    limit: int,
    run: Callable[[sql.Composed | sql.SQL, int | None], list],
    vector_rows: Callable[[list], int],
) -> list:
    """``run(vector leg statement, hnsw_limit)`` through the workspace's HNSW index when one is
    recorded (kb.vector_index; ``hnsw_limit`` = ``limit``), and again with the exact scan
    (``hnsw_limit`` None) when there is none or its result held fewer than ``limit`` vector rows
    (``vector_rows(result)``): the approximate index never costs the search its k results."""
    index = vector_index.recorded_index(conn, workspace_id, model)
    if index is not None:
        rows = run(vector_index.approximate_statement(index, workspace_id, model), limit)
        if vector_rows(rows) >= limit:
            return rows
    return run(composable("vector_leg"), None)


def vector_leg(conn: Connection, workspace_id: int, model: str, vector, limit: int) -> list[int]:
    """Chunk ids of the workspace nearest to ``vector`` (a float array), best first, at most
    ``limit`` (exactly ``limit`` when the workspace has that many chunks of ``model``).

    Through the workspace's HNSW index when one is recorded (kb.vector_index), else — and whenever
    the index returns fewer than ``limit`` rows — by the exact scan.
    """
    params = {"workspace_id": workspace_id, "model": model, "embedding": vector_literal(vector), "limit": limit}

    def run(statement: sql.Composed | sql.SQL, hnsw_limit: int | None) -> list[int]:
        return [row["id"] for row in _fetch(conn, statement, params, hnsw_limit)]

    return _with_exact_fallback(conn, workspace_id, model, limit, run, len)


def lexical_leg(conn: Connection, workspace_id: int, query: str, limit: int, unit: str = "chunk") -> list[int]:
    """Ids of the workspace's chunks (``unit="chunk"``) or documents (``"document"``) ranked by
    BM25 for ``query``, best first, at most ``limit`` (fewer when fewer hold a query term)."""
    params = _params(workspace_id, "", "", query, limit)
    return [row["id"] for row in _fetch(conn, lexical_statement(unit), params)]


Ranked = TypeVar("Ranked", int, str)
"""What a leg ranks: chunk or document ids (kb), or paths (bin/eval_search.py)."""


def fuse(legs: list[tuple[float, list[Ranked]]], rrf_k: float = RRF_K) -> list[tuple[Ranked, float]]:
    """Weighted reciprocal-rank fusion of ranked id lists ``[(weight, ids), ...]``:
    ``score(id) = Σ weight / (rrf_k + rank)`` with 1-based ranks; best first, ties by id."""
    scores: dict[Ranked, float] = {}
    for weight, ids in legs:
        for rank, item in enumerate(ids, start=1):
            scores[item] = scores.get(item, 0.0) + weight / (rrf_k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))


def documents_in_order(chunk_ids: list[int], rows: dict[int, dict]) -> list[int]:
    """The documents of ranked chunk ids, each at the rank of its best chunk (a chunk leg's
    ranking of documents)."""
    return list(dict.fromkeys(rows[chunk_id]["document_id"] for chunk_id in chunk_ids))


@functools.lru_cache(maxsize=256)
def candidates_statement(vector_leg_text: str) -> bytes:
    """``search_candidates`` with the vector leg ``vector_leg_text`` (the exact leg, or a
    workspace's approximate leg rendered with its literals) and the two lexical legs, rendered
    to bytes once per vector leg: psycopg renders a composed statement on every execution, and
    for this one (15 kB) that took 0.3 ms of each search."""
    return (
        composable("search_candidates")
        .format(
            vector_leg=sql.SQL(vector_leg_text),
            lexical_leg=lexical_statement("chunk"),
            document_leg=lexical_statement("document"),
        )
        .as_string()
        .encode()
    )


def _candidates(conn: Connection, workspace_id: int, model: str, params: dict, limit: int) -> list[dict]:
    """Every leg's rows from one statement (``search_candidates``)."""

    def run(vector: sql.Composed | sql.SQL, hnsw_limit: int | None) -> list[dict]:
        return _fetch(conn, candidates_statement(vector.as_string()), params, hnsw_limit)

    return _with_exact_fallback(
        conn, workspace_id, model, limit, run, lambda rows: sum(1 for r in rows if r["vector_rank"] is not None)
    )


def _fetch(
    conn: Connection, statement: sql.Composed | sql.SQL | bytes, params: dict, hnsw_limit: int | None = None
) -> list[dict]:
    """Rows of ``statement``, with the HNSW scan settings for ``hnsw_limit`` when given; the
    connection comes back idle.

    An idle connection runs it in autocommit mode: one round trip, the statement its own
    transaction, the HNSW settings kept on the connection's session
    (``vector_index.session_scan_settings``). Otherwise it runs in a transaction (a savepoint
    inside the caller's) with the settings set for the transaction (``set_config(…, true)``: they
    stay until the caller's transaction ends, where only HNSW scans read them, and every one kb
    runs sets them first); so does a connection behind a transaction-mode pooler. Before,
    every statement took BEGIN, the settings and COMMIT too: four round trips instead of one.

    Plain round trips, not a pipeline: psycopg's pipeline mode measured slower (same run, order
    rotated per query, load ~12 on 2 cores, 10,000-chunk workspace: pipelined transaction p50
    69.6 ms, plain transaction 62.8 ms)."""
    if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
        with _autocommit(conn):
            if hnsw_limit is None or vector_index.session_scan_settings(conn, hnsw_limit):
                return conn.execute(statement, params).fetchall()
    with conn.transaction():
        if hnsw_limit is not None:
            vector_index.scan_settings(conn, hnsw_limit)
        return conn.execute(statement, params).fetchall()


@contextlib.contextmanager
def _autocommit(conn: Connection) -> Iterator[None]:
    """``conn`` (idle) in autocommit mode for the block, as it was after."""
    if conn.autocommit:
        yield
        return
    conn.autocommit = True
    try:
        yield
    finally:
        if not conn.closed:
            conn.autocommit = False


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
    conn: Connection,
    repo: Repository,
    embedder: Embedder,
    workspace_id: int,
    query: str,
    k: int = 5,
) -> list[Envelope]:
    """Top ``k`` documents for ``query`` as excerpt envelopes, best first, cites numbered 1..k.

    Documents are ranked by the fusion of the three legs (``rank_documents``), all run in one
    statement on ``conn`` (``search_candidates``); each envelope holds the document's best
    ``EXCERPTS_PER_DOCUMENT`` excerpts. The connection comes back idle. Raises InvalidInput for a
    bad query or k (``check_query``).
    """
    check_query(query, k)
    vector = query_vector(embedder, query)  # e5 embeds a query unlike a passage
    params = _params(workspace_id, embedder.model, vector_literal(vector), query, max(LEG_LIMIT, 4 * k))
    fusion = fusion_for(embedder, query)  # per model and query language
    while True:
        rows = _candidates(conn, workspace_id, embedder.model, params, params["limit"])
        documents, excerpts = rank_documents(rows, fusion)
        if len(documents) >= k or sum(1 for r in rows if r["vector_rank"] is not None) < params["limit"]:
            break
        # the legs' chunks came from fewer than k documents (long documents, many chunks each)
        # and the workspace has more vectors: ask again for more, so a search returns k envelopes
        # whenever the workspace has k indexed documents
        params["limit"] *= WIDEN_FACTOR
    return envelopes(conn, repo, rows, documents, excerpts, k, params["query"])


def rank_documents(
    rows: list[dict],
    fusion: Fusion | float = DEFAULT_FUSION,
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """``(documents, excerpts)`` from the legs' rows (``search_candidates``' shape): document ids
    with their fused score (``Σ w / (k + rank)`` with ``fusion``'s weights and k over the vector
    leg, the chunk leg — each ranking documents by their best chunk — and the document leg; a
    number is the vector leg's weight, the others the defaults), best first; and chunk ids fused
    from the two chunk legs, the order in which a document's excerpts are shown."""
    if not isinstance(fusion, Fusion):
        fusion = Fusion(vector=fusion)
    chunks = {r["chunk_id"]: r for r in rows if r["chunk_id"] is not None}
    by_vector = [
        c
        for c, r in sorted(
            ((c, r) for c, r in chunks.items() if r["vector_rank"] is not None), key=lambda item: item[1]["vector_rank"]
        )
    ]
    by_text = [
        c
        for c, r in sorted(
            ((c, r) for c, r in chunks.items() if r["text_rank"] is not None), key=lambda item: item[1]["text_rank"]
        )
    ]
    by_document = [
        r["document_id"] for r in sorted((r for r in rows if r["chunk_id"] is None), key=lambda r: r["document_rank"])
    ]
    documents = fuse(
        [
            (fusion.vector, documents_in_order(by_vector, chunks)),
            (fusion.text, documents_in_order(by_text, chunks)),
            (fusion.document, by_document),
        ],
        fusion.rrf_k,
    )
    return documents, fuse([(fusion.vector, by_vector), (fusion.text, by_text)], fusion.rrf_k)


def envelopes(
    conn: Connection,
    repo: Repository,
    rows: list[dict],
    documents: list[tuple[int, float]],
    excerpts: list[tuple[int, float]],
    k: int,
    lexical_query: str,
) -> list[Envelope]:
    """The top ``k`` of the ranked ``documents`` as excerpt envelopes: each document's chunks in
    ``excerpts`` order (at most EXCERPTS_PER_DOCUMENT). A document only the document leg found
    gets the chunk holding most of the query's terms (``excerpt_chunks``, one query for all such
    documents, ``lexical_query`` prepared as the legs had it); one that has no chunk left by then
    (deleted meanwhile) gives its place to the next. A document's excerpts all come from the
    indexed blob of its first row (an excerpt chunk is read after the legs, in another snapshot:
    the document may have been re-indexed between the two). Paths are distinct: of two documents
    citing one path (one moved away and not re-indexed yet), the better ranked is shown."""
    chunks = {r["chunk_id"]: r for r in rows if r["chunk_id"] is not None}
    chunks_of: dict[int, list[dict]] = {}
    for chunk_id, _score in excerpts:
        chunks_of.setdefault(chunks[chunk_id]["document_id"], []).append(chunks[chunk_id])
    order, position, paths = [doc for doc, _ in documents], 0, set()
    chosen: list[int] = []
    while len(chosen) < k and position < len(order):
        window = order[position : position + k - len(chosen)]
        position += len(window)
        missing = [doc for doc in window if doc not in chunks_of]
        if missing:
            for row in _fetch(conn, composable("excerpt_chunks"), {"document_ids": missing, "query": lexical_query}):
                chunks_of[row["document_id"]] = [row]
        for doc in window:
            # one envelope per path: a page moved and edited since it was indexed cites its old
            # path (indexed_path) until the next index run, and a page written at that path
            # meanwhile may rank too; the better ranked of the two is shown
            if doc in chunks_of and chunks_of[doc][0]["path"] not in paths:
                chosen.append(doc)
                paths.add(chunks_of[doc][0]["path"])
    scores = dict(documents)
    result = []
    for cite, document_id in enumerate(chosen, start=1):
        group = chunks_of[document_id]
        first = group[0]
        spans: list[tuple[int, int]] = []
        unnumbered: list[str] = []
        for row in group:
            if row["indexed_content_id"] != first["indexed_content_id"]:
                continue  # read in another snapshot, after the document was re-indexed: other lines
            if len(spans) + len(unnumbered) == EXCERPTS_PER_DOCUMENT:
                break
            if row["start_line"] is None:
                unnumbered.append(row["text"])
            else:
                spans.append((row["start_line"], row["end_line"]))
        envelope = Envelope(
            first["path"],
            first["title"],
            first["indexed_revision"],
            "excerpts",
            cite=cite,
            score=round(scores[document_id], 6),
            content_id=first["indexed_content_id"],
        )
        if spans:
            envelope.lines = excerpt_lines(blob_lines.get(repo, first["indexed_content_id"]), spans)
        envelope.lines += [(None, line) for text in unnumbered for line in text.split("\n")]
        result.append(envelope)
    return result
