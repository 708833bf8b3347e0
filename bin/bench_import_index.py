#!/usr/bin/env python
"""design §3 benchmark: import a folder of markdown, index it, and compare kb's indexing throughput
with the raw embedder's on the same chunks, measured in the same process.

    python bin/bench_import_index.py ../shared/corpus/tldr/pages [--model minilm] [--sample 1500]

Prints (and writes bench-results/import_index.json): import wall time, indexing wall time,
documents and chunks, kb chunks/s, raw embedder chunks/s on a random sample of the same chunk
texts (embedded in the same batch size), and the ratio kb/raw. Uses a fresh embedded Postgres and
storage root in a temporary directory, deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kb.db.database import connect, start_embedded, stop_embedded
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from tests.support.named_queries import queries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--sample", type=int, default=1500, help="chunks embedded by the raw leg")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kb-bench-"))
    try:
        url = start_embedded(root / "postgres")
        settings = Settings(database_url=url, storage_root=root, embedding_model=args.model)
        kb = KnowledgeBase.open(settings)
        embedder = kb.embedder
        embedder.embed(["load the model before timing"])  # the model loads on first embed()

        started = time.perf_counter()
        report = kb.import_folder(args.source, 1, author="bench")
        import_seconds = time.perf_counter() - started

        started = time.perf_counter()
        index = kb.index(1)
        index_seconds = time.perf_counter() - started

        with connect(url) as conn:
            texts = [r["text"] for r in conn.execute(queries["bench_chunk_texts"], {"workspace_id": 1})]
        sample = random.Random(7).sample(texts, min(args.sample, len(texts)))
        started = time.perf_counter()
        for i in range(0, len(sample), settings.embed_batch_size):
            embedder.embed(sample[i : i + settings.embed_batch_size])
        raw_seconds = time.perf_counter() - started

        kb_rate = index.embeddings_computed / index_seconds
        raw_rate = len(sample) / raw_seconds
        result = {
            "source": str(args.source),
            "model": embedder.model,
            "documents": report.documents_found,
            "import_seconds": round(import_seconds, 2),
            "index_seconds": round(index_seconds, 2),
            "chunks": len(texts),
            "embedded": index.embeddings_computed,
            "kb_chunks_per_second": round(kb_rate, 2),
            "raw_sample": len(sample),
            "raw_chunks_per_second": round(raw_rate, 2),
            "kb_over_raw": round(kb_rate / raw_rate, 3),
            "failed": index.documents_failed,
        }
        print(json.dumps(result, indent=2))
        out = Path("bench-results")
        out.mkdir(exist_ok=True)
        (out / "import_index.json").write_text(json.dumps(result, indent=2))
        return 0
    finally:
        stop_embedded(root / "postgres")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
