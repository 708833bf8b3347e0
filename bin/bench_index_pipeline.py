#!/usr/bin/env python
"""Index pipeline benchmark (design §7, §14): kb's indexing against kb's chunker + embedder alone.

Two rows, each leg interleaved round by round with its reference, medians reported:

1. **Throughput with the hashing embedder**: the reference cuts every corpus document with kb's
   chunker and embeds the chunk texts with the hashing embedder in batches of
   ``KB_EMBED_BATCH_SIZE`` (no Postgres); both legs first run once on 50 files (warm-up: imports,
   the tokenizer, kb's language model), untimed; kb imports the corpus into a fresh workspace (not timed),
   empties the embedding cache and runs ``kb.index`` (projection, blob reads, chunking, cache
   look-ups, embedding, chunk rows). chunks/s each; ratio kb ÷ reference (goal ≥ 0.7).
2. **Peak memory (max RSS) of a worker with the hashing embedder**: a child process that only cuts
   and embeds the corpus as in 1, against ``kb worker --until-idle`` indexing a fresh import of it
   (``os.wait4``'s ru_maxrss of each child, taken by a small launcher process: ``RSS_LAUNCHER``). Ratio
   kb ÷ reference (goal ≤ 1.1). ru_maxrss is the largest of the worker's processes, each alone (a
   cutter process, kb.index.cutting, counts only when it is the largest), so the row also prints
   the peak of the worker's processes' resident memory summed (/proc, sampled every 20 ms).

``--model NAME`` (throughput row) runs both legs with another embedder instead of hashing (e.g.
``minilm``, through onnxruntime as kb runs it; ``use-m3``): the reference embeds the chunk texts with
the same embedder object kb builds from ``KB_EMBEDDING_MODEL=NAME`` (``make_embedder``), warmed up
on the same 50 files, so the ratio says whether kb's pipeline or the embedder sets the pace. A
model embeds tens of chunks a second here, not thousands: use a small ``--limit`` (200 files:
~400 chunks).

``--fingerprint`` (with ``--compare``) then checks that both trees stored the same index: every
chunk, vector, tsvector, stamp, document-terms and statistics row of this tree's last run against the
compared tree's (bin/index_fingerprint.py, md5 per table); the bench exits 1 when any part differs.

``--compare TREE`` (throughput row, embedded server only) also times another checkout's kb (e.g.
main) in every round, right after this tree's run and against the same round's reference: a child
process with ``PYTHONPATH=TREE`` warms up on the same 50 files, imports the corpus into a fresh
database of its own (that tree's migrations) and times its ``kb.index`` (the import and warm-up
untimed), so both trees meet the same load — on a shared machine, separate runs of the bench drift
apart more than the trees differ.

Usage: python bin/bench_index_pipeline.py [--corpus DIR] [--limit N] [--rounds 3] [--work /tmp/kb-bench-pipeline]
       [--compare TREE [--fingerprint]] [--model hashing|minilm|use-m3]
Postgres: ``KB_DATABASE_URL`` when set, else an embedded server under --work.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bin"))

from index_fingerprint import differences, fingerprint  # noqa: E402

from kb.db import database  # noqa: E402
from kb.index.chunking import Chunker  # noqa: E402
from kb.index.embedding import HashingEmbedder, make_embedder  # noqa: E402
from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.settings import Settings  # noqa: E402
from kb.store.indexable import decode_document  # noqa: E402
from tests.support.named_queries import queries  # noqa: E402

REFERENCE_CHILD = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from kb.index.chunking import Chunker
from kb.index.embedding import HashingEmbedder
from kb.store.indexable import decode_document
chunker, embedder = Chunker({chunk_size}), HashingEmbedder({dim})
texts = []
for path in sorted(Path({corpus!r}).rglob("*.md")):
    texts += [c.text for c in chunker.chunk(decode_document(path.read_bytes()))]
    while len(texts) >= {batch}:
        embedder.embed(texts[:{batch}])
        texts = texts[{batch}:]
embedder.embed(texts)
"""


COMPARE_CHILD = """
import shutil, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from kb.db import database
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from tests.support.named_queries import queries
shutil.rmtree({storage!r}, ignore_errors=True)
kb = KnowledgeBase.open(Settings(storage_root={storage!r}, embedding_model="hashing", database_url={url!r}))
for ws, corpus in ((1, {warm!r}), (2, {corpus!r})):
    kb.import_folder(Path(corpus), ws, message="bench import", author="bench")
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["bench_forget_embeddings"])
    start = time.perf_counter()
    report = kb.index(ws)
    elapsed = time.perf_counter() - start
    assert report.documents_failed == 0 and report.embeddings_computed > 0, report
print(report.chunks_written / elapsed, report.chunks_written)
"""


def compare_rate(tree: Path, admin_url: str, work: Path, warm: Path, corpus: Path) -> tuple[float, int]:
    """(chunks/s, chunks) of ``tree``'s kb indexing ``corpus`` (``COMPARE_CHILD``): a fresh database
    ``kb_pipeline_compare`` on the embedded server (``admin_url``: its ``kb_bench`` database) and a
    fresh storage root under ``work``. Exits on failure."""
    with database.connect(admin_url, autocommit=True) as conn:
        conn.execute(queries["drop_database"].format(database='"kb_pipeline_compare"'))
        conn.execute(queries["create_database"].format(database='"kb_pipeline_compare"'))
    child = COMPARE_CHILD.format(
        root=str(tree),
        storage=str(work / "compare-storage"),
        url=admin_url.replace("/kb_bench?", "/kb_pipeline_compare?"),
        warm=str(warm),
        corpus=str(corpus),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env["PYTHONPATH"] = str(tree)
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        sys.exit(f"--compare {tree} failed: {done.stderr[-2000:]}")
    rate, chunks = done.stdout.split()[-2:]
    return float(rate), int(chunks)


def reference_rate(files: list[Path], settings: Settings, embedder=None) -> tuple[float, int]:
    """(chunks/s, chunks) of kb's chunker + an embedder alone over ``files`` (``embedder``: the
    hashing embedder when None)."""
    chunker = Chunker(settings.chunk_size)
    embedder = embedder or HashingEmbedder(settings.embedding_dim)
    size = settings.embed_batch_size
    start, chunks, texts = time.perf_counter(), 0, []
    for path in files:
        texts += [c.text for c in chunker.chunk(decode_document(path.read_bytes()))]
        while len(texts) >= size:
            embedder.embed(texts[:size])
            chunks += size
            texts = texts[size:]
    embedder.embed(texts)
    chunks += len(texts)
    return chunks / (time.perf_counter() - start), chunks


def fresh_workspace(kb: KnowledgeBase, ws: int, corpus: Path) -> None:
    """Import ``corpus`` as workspace ``ws`` and empty the embedding cache (not timed)."""
    kb.import_folder(corpus, ws, message="bench import", author="bench")
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["bench_forget_embeddings"])


RSS_LAUNCHER = """
import os, sys
devnull = os.open(os.devnull, os.O_WRONLY)
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 1)])
_, status, usage = os.wait4(pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""
"""Runs a command and prints its exit code and ru_maxrss: a small process between the bench and the
measured one, since a process spawned by the bench itself starts with the bench's peak (Linux
keeps the peak of the memory a process replaces at exec, and subprocess spawns by vfork), so after
the throughput leg every child read as the bench's ~230 MB."""


def _tree_rss(root: int) -> int:
    """Bytes resident in the descendants of ``root`` (not ``root``), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree, grew = {root}, True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grew = True
    total = 0
    for pid in tree - {root}:
        with contextlib.suppress(OSError, ValueError):
            total += int((Path("/proc") / str(pid) / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return total


def max_rss_mb(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``command`` to its end: ``(its peak resident memory in MB (ru_maxrss: the largest of it and
    its child processes, each alone), the peak of its processes' resident memory summed, sampled
    every 20 ms)``. Exits on failure."""
    process = subprocess.Popen(
        [sys.executable, "-c", RSS_LAUNCHER, *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    peak = 0
    while process.poll() is None:
        peak = max(peak, _tree_rss(process.pid))
        time.sleep(0.02)
    out, err = process.communicate()
    code, maxrss = (int(x) for x in out.split()) if out.strip() else (process.returncode, 0)
    if process.returncode != 0 or code != 0:
        sys.exit(f"{command[:3]} failed: {err.decode()[-2000:]}")
    return maxrss / 1024, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus" / "tldr" / "pages")
    parser.add_argument("--limit", type=int, default=0, help="only the first N files (0: all)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--legs", default="throughput,memory")
    parser.add_argument("--work", type=Path, default=Path("/tmp/kb-bench-pipeline"))
    parser.add_argument("--model", default="hashing", help="the embedder of both throughput legs (default hashing)")
    parser.add_argument("--compare", type=Path, help="another checkout of kb to time in the same rounds")
    parser.add_argument(
        "--fingerprint", action="store_true", help="with --compare: check both trees stored the same index"
    )
    args = parser.parse_args()
    shutil.rmtree(args.work / "storage", ignore_errors=True)
    settings = Settings(storage_root=args.work / "storage", embedding_model=args.model)
    if args.model != "hashing" and ("memory" in args.legs or args.compare):
        sys.exit("--model other than hashing times the throughput row alone: add --legs throughput, no --compare")
    embedder = None if args.model == "hashing" else make_embedder(settings)
    admin_url = None
    if settings.database_url is None:
        url = admin_url = database.start_embedded(args.work / "pg", database="kb_bench")
        with database.connect(url, autocommit=True) as conn:
            conn.execute(queries["drop_database"].format(database='"kb_pipeline_run"'))
            conn.execute(queries["create_database"].format(database='"kb_pipeline_run"'))
        settings = settings.model_copy(update={"database_url": url.replace("/kb_bench?", "/kb_pipeline_run?")})
    if args.compare and admin_url is None:
        sys.exit("--compare needs the embedded server (unset KB_DATABASE_URL)")
    kb = KnowledgeBase.open(settings)
    corpus = args.work / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)
    files = sorted(args.corpus.rglob("*.md"))[: args.limit or None]
    for path in files:
        target = corpus / path.relative_to(args.corpus)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    files = sorted(corpus.rglob("*.md"))
    print(f"{len(files)} documents of {args.corpus}; load {os.getloadavg()[0]:.1f}", flush=True)
    ws = 0
    if "throughput" in args.legs:
        ours, theirs, compared = [], [], []
        reference_rate(files[:50], settings, embedder)  # warm-up: the chunker's imports and tokenizer
        # kb's warm-up likewise, on the same 50 files: its imports and the language classifier's
        # model (loaded once per process, 0.7 s), so both legs are timed warm
        warm = args.work / "warm-corpus"
        shutil.rmtree(warm, ignore_errors=True)
        for path in files[:50]:
            target = warm / path.relative_to(corpus)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        ws += 1
        fresh_workspace(kb, ws, warm)
        kb.index(ws)
        for number in range(args.rounds):
            rate, chunks = reference_rate(files, settings, embedder)
            theirs.append(rate)
            # the compared tree runs after this one in even rounds and before it in odd ones, so
            # neither always follows the reference
            if args.compare and admin_url is not None and number % 2:
                other, other_chunks = compare_rate(args.compare.resolve(), admin_url, args.work, warm, corpus)
            ws += 1
            fresh_workspace(kb, ws, corpus)
            start = time.perf_counter()
            report = kb.index(ws)
            ours.append(report.chunks_written / (time.perf_counter() - start))
            assert report.documents_failed == 0 and report.embeddings_computed > 0, report
            line = f"  round: kb {ours[-1]:.0f} chunks/s ({report.chunks_written}), reference {rate:.0f} ({chunks})"
            if args.compare and admin_url is not None:
                if not number % 2:
                    other, other_chunks = compare_rate(args.compare.resolve(), admin_url, args.work, warm, corpus)
                compared.append(other / rate)
                line += f", compared tree {other:.0f} ({other_chunks})"
            print(line, f"load {os.getloadavg()[0]:.1f}", flush=True)
        kb_rate, ref_rate = statistics.median(ours), statistics.median(theirs)
        print(
            f"indexing, {args.model} embedder: kb {kb_rate:.0f} chunks/s"
            f"   chunker+{args.model} alone {ref_rate:.0f} chunks/s"
            f"   kb/reference {kb_rate / ref_rate:.2f} (goal >= 0.7)",
            flush=True,
        )
        if compared:
            ratios = [o / t for o, t in zip(ours, theirs)]
            print(
                f"  per round kb/reference: this tree {statistics.median(ratios):.2f} (median of"
                f" {', '.join(f'{r:.2f}' for r in ratios)}), {args.compare} {statistics.median(compared):.2f}"
                f" (median of {', '.join(f'{r:.2f}' for r in compared)})",
                flush=True,
            )
        if args.fingerprint and compared and admin_url is not None:
            # the compared tree's last round: workspace 2 of its own database (COMPARE_CHILD)
            ours = fingerprint(settings.database_url, ws)
            theirs = fingerprint(admin_url.replace("/kb_bench?", "/kb_pipeline_compare?"), 2)
            for part in sorted(ours):
                print(f"  {part:22s} {ours[part][0]:6d} rows  {ours[part][1]}  {theirs.get(part)}")
            if differences(ours, theirs):
                sys.exit(f"the trees stored different indexes: {', '.join(differences(ours, theirs))}")
            print("  fingerprint: this tree stored exactly what the compared tree did", flush=True)
    if "memory" in args.legs:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
        env.update(
            KB_DATABASE_URL=settings.database_url,
            KB_STORAGE_ROOT=str(settings.storage_root),
            KB_EMBEDDING_MODEL="hashing",
            PYTHONPATH=str(ROOT),
        )
        child = REFERENCE_CHILD.format(
            root=str(ROOT),
            chunk_size=settings.chunk_size,
            dim=settings.embedding_dim,
            corpus=str(corpus),
            batch=settings.embed_batch_size,
        )
        ours, theirs, summed = [], [], []
        for _ in range(args.rounds):
            theirs.append(max_rss_mb([sys.executable, "-c", child], env)[0])
            ws += 1
            fresh_workspace(kb, ws, corpus)
            worker = [sys.executable, "-m", "kb.adapters.cli.main", "worker", "--until-idle", "-q"]
            own, total = max_rss_mb(worker, env)
            ours.append(own)
            summed.append(total)
            print(
                f"  round: kb worker {ours[-1]:.0f} MB (its processes summed {summed[-1]:.0f} MB),"
                f" reference {theirs[-1]:.0f} MB"
            )
        kb_mb, ref_mb = statistics.median(ours), statistics.median(theirs)
        print(
            f"worker peak memory, hashing: kb worker {kb_mb:.0f} MB   chunker+hashing alone {ref_mb:.0f} MB"
            f"   kb/reference {kb_mb / ref_mb:.2f} (goal <= 1.1)"
            f"   the worker's processes summed {statistics.median(summed):.0f} MB"
            f" ({statistics.median(summed) / ref_mb:.2f})"
        )
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
