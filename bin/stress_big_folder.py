#!/usr/bin/env python
"""Processes writing one big folder at once (design §2.1, §4): the write path's incremental trees
(``kb.git.tree_layout``), the index re-read by changed entries (``kb.git.gitindex``) and the
segmented loose objects (``kb.git.loose_zlib``) when several processes — each its own
``KnowledgeBase`` — rewrite the same big tree, while ``git gc`` / ``git repack -a -d`` run and
writers are SIGKILLed mid-commit.

The folder is seeded with ``--documents`` names that stress git's tree order: prefixes (``a``,
``a-b``, ``a.b``, ``a0``), a file ``a.md`` beside a folder ``a.md/`` and a folder ``a/``,
non-ASCII (NFC), spaces, names of 200 bytes, and a first entry (``!first.md``) every writer
rewrites often (the change at the head of the tree's text). Each writer process loops: write a
new or existing document, move one within the folder, remove one, rewrite the first entry; every
commit message carries an op id so git says whether it landed. A killer SIGKILLs a random writer
every ``--kill-every`` seconds and starts another in its place.

Checks (exit 1 when one breaks), all before ``kb fsck`` is asked (its repairs would hide damage):
every reported revision is in git and ``kb.revisions``, no write reported failed landed,
``git fsck --strict`` clean, ``git status`` clean, 0 duplicate index entries, kb's document paths
(``kb.documents``) equal git's paths at HEAD and their blob ids equal, then ``kb fsck`` ok with
nothing to repair. Example::

    KB_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        python bin/stress_big_folder.py --writers 4 --documents 1500 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

WS = 1
FOLDER = "/documents/big"


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check)


def tricky_names(count: int) -> list[str]:
    """Document paths in FOLDER that stress git's tree order, then plain ones up to ``count``."""
    names = [
        "!first.md",
        "a.md",
        "a-b.md",
        "a.b.md",
        "a0.md",
        "a/x.md",
        "a/y z.md",
        "a.m/inner.md",
        "a.md.d/inner.md",
        "a-b/inner.md",
        "ab.md",
        "caf\u00e9.md",
        "\u00e9t\u00e9 d\u2019hiver.md",
        "\u6f22\u5b57.md",
        "with space.md",
        "with  two spaces.md",
        "z" * 190 + ".md",
        "y" * 100 + "/" + "w" * 100 + ".md",
        "0.md",
        "00.md",
        "0/0.md",
        "_under.md",
        "~tilde.md",
    ]
    names += [f"doc {i:05d}.md" for i in range(count - len(names))]
    return [f"{FOLDER}/{name}" for name in names]


def git_cli_edit(repo: Path, round_no: int) -> None:
    """Edit the big folder with the git CLI in kb's checkout (no kb writer runs): rewrite its first
    entry, add a new first entry, remove one document; git writes the big tree at its own zlib
    level."""
    folder = repo / FOLDER.lstrip("/")
    (folder / "!first.md").write_text(f"first, by the git CLI in round {round_no}\n")
    (folder / f"!!cli {round_no}.md").write_text(f"added by the git CLI in round {round_no}\n")
    victim = next((p for p in sorted(folder.glob("doc *.md"))), None)
    if victim is not None:
        victim.unlink()
    git(repo, "add", "-A", FOLDER.lstrip("/"))
    git(repo, "-c", "user.name=cli", "-c", "user.email=cli@example.invalid", "commit", "-q", "-m", f"cli {round_no}")


def settings_for(url: str, storage: Path):
    from kb.settings import Settings

    return Settings(database_url=url, storage_root=storage, embedding_model="hashing", lock_timeout=30.0)


def writer(k: int, url: str, storage: str, seconds: float, results: str, seed: int) -> None:
    """One writer process: its own KnowledgeBase; appends one JSON line per operation to
    ``results`` (``{"op", "kind", "reported", "revision", "error"}``) before and after it."""
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)
    from kb.errors import CommitOutcomeUnknown, KbError
    from kb.knowledge_base import KnowledgeBase

    kb = KnowledgeBase.open(settings_for(url, Path(storage)))
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    with open(results, "a", buffering=1) as out:
        while time.monotonic() < deadline:
            op = uuid.uuid4().hex[:12]
            kind = rng.choices(["write", "move", "remove", "first", "pair"], [40, 20, 15, 15, 10])[0]
            out.write(json.dumps({"op": op, "kind": kind, "reported": "started"}) + "\n")
            record: dict = {"op": op, "kind": kind}
            try:
                with kb.transaction(WS, f"stress {op} {kind}", f"writer{k}") as tx:
                    entries = kb.ls(WS, FOLDER) if kind in ("move", "remove") else []
                    files = [e.path for e in entries if e.kind == "file"]
                    if kind == "write":
                        tx.write(f"{FOLDER}/w{k} {op}.md", f"# {op}\n\nfrom writer {k}\n")
                    elif kind == "move" and files:
                        source = rng.choice(files)
                        tx.move(source, f"{FOLDER}/m{k} {op}.md")
                    elif kind == "remove" and files:
                        tx.remove(rng.choice(files), missing_ok=True)
                        tx.write(f"{FOLDER}/r{k} {op}.md", "a removal's companion\n")
                    elif kind == "first":
                        tx.write(f"{FOLDER}/!first.md", f"first, last by {op}\n")
                    else:
                        tx.write(f"{FOLDER}/a.md", f"a by {op}\n")
                        tx.write(f"{FOLDER}/a/x.md", f"a/x by {op}\n")
                        tx.write(f"{FOLDER}/a-b.md", f"a-b by {op}\n")
                record.update(reported="landed" if tx.revision else "empty", revision=tx.revision and tx.revision.id)
            except CommitOutcomeUnknown as exc:
                record.update(reported="unknown", error=f"{type(exc).__name__}: {exc}"[:300])
            except KbError as exc:
                frames = [
                    f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)
                ]
                record.update(reported="failed", error=f"{type(exc).__name__}: {exc}"[:300], where=frames[-8:])
            except Exception as exc:
                record.update(reported="raw", error=f"{type(exc).__name__}: {exc}"[:300])
            out.write(json.dumps(record) + "\n")
    kb.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--documents", type=int, default=1500)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--kill-every", type=float, default=4.0, help="0: no kills")
    parser.add_argument("--gc-every", type=float, default=3.0, help="0: no gc/repack")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2, help="writer rounds; the git CLI commits between two")
    args = parser.parse_args()
    logging.getLogger("psycopg").setLevel(logging.CRITICAL)
    import psycopg
    from bench_store import database

    from kb.errors import KbError
    from kb.knowledge_base import KnowledgeBase
    from tests.support.named_queries import queries

    rng = random.Random(args.seed)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kb-bigfolder-") as tmp:
        url, cleanup = database(Path(tmp))
        storage = Path(tmp) / "storage"
        try:
            kb = KnowledgeBase.open(settings_for(url, storage))
            kb.create_workspace(WS)
            paths = tricky_names(args.documents)
            with kb.transaction(WS, "stress seed", "stress") as tx:
                for i, path in enumerate(paths):
                    tx.write(path, f"# seed {i}\n")
            repo = settings_for(url, storage).knowledge_store / str(WS)
            results = [str(Path(tmp) / f"writer-{k}.jsonl") for k in range(args.writers * 50)]
            ctx = multiprocessing.get_context("spawn")
            started = 0
            running: list = []

            def start() -> None:
                nonlocal started
                left = max(1.0, deadline - time.monotonic())
                p = ctx.Process(
                    target=writer, args=(started, url, str(storage), left, results[started], rng.randrange(10**9))
                )
                p.start()
                running.append(p)
                started += 1

            kills = gcs = projections = cli_commits = 0
            deadline = 0.0
            for round_no in range(args.rounds):
                if round_no:  # the git CLI edits the big folder between kb's writes (its own zlib level)
                    git_cli_edit(repo, round_no)
                    cli_commits += 1
                deadline = time.monotonic() + args.seconds / args.rounds
                running.clear()
                for _ in range(args.writers):
                    start()
                next_project = time.monotonic() + 1.0
                next_kill = time.monotonic() + (args.kill_every or 1e9)
                next_gc = time.monotonic() + (args.gc_every or 1e9)
                while time.monotonic() < deadline:
                    time.sleep(0.2)
                    now = time.monotonic()
                    if now >= next_kill:
                        victim = rng.choice([p for p in running if p.is_alive()] or running)
                        if victim.is_alive():
                            os.kill(victim.pid, signal.SIGKILL)
                            victim.join()
                            kills += 1
                            running.remove(victim)
                            start()
                        next_kill = now + args.kill_every
                    if now >= next_project:  # the projection job's work, beside the writers (design §6)
                        try:
                            kb.project(WS)
                            projections += 1
                        except KbError as exc:
                            problems.append(f"projection during the run: {type(exc).__name__}: {exc}")
                        next_project = time.monotonic() + 1.0
                    if now >= next_gc:
                        cmd = ["gc", "--quiet"] if gcs % 2 else ["repack", "-a", "-d", "-q"]
                        git(repo, *cmd, check=False)
                        gcs += 1
                        next_gc = now + args.gc_every
                for p in running:
                    p.join(120)
                    if p.is_alive():
                        problems.append(f"writer pid {p.pid} still running 120 s after the deadline")
                        p.kill()
            outcomes: dict[str, dict] = {}
            for name in results[:started]:
                if Path(name).exists():
                    for line in Path(name).read_text().splitlines():
                        record = json.loads(line)
                        outcomes[record["op"]] = record  # the last line of an op wins
            landed = {}
            for line in git(repo, "log", "--format=%H %s").stdout.splitlines():
                revision, _, subject = line.partition(" ")
                if subject.startswith("stress ") and subject != "stress seed":
                    landed[subject.split()[1]] = revision
            kb.project(WS)
            with psycopg.connect(url) as conn:
                recorded = {r[0] for r in conn.execute(queries["stress_recorded_revisions"], {"workspace_id": WS})}
                kb_paths = {r[1]: r[2] for r in conn.execute(queries["document_paths"], {"workspace_id": WS})}
            counts = Counter(o["reported"] for o in outcomes.values())
            for o in outcomes.values():
                actual = landed.get(o["op"])
                if o["reported"] == "raw":
                    problems.append(f"raw error: {o['kind']} {o['op']}: {o['error']}")
                if o["reported"] == "landed" and (actual != o["revision"] or o["revision"] not in recorded):
                    problems.append(f"lost: {o['kind']} {o['op']} reported {o['revision']}, git {actual}")
                if o["reported"] in ("failed", "raw", "empty") and actual is not None:
                    problems.append(f"misreported: {o['kind']} {o['op']} {o.get('error')} but {actual} landed")
                    problems.append(f"  raised at {o.get('where')}")
                    around = git(repo, "log", "--format=%H %P %an %s", "-n", "6", actual).stdout
                    problems.append(f"  history up to it: {around}")
                    reflog = git(repo, "reflog", "--format=%H %gs", "-n", "400", check=False).stdout
                    problems.append(f"  reflog: {[line for line in reflog.splitlines() if line.startswith(actual)]}")
            for o in outcomes.values():
                if o["reported"] == "failed":
                    print(f"failed (truthfully, not in git): {o['kind']}: {o['error'][:200]}")
            cli_in_git = sum(
                1 for line in git(repo, "log", "--format=%s").stdout.splitlines() if line.startswith("cli ")
            )
            if cli_in_git != cli_commits:
                problems.append(f"{cli_commits} git CLI commits, {cli_in_git} in history")
            killed_landed = sum(1 for o in outcomes.values() if o["reported"] == "started" and o["op"] in landed)
            fsck = git(repo, "fsck", "--strict", "--no-progress", check=False)
            if fsck.returncode:
                problems.append(f"git fsck: {(fsck.stderr or fsck.stdout).strip()[:400]}")
            status = git(repo, "status", "--porcelain", "--untracked-files=all").stdout.splitlines()
            if status:
                problems.append(f"git status not clean: {status[:5]}")
            staged = [line for line in git(repo, "ls-files", "--stage", "-z").stdout.split("\0") if line]
            dupes = [n for n, c in Counter(line.split("\t", 1)[1] for line in staged).items() if c > 1]
            if dupes:
                problems.append(f"index lists twice: {dupes[:5]}")
            tree = git(repo, "ls-tree", "-r", "-z", "HEAD").stdout.split("\0")
            git_paths = {}
            for line in filter(None, tree):
                meta, path = line.split("\t", 1)
                if path.startswith("documents/") and not path.endswith("/.keep"):
                    git_paths["/" + path] = meta.split()[2]
            if set(git_paths) != set(kb_paths):
                only_git = sorted(set(git_paths) - set(kb_paths))
                print(f"{len(only_git)} only in git, e.g. {only_git[:40]}")
                only_git = only_git[:5]
                only_kb = sorted(set(kb_paths) - set(git_paths))[:5]
                problems.append(f"kb's paths differ from git's: only in git {only_git}, only in kb {only_kb}")
            wrong = [p for p in git_paths if p in kb_paths and kb_paths[p] not in (None, git_paths[p])]
            if wrong:
                problems.append(f"kb's content ids differ from git's blobs: {wrong[:5]}")
            try:
                report = kb.fsck(WS)
                if not report.ok or report.worktree_repaired or report.index_repaired:
                    problems.append(f"kb fsck: ok={report.ok}, repaired {report.worktree_repaired[:5]}")
            except KbError as exc:
                problems.append(f"kb fsck: {type(exc).__name__}: {exc}")
            kb.close()
            print(
                f"{args.writers} writers × {args.seconds:g}s on {args.documents} documents: "
                f"{dict(counts)}, {kills} kills ({killed_landed} killed ops landed), {gcs} gc/repack, "
                f"{projections} projections, {cli_commits} git CLI commits, "
                f"{len(git_paths)} paths at HEAD"
            )
        finally:
            from kb.db import database as db

            db.close_pools()
            cleanup()
    for problem in problems[:30]:
        print("PROBLEM", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
