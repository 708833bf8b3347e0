#!/usr/bin/env python
"""Citation stress (design §7, §8): searches checked against ``git show`` while commits,
projections, index runs and reindexes race, for minutes; then convergence. CI runs an 8-second
sample of the same code (tests/test_citation_stress.py); what is checked is in
tests/support/citation_stress.py.

Usage: python bin/stress_citations.py [--seconds 300] [--seed 0] [--separate] [--searchers 2]
A fresh storage root and embedded Postgres in a temporary folder (or KB_DATABASE_URL's server),
the hashing embedder (the races do not depend on what vectors mean). Exit status 1 on any fault.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kb.index.embedding import HashingEmbedder  # noqa: E402
from kb.knowledge_base import KnowledgeBase  # noqa: E402
from kb.settings import Settings  # noqa: E402
from tests.support.citation_stress import stress  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--separate", action="store_true", help="each searcher opens its own KnowledgeBase")
    parser.add_argument("--searchers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kb-stress-") as root:
        kb = KnowledgeBase.open(Settings(storage_root=Path(root), embedding_model="hashing"))
        kb.use_embedder(HashingEmbedder())
        started = time.perf_counter()
        try:
            report = stress(kb, 1, args.seconds, seed=args.seed, shared=not args.separate, searchers=args.searchers)
        finally:
            kb.close()
            if not kb.settings.database_url:
                from kb.db.database import stop_embedded

                stop_embedded(Path(root) / "postgres")
    print(
        f"{time.perf_counter() - started:.0f} s: "
        + ", ".join(f"{n} {kind}" for kind, n in sorted(report.counts.items()))
    )
    print(f"faults: {sum(report.fault_counts.values())} {dict(report.fault_counts)}")
    for fault in report.faults:
        print("  FAULT", fault)
    return 1 if report.faults else 0


if __name__ == "__main__":
    sys.exit(main())
