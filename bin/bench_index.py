#!/usr/bin/env python
"""Indexing and search benchmark on a real corpus (design §14), as ratios in one process.

Legs, all with the same embedder and the same ``torch.set_num_threads``:

1. raw: the corpus is cut with kb's chunker, and the embedder alone embeds every distinct chunk
   text in batches of ``KB_EMBED_BATCH_SIZE`` (the reference).
2. kb: the corpus is imported as one revision and ``kb.index`` runs end to end (projection,
   reading blobs, chunking, cache look-ups, embedding, chunk rows, per-document transactions).
   Ratio = kb's embedded-chunks/s ÷ raw chunks/s (goal ≥ 0.8).
3. warm reindex: ``kb.reindex`` with every chunk row in place, then again after deleting all chunk
   rows (everything comes from the embedding cache; the embedder is never called).
4. search: both legs' SQL p50/p95 over sample queries (the query embedding excluded; the facade's
   end-to-end latency is bin/bench_search.py's), and the
   vector leg's recall@10 against an exact numpy scan of every stored embedding.

Usage: python bin/bench_index.py [--corpus DIR] [--limit N] [--threads 2] [--model minilm]
       [--search-model hashing]
Prints the figures and writes bench-results/index-<time>.json. Uses its own embedded Postgres
under --work (default /tmp/kb-bench) unless KB_DATABASE_URL is set.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.db import database  # noqa: E402
from kb.index.embedding import make_embedder, vector_literal  # noqa: E402
from kb.index.indexer import decode_document  # noqa: E402
from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.search.hybrid import LEG_LIMIT, lexical_leg, vector_leg  # noqa: E402
from kb.settings import Settings  # noqa: E402
from tests.support.named_queries import queries  # noqa: E402

WS = 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus" / "tldr" / "pages")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--search-model",
        default=None,
        help="embedder for the whole-corpus search leg (default: --model); 'hashing' "
        "indexes the whole corpus in seconds when the throughput legs use --limit",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/kb-bench"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if not args.corpus.exists():
        sys.exit(f"corpus {args.corpus} is absent")
    shutil.rmtree(args.work / "storage", ignore_errors=True)
    settings = Settings(storage_root=args.work / "storage", embedding_model=args.model)
    if settings.database_url is None:
        url = database.start_embedded(args.work / "pg", database="kb_bench")
        with database.connect(url, autocommit=True) as conn:
            conn.execute(queries["drop_database"].format(database='"kb_bench_run"'))
            conn.execute(queries["create_database"].format(database='"kb_bench_run"'))
        settings = settings.model_copy(update={"database_url": url.replace("/kb_bench?", "/kb_bench_run?")})
    kb = KnowledgeBase.open(settings)
    embedder = kb.use_embedder(make_embedder(settings))
    chunker = kb.chunker
    source = args.work / "corpus"
    shutil.rmtree(source, ignore_errors=True)
    files = sorted(p for p in args.corpus.rglob("*.md"))
    if args.limit:
        files = files[: args.limit]
    for path in files:
        target = source / path.relative_to(args.corpus)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    result: dict = {
        "corpus": str(args.corpus),
        "files": len(files),
        "model": embedder.model,
        "threads": args.threads,
        "chunk_size": settings.chunk_size,
        "chunk_unit": chunker.unit,
        "batch_size": settings.embed_batch_size,
    }

    # 1. raw embedder on the corpus' distinct chunk texts
    texts: dict[str, None] = {}
    chunk_count = 0
    for path in files:
        for chunk in chunker.chunk(decode_document(path.read_bytes())):
            texts.setdefault(chunk.text, None)
            chunk_count += 1
    distinct = list(texts)
    embedder.embed(distinct[:8])  # warm-up (model load, first-call allocations)
    t0 = time.perf_counter()
    size = settings.embed_batch_size
    for start in range(0, len(distinct), size):
        embedder.embed(distinct[start : start + size])
    raw_seconds = time.perf_counter() - t0
    result.update(
        chunks=chunk_count,
        distinct_chunks=len(distinct),
        raw_seconds=raw_seconds,
        raw_chunks_per_second=len(distinct) / raw_seconds,
    )
    print(
        f"raw embedder: {len(distinct)} distinct chunks in {raw_seconds:.1f}s = "
        f"{len(distinct) / raw_seconds:.2f} chunks/s",
        flush=True,
    )

    # 2. kb end to end: import, then index (projection, chunking, cache, embedding, rows)
    t0 = time.perf_counter()
    kb.import_folder(source, WS)
    import_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = kb.index(WS)
    index_seconds = time.perf_counter() - t0
    assert report.documents_failed == 0, report.failures
    kb_rate = report.embeddings_computed / index_seconds
    result.update(
        import_seconds=import_seconds,
        index_seconds=index_seconds,
        kb_documents=report.documents_indexed,
        kb_chunks_written=report.chunks_written,
        kb_embeddings_computed=report.embeddings_computed,
        kb_chunks_per_second=kb_rate,
        ratio_kb_to_raw=kb_rate / result["raw_chunks_per_second"],
    )
    print(
        f"kb index: {report.documents_indexed} documents, {report.chunks_written} chunk rows, "
        f"{report.embeddings_computed} embedded in {index_seconds:.1f}s = {kb_rate:.2f} chunks/s "
        f"→ ratio {result['ratio_kb_to_raw']:.3f} (import took {import_seconds:.1f}s)",
        flush=True,
    )

    # 3. warm-cache reindex: rows in place, then rows wiped (cache only)
    t0 = time.perf_counter()
    again = kb.reindex(WS)
    warm_seconds = time.perf_counter() - t0
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["bench_delete_workspace_chunks"], {"workspace_id": WS})
    t0 = time.perf_counter()
    rebuilt = kb.reindex(WS)
    rebuild_seconds = time.perf_counter() - t0
    result.update(
        warm_reindex_seconds=warm_seconds,
        warm_reindex_embedded=again.embeddings_computed,
        warm_reindex_reused=again.chunks_reused,
        rebuild_from_cache_seconds=rebuild_seconds,
        rebuild_embedded=rebuilt.embeddings_computed,
        rebuild_cache_hits=rebuilt.embeddings_cached,
        rebuild_chunks_written=rebuilt.chunks_written,
    )
    print(
        f"warm reindex: {warm_seconds:.1f}s, embedded {again.embeddings_computed}, reused "
        f"{again.chunks_reused}; rebuild after wiping chunk rows: {rebuild_seconds:.1f}s, embedded "
        f"{rebuilt.embeddings_computed}, cache hits {rebuilt.embeddings_cached}",
        flush=True,
    )

    # 4. search latency (SQL only) and vector-leg recall@10 against an exact scan, at the whole
    # corpus: workspace 1 when the legs above used it all, else workspace 2 with --search-model
    search_ws, search_embedder = WS, embedder
    if args.limit or (args.search_model and args.search_model != args.model):
        search_ws = 2
        search_embedder = make_embedder(
            settings.model_copy(update={"embedding_model": args.search_model or args.model})
        )
        kb.use_embedder(search_embedder)
        whole = args.work / "corpus-whole"
        shutil.rmtree(whole, ignore_errors=True)
        shutil.copytree(args.corpus, whole)
        kb.import_folder(whole, search_ws)
        t0 = time.perf_counter()
        whole_report = kb.index(search_ws)
        result.update(
            search_index_model=search_embedder.model,
            search_index_seconds=time.perf_counter() - t0,
            search_index_documents=whole_report.documents_indexed,
        )
    result["search_model"] = search_embedder.model
    with database.connect(kb.database_url, autocommit=True) as conn:
        samples = [
            r["text"].split("\n")[0][:80]
            for r in conn.execute(queries["bench_sample_chunks"], {"workspace_id": search_ws, "n": args.queries})
        ]
        rows = conn.execute(queries["bench_all_embeddings"], {"workspace_id": search_ws}).fetchall()
        ids = np.array([r["id"] for r in rows])
        matrix = np.array([json.loads(r["embedding"]) for r in rows], dtype=np.float32)
        vectors = search_embedder.embed(samples)
        latencies, recalls, lengths = [], [], []
        for query, vector in zip(samples, vectors):
            literal = vector_literal(vector)
            t0 = time.perf_counter()
            vector_leg(conn, search_ws, search_embedder.model, vector, LEG_LIMIT)
            lexical_leg(conn, search_ws, query, LEG_LIMIT)
            latencies.append(time.perf_counter() - t0)
            leg = [
                r["id"]
                for r in conn.execute(
                    queries["bench_vector_leg"], {"workspace_id": search_ws, "embedding": literal, "k": 10}
                )
            ]
            distances = 1 - (matrix @ vector) / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(vector))
            tenth = np.sort(distances)[9]
            by_id = dict(zip(ids.tolist(), distances.tolist()))
            # tie-aware: a returned row counts when it is as near as the exact 10th (float32 rounding
            # differs between numpy and pgvector, and lexical vectors tie often)
            recalls.append(sum(1 for i in leg if by_id[i] <= tenth + 1e-6) / 10)
            lengths.append(len(leg))
    latencies.sort()
    result.update(
        search_queries=len(samples),
        search_chunks=len(ids),
        search_p50_ms=1000 * statistics.median(latencies),
        search_p95_ms=1000 * latencies[int(0.95 * (len(latencies) - 1))],
        vector_recall_at_10=statistics.mean(recalls),
        vector_leg_min_rows=min(lengths),
    )
    print(
        f"search ({search_embedder.model}) over {len(ids)} chunks: p50 {result['search_p50_ms']:.1f} ms, p95 "
        f"{result['search_p95_ms']:.1f} ms (query embedding excluded); vector leg recall@10 "
        f"{result['vector_recall_at_10']:.4f}, min rows {min(lengths)}",
        flush=True,
    )

    out = ROOT / "bench-results"
    out.mkdir(exist_ok=True)
    path = out / f"index-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
