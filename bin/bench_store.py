#!/usr/bin/env python
"""Store benchmark (design §14): kb vs the git CLI on the same repository, ratios in one run.

Builds a workspace of ``--documents`` documents (default 20,000) over ``--revisions`` revisions
(default 1,000: one import, then revisions editing, adding and moving a few documents each), then
times, as medians over ``--repeat`` runs:

* a 1-file commit: ``kb.transaction`` writing one document  vs  ``git commit -q -m … -- path``
  (index refresh + commit, the git CLI's way to record a one-file change) on the same repository;
* a per-document history: ``kb.store.history(path)`` (Postgres rows)  vs  ``git log --format=%H -- path``.

* loose objects: the most loose objects kb's repository held during the build (sampled every 25
  revisions) with a worker running the jobs writers defer (``--no-worker``: none), and
  ``git log --format=%H -- path`` on kb's repository against a packed (``git clone --bare
  --no-local``) clone of it, interleaved.

Prints the figures and the ratios kb/git (≤ 1.0 means kb is at least as fast). Postgres:
``KB_DATABASE_URL`` when set (a fresh database is created there), else an embedded server in a
temporary directory. Example::

    python bin/bench_store.py --documents 20000 --revisions 1000
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg
from psycopg import sql

from kb.git.maintenance import loose_object_count
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from tests.support.named_queries import queries

WS = 1


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def database(workdir: Path) -> tuple[str, callable]:
    """A fresh database URL and a cleanup function."""
    from kb.db.database import start_embedded, stop_embedded

    server = os.environ.get("KB_DATABASE_URL")
    started = None
    if not server:
        started = workdir / "pg"
        server = start_embedded(started, database="postgres")
    name = f"kb_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL(queries["create_database"]).format(database=sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(server)
    info["dbname"] = name
    url = psycopg.conninfo.make_conninfo(**info)

    def cleanup() -> None:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL(queries["bench_drop_database"]).format(database=sql.Identifier(name)))
        if started:
            stop_embedded(started)

    return url, cleanup


def build(kb: KnowledgeBase, documents: int, revisions: int, rng: random.Random, loose: list[int]) -> list[str]:
    """Import ``documents`` documents, then ``revisions - 1`` small revisions; returns the paths.
    Appends the repository's loose-object count every 25 revisions to ``loose``."""
    paths = [f"/documents/area {i % 40}/topic {i % 400}/note {i}.md" for i in range(documents)]
    kb.create_workspace(WS)
    start = time.perf_counter()
    with kb.transaction(WS, "import", "bench") as tx:
        for i, path in enumerate(paths):
            tx.write(path, f"# Note {i}\n\nbody of note {i}\n" * 4)
    print(f"built revision 1 ({documents} documents) in {time.perf_counter() - start:.1f}s", flush=True)
    start = time.perf_counter()
    if revisions < 2:
        loose.append(loose_object_count(kb.settings.knowledge_store / str(WS)))
    for r in range(2, revisions + 1):
        with kb.transaction(WS, f"edit {r}", "bench") as tx:
            for path in rng.sample(paths, 3):
                tx.write(path, f"# edited in {r}\n{rng.random()}\n")
            tx.write(paths[0], f"hot document, revision {r}\n")  # one document with a long history
            if r % 10 == 0:
                i = rng.randrange(1, len(paths))
                new = paths[i].replace("note ", f"moved {r} note ")
                tx.move(paths[i], new)
                paths[i] = new
        if r % 25 == 0 or r == revisions:  # the last revision too: a short build samples once at least
            loose.append(loose_object_count(kb.settings.knowledge_store / str(WS)))
        if r % 200 == 0:
            print(f"  {r} revisions ({time.perf_counter() - start:.0f}s), {loose[-1]} loose objects", flush=True)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--revisions", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-worker", action="store_true", help="build without a worker (nothing packs)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="kb-bench-"))
    url, cleanup = database(workdir)
    try:
        kb = KnowledgeBase.open(Settings(database_url=url, storage_root=workdir / "storage", embedding_model="hashing"))
        worker = None
        if not args.no_worker:  # as deployed: a worker runs the jobs writers defer (packing among them)
            env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
            env.update(
                KB_DATABASE_URL=url,
                KB_STORAGE_ROOT=str(kb.settings.storage_root),
                KB_EMBEDDING_MODEL="hashing",
                PYTHONPATH=str(Path(__file__).resolve().parents[1]),
            )
            worker = subprocess.Popen(
                [sys.executable, "-m", "kb.adapters.cli.main", "worker", "-q"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        loose: list[int] = []
        try:
            paths = build(kb, args.documents, args.revisions, rng, loose)
        finally:
            if worker is not None:
                worker.send_signal(signal.SIGINT)
                worker.wait(300)
        repo = kb.settings.knowledge_store / str(WS)
        assert git(repo, "status", "--porcelain") == ""
        packed = workdir / "packed.git"
        git(repo, "clone", "-q", "--bare", "--no-local", str(repo), str(packed))
        kb_log, packed_log = [], []
        for _ in range(args.repeat):  # interleaved, round by round
            for fn, times in (
                (lambda: git(repo, "log", "--format=%H", "--", paths[0][1:]), kb_log),
                (lambda: git(packed, "log", "--format=%H", "--", paths[0][1:]), packed_log),
            ):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1000)
        print(
            f"loose objects after {args.revisions} revisions ({'no worker' if worker is None else 'a worker running'}):"
            f" at most {max(loose)} (sampled every 25 revisions), {loose_object_count(repo)} at the end\n"
            f"git log -- path: kb's repository {statistics.median(kb_log):.1f} ms   packed clone "
            f"{statistics.median(packed_log):.1f} ms   ratio {statistics.median(kb_log) / statistics.median(packed_log):.2f}",
            flush=True,
        )
        counter = iter(range(10**9))

        def kb_commit() -> None:
            with kb.transaction(WS, "bench commit", "bench") as tx:
                tx.write(paths[1], f"kb commit {next(counter)}\n")

        def kb_history() -> None:
            assert len(kb.history(WS, paths[0], limit=10_000)) >= args.revisions

        def git_history() -> None:
            assert len(git(repo, "log", "--format=%H", "--", paths[0][1:]).split()) >= args.revisions

        figures = {
            "kb commit (1 file)": median_ms(kb_commit, args.repeat),
            "kb history (1 document)": median_ms(kb_history, args.repeat),
            "git log -- path": median_ms(git_history, args.repeat),
        }
        target = repo / paths[2][1:]

        def git_commit() -> None:
            target.write_text(f"git commit {next(counter)}\n")
            git(
                repo,
                "-c",
                "user.name=bench",
                "-c",
                "user.email=b@x",
                "commit",
                "-q",
                "-m",
                "git bench",
                "--",
                paths[2][1:],
            )

        figures["git commit -- path (1 file)"] = median_ms(git_commit, args.repeat)
        recorded = kb.reconcile(WS)  # the git CLI's commits are recorded like any outside revision
        assert len(recorded) == args.repeat
        print(
            f"\nworkspace: {len(kb.list_paths(WS))} documents, {len(kb.history(WS, limit=10**6))} revisions, "
            f"history of {paths[0]}: {len(kb.history(WS, paths[0], limit=10**6))} revisions"
        )
        for name, value in figures.items():
            print(f"{name:<32} {value:8.1f} ms (median of {args.repeat})")
        print(
            f"{'ratio commit kb/git':<32} {figures['kb commit (1 file)'] / figures['git commit -- path (1 file)']:8.2f}"
        )
        print(f"{'ratio history kb/git':<32} {figures['kb history (1 document)'] / figures['git log -- path']:8.2f}")
    finally:
        cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
