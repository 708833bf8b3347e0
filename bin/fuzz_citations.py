"""Citation fuzz, long runs (design §8). Two layers:

    python bin/fuzz_citations.py --cases 10000          # pure layer: line counting, envelope
                                                         # rendering, normalizer, follow over
                                                         # in-memory histories
    python bin/fuzz_citations.py --e2e 300               # end to end: real store, index, registry

The end-to-end layer uses ``KB_DATABASE_URL`` when set, else an embedded Postgres under a
temporary storage root (removed afterwards), with the hashing embedder. Prints cases, confidently
wrong (must be 0), degraded vs expected, the follow confusion counts and wall time; exits 1 when
a hard rule broke. The CI runs the same checks on a smaller sample (tests/test_citations_*.py).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.citation_fuzz import PURE_CHECKS, FollowTally, check_follow, run_e2e


def _confusion(tally: FollowTally) -> str:
    rows = [f"    expected {e:<9} answered {a:<9} {n:>6}" for (e, a), n in sorted(tally.confusion.items())]
    return "\n".join(rows)


def _follow_report(tally: FollowTally) -> list[str]:
    return [
        "  follow confusion (expected from line identities → answered):",
        _confusion(tally),
        f"  follow unchanged for differing text: {tally.wrong_unchanged} (must be 0)",
        f"  follow missed unchanged, cited lines unique: {tally.missed_unchanged} (must be 0)",
        f"  follow missed unchanged, cited text repeated (ambiguous from text): {tally.ambiguous_missed}",
        f"  follow wrong numbers, one copy at HEAD: {tally.wrong_numbers} (must be 0)",
        f"  follow other copy chosen, several identical copies at HEAD: {tally.ambiguous_numbers}",
    ]


def pure(cases: int, seed: int) -> bool:
    tally = FollowTally()
    started = time.perf_counter()
    for k in range(cases):
        rng = random.Random(seed * 1_000_003 + k)
        for check in PURE_CHECKS:
            check(rng)
        check_follow(rng, tally)
    wall = time.perf_counter() - started
    print(f"pure layer: {cases} cases × (line counting, rendering, normalizer, follow) in {wall:.1f} s")
    print("  confidently wrong: 0 (every check passed)")
    print("\n".join(_follow_report(tally)))
    return tally.wrong_unchanged == tally.missed_unchanged == tally.wrong_numbers == 0


def e2e(cases: int, seed: int) -> bool:
    from kb.knowledge_base import KnowledgeBase
    from kb.settings import Settings

    with tempfile.TemporaryDirectory(prefix="kb-fuzz-") as root:
        kb = KnowledgeBase.open(Settings(storage_root=Path(root), embedding_model="hashing"))
        started = time.perf_counter()
        try:
            tally = run_e2e(kb, seed, cases)
        finally:
            wall = time.perf_counter() - started
            if not kb.settings.database_url:
                from kb.db.database import stop_embedded

                stop_embedded(Path(root) / "postgres")
    print(f"end to end: {tally.cases} cases, {tally.resolutions} resolutions in {wall:.1f} s")
    print(f"  confidently wrong: {tally.confidently_wrong} (must be 0)")
    print(f"  degraded to document level: {tally.degraded} (expected {tally.expected_degraded})")
    print("\n".join(_follow_report(tally.follow)))
    for failure in tally.failures[:20]:
        print("  FAIL", failure)
    for note in tally.notes[:20]:
        print("  NOTE", note)
    return (
        tally.confidently_wrong == 0
        and tally.degraded == tally.expected_degraded
        and tally.follow.wrong_unchanged == tally.follow.missed_unchanged == tally.follow.wrong_numbers == 0
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=0, help="pure-layer cases")
    parser.add_argument("--e2e", type=int, default=0, help="end-to-end cases")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not args.cases and not args.e2e:
        parser.error("give --cases N and/or --e2e N")
    ok = True
    if args.cases:
        ok &= pure(args.cases, args.seed)
    if args.e2e:
        ok &= e2e(args.e2e, args.seed)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
