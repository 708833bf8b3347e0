#!/usr/bin/env python
"""Seed and span-fill benchmark (design §9, §10, §14): ratios against references in one run.

Builds a legacy database with ``../shared/legacy/make_legacy.py`` from ``--source`` (default the
tldr pages, hash vectors named ``legacy-hash-384``) as legacy workspace 1, and the ``linux`` part of
it as legacy workspace 2 (a smaller set, for the memory comparison). Then, interleaved round by
round (``--rounds``, medians reported):

* seed: ``kb.seed(..., yes=True, flip=True)`` of legacy workspace 1 into a fresh kb workspace (plan,
  one revision, parity, projection, identity and chunk adoption) **vs** ``kb.import_folder`` of
  the same markdown folder into a fresh workspace followed by its projection (``kb.project``): the
  reference is the same documents as one revision from files, with their document rows.
  Documents/s for both and the ratio seed/import.
* span fill: ``kb.span_fill().run()`` of the seeded workspace (spans reset between rounds) **vs**
  the reference: reading the same blobs from git and finding each chunk text with ``str.find``
  (the alignment's own work without Postgres). Documents/s, goal ≥ 1,000.

Memory: one untimed seed per legacy workspace under ``tracemalloc`` (Python heap peak), so the
peak for ~2,000 and ~6,600 documents can be compared (bodies are streamed; the plan keeps one small
record per document). The embedder registered is a model named ``legacy-hash-384`` that raises if
called: seeding must embed nothing. Postgres: ``KB_DATABASE_URL``'s server when set, else an
embedded one in a temporary directory. Example::

    python bin/bench_seed.py --source ../shared/corpus/tldr/pages --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import psycopg
from psycopg import sql

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from tests.support.named_queries import queries

HERE = Path(__file__).resolve().parents[1]
SHARED = HERE.parent / "shared"


class MustNotEmbed:
    """An embedder named like the legacy model that fails if anything asks it for a vector."""

    model, dim, semantic = "legacy-hash-384", 384, False

    def embed(self, texts: list[str]) -> np.ndarray:
        raise AssertionError(f"seeding embedded {len(texts)} texts; it must adopt the legacy vectors")


def create_database(server: str, name: str) -> str:
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL(queries["create_database"]).format(database=sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(server)
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo(**info)


def make_legacy(dsn: str, source: Path, workspace: int) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            str(SHARED / "legacy" / "make_legacy.py"),
            "--dsn",
            dsn,
            "--source",
            str(source),
            "--workspace",
            str(workspace),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def reference_alignment(kb: KnowledgeBase, ws: int) -> int:
    """Read every adopted document's blob from git and find its chunk texts in order (no Postgres
    writes): the alignment work alone. Returns the documents aligned."""
    with psycopg.connect(kb.database_url) as conn:
        rows = conn.execute(queries["bench_seeded_chunk_texts"], {"workspace_id": ws}).fetchall()
    repo = kb.store(ws).repository
    for content_id, texts in rows:
        text, cursor = repo.blob(content_id).decode(), 0
        for chunk in texts:
            found = text.find(chunk, cursor)
            cursor = found + len(chunk) if found >= 0 else cursor
    return len(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", type=Path, default=SHARED / "corpus" / "tldr" / "pages")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    if not (SHARED / "legacy" / "make_legacy.py").exists() or not a.source.is_dir():
        print(f"needs ../shared/legacy/make_legacy.py and {a.source}", file=sys.stderr)
        return 2
    from kb.db.database import start_embedded, stop_embedded

    work = Path(tempfile.mkdtemp(prefix="kb-bench-seed-"))
    server, started = os.environ.get("KB_DATABASE_URL"), None
    if not server:
        started = work / "pg"
        server = start_embedded(started, database="postgres")
    tag = uuid.uuid4().hex[:8]
    kb_url, legacy_url = create_database(server, f"kb_bench_{tag}"), create_database(server, f"legacy_bench_{tag}")
    try:
        t, full = timed(lambda: make_legacy(legacy_url, a.source, 1))
        print(f"legacy workspace 1: {full['documents']} documents, {full['chunks']} chunks ({t:.0f} s to generate)")
        subset = a.source / "linux"
        small = make_legacy(legacy_url, subset, 2) if subset.is_dir() else None
        kb = KnowledgeBase.open(Settings(database_url=kb_url, storage_root=work / "storage", embedding_model="hashing"))
        kb.use_embedder(MustNotEmbed())

        seed_s, import_s, fill_s, ref_s = [], [], [], []
        seeded = imported = filled = aligned = 0
        for r in range(a.rounds):
            ws_seed, ws_import = 10 + r, 100 + r
            t, report = timed(lambda: kb.seed(legacy_url, 1, ws_seed, yes=True, flip=True))
            seed_s.append(t)
            seeded = len(report.seeded)
            assert report.parity.ok and report.chunks_adopted == full["chunks"], report.summary()
            t, imp = timed(lambda: (kb.import_folder(a.source, ws_import), kb.project(ws_import))[0])
            import_s.append(t)
            imported = imp.documents_found
            with psycopg.connect(kb.database_url, autocommit=True) as conn:  # spans back to NULL
                conn.execute(queries["bench_forget_spans"], {"workspace_id": ws_seed})
                conn.execute(queries["bench_forget_span_fill_skips"])
                conn.execute(queries["bench_span_fill_unthrottled"])
            t, fill = timed(lambda: kb.span_fill().run(ws_seed))
            fill_s.append(t)
            filled = fill.documents_filled + fill.documents_stale
            t, aligned = timed(lambda: reference_alignment(kb, ws_seed))
            ref_s.append(t)
            print(
                f"round {r + 1}: seed {seed_s[-1]:.1f} s, import {import_s[-1]:.1f} s, span fill {fill_s[-1]:.2f} s "
                f"({fill.documents_filled} filled, {fill.documents_stale} stale), reference alignment {ref_s[-1]:.2f} s",
                flush=True,
            )
        ms, mi, mf, mr = (statistics.median(x) for x in (seed_s, import_s, fill_s, ref_s))
        print(f"seed phases of the last round (s): {report.summary()['phases']}")
        print(f"\nseed:      {seeded} documents in {ms:.2f} s = {seeded / ms:,.0f} documents/s (median of {a.rounds})")
        print(f"import+projection: {imported} documents in {mi:.2f} s = {imported / mi:,.0f} documents/s (reference)")
        print(f"ratio seed/import throughput: {(seeded / ms) / (imported / mi):.2f}")
        print(f"span fill: {filled} documents in {mf:.2f} s = {filled / mf:,.0f} documents/s (goal >= 1,000)")
        print(
            f"alignment alone (git blobs + str.find): {aligned / mr:,.0f} documents/s; "
            f"span fill / alignment = {(filled / mf) / (aligned / mr):.2f}"
        )

        for legacy_ws, summary in ((2, small), (1, full)):
            if summary is None:
                continue
            tracemalloc.start()
            kb.seed(legacy_url, legacy_ws, 500 + legacy_ws, yes=True)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            print(
                f"memory: seeding {summary['documents']} legacy rows peaked at {peak / 2**20:.1f} MiB of Python heap "
                f"({peak / summary['documents'] / 1024:.1f} KiB per document)"
            )
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            for name in (f"kb_bench_{tag}", f"legacy_bench_{tag}"):
                conn.execute(sql.SQL(queries["bench_drop_database"]).format(database=sql.Identifier(name)))
        if started:
            stop_embedded(started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
