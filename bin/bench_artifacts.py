#!/usr/bin/env python
"""Artifact save benchmark (design §11, §14): what a save costs over a plain revision.

Interleaves, round by round in one process and one workspace, the median wall time of:

* ``artifacts.save(title, markdown, {"data.bin": <--file-bytes> random bytes})`` — blob written and
  fsynced, one revision, sidecar rows, the generation check under the write lock;
* ``kb.transaction`` writing the same markdown to a new path (the reference: a plain 1-file revision);
* ``artifacts.revise(id, generation, markdown=…)`` — a markdown revision of an existing artifact.

Prints the medians and the ratios against the plain revision. Postgres: ``KB_DATABASE_URL`` when set
(a fresh database is created there), else an embedded server in a temporary directory. Example::

    python bin/bench_artifacts.py --rounds 40 --file-bytes 1000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

WS = 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--file-bytes", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-bench-artifacts-") as tmp:
        settings = Settings(
            storage_root=Path(tmp), embedding_model="hashing", database_url=os.environ.get("KB_DATABASE_URL")
        )
        kb = KnowledgeBase.open(settings)
        kb.create_workspace(WS)
        artifacts = kb.artifacts(WS)
        markdown = "# Weekly report\n\n" + "A line of findings with numbers 12, 34 and 56.\n" * 200
        target = artifacts.save("Revised", markdown)
        times: dict[str, list[float]] = {"plain revision": [], "artifact save": [], "artifact revise": []}
        for n in range(args.rounds):
            payload = os.urandom(args.file_bytes)
            start = time.perf_counter()
            with kb.transaction(WS, f"plain {n}", "bench") as tx:
                tx.write(f"/documents/Plain/p{n}.md", markdown)
            times["plain revision"].append(time.perf_counter() - start)
            start = time.perf_counter()
            artifacts.save(f"Report {n}", markdown, {"data.bin": payload})
            times["artifact save"].append(time.perf_counter() - start)
            start = time.perf_counter()
            target = artifacts.revise(target.id, target.generation, markdown=f"{markdown}\nround {n}\n")
            times["artifact revise"].append(time.perf_counter() - start)
        reference = statistics.median(times["plain revision"])
        for name, values in times.items():
            print(f"{name:<18} {statistics.median(values) * 1000:8.1f} ms (median of {len(values)})")
        for name in ("artifact save", "artifact revise"):
            print(f"ratio {name} / plain revision   {statistics.median(times[name]) / reference:.2f}")
        print(f"file size: {args.file_bytes} bytes")


if __name__ == "__main__":
    main()
