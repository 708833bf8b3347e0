#!/usr/bin/env python
"""Projection cost at scale (design §6, §14), as ratios against `git ls-tree -r` of the same tree.

Imports the tldr corpus (~6,600 small documents in two folders) into a scratch workspace, then
times: the first projection (every row created, one kb_events notification each), a one-file edit,
a rename of the biggest folder (thousands of recorded moves, ids kept) and a forced rebuild with
nothing to change. Each projection walks HEAD's whole tree, so the reference is git's own full
tree listing, measured in this process on the same repository.

Usage: python bin/bench_projection.py [CORPUS_DIR]   (default ../shared/corpus/tldr/pages)
Uses KB_DATABASE_URL if set, else an embedded Postgres in a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kb.db.database import start_embedded, stop_embedded
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    corpus = (
        Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared/corpus/tldr/pages"
    )
    if not corpus.is_dir():
        sys.exit(f"corpus {corpus} is absent; pass a folder of markdown")
    scratch = Path(tempfile.mkdtemp(prefix="kb-bench-projection-"))
    url = os.environ.get("KB_DATABASE_URL") or start_embedded(scratch / "pg", database="kb_bench")
    try:
        settings = Settings(database_url=url, storage_root=scratch / "storage", embedding_model="hashing")
        kb = KnowledgeBase.open(settings)
        ws = int(os.environ.get("KB_BENCH_WORKSPACE", "1"))
        report = kb.import_folder(corpus, ws)
        repo = settings.knowledge_store / str(ws)

        def git_listing() -> float:
            return min(
                timed(
                    lambda: subprocess.run(
                        ["git", "-C", str(repo), "ls-tree", "-r", "HEAD", "documents"], check=True, capture_output=True
                    )
                )[0]
                for _ in range(3)
            )

        reference = git_listing()
        rows = []
        t, first = timed(lambda: kb.project(ws))
        rows.append(("first projection", t, len(first.created), len(first.events)))
        some = sorted(kb.list_paths(ws))[len(first.created) // 2]
        with kb.transaction(ws, "edit one") as tx:
            tx.write(some, tx.read(some) + b"\nedited\n")
        t, edit = timed(lambda: kb.project(ws))
        rows.append(("one-file edit", t, len(edit.updated), len(edit.events)))
        folders = sorted(
            {p.split("/")[2] for p in kb.list_paths(ws)},
            key=lambda f: -sum(p.startswith(f"/documents/{f}/") for p in kb.list_paths(ws)),
        )
        with kb.transaction(ws, "rename the biggest folder") as tx:
            tx.move(f"/documents/{folders[0]}", f"/documents/{folders[0]}-renamed")
        reference_after = git_listing()
        t, moved = timed(lambda: kb.project(ws))
        assert not moved.created and not moved.deleted, "a folder rename must keep every id"
        rows.append((f"rename folder {folders[0]}", t, len(moved.moved), len(moved.events)))
        t, rebuilt = timed(lambda: kb.rebuild_projection(ws))
        rows.append(("forced rebuild, no change", t, len(rebuilt.updated), len(rebuilt.events)))

        print(
            f"corpus {corpus}: {report.documents_found} documents; git ls-tree -r: "
            f"{reference * 1000:.1f} ms (after rename {reference_after * 1000:.1f} ms)"
        )
        print(f"{'step':32} {'ms':>9} {'rows':>6} {'events':>7} {'× git ls-tree':>14}")
        for name, seconds, changed, events in rows:
            print(f"{name:32} {seconds * 1000:9.1f} {changed:6d} {events:7d} {seconds / reference:14.1f}")
    finally:
        if not os.environ.get("KB_DATABASE_URL"):
            stop_embedded(scratch / "pg")
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
