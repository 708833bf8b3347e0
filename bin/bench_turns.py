#!/usr/bin/env python
"""Benchmark a turn (design §5) against the git CLI's full-checkout turn, in one process.

A turn = open it, read 3 documents, edit one, commit. Reference = ``git worktree add --detach``
(a full checkout), the same reads and edit, ``git commit`` (worktree removal not timed). Both run
``--runs`` times on each workspace: the 173-document ``obsidian-help/en`` and the ~6,600-document
``tldr/pages``. Also times ``grep`` over the whole tldr workspace inside a turn against ``git grep``
on the same revision. Prints p50 figures and ratios; asserts nothing.

Usage: python bin/bench_turns.py [--root /tmp/kb-bench-turns] [--runs 20] [--grep-runs 9] [--skip turns]
The storage root keeps the imported workspaces between runs (imported once, one revision each);
the database is ``KB_DATABASE_URL`` or an embedded one under the root.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus"
WORKSPACES = {1: ("obsidian-help/en", CORPUS / "obsidian-help" / "en"), 2: ("tldr", CORPUS / "tldr" / "pages")}
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-c", "core.hooksPath=/dev/null"]


def p50(values: list[float]) -> float:
    return statistics.median(values) * 1000


def pick(paths: list[str]) -> list[str]:
    """Three documents spread over the workspace, deterministic."""
    ordered = sorted(p for p in paths if p.endswith(".md"))
    return [ordered[len(ordered) // 7], ordered[len(ordered) // 2], ordered[(len(ordered) * 5) // 6]]


def kb_turn(kb: KnowledgeBase, ws: int, docs: list[str], run: int) -> float:
    start = time.perf_counter()
    turn = kb.turn(ws, f"bench-{run}", "bench")
    texts = [turn.read(d).text for d in docs]
    whole = turn.read_bytes(docs[0]).decode()
    turn.edit(docs[0], whole, whole + f"\nbench run {run} ({len(texts)} read)\n")
    result = turn.commit(f"bench turn {run}")
    elapsed = time.perf_counter() - start
    assert result is not None and result.modified == [docs[0]], result
    return elapsed


def git_turn(repo: Path, scratch: Path, docs: list[str], run: int) -> float:
    wt = scratch / f"git-{run}"
    start = time.perf_counter()
    subprocess.run([*GIT, "-C", str(repo), "worktree", "add", "-q", "--detach", str(wt), "HEAD"], check=True)
    texts = [(wt / d.lstrip("/")).read_text() for d in docs]
    target = wt / docs[0].lstrip("/")
    target.write_text(target.read_text() + f"\ngit run {run} ({len(texts)} read)\n")
    subprocess.run([*GIT, "-C", str(wt), "commit", "-qam", f"git turn {run}"], check=True)
    elapsed = time.perf_counter() - start
    subprocess.run([*GIT, "-C", str(repo), "worktree", "remove", "--force", str(wt)], check=True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/kb-bench-turns"))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--grep-runs", type=int, default=9)
    parser.add_argument("--skip", default="", help="'turns' to time only the grep leg")
    args = parser.parse_args()
    kb = KnowledgeBase.open(Settings(storage_root=args.root, embedding_model="hashing"))
    scratch = args.root / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    figures = {}
    for ws, (label, source) in WORKSPACES.items():
        if not source.is_dir():
            sys.exit(f"corpus {source} is absent (see ../shared/corpus/README.md)")
        if not (kb.store(ws).exists() and kb.head(ws)):
            t0 = time.perf_counter()
            report = kb.import_folder(source, ws, message=f"bench import {label}", author="bench")
            print(
                f"imported {label}: {report.documents_found} documents as revision {report.revision.id} "
                f"in {time.perf_counter() - t0:.1f}s"
            )
        paths = list(kb.list_paths(ws))
        if "turns" in args.skip:
            continue
        docs = pick(paths)
        repo = kb.store(ws).path
        kb_turn(kb, ws, docs, -1), git_turn(repo, scratch, docs, -1)  # warm-up
        ours, theirs = [], []
        for run in range(args.runs):
            ours.append(kb_turn(kb, ws, docs, run))
            theirs.append(git_turn(repo, scratch, docs, run))
        figures[ws] = p50(ours)
        print(
            f"{label:18} {len(paths):5d} docs  kb turn p50 {p50(ours):7.1f} ms   "
            f"git full-checkout turn p50 {p50(theirs):8.1f} ms   git/kb {p50(theirs) / p50(ours):6.1f}x"
        )
    if figures:
        print(f"6,600-doc turn / 173-doc turn: {figures[2] / figures[1]:.2f}x (goal <= 1.5x)")

    head = kb.head(2)
    repo = kb.store(2).path
    grep_ours, grep_git = [], []
    for run in range(args.grep_runs):
        turn = kb.turn(2, f"grep-{run}", "bench")
        start = time.perf_counter()
        hits = turn.grep("tar")
        grep_ours.append(time.perf_counter() - start)
        turn.abort()
        start = time.perf_counter()
        out = subprocess.run(
            [*GIT, "-C", str(repo), "grep", "-n", "-e", "tar", head, "--", "documents"], check=True, capture_output=True
        ).stdout
        grep_git.append(time.perf_counter() - start)
    print(
        f"grep 'tar' over tldr: kb turn p50 {p50(grep_ours):.1f} ms ({len(hits)} lines)   "
        f"git grep p50 {p50(grep_git):.1f} ms ({len(out.splitlines())} lines)   kb/git {p50(grep_ours) / p50(grep_git):.2f}x (goal <= 2x)"
    )


if __name__ == "__main__":
    main()
