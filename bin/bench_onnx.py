#!/usr/bin/env python
"""MiniLM through its ONNX export (onnxruntime + tokenizers) against the torch path (design §7).

    python bin/bench_onnx.py [--corpus DIR] [--chunks 256] [--rounds 3] [--queries 20]

Cuts the corpus (default: tests/corpus/en, or the tldr pages given as ``--corpus``) with kb's
chunker, embeds ``--chunks`` chunk texts with the context line kb gives them, in batches of
``KB_EMBED_BATCH_SIZE``, through both paths, legs interleaved round by round, and prints chunks
per second (medians), the ratio ONNX ÷ torch, and the least cosine between the two paths' vectors
of every chunk (goal ≥ 0.9999). Then the same for single queries (what a search embeds): median
milliseconds per query. The ONNX export is made first (timed once, into a temporary
KB_MODEL_CACHE): what a user's first index or search pays once.

This measurement decided that indexing too runs on onnxruntime (torch only exports): see the note
of the branch that introduced it for the figures at idle and under load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.index.chunking import Chunker  # noqa: E402
from kb.index.embedding import MINILM_LANGUAGES, MINILM_MODEL, MiniLMEmbedder, _minilm_directory  # noqa: E402
from kb.index.onnx_embedder import OnnxEmbedder, prepared_export  # noqa: E402


def chunk_texts(corpus: Path, limit: int) -> list[str]:
    """Up to ``limit`` chunk texts of the corpus' pages, each with its page title as context line."""
    chunker = Chunker(240)
    texts: list[str] = []
    for page in sorted(corpus.rglob("*.md")):
        text = page.read_text(errors="replace")
        texts.extend(f"{page.stem}\n\n{chunk.text}" for chunk in chunker.chunk(text))
        if len(texts) >= limit:
            break
    return texts[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=ROOT / "tests" / "corpus" / "en")
    parser.add_argument("--chunks", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    import numpy as np

    with tempfile.TemporaryDirectory(prefix="kb-bench-onnx-") as cache:
        started = time.perf_counter()
        export = prepared_export(_minilm_directory(), Path(cache))
        exported = time.perf_counter() - started
        if export.refused:
            raise SystemExit(f"the export was refused: {export.refused}")
        onnx = OnnxEmbedder(export, MINILM_MODEL, args.batch, MINILM_LANGUAGES)
        torch_path = MiniLMEmbedder(batch_size=args.batch)
        texts = chunk_texts(args.corpus, args.chunks)
        queries = [t.split("\n\n", 1)[1][:80] for t in texts[: args.queries]]
        legs = {"onnx": onnx, "torch": torch_path}
        seconds: dict[str, list[float]] = {name: [] for name in legs}
        per_query: dict[str, list[float]] = {name: [] for name in legs}
        vectors = {}
        for embedder in legs.values():  # warm-up
            embedder.embed(texts[:8])
        for _ in range(args.rounds):
            for name, embedder in legs.items():
                started = time.perf_counter()
                vectors[name] = embedder.embed(texts)
                seconds[name].append(time.perf_counter() - started)
                for query in queries:
                    started = time.perf_counter()
                    embedder.embed([query])
                    per_query[name].append(time.perf_counter() - started)
        cosine = float(np.min(np.sum(vectors["onnx"] * vectors["torch"], axis=1)))
        rate = {name: len(texts) / statistics.median(values) for name, values in seconds.items()}
        query_ms = {name: 1000 * statistics.median(values) for name, values in per_query.items()}
        print(
            f"{len(texts)} chunks of {args.corpus.name}, batches of {args.batch}, {args.rounds} rounds interleaved, "
            f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; export (once) {exported:.1f} s"
        )
        print(
            f"  chunks/s  onnx {rate['onnx']:7.1f}  torch {rate['torch']:7.1f}  ratio {rate['onnx'] / rate['torch']:.2f}"
        )
        print(
            f"  one query onnx {query_ms['onnx']:6.1f} ms  torch {query_ms['torch']:6.1f} ms  "
            f"ratio {query_ms['onnx'] / query_ms['torch']:.2f}"
        )
        print(f"  least cosine onnx vs torch over {len(texts)} chunks: {cosine:.7f} (goal ≥ 0.9999)")


if __name__ == "__main__":
    main()
