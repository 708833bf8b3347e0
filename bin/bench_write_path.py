#!/usr/bin/env python
"""Write-path benchmark (design §3, §4, §14): kb vs the git CLI, side by side in one run.

Three measurements, each leg interleaved round by round with its reference, medians reported:

1. **Revisions per second** with 1, 4 and 16 concurrent writer processes on one workspace, each
   recording one-file revisions (``kb.transaction``), against the same number of processes running
   ``git commit -q -- <own file>`` on one repository (serialized by an flock, as git's own
   ``index.lock`` would otherwise make them fail). Goal: ≥ 100/s with ≥ 4 writers, ≥ 1.5× git.
2. **A turn** (write one document into a big flat folder, commit) in a workspace of ``--small``
   (173) documents vs one of ``--large`` (6,600) documents with ``--flat`` (4,612) in one folder.
   Goal: large/small ≤ 1.5, ≤ 100 ms. Measured twice: turns in a row, and each turn after
   another writer put a document into the same folder (a head this process has not seen).
3. **Renaming that folder** while a one-file writer keeps committing: the write-lock hold of the
   rename (logged by ``kb.db.locks``) and the other writer's worst commit latency. Goal: ≤ 2 s.
   Then renaming it back and forth alone, interleaved with ``git mv`` + ``git commit`` under an
   flock in a clone of the same repository: lock hold kb ÷ git (goal ≤ 1.5).

Postgres: ``KB_DATABASE_URL`` when set (a fresh database is created), else an embedded server in a
temporary directory. Example::

    python bin/bench_write_path.py --seconds 4 --rounds 3
"""

from __future__ import annotations

import argparse
import fcntl
import logging
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_store import database, git

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

RATE_WS, SMALL_WS, LARGE_WS = 1, 2, 3


def _kb_writer(settings, url, k, seconds, barrier, counts):
    kb = KnowledgeBase(settings, url)
    nonce = time.time_ns()  # every write changes the file, in every round (no net-empty commits)
    barrier.wait(120)
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        with kb.transaction(RATE_WS, f"writer {k} #{n}", f"w{k}") as tx:
            tx.write(f"/documents/writers/w{k}.md", f"{k}:{n}:{nonce}\n")
        n += 1
    counts[k] = n


def _git_writer(repo, k, seconds, barrier, counts):
    target = repo / "documents" / "writers" / f"g{k}.md"
    lock = open(repo / ".git" / "bench.lock", "w")
    nonce = time.time_ns()  # as the kb leg: a round repeating the last round's bytes would commit nothing
    barrier.wait(120)
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            target.write_text(f"{k}:{n}:{nonce}\n")
            git(repo, "-c", "user.name=bench", "-c", "user.email=b@x", "add", "--", str(target))
            git(repo, "-c", "user.name=bench", "-c", "user.email=b@x", "commit", "-q", "-m", f"g{k} #{n}")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        n += 1
    counts[k] = n


def _rate(target, args_of, writers: int, seconds: float) -> float:
    ctx = multiprocessing.get_context("fork")
    barrier, counts = ctx.Barrier(writers + 1), ctx.Manager().dict()
    procs = [ctx.Process(target=target, args=(*args_of(k), seconds, barrier, counts)) for k in range(writers)]
    for proc in procs:
        proc.start()
    barrier.wait(120)
    start = time.perf_counter()
    for proc in procs:
        proc.join(seconds + 120)
    elapsed = time.perf_counter() - start
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return sum(counts.values()) / elapsed


def bench_rates(kb: KnowledgeBase, url: str, workdir: Path, seconds: float, rounds: int) -> None:
    kb.create_workspace(RATE_WS)
    with kb.transaction(RATE_WS, "seed", "bench") as tx:
        for k in range(16):
            tx.write(f"/documents/writers/w{k}.md", "seed\n")
    gitrepo = workdir / "gitref"
    gitrepo.mkdir()
    git(gitrepo, "init", "-q")
    (gitrepo / "documents" / "writers").mkdir(parents=True)
    for k in range(16):
        (gitrepo / "documents" / "writers" / f"g{k}.md").write_text("seed\n")
    git(gitrepo, "add", "-A")
    git(gitrepo, "-c", "user.name=bench", "-c", "user.email=b@x", "commit", "-q", "-m", "seed")
    print("\nrevisions/s (median of rounds; each round: kb leg then git leg)")
    for writers in (1, 4, 16):
        kb_rates, git_rates = [], []
        for _ in range(rounds):
            kb_rates.append(_rate(_kb_writer, lambda k: (kb.settings, url, k), writers, seconds))
            git_rates.append(_rate(_git_writer, lambda k: (gitrepo, k), writers, seconds))
        kb_r, git_r = statistics.median(kb_rates), statistics.median(git_rates)
        print(
            f"  {writers:>2} writers: kb {kb_r:7.1f}/s   git CLI {git_r:7.1f}/s   kb/git {kb_r / git_r:5.2f}",
            flush=True,
        )


def build_workspace(kb: KnowledgeBase, ws: int, documents: int, flat: int) -> None:
    kb.create_workspace(ws)
    with kb.transaction(ws, "import", "bench") as tx:
        for i in range(documents):
            folder = "Flat" if i < flat else f"Area {i % 30}"
            tx.write(f"/documents/{folder}/note {i}.md", f"# Note {i}\n\nbody of note {i}\n")


def bench_turns(kb: KnowledgeBase, small: int, large: int, flat: int, rounds: int, other: KnowledgeBase) -> None:
    """Two legs, each small/large interleaved round by round: turns in a row in one process, and
    turns after another writer (``other``: its own KnowledgeBase, so its own caches, as another
    process) put a document into the same folder, so each turn starts from a head this process
    has never seen (timed: the turn only)."""
    build_workspace(kb, SMALL_WS, small, min(flat, small * 2 // 3))
    build_workspace(kb, LARGE_WS, large, flat)
    for leg in ("in a row", "after another writer"):
        times: dict[int, list[float]] = {SMALL_WS: [], LARGE_WS: []}
        for r in range(rounds):
            for ws in (SMALL_WS, LARGE_WS):
                if leg != "in a row":
                    with other.transaction(ws, f"other {r}", "other") as tx:
                        tx.write(f"/documents/Flat/other note {r}.md", f"other {r}\n")
                start = time.perf_counter()
                turn = kb.turn(ws, f"bench-{r}", "agent")
                turn.write(f"/documents/Flat/turn note {leg[0]} {r}.md", f"turn {r}\n")
                assert turn.commit() is not None
                times[ws].append((time.perf_counter() - start) * 1000)
        s, lg = statistics.median(times[SMALL_WS]), statistics.median(times[LARGE_WS])
        print(
            f"\nturn (write 1 document into the flat folder + commit), {leg}, median of {rounds}:\n"
            f"  {small} documents: {s:6.1f} ms   {large} documents ({flat} in one folder): {lg:6.1f} ms   "
            f"ratio {lg / s:4.2f}",
            flush=True,
        )


class _LockHolds(logging.Handler):
    def __init__(self):
        super().__init__()
        self.holds: list[float] = []

    def emit(self, record):
        if record.args and record.msg.startswith("workspace %s: write lock held"):
            self.holds.append(record.args[1])


def _one_file_writer(settings, url, stop, latencies, holds):
    kb = KnowledgeBase(settings, url)
    mine = _LockHolds()  # a group this writer leads may record the rename: its holds count too
    mine.holds = holds
    logging.getLogger("kb.db.locks").addHandler(mine)
    n = 0
    while not stop.is_set():
        start = time.perf_counter()
        with kb.transaction(LARGE_WS, f"one-file #{n}", "other") as tx:
            tx.write("/documents/other.md", f"{n}\n")
        latencies.append(time.perf_counter() - start)
        n += 1


def bench_rename(kb: KnowledgeBase, url: str, flat: int, rounds: int) -> None:
    holds = _LockHolds()
    lock_log = logging.getLogger("kb.db.locks")
    lock_log.addHandler(holds)
    lock_log.setLevel(logging.DEBUG)
    ctx = multiprocessing.get_context("fork")
    manager = ctx.Manager()
    stop, latencies, other_holds = ctx.Event(), manager.list(), manager.list()
    other = ctx.Process(target=_one_file_writer, args=(kb.settings, url, stop, latencies, other_holds))
    other.start()
    time.sleep(1.0)
    start = time.perf_counter()
    with kb.transaction(LARGE_WS, "rename the flat folder", "bench") as tx:
        tx.move("/documents/Flat", "/documents/Flat renamed")
    wall = time.perf_counter() - start
    time.sleep(1.0)
    stop.set()
    other.join(60)
    lock_log.removeHandler(holds)
    moved = sum(1 for p in kb.list_paths(LARGE_WS) if p.startswith("/documents/Flat renamed/"))
    print(
        f"\nrename of a folder of {moved} documents while a one-file writer commits:\n"
        f"  rename wall {wall:5.2f} s, write lock held {max([*holds.holds, *other_holds]):5.2f} s (longest hold, either "
        f"process: a group the other writer leads may record the rename); other writer: "
        f"{len(latencies)} commits, worst latency {max(latencies):5.2f} s, "
        f"median {statistics.median(latencies) * 1000:5.1f} ms",
        flush=True,
    )
    # the same rename back and forth, alone, against `git mv` + `git commit` under an flock in a
    # clone of the same repository (full checkout), interleaved round by round
    clone = Path(tempfile.mkdtemp(prefix="kb-bench-rename-")) / "clone"
    subprocess.run(["git", "clone", "-q", str(kb.store(LARGE_WS).path), str(clone)], check=True)
    names = ("Flat renamed", "Flat")
    ours, theirs = [], []
    lock_log.addHandler(holds)
    for r in range(rounds):
        src, dst = names[r % 2], names[(r + 1) % 2]
        with kb.transaction(LARGE_WS, f"rename {r}", "bench") as tx:
            tx.move(f"/documents/{src}", f"/documents/{dst}")
        ours.append(holds.holds[-1])
        with open(clone / ".git" / "bench.lock", "w") as lock:
            start = time.perf_counter()
            fcntl.flock(lock, fcntl.LOCK_EX)
            git(clone, "mv", f"documents/{src}", f"documents/{dst}")
            git(clone, "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-q", "-m", f"rename {r}")
            fcntl.flock(lock, fcntl.LOCK_UN)
            theirs.append(time.perf_counter() - start)
    lock_log.removeHandler(holds)
    subprocess.run(["rm", "-rf", str(clone.parent)], check=False)
    k, g = statistics.median(ours), statistics.median(theirs)
    print(
        f"folder rename alone, median of {rounds}: kb write lock held {k:5.2f} s   "
        f"git mv + commit under flock {g:5.2f} s   kb/git {k / g:4.2f} (goal <= 1.5)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="Length of one rate leg.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=173)
    parser.add_argument("--large", type=int, default=6600)
    parser.add_argument("--flat", type=int, default=4612)
    parser.add_argument("--skip", default="", help="Comma-separated legs to skip: rates,turns,rename.")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    workdir = Path(tempfile.mkdtemp(prefix="kb-bench-write-"))
    url, cleanup = database(workdir)
    try:
        kb = KnowledgeBase.open(
            Settings(database_url=url, storage_root=workdir / "storage", embedding_model="hashing", lock_timeout=120.0)
        )
        if "rates" not in skip:
            bench_rates(kb, url, workdir, args.seconds, args.rounds)
        if "turns" not in skip or "rename" not in skip:
            other = KnowledgeBase(kb.settings, url)
            bench_turns(kb, args.small, args.large, args.flat, max(args.rounds, 5) * 3, other)
            other.close()
        if "rename" not in skip:
            bench_rename(kb, url, args.flat, max(args.rounds, 5))
    finally:
        from kb.db.database import close_pools

        close_pools()
        cleanup()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    main()
