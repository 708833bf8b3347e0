#!/usr/bin/env python
"""design §3 benchmark: ``kb import`` of a folder whose documents ``kb mv`` moved since (each file
followed to where its document is now) against the same import where nothing moved.

    python bin/bench_import_follows.py [--files 20000] [--rounds 3]

Workspace 1 imports FILES files under /documents/New, then moves that folder to /documents/Gone;
workspace 2 imports the same files and moves nothing. Each round runs a dry run of the folder into
each (legs interleaved, the order alternating); prints the medians of kb (followed: every file's
document moved), the reference (unmoved) and their ratio. Uses a fresh embedded Postgres and
storage root in a temporary directory, deleted afterwards.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kb.db.database import start_embedded, stop_embedded
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kb-bench-"))
    try:
        url = start_embedded(root / "postgres")
        kb = KnowledgeBase.open(Settings(database_url=url, storage_root=root / "store", embedding_model="hashing"))
        folder = root / "folder"
        for i in range(args.files):
            sub = folder / f"d{i % 100}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"n{i}.md").write_text(f"# Note {i}\n\nbody {i}\n")
        for workspace in (1, 2):
            kb.import_folder(folder, workspace, prefix="New", author="bench")
        kb.workspace(1).move("/documents/New", "/documents/Gone", author="bench")
        times: dict[int, list[float]] = {1: [], 2: []}
        for round_ in range(args.rounds):
            for workspace in (1, 2) if round_ % 2 == 0 else (2, 1):
                started = time.perf_counter()
                report = kb.import_folder(folder, workspace, prefix="New", dry_run=True)
                times[workspace].append(time.perf_counter() - started)
                assert report.unchanged == args.files and len(report.followed) == (args.files if workspace == 1 else 0)
        followed, reference = statistics.median(times[1]), statistics.median(times[2])
        print(f"files: {args.files}, rounds: {args.rounds}")
        print(f"kb (dry run, every document moved since): {followed:.2f} s")
        print(f"reference (dry run, nothing moved):        {reference:.2f} s")
        print(f"ratio: {followed / reference:.2f}")
        return 0
    finally:
        stop_embedded(root / "postgres")
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
