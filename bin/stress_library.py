#!/usr/bin/env python
"""kb as a library under threads (design §4, §14): N threads sharing ONE ``KnowledgeBase`` for T
seconds doing transactions, turns, moves, reads, searches and ``kb.index``, while a loop runs
``git repack -ad`` in the repository and another ends kb's Postgres sessions
(``pg_terminate_backend``). Every operation's reported outcome is then checked against git and
Postgres, and the repository against git's own checks.

Outcomes of writes (each write's commit message carries its own id, so git says whether it landed):

* **landed** — a revision was returned: it must be in git history (same id) and in ``kb.revisions``;
* **failed** — a KbError that does not say the outcome is unknown: the write must not be in git;
  one whose message claims "nothing was recorded" but whose write landed is counted apart
  (``nothing-recorded but landed``), as is a lost-connection error (LockUnavailable …) whose write
  landed: both are the group-commit outcome under dropped connections, a misreport all the same;
* **unknown** — ``CommitOutcomeUnknown`` (or a message saying the write may have landed): either
  way is truthful; how many landed is reported.

Invariants (exit 1 when one breaks): 0 corrupt indexes (``git ls-files --stage`` duplicates, an
unordered index, ``git fsck --strict`` reading it), 0 hangs (an operation running longer than
``--op-timeout``, or a thread that never finishes), 0 misreported outcomes, 0 raw (non-KbError)
exceptions. Prints a table of counts per operation.

Postgres: ``KB_DATABASE_URL`` when set (a fresh database is created there), else an embedded
server in a temporary directory. Example::

    python bin/stress_library.py --threads 8 --seconds 120
"""

from __future__ import annotations

import argparse
import logging
import random
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

from kb.errors import CommitOutcomeUnknown, KbError
from kb.git.gitindex import order_problem
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
from tests.support.named_queries import queries

WS = 1
WRITES = ("transaction", "move", "turn")
WEIGHTS = {"transaction": 30, "move": 10, "turn": 20, "read": 20, "search": 12, "index": 3}
NOTHING_RECORDED = "nothing was recorded"
CONNECTION_ERRORS = ("DatabaseUnavailable", "LockUnavailable", "StatementCanceled")


@dataclass
class Outcome:
    """One operation as its caller saw it."""

    kind: str
    op_id: str
    reported: str  # landed | empty | failed | unknown | ok | error | raw
    seconds: float
    revision: str | None = None
    error: str | None = None
    message: str = ""


@dataclass
class Report:
    """What a stress run found (``Stress.check``)."""

    outcomes: list[Outcome]
    hangs: list[str] = field(default_factory=list)
    corrupt_index: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    """Writes reported landed that git or ``kb.revisions`` lacks (or holds under another id)."""
    phantom: list[str] = field(default_factory=list)
    """Writes reported failed (not unknown) that landed, other than the two kinds below."""
    nothing_recorded_landed: list[str] = field(default_factory=list)
    """Writes whose error said "nothing was recorded" but which landed (group-commit outcomes
    under dropped connections; idempotency keys and truthful outcomes are another branch's work)."""
    dropped_connection_landed: list[str] = field(default_factory=list)
    """Writes refused with a lost-connection error (LockUnavailable …) not saying "nothing was
    recorded", which landed: the same group-commit outcome under dropped connections."""
    unknown_landed: int = 0
    unknown_not_landed: int = 0
    raw_errors: list[str] = field(default_factory=list)
    git_fsck: str = ""
    status_lines: int = 0
    fsck_repairs: dict = field(default_factory=dict)
    pool: dict = field(default_factory=dict)
    repacks: int = 0
    kills: int = 0
    terminated: int = 0

    @property
    def misreported(self) -> int:
        """Every outcome that disagrees with git/Postgres."""
        return (
            len(self.lost) + len(self.phantom) + len(self.nothing_recorded_landed) + len(self.dropped_connection_landed)
        )

    @property
    def ok(self) -> bool:
        return not (
            self.hangs
            or self.corrupt_index
            or self.misreported
            or self.raw_errors
            or self.git_fsck
            or "error" in self.fsck_repairs
        )


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check)


class Stress:
    """One run: ``run()`` drives the threads, ``check()`` compares outcomes with git and Postgres."""

    def __init__(
        self,
        kb: KnowledgeBase,
        threads: int,
        seconds: float,
        op_timeout: float = 60.0,
        repack_every: float = 1.0,
        kill_every: float = 3.0,
        kill_fraction: float = 0.5,
        seed: int = 0,
    ) -> None:
        self.kb, self.threads, self.seconds = kb, threads, seconds
        self.op_timeout, self.repack_every, self.kill_every = op_timeout, repack_every, kill_every
        self.kill_fraction = kill_fraction
        self.seed = seed
        self.repo = kb.settings.knowledge_store / str(WS)
        self.outcomes: list[Outcome] = []
        self.in_flight: dict[int, tuple[str, str, float]] = {}  # thread id -> (kind, op id, start)
        self.hangs: list[str] = []
        self.stop = threading.Event()
        self.repacks = self.kills = self.terminated = 0

    # -- the operations ------------------------------------------------------------------
    def _transaction(self, k: int, op_id: str, rng: random.Random, mine: list[str]) -> str | None:
        path = f"/documents/t{k}/{op_id}.md"
        with self.kb.transaction(WS, f"stress {op_id} transaction", f"thread{k}") as tx:
            tx.write(path, f"# {op_id}\n\nstress note from thread {k}\n")
            if rng.random() < 0.3:
                tx.write(f"/documents/shared/{rng.randrange(5)}.md", f"shared, last by {op_id}\n")
        mine.append(path)
        return tx.revision.id if tx.revision else None

    def _move(self, k: int, op_id: str, rng: random.Random, mine: list[str]) -> str | None:
        if not mine:
            return self._transaction(k, op_id, rng, mine)
        source = mine.pop(rng.randrange(len(mine)))
        target = f"/documents/t{k}/moved/{op_id}.md"
        with self.kb.transaction(WS, f"stress {op_id} move", f"thread{k}") as tx:
            tx.move(source, target)
            tx.write(f"/documents/t{k}/moves.md", f"last move {op_id}\n")  # the revision is never empty
        mine.append(target)
        return tx.revision.id if tx.revision else None

    def _turn(self, k: int, op_id: str, rng: random.Random, mine: list[str]) -> str | None:
        turn = self.kb.turn(WS, f"stress-{op_id}", f"agent{k}")
        try:
            path = f"/documents/t{k}/turn-{op_id}.md"
            turn.write(path, f"# turn {op_id}\n\nwritten by agent {k}\n")
            turn.read(path)
            if mine and rng.random() < 0.3:
                try:
                    turn.edit(rng.choice(mine), "stress note", f"stress note (edited by {op_id})")
                except KbError:
                    pass  # moved or edited meanwhile: the turn's own write still commits
            result = turn.commit(f"stress {op_id} turn")
        except BaseException:
            try:
                turn.abort()
            except KbError:
                pass
            raise
        mine.append(path)
        return result.revision if result else None

    def _read(self, k: int, rng: random.Random, mine: list[str]) -> None:
        if mine:
            self.kb.read(WS, rng.choice(mine))
        self.kb.ls(WS, "/documents")

    def _search(self, rng: random.Random) -> None:
        self.kb.search(WS, rng.choice(["stress note", "thread", "turn written by agent", "shared"]), k=5)

    def _one(self, k: int, kind: str, rng: random.Random, mine: list[str]) -> None:
        op_id = uuid.uuid4().hex[:12]
        ident = threading.get_ident()
        start = time.monotonic()
        self.in_flight[ident] = (kind, op_id, start)
        outcome = Outcome(kind, op_id, "ok", 0.0)
        try:
            if kind in WRITES:
                revision = getattr(self, f"_{kind}")(k, op_id, rng, mine)
                outcome.reported, outcome.revision = ("landed", revision) if revision else ("empty", None)
            elif kind == "read":
                self._read(k, rng, mine)
            elif kind == "search":
                self._search(rng)
            else:
                self.kb.index(WS)
        except CommitOutcomeUnknown as exc:
            outcome.reported, outcome.error, outcome.message = "unknown", type(exc).__name__, str(exc)
        except KbError as exc:
            unknown = "may have landed" in str(exc) or "outcome is unknown" in str(exc)
            outcome.reported = ("unknown" if unknown else "failed") if kind in WRITES else "error"
            outcome.error, outcome.message = type(exc).__name__, str(exc)
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = ([f for f in frames if "/kb/" in f.filename] or frames)[-1]  # kb's last frame
            outcome.reported, outcome.error = "raw", type(exc).__name__
            outcome.message = f"{str(exc)[:200]} (at {Path(where.filename).name}:{where.lineno} {where.name})"
        finally:
            self.in_flight.pop(ident, None)
        outcome.seconds = time.monotonic() - start
        self.outcomes.append(outcome)

    # -- the threads ---------------------------------------------------------------------
    def _worker(self, k: int, deadline: float) -> None:
        rng = random.Random(self.seed * 1000 + k)
        kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
        mine: list[str] = []
        while time.monotonic() < deadline and not self.stop.is_set():
            self._one(k, rng.choices(kinds, weights)[0], rng, mine)

    def _repacker(self) -> None:
        while not self.stop.wait(self.repack_every):
            if git(self.repo, "repack", "-a", "-d", "-q", check=False).returncode == 0:
                self.repacks += 1

    def _killer(self) -> None:
        with psycopg.connect(self.kb.database_url, autocommit=True) as conn:
            while not self.stop.wait(self.kill_every):
                row = conn.execute(queries["stress_terminate_backends"], {"fraction": self.kill_fraction}).fetchone()
                self.kills += 1
                self.terminated += row[0]

    def _watchdog(self) -> None:
        flagged: set[str] = set()
        while not self.stop.wait(0.5):
            now = time.monotonic()
            for kind, op_id, start in list(self.in_flight.values()):
                if now - start > self.op_timeout and op_id not in flagged:
                    flagged.add(op_id)
                    self.hangs.append(f"{kind} {op_id} still running after {self.op_timeout:g}s")

    def run(self) -> None:
        """Seed the workspace, run the threads for ``seconds``, stop the loops."""
        self.kb.create_workspace(WS)
        with self.kb.transaction(WS, "stress seed", "stress") as tx:
            for i in range(5):
                tx.write(f"/documents/shared/{i}.md", f"shared {i}\n")
        deadline = time.monotonic() + self.seconds
        workers = [
            threading.Thread(target=self._worker, args=(k, deadline), name=f"worker-{k}", daemon=True)
            for k in range(self.threads)
        ]
        helpers = [
            threading.Thread(target=f, name=f.__name__, daemon=True)
            for f in (self._repacker, self._killer, self._watchdog)
        ]
        for thread in workers + helpers:
            thread.start()
        for thread in workers:
            thread.join(max(0.0, deadline - time.monotonic()) + self.op_timeout + 30)
        self.stop.set()
        for thread in helpers:
            thread.join(60)
        self.hangs += [f"{t.name} never finished" for t in workers if t.is_alive()]

    # -- the check -----------------------------------------------------------------------
    def check(self) -> Report:
        """Compare every write's reported outcome with git and ``kb.revisions``; run git's checks
        of the repository and its index, then ``kb fsck``."""
        report = Report(
            list(self.outcomes),
            hangs=list(self.hangs),
            repacks=self.repacks,
            kills=self.kills,
            terminated=self.terminated,
        )
        log = git(self.repo, "log", "--format=%H %s").stdout.splitlines()
        landed = {}
        for line in log:
            revision, _, subject = line.partition(" ")
            if subject.startswith("stress ") and subject != "stress seed":
                landed[subject.split()[1]] = revision
        with psycopg.connect(self.kb.database_url) as conn:
            recorded = {r[0] for r in conn.execute(queries["stress_recorded_revisions"], {"workspace_id": WS})}
        for o in report.outcomes:
            if o.reported == "raw":
                report.raw_errors.append(f"{o.kind}: {o.error}: {o.message}")
            if o.kind not in WRITES:
                continue
            actual = landed.get(o.op_id)
            if o.reported == "landed":
                if actual != o.revision or o.revision not in recorded:
                    report.lost.append(
                        f"{o.kind} {o.op_id}: reported {o.revision}, git {actual}, "
                        f"kb.revisions {'has' if o.revision in recorded else 'lacks'} it"
                    )
            elif o.reported in ("failed", "raw", "empty") and actual is not None:
                entry = f"{o.kind} {o.op_id}: {o.error}: {o.message[:160]} — but {actual} landed"
                if NOTHING_RECORDED in o.message.lower():
                    report.nothing_recorded_landed.append(entry)
                elif o.error in CONNECTION_ERRORS:
                    report.dropped_connection_landed.append(entry)
                else:
                    report.phantom.append(entry)
            elif o.reported == "unknown":
                if actual is None:
                    report.unknown_not_landed += 1
                else:
                    report.unknown_landed += 1
        staged = git(self.repo, "ls-files", "--stage", "-z").stdout.split("\0")
        names = Counter(line.split("\t", 1)[1] for line in staged if line)
        report.corrupt_index = [f"{n} listed {c} times" for n, c in names.items() if c > 1]
        problem = order_problem(self.repo / ".git" / "index")
        if problem:
            report.corrupt_index.append(problem)
        fsck = git(self.repo, "fsck", "--strict", "--no-progress", check=False)  # reads the index too
        if fsck.returncode != 0:
            report.git_fsck = (fsck.stderr or fsck.stdout).strip()[:500]
            if "unordered stage entries" in report.git_fsck:
                report.corrupt_index.append(report.git_fsck.splitlines()[0])
        report.status_lines = len(git(self.repo, "status", "--porcelain", "--untracked-files=all").stdout.splitlines())
        try:
            kb_fsck = self.kb.fsck(WS)
        except KbError as exc:  # reported with the rest, not instead of it
            report.fsck_repairs = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        else:
            report.fsck_repairs = {
                "ok": kb_fsck.ok,
                "index rebuilt": kb_fsck.index_repaired,
                "working tree paths": len(kb_fsck.worktree_repaired),
                "revisions recorded": len(kb_fsck.recorded),
            }
        report.pool = pool_state(self.kb.database_url)
        return report


def pool_state(url: str) -> dict:
    """The process's connection pool for ``url`` after the run (psycopg_pool's statistics)."""
    from kb.db import database

    stats = database.pool(url).get_stats()
    return {
        k: stats.get(k)
        for k in (
            "pool_size",
            "pool_available",
            "requests_waiting",
            "connections_lost",
            "requests_errors",
            "connections_errors",
        )
    }


def print_report(report: Report, seconds: float, threads: int) -> None:
    """The summary table and the invariants."""
    kinds = list(WEIGHTS)
    columns = ["landed", "ok", "empty", "failed", "unknown", "error", "raw"]
    counts = {k: Counter(o.reported for o in report.outcomes if o.kind == k) for k in kinds}
    print(
        f"\n{threads} threads on one KnowledgeBase for {seconds:g}s: {len(report.outcomes)} operations, "
        f"{report.repacks} `git repack -ad`, {report.kills} kill rounds ({report.terminated} sessions ended)\n"
    )
    print(f"{'operation':<12}" + "".join(f"{c:>9}" for c in columns) + f"{'max s':>9}")
    for k in kinds:
        slowest = max((o.seconds for o in report.outcomes if o.kind == k), default=0.0)
        print(f"{k:<12}" + "".join(f"{counts[k][c]:>9}" for c in columns) + f"{slowest:>9.1f}")
    errors = Counter(f"{o.kind}/{o.error}" for o in report.outcomes if o.error)
    if errors:
        print("\nerrors by operation/class (first message of each):")
        for name, count in errors.most_common():
            first = next(o.message for o in report.outcomes if f"{o.kind}/{o.error}" == name)
            print(f"  {name:<34}{count:>5}  {' '.join(first.split())[:150]}")
    print("\ninvariants")
    rows = [
        ("corrupt indexes", len(report.corrupt_index)),
        ("hangs", len(report.hangs)),
        ("lost writes (reported landed, absent)", len(report.lost)),
        ("phantom writes (reported failed, landed)", len(report.phantom)),
        ("nothing-recorded but landed (misreport)", len(report.nothing_recorded_landed)),
        ("lost-connection error but landed (misreport)", len(report.dropped_connection_landed)),
        ("raw (non-KbError) exceptions", len(report.raw_errors)),
        ("git fsck --strict errors", 1 if report.git_fsck else 0),
    ]
    for name, value in rows:
        print(f"  {name:<44}{value:>6}")
    print(f"  {'unknown outcomes: landed / not landed':<44}{report.unknown_landed:>3} / {report.unknown_not_landed}")
    print(f"  {'git status lines before kb fsck':<44}{report.status_lines:>6}")
    print(f"  kb fsck afterwards: {report.fsck_repairs}")
    print(f"  connection pool afterwards: {report.pool}")
    for title, items in (
        ("corrupt index", report.corrupt_index),
        ("hang", report.hangs),
        ("lost", report.lost),
        ("phantom", report.phantom),
        ("nothing-recorded but landed", report.nothing_recorded_landed),
        ("lost-connection error but landed", report.dropped_connection_landed),
        ("raw", report.raw_errors),
    ):
        for item in items[:5]:
            print(f"  {title}: {item}")
    if report.git_fsck:
        print(f"  git fsck: {report.git_fsck}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--op-timeout", type=float, default=60.0, help="an operation running longer is a hang")
    parser.add_argument("--repack-every", type=float, default=1.0)
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)  # the pool's notes on sessions this script ends
    from bench_store import database

    with tempfile.TemporaryDirectory(prefix="kb-stress-") as tmp:
        url, cleanup = database(Path(tmp))
        try:
            settings = Settings(
                database_url=url, storage_root=Path(tmp) / "storage", embedding_model="hashing", lock_timeout=20.0
            )
            kb = KnowledgeBase.open(settings)
            stress = Stress(
                kb, args.threads, args.seconds, args.op_timeout, args.repack_every, args.kill_every, seed=args.seed
            )
            stress.run()
            report = stress.check()
            print_report(report, args.seconds, args.threads)
            kb.close()
        finally:
            from kb.db import database as db

            db.close_pools()
            cleanup()
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
