"""End-to-end citation fuzz (design §8) through the real store, index and registry: random
documents, a reader citing only lines it was shown (search excerpts and windowed reads), random
histories (edits above and inside cited ranges through transactions and turns, moves, swaps,
deletes, restores, reindex, NULL spans, truncated chunks), then every citation resolved with
``follow``. The bench is ``python bin/fuzz_citations.py --e2e 300``."""

from __future__ import annotations

import os

from support.citation_fuzz import run_e2e

CASES = int(os.environ.get("KB_E2E_CITATION_CASES", "50"))


def test_every_resolution_returns_what_the_reader_saw(kb):
    tally = run_e2e(kb, seed=20261130, cases=CASES)
    assert tally.cases == CASES
    assert tally.failures == []
    assert tally.confidently_wrong == 0
    assert tally.degraded == tally.expected_degraded
    assert tally.follow.wrong_unchanged == 0
    assert tally.follow.missed_unchanged == 0
    assert tally.follow.wrong_numbers == 0
    assert tally.resolutions > CASES
