#!/usr/bin/env python
"""Search latency at scale (design §8, §14): facade ``kb.search`` vs a numpy exact top-10.

Set-up: the tldr pages are imported (real git repositories, real blobs) into three workspaces, and
each gets synthetic chunk rows pointing at its documents: ``--sizes`` chunks per measured
workspace (default 10,000 and 100,000) plus ``--other`` chunks in a third workspace, all in the
one ``kb.chunks`` table. A chunk is one paragraph of a tldr page with its true line span (so the
envelopes render real excerpts); replicas past the corpus' paragraphs carry a "variant N" suffix
so every text and vector differs. Vectors come from the hashing embedder (lexical feature
hashing: fine for latency, which does not depend on what the 384 floats mean; say so with the
figures), or with ``--minilm`` from the real all-MiniLM-L6-v2 model, whose clustered vectors are
what the HNSW recall must hold on. MiniLM on this CPU embeds tens of texts a second, so its
vectors are kept in a file cache keyed by the SHA-256 of each text (``--work``/minilm-vectors.npz,
written as it goes): a second run, or one interrupted, embeds only what is missing.
tsv is built as the indexer builds it.

Timed, per query, interleaved round by round:

- kb: ``kb.search(ws, query, k=10)`` through the facade — pooled connection, both legs, fusion,
  excerpts from blobs, and ``render()`` of every envelope. The query embedding is excluded: the
  embedder is a lookup of vectors computed before the timing. Timed twice per round, in
  alternating order: as shipped, and without the document leg (``without_document_leg``: its
  cost).
- numpy: exact cosine top-10 over the workspace's vectors held in memory (argpartition + sort).

Workspaces past kb.vector_index.HNSW_MIN_CHUNKS get their partial HNSW index first, as the job
``kb.maintain_vector_index`` would build it (``--exact``: none, every vector leg scans exactly);
then a CHECKPOINT, so the writes of loading and building are not flushed during the timing.

Also: the vector leg's recall@10 against the numpy exact top-10 (tie-aware), and that every search
returned k envelopes.

Usage: python bin/bench_search.py [--sizes 10000 100000] [--other 20000] [--queries 200] [--minilm]
Prints the figures and writes bench-results/search-<time>.json. Uses its own embedded Postgres
under --work (default /tmp/kb-bench-search) unless KB_DATABASE_URL is set.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.citations.envelope import document_lines  # noqa: E402
from kb.db import database  # noqa: E402
from kb.db.sql import composable  # noqa: E402
from kb.index.chunk_context import context_line  # noqa: E402
from kb.index.embedding import HashingEmbedder, vector_literal  # noqa: E402
from kb.index.vector_index import maintain  # noqa: E402
from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.search import hybrid as search_module  # noqa: E402
from kb.search.hybrid import vector_leg  # noqa: E402
from kb.settings import Settings  # noqa: E402
from tests.support.named_queries import queries  # noqa: E402

K = 10


class PrecomputedEmbedder:
    """A model's space (name, dimension, languages), answering queries from vectors computed
    before the timing."""

    semantic = False

    def __init__(self, source, vectors: dict[str, np.ndarray]) -> None:
        self.model, self.dim = source.model, source.dim
        self.languages = getattr(source, "languages", None)
        self.vectors = vectors

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


class CachedEmbedder:
    """``embedder`` behind a file of the vectors it made, keyed by SHA-256 of the text (an .npz of
    ``keys`` and ``vectors``), saved every ``SAVE_EVERY`` new vectors and at the end."""

    SAVE_EVERY = 2000

    def __init__(self, embedder, path: Path) -> None:
        self.embedder, self.path = embedder, path
        self.model, self.dim = embedder.model, embedder.dim
        self.languages = getattr(embedder, "languages", None)
        self.known: dict[bytes, np.ndarray] = {}
        if path.exists():
            with np.load(path) as saved:
                self.known = dict(zip((bytes(k) for k in saved["keys"]), saved["vectors"]))

    def embed(self, texts: list[str]) -> np.ndarray:
        keys = [hashlib.sha256(t.encode()).digest() for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self.known))
        by_key = dict(zip(keys, texts))
        for start in range(0, len(missing), self.SAVE_EVERY):
            batch = missing[start : start + self.SAVE_EVERY]
            t0 = time.perf_counter()
            self.known.update(zip(batch, self.embedder.embed([by_key[k] for k in batch])))
            self.save()
            print(
                f"{self.model}: embedded {start + len(batch)} of {len(missing)} new texts "
                f"({len(batch) / (time.perf_counter() - t0):.0f}/s)",
                flush=True,
            )
        return np.stack([self.known[k] for k in keys]) if keys else np.zeros((0, self.dim), np.float32)

    def save(self) -> None:
        keys = list(self.known)
        partial = self.path.with_suffix(".partial.npz")
        np.savez(
            partial,
            keys=np.array([np.frombuffer(k, np.uint8) for k in keys]),
            vectors=np.stack([self.known[k] for k in keys]),
        )
        partial.replace(self.path)


@functools.lru_cache(maxsize=16)
def _chunk_legs_only(vector_leg_text: str) -> bytes:
    """``search_candidates`` as kb.search.candidates_statement renders it, with the document leg
    returning no rows without running (``bench_empty_document_leg``)."""
    return (
        composable("search_candidates")
        .format(
            vector_leg=psycopg.sql.SQL(vector_leg_text),
            lexical_leg=search_module.lexical_statement("chunk"),
            document_leg=sql.SQL(queries["bench_empty_document_leg"].rstrip().rstrip(";")),
        )
        .as_string()
        .encode()
    )


@contextlib.contextmanager
def without_document_leg(enabled: bool):
    """While ``enabled``, the document leg (BM25 over whole documents, migration 0018) returns no
    rows without running: what the search cost before it had that leg, timed in the same rounds.
    Both statements are rendered once and cached, as kb caches its own."""
    if not enabled:
        yield
        return
    real = search_module.candidates_statement
    search_module.candidates_statement = _chunk_legs_only
    try:
        yield
    finally:
        search_module.candidates_statement = real


def paragraphs(lines: list[str]) -> list[tuple[int, int, str]]:
    """``(start_line, end_line, text)`` of the blank-line separated blocks of a document."""
    blocks, start = [], None
    for number, line in enumerate(lines + [""], start=1):
        if line.strip() and start is None:
            start = number
        elif not line.strip() and start is not None:
            blocks.append((start, number - 1, "\n".join(lines[start - 1 : number - 1])))
            start = None
    return blocks


def fill_workspace(kb: KnowledgeBase, ws: int, corpus: Path, size: int, embedder) -> None:
    """Import ``corpus`` into ``ws`` and give it ``size`` synthetic chunk rows (see the docstring)."""
    kb.import_folder(corpus, ws)
    kb.project(ws)
    repo = kb.store(ws).repository
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["bench_mark_indexed"], {"workspace_id": ws})
        documents = conn.execute(queries["bench_workspace_documents"], {"workspace_id": ws}).fetchall()
    blocks = []
    for doc in documents:
        lines = document_lines(repo.blob(doc["content_id"]))
        context = context_line(doc["title"], [])
        blocks.extend(
            (doc["id"], position, start, end, text, context)
            for position, (start, end, text) in enumerate(paragraphs(lines))
        )
    rows = []
    for i in range(size):
        document_id, position, start, end, text, context = blocks[i % len(blocks)]
        replica = i // len(blocks)
        if replica:
            text = f"{text}\nvariant {replica}"
        rows.append((document_id, ws, position + 1000 * replica, text, context, start, end))
    t0 = time.perf_counter()
    with database.connect(kb.database_url) as conn:
        for start in range(0, len(rows), 20_000):
            batch = rows[start : start + 20_000]
            # (document_id, ws, position, text, context, start_line, end_line): embed as the indexer does
            vectors = embedder.embed([f"{row[4]}\n\n{row[3]}" for row in batch])
            with conn.transaction():
                conn.execute(queries["bench_create_staging"])
                with conn.cursor().copy(queries["bench_copy_staging"]) as copy:
                    for row, vector in zip(batch, vectors):
                        copy.write_row((*row, embedder.model, vector_literal(vector)))
                conn.execute(queries["bench_insert_staged"])
        conn.execute(queries["refresh_document_terms"], {"document_ids": [doc["id"] for doc in documents]})
        conn.commit()
    print(
        f"workspace {ws}: {size} chunks over {len(documents)} documents in {time.perf_counter() - t0:.0f}s", flush=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus" / "tldr" / "pages")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--other", type=int, default=20_000, help="chunks of one more workspace")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--exact", action="store_true", help="do not build the per-workspace HNSW indexes (exact scans everywhere)"
    )
    parser.add_argument(
        "--minilm",
        action="store_true",
        help="real all-MiniLM-L6-v2 vectors (file-cached under --work) instead of hashing",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/kb-bench-search"))
    args = parser.parse_args()
    if not args.corpus.exists():
        sys.exit(f"corpus {args.corpus} is absent")

    shutil.rmtree(args.work / "storage", ignore_errors=True)
    settings = Settings(storage_root=args.work / "storage", embedding_model="hashing")
    if settings.database_url is None:
        url = database.start_embedded(args.work / "pg", database="kb_bench")
        with database.connect(url, autocommit=True) as conn:
            conn.execute(queries["drop_database"].format(database='"kb_bench_search"'))
            conn.execute(queries["create_database"].format(database='"kb_bench_search"'))
        settings = settings.model_copy(update={"database_url": url.replace("/kb_bench?", "/kb_bench_search?")})
    kb = KnowledgeBase.open(settings)
    if args.minilm:
        from kb.index.embedding import MiniLMEmbedder

        args.work.mkdir(parents=True, exist_ok=True)
        embedder = CachedEmbedder(MiniLMEmbedder(), args.work / "minilm-vectors.npz")
    else:
        embedder = HashingEmbedder(384)
    corpus = args.work / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    shutil.copytree(args.corpus, corpus, ignore=lambda d, names: [n for n in names if n.startswith(".")])
    sizes = {ws: size for ws, size in enumerate(args.sizes, start=1)}
    sizes[len(sizes) + 1] = args.other
    for ws, size in sizes.items():
        fill_workspace(kb, ws, corpus, size, embedder)
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["bench_analyze"])
    result: dict = {
        "corpus": str(args.corpus),
        "model": embedder.model,
        "k": K,
        "exact_only": args.exact,
        "table_chunks": sum(sizes.values()),
        "workspaces": {},
    }
    if not args.exact:
        for ws in sizes:
            t0 = time.perf_counter()
            change = maintain(kb.database_url, ws, embedder.model, embedder.dim)
            print(f"workspace {ws}: HNSW index {change.action} in {time.perf_counter() - t0:.0f}s", flush=True)

    with database.connect(kb.database_url, autocommit=True) as conn:
        try:
            conn.execute(queries["bench_checkpoint"])
        except psycopg.errors.InsufficientPrivilege:
            print("(not allowed to CHECKPOINT: the first searches may meet a checkpoint)", flush=True)

    for ws, size in list(sizes.items())[:-1]:
        with database.connect(kb.database_url, autocommit=True) as conn:
            rows = conn.execute(queries["bench_all_embeddings"], {"workspace_id": ws}).fetchall()
            samples = [
                r["text"].split("\n")[0][:80]
                for r in conn.execute(queries["bench_sample_chunks"], {"workspace_id": ws, "n": args.queries})
            ]
        ids = np.array([r["id"] for r in rows])
        matrix = np.array([json.loads(r["embedding"]) for r in rows], dtype=np.float32)
        matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        del rows  # the bench's own 100,000 row dicts: no collection during the timing should walk them
        gc.collect()
        gc.freeze()
        samples = list(dict.fromkeys(samples))
        vectors = dict(zip(samples, embedder.embed(samples)))
        kb.use_embedder(PrecomputedEmbedder(embedder, vectors))
        kb.search(ws, samples[0], k=K)  # open the pool, load the store
        kb_times, numpy_times, recalls, counts, chunk_only_times = [], [], [], [], []
        with database.connect(kb.database_url, autocommit=True) as conn:
            for round_no, query in enumerate(samples):
                vector = vectors[query]
                # the facade as shipped and, in alternating order, without the document leg
                for leg in ("kb", "chunk_only") if round_no % 2 else ("chunk_only", "kb"):
                    t0 = time.perf_counter()
                    with without_document_leg(leg == "chunk_only"):
                        found = kb.search(ws, query, k=K)
                    for envelope in found:
                        envelope.render()
                    (kb_times if leg == "kb" else chunk_only_times).append(time.perf_counter() - t0)
                    counts.append(len(found))
                t0 = time.perf_counter()
                scores = matrix @ vector
                top = np.argpartition(-scores, K)[:K]
                exact = ids[top[np.argsort(-scores[top])]]
                numpy_times.append(time.perf_counter() - t0)
                leg = vector_leg(conn, ws, embedder.model, vector, K)
                tenth = np.sort(scores)[-K]
                by_id = dict(zip(ids.tolist(), scores.tolist()))
                # tie-aware: a returned row counts when it is as near as the exact 10th
                recalls.append(sum(1 for i in leg if by_id[i] >= tenth - 1e-6) / K)
                assert len(exact) == K
        kb_times.sort()
        numpy_times.sort()
        chunk_only_times.sort()

        def pct(values, q):
            return 1000 * values[int(q * (len(values) - 1))]

        figures = {
            "chunks": size,
            "queries": len(samples),
            "load_average": os.getloadavg(),
            "kb_p50_ms": 1000 * statistics.median(kb_times),
            "kb_p95_ms": pct(kb_times, 0.95),
            "numpy_p50_ms": 1000 * statistics.median(numpy_times),
            "numpy_p95_ms": pct(numpy_times, 0.95),
            "vector_recall_at_10": statistics.mean(recalls),
            "min_envelopes": min(counts),
            "without_document_leg_p50_ms": 1000 * statistics.median(chunk_only_times),
            "without_document_leg_p95_ms": pct(chunk_only_times, 0.95),
        }
        figures["p50_ratio"] = figures["kb_p50_ms"] / figures["numpy_p50_ms"]
        result["workspaces"][ws] = figures
        print(
            f"workspace {ws} ({size} chunks, {result['table_chunks']} in the table): kb.search p50 "
            f"{figures['kb_p50_ms']:.1f} ms p95 {figures['kb_p95_ms']:.1f} ms (without the "
            f"document leg: p50 {figures['without_document_leg_p50_ms']:.1f} "
            f"p95 {figures['without_document_leg_p95_ms']:.1f}) | numpy exact top-10 p50 "
            f"{figures['numpy_p50_ms']:.1f} ms p95 {figures['numpy_p95_ms']:.1f} ms | vector leg recall@10 "
            f"{figures['vector_recall_at_10']:.4f} | min envelopes {figures['min_envelopes']} of {K} | "
            f"load average {' '.join(f'{x:.2f}' for x in figures['load_average'])}",
            flush=True,
        )
    database.close_pools()
    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    path = out / f"search-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
