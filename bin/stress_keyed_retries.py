#!/usr/bin/env python
"""Keyed retries at once (design §3): processes × threads send the same write with one idempotency
key, as transactions and turn commits, beside writers of other keys, one process SIGKILLed holding
the key's fence every other round; every answer must name one revision and git hold one commit of
the key (what is checked: tests/support/keyed_retry_stress.py). CI runs a short sample
(tests/test_keyed_retry_stress.py).

Usage: python bin/stress_keyed_retries.py [--rounds 10] [--processes 5] [--threads 9]
A fresh storage root and embedded Postgres in a temporary folder (or KB_DATABASE_URL's server).
Prints one line per fault and the totals; exit status 1 on any round that did not hold.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.settings import Settings  # noqa: E402
from tests.support.keyed_retry_stress import stress_keyed_retries  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--threads", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-keyed-retries-") as root:
        kb = KnowledgeBase.open(Settings(storage_root=Path(root), embedding_model="hashing"))
        try:
            workspace = max((w["id"] for w in kb.workspaces()), default=0) + 1
            kb.create_workspace(workspace)
            with kb.transaction(workspace, "base", "stress") as tx:
                tx.write("/documents/base.md", "base\n")
            report = stress_keyed_retries(kb, workspace, args.rounds, args.processes, args.threads)
        finally:
            kb.close()
            if not kb.settings.database_url:
                from kb.db.database import stop_embedded

                stop_embedded(Path(root) / "postgres")
    for line in report.faults:
        print(line)
    print("totals: " + ", ".join(f"{n} {k}" for k, n in sorted(report.counts.items())))
    return 1 if report.counts["bad_rounds"] else 0


if __name__ == "__main__":
    sys.exit(main())
