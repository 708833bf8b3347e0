#!/usr/bin/env python
"""Write outcomes under connection kills (design §3): writers write while every backend of the
database is terminated every 0.1-0.6 s; each answer is checked against what landed (what is
checked: tests/support/outcome_stress.py). CI runs a short sample (tests/test_outcome_stress.py).

Usage: python bin/stress_outcomes.py [--runs 8] [--seconds 6] [--writers 1] [--targets all|busy]
Each run: a fresh storage root and embedded Postgres in a temporary folder (or KB_DATABASE_URL's
server, a new workspace per run). Prints one line per run and the totals; exit status 1 on any
misreported outcome or write applied twice.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.settings import Settings  # noqa: E402
from tests.support.outcome_stress import stress_outcomes  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument(
        "--targets",
        choices=["all", "busy"],
        default="all",
        help="terminate every client backend, or only those inside a transaction",
    )
    args = parser.parse_args()
    totals, bad_runs = Counter(), 0
    with tempfile.TemporaryDirectory(prefix="kb-outcomes-") as root:
        kb = KnowledgeBase.open(Settings(storage_root=Path(root), embedding_model="hashing"))
        try:
            for run in range(args.runs):
                report = stress_outcomes(
                    kb, run + 1, args.seconds, writers=args.writers, seed=run, targets=args.targets
                )
                totals.update(report.counts)
                bad = report.counts["misreported"] + report.counts["applied_twice"]
                bad_runs += bad > 0
                print(f"run {run + 1}: " + ", ".join(f"{n} {k}" for k, n in sorted(report.counts.items())))
                for line in report.faults[:3]:
                    print("   ", line)
        finally:
            kb.close()
            if not kb.settings.database_url:
                from kb.db.database import stop_embedded

                stop_embedded(Path(root) / "postgres")
    print(f"runs with a misreported outcome or a write applied twice: {bad_runs} of {args.runs}")
    print("totals: " + ", ".join(f"{n} {k}" for k, n in sorted(totals.items())))
    return 1 if bad_runs else 0


if __name__ == "__main__":
    sys.exit(main())
