"""Hybrid search (SPEC §8): one query embedding, a vector leg and a full-text leg over the
workspace's chunks, one global reciprocal-rank fusion (k=60), grouped by document into envelopes
whose lines are the document's true lines at the indexed revision.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from kb.citations import Envelope, document_lines, excerpt_lines
from kb.errors import InvalidInput
from kb.embedding import Embedder, vector_literal
from kb.repository import Repository
from kb.sql import queries

MAX_QUERY_CHARS = 4000
"""Longer queries are refused: Postgres' tsquery parser overflows its stack near 100k characters,
and the embedder reads only its first 256 tokens anyway."""
RRF_K = 60
LEG_LIMIT = 100


@dataclass
class _Group:
    row: dict
    score: float
    spans: list[tuple[int, int]]
    unnumbered: list[str]


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


def search(
    conn: psycopg.Connection,
    repo: Repository,
    embedder: Embedder,
    workspace_id: int,
    query: str,
    k: int = 5,
    fts_config: str = "english",
) -> list[Envelope]:
    """Top ``k`` documents for ``query`` as excerpt envelopes, best first, cites numbered 1..k.

    A document's score is its best chunk's fused score; several chunks of one document collapse
    into one envelope.
    """
    check_query(query, k)
    vector = vector_literal(embedder.embed([query])[0])
    rows = conn.execute(
        queries["hybrid_search"],
        {"workspace_id": workspace_id, "embedding": vector, "model": embedder.model, "query": query,
         "fts_config": fts_config,
         "rrf_k": RRF_K, "leg_limit": max(LEG_LIMIT, 4 * k), "limit": 2 * max(LEG_LIMIT, 4 * k)},
    ).fetchall()
    groups: dict[int, _Group] = {}
    for row in rows:
        group = groups.get(row["document_id"])
        if group is None:
            if len(groups) >= k:
                continue
            group = groups[row["document_id"]] = _Group(row, row["score"], [], [])
        if len(group.spans) + len(group.unnumbered) >= 3:
            continue  # the best three excerpts per document
        if row["start_line"] is None:
            group.unnumbered.append(row["text"])
        else:
            group.spans.append((row["start_line"], row["end_line"]))
    envelopes = []
    for cite, group in enumerate(groups.values(), start=1):
        row = group.row
        envelope = Envelope(row["path"], row["title"], row["indexed_revision"], "excerpts",
                            cite=cite, score=round(group.score, 6), content_id=row["indexed_content_id"])
        if group.spans:
            lines = document_lines(repo.blob(row["indexed_content_id"]))
            envelope.lines = excerpt_lines(lines, group.spans)
        envelope.lines += [(None, line) for text in group.unnumbered for line in text.split("\n")]
        envelopes.append(envelope)
    return envelopes
