#!/usr/bin/env python
"""Adversarial runs of the store and turns (design §3, §5, §14). Each prints its figures
and exits 1 when an invariant broke. Subcommands:

* ``writers`` — N writer processes × M transactions on one workspace with a Procrastinate worker
  running; writers also race to create case/Unicode twins. Checks: every reported revision is in
  git and Postgres (0 lost), history linear, 0 twin names at HEAD, 0 non-kb errors.
* ``kills`` — K children doing a random transaction, turn commit (recovering a killed turn of the
  same id), import or worker run, each SIGKILLed at a random commit step or after a random delay.
  Checks: ``kb fsck`` ok and Postgres level with git, every reported revision present, at most one
  revision per turn id (0 resurrected turns), git fsck and ``git status`` clean.
* ``fuzz`` — P random paths (case twins, NFC/NFD, device names, dots/spaces, lone surrogates,
  control characters, over-long paths) through ``transaction().write`` and ``turn.write`` +
  ``commit``. Checks: every refusal is a KbError (0 escapes), 0 twins at HEAD, git clean.
* ``fsck-load`` — R runs of ``kb fsck`` while writers commit. Checks: 0 false reports.

Postgres: ``KB_DATABASE_URL`` when set (a fresh database is created there), else an embedded
server in a temporary directory. Example::

    python bin/adversarial_store.py writers --writers 32 --revisions 100
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_store import database, git

from kb.errors import KbError
from kb.faults import COMMIT_POINTS
from kb.knowledge_base import KnowledgeBase
from kb.paths import name_key
from kb.settings import Settings

WS = 1
TWINS = [
    "Foo.md",
    "FOO.md",
    "foo.md",
    unicodedata.normalize("NFC", "Café.md"),
    unicodedata.normalize("NFD", "Café.md"),
    "CAFÉ.md",
]


def twins_at_head(kb: KnowledgeBase) -> list[tuple[str, str]]:
    """Pairs of paths at HEAD that differ only in case/normalization within one folder."""
    seen, clashes = {}, []
    for path in sorted(kb.list_paths(WS)):
        folder, _, name = path.rpartition("/")
        parts = folder.split("/")
        for depth in range(2, len(parts) + 1):  # folder names too
            key = ("/".join(parts[: depth - 1]), name_key(parts[depth - 1]))
            other = seen.setdefault(key, parts[depth - 1])
            if other != parts[depth - 1]:
                clashes.append((other, parts[depth - 1]))
        key = (folder, name_key(name))
        other = seen.setdefault(key, name)
        if other != name:
            clashes.append((other, name))
    return clashes


def git_checks(kb: KnowledgeBase) -> list[str]:
    repo = kb.store(WS).path
    problems = []
    fsck = subprocess.run(["git", "-C", str(repo), "fsck", "--strict"], capture_output=True, text=True)
    if fsck.returncode:
        problems.append(f"git fsck: {fsck.stderr.strip()[:300]}")
    status = git(repo, "status", "--porcelain", "--untracked-files=all")
    if status:
        problems.append(f"git status not clean: {status[:300]}")
    commits = git(repo, "rev-list", "HEAD").split()
    if [r.id for r in kb.history(WS, limit=10**6)] != commits:
        problems.append("Postgres history differs from git")
    if git(repo, "rev-list", "--merges", "HEAD"):
        problems.append("history is not linear")
    return problems


# -- writers -------------------------------------------------------------------------------
def _writer(settings, url, k, revisions, seed, out):
    kb = KnowledgeBase(settings, url)
    rng, ledger = random.Random(seed), {"committed": [], "refused": Counter(), "escaped": []}
    for i in range(revisions):
        try:
            with kb.transaction(WS, f"writer {k} #{i}", f"w{k}") as tx:
                tx.write(f"/documents/w{k}.md", f"{k}:{i}\n")
                if rng.random() < 0.2:
                    tx.write(f"/documents/twins/{rng.choice(TWINS)}", f"{k}:{i}\n")
            ledger["committed"].append((tx.revision.id, f"/documents/w{k}.md", f"{k}:{i}\n"))
        except KbError as exc:
            ledger["refused"][type(exc).__name__] += 1
        except Exception as exc:  # counting escapes is the point
            ledger["escaped"].append(f"{type(exc).__name__}: {exc}"[:200])
    out.put((k, ledger))


def run_writers(kb: KnowledgeBase, writers: int, revisions: int, with_worker: bool) -> list[str]:
    kb.create_workspace(WS)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    worker = ctx.Process(target=lambda: kb.run_worker(concurrency=1)) if with_worker else None
    if worker:
        worker.start()
    start = time.perf_counter()
    procs = [
        ctx.Process(target=_writer, args=(kb.settings, kb.database_url, k, revisions, k, out)) for k in range(writers)
    ]
    for proc in procs:
        proc.start()
    ledgers = dict(out.get(timeout=3600) for _ in procs)
    for proc in procs:
        proc.join(60)
    elapsed = time.perf_counter() - start
    if worker:
        worker.kill()
        worker.join()
    committed = [c for ledger in ledgers.values() for c in ledger["committed"]]
    refused = sum((ledger["refused"] for ledger in ledgers.values()), Counter())
    escaped = [e for ledger in ledgers.values() for e in ledger["escaped"]]
    problems = git_checks(kb)
    history = {r.id for r in kb.history(WS, limit=10**6)}
    lost = [rev for rev, _, _ in committed if rev not in history]
    last = {}
    for _rev, path, text in committed:
        last[path] = text
    stale = [p for p, text in last.items() if kb.read(WS, p).decode() != text]
    twins = twins_at_head(kb)
    print(
        f"writers: {writers} × {revisions}: {len(committed)} revisions in {elapsed:.1f}s "
        f"({len(committed) / elapsed:.1f}/s); refused {dict(refused)}; escaped {len(escaped)}; "
        f"lost {len(lost)}; stale last writes {len(stale)}; twins at HEAD {len(twins)}"
    )
    problems += [f"escaped: {e}" for e in escaped[:5]] + [f"lost revision {r}" for r in lost[:5]]
    problems += [f"last write missing at {p}" for p in stale[:5]] + [f"twins {t}" for t in twins[:5]]
    if len(committed) + sum(refused.values()) + len(escaped) != writers * revisions:
        problems.append("some writers did not report")
    return problems


# -- kills ---------------------------------------------------------------------------------
CHILD = r"""
import json, sys
from kb.knowledge_base import KnowledgeBase
kb = KnowledgeBase.open()
action, n, turn_id = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if action == "transaction":
    with kb.transaction(1, f"txn {n}", "killer") as tx:
        tx.write(f"/documents/t/{n % 13}.md", f"txn {n}\n")
        if n % 3 == 0 and tx.exists(f"/documents/t/{(n + 1) % 13}.md"):
            tx.move(f"/documents/t/{(n + 1) % 13}.md", f"/documents/t/moved {n}.md")
    print(json.dumps({"revision": tx.revision.id if tx.revision else None}), flush=True)
elif action == "turn":
    turn = kb.turn(1, turn_id, "agent")
    result = turn.commit()  # recovery of a killed attempt of this turn id, if any
    if result is None:
        turn.write(f"/documents/turns/{turn_id}.md", f"turn {turn_id}\n")
        turn.write(f"/documents/t/{n % 13}.md", f"turn {n}\n")
        result = turn.commit()
    print(json.dumps({"revision": result.revision if result else None, "turn": turn_id}), flush=True)
elif action == "import":
    report = kb.import_folder(sys.argv[4], 1, prefix=f"imported/{n}")
    print(json.dumps({"revision": report.revision.id if report.revision else None}), flush=True)
else:
    kb.run_worker(until_idle=True)
    print(json.dumps({}), flush=True)
"""


def run_kills(kb: KnowledgeBase, env: dict, kills: int, seed: int, workdir: Path) -> list[str]:
    rng = random.Random(seed)
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "seed") as tx:
        for i in range(13):
            tx.write(f"/documents/t/{i}.md", "seed\n")
    source = workdir / "import-src"
    for i in range(300):
        (source / f"f{i % 10}").mkdir(parents=True, exist_ok=True)
        (source / f"f{i % 10}" / f"doc {i}.md").write_text(f"# doc {i}\n\nbody {i}\n" * 5)
    reported, killed, turn_ids, exits = [], Counter(), {}, Counter()
    pending_turn = None
    n = 0
    while sum(killed.values()) < kills:
        n += 1
        action = rng.choice(["transaction", "transaction", "turn", "turn", "import", "worker"])
        turn_id = pending_turn or f"turn-{n}"
        if action == "turn":
            turn_ids.setdefault(turn_id, 0)
            turn_ids[turn_id] += 1
        child_env = dict(env)
        point = rng.choice([*COMMIT_POINTS, None, None])
        if point and action in ("transaction", "turn"):
            child_env["KB_FAULT_POINT"] = point
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, action, str(n), turn_id, str(source)],
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if "KB_FAULT_POINT" not in child_env:
            try:
                proc.wait(timeout=rng.uniform(0.5, 6.0))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
        if proc.returncode == -signal.SIGKILL:
            killed[action] += 1
            pending_turn = turn_id if action == "turn" else pending_turn
            continue
        exits[proc.returncode] += 1
        if proc.returncode != 0:
            if "kb: error" not in err and "KbError" not in err and "Error" in err and "Traceback" in err:
                last = err.strip().splitlines()[-1]
                if not last.startswith(("kb.errors.",)):
                    return [f"child {action} #{n} crashed with a non-kb error: {last[:300]}"]
            continue
        line = json.loads(out.strip().splitlines()[-1])
        if line.get("revision"):
            reported.append(line["revision"])
        if action == "turn":
            pending_turn = None
    report = kb.fsck(WS)
    problems = [] if report.ok else [f"kb fsck: {report.git_messages[:3]}"]
    problems += git_checks(kb)
    history = {r.id: r for r in kb.history(WS, limit=10**6)}
    lost = [r for r in reported if r not in history]
    # A replay re-records a turn's old bytes: two revisions of one turn id writing the same blobs
    # to the same paths. (A turn id may record new work again after its commit returned: the
    # child is killed before printing and the next attempt writes different bytes.)
    per_turn: dict[str, list[frozenset]] = {}
    for revision in history.values():
        last_line = revision.message.rstrip("\n").rsplit("\n", 1)[-1]
        if last_line.startswith("Turn: "):
            written = frozenset((c.path, c.content_id) for c in kb.list_changes(WS, revision.id))
            per_turn.setdefault(last_line[6:], []).append(written)
    replayed = {t: len(sets) for t, sets in per_turn.items() if len(set(sets)) < len(sets)}
    print(
        f"kills: {sum(killed.values())} SIGKILLs {dict(killed)}; {n} children, exits {dict(exits)}; "
        f"{len(reported)} revisions reported, lost {len(lost)}; turns replayed {len(replayed)} "
        f"(of {len(per_turn)} turn ids, {sum(len(v) for v in per_turn.values())} turn revisions); "
        f"kb fsck recorded {len(report.recorded)}, repaired {len(report.worktree_repaired)} paths"
    )
    return problems + [f"lost {r}" for r in lost[:5]] + [f"turn replayed: {t}" for t in list(replayed)[:5]]


# -- fuzz ----------------------------------------------------------------------------------
def fuzz_path(rng: random.Random) -> str:
    pieces = [
        "a",
        "Foo",
        "FOO",
        "foo",
        "Café",
        unicodedata.normalize("NFD", "Café"),
        "CAFÉ",
        "NUL",
        "lpt9.txt",
        "con",
        "x.",
        "y ",
        ".git",
        "GIT~1",
        "..",
        ".",
        "",
        "\ud800",
        "\udcff",
        "a\x00b",
        "tab\there",
        "ß",
        "SS",
        "ı",
        "I",
        "Ω",
        "Ω",
        "ǅ",
        "x" * 255,
        "y" * 256,
        "é" * 130,
        "dir",
        "Dir",
        " lead",
        "emoji 😀",
        "a:b",
        "a*b",
        "back\\slash",
        ".keep",
        "\u200d.git",
    ]
    depth = rng.choice([1, 1, 2, 2, 3, 6, 12])
    segments = [rng.choice(pieces) for _ in range(depth)]
    name = segments[-1] + rng.choice([".md", "", ".MD", ".txt"])
    return "/documents/" + "/".join([*segments[:-1], name])


def run_fuzz(kb: KnowledgeBase, paths: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    kb.create_workspace(WS)
    outcomes, escaped = Counter(), []
    for i in range(paths):
        path = fuzz_path(rng)
        via_turn = i % 2 == 1
        try:
            if via_turn:
                turn = kb.turn(WS, f"fuzz-{i}", "fuzzer")
                try:
                    turn.write(path, f"fuzz {i}\n")
                    turn.commit()
                finally:
                    turn.abort()
            else:
                with kb.transaction(WS, f"fuzz {i}", "fuzzer") as tx:
                    tx.write(path, f"fuzz {i}\n")
            outcomes["stored"] += 1
        except KbError as exc:
            outcomes[type(exc).__name__] += 1
        except Exception as exc:
            escaped.append(f"{'turn' if via_turn else 'transaction'} {path!r}: {type(exc).__name__}: {exc}"[:300])
    twins = twins_at_head(kb)
    problems = git_checks(kb)
    print(
        f"fuzz: {paths} paths through both APIs: {dict(outcomes)}; escaped {len(escaped)}; twins at HEAD {len(twins)}"
    )
    return problems + escaped[:10] + [f"twins {t}" for t in twins[:5]]


# -- fsck under load -----------------------------------------------------------------------
def _load(settings, url, stop):
    """One writer beside fsck; a KbError (a lock timeout under load) is an answer, anything else
    ends the process with a traceback and a non-zero exit, which run_fsck_load reports."""
    kb = KnowledgeBase(settings, url)
    i = 0
    while not stop.is_set():
        try:
            with kb.transaction(WS, f"load {i}", "load") as tx:
                tx.write(f"/documents/load/{i % 50}.md", f"{i}\n")
        except KbError:
            pass
        i += 1


def run_fsck_load(kb: KnowledgeBase, runs: int, writers: int) -> list[str]:
    kb.create_workspace(WS)
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    procs = [ctx.Process(target=_load, args=(kb.settings, kb.database_url, stop)) for _ in range(writers)]
    for proc in procs:
        proc.start()
    time.sleep(1)
    false_reports = []
    for _ in range(runs):
        report = kb.fsck(WS)
        if not report.ok:
            false_reports.append(report.git_messages[:3])
    stop.set()
    for proc in procs:
        proc.join(60)
    crashed = [proc.exitcode for proc in procs if proc.exitcode != 0]
    print(
        f"fsck-load: {runs} kb fsck runs beside {writers} writers ({len(kb.history(WS, limit=10**6))} "
        f"revisions): {len(false_reports)} reported errors; writers that died of a non-kb error "
        f"{len(crashed)}"
    )
    return (
        [f"fsck reported {m}" for m in false_reports[:5]]
        + git_checks(kb)
        + [f"a writer died (exit {code}): a non-KbError escaped the facade" for code in crashed]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writers")
    w.add_argument("--writers", type=int, default=32)
    w.add_argument("--revisions", type=int, default=100)
    w.add_argument("--no-worker", action="store_true")
    k = sub.add_parser("kills")
    k.add_argument("--kills", type=int, default=100)
    f = sub.add_parser("fuzz")
    f.add_argument("--paths", type=int, default=2000)
    r = sub.add_parser("fsck-load")
    r.add_argument("--runs", type=int, default=10)
    r.add_argument("--writers", type=int, default=4)
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kb-adversarial-"))
    url, cleanup = database(workdir)
    settings = Settings(
        database_url=url, storage_root=workdir / "storage", embedding_model="hashing", lock_timeout=600.0
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KB_")},
        "KB_DATABASE_URL": url,
        "KB_STORAGE_ROOT": str(settings.storage_root),
        "KB_EMBEDDING_MODEL": "hashing",
        "KB_LOCK_TIMEOUT": "600",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    try:
        kb = KnowledgeBase.open(settings)
        if args.command == "writers":
            problems = run_writers(kb, args.writers, args.revisions, not args.no_worker)
        elif args.command == "kills":
            problems = run_kills(kb, env, args.kills, args.seed, workdir)
        elif args.command == "fuzz":
            problems = run_fuzz(kb, args.paths, args.seed)
        else:
            problems = run_fsck_load(kb, args.runs, args.writers)
    finally:
        from kb.db.database import close_pools

        close_pools()
        cleanup()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print("OK" if not problems else f"FAILED: {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
