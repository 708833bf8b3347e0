"""Pure-layer citation fuzz (design §8): line counting, envelope rendering, the normalizer and
``follow`` over in-memory histories, 2,000+ hypothesis examples in all. The long run is
``python bin/fuzz_citations.py --cases 10000``."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.citation_fuzz import FollowTally, check_follow, check_line_counting, check_normalizer, check_rendering

SEEDS = st.integers(min_value=0, max_value=2**64 - 1)
"""Each example is a seed for the shared generators (tests/support/citation_fuzz.py); a failure prints it,
and ``bin/fuzz_citations.py`` runs the same checks over many more."""
FAST = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)


@FAST
@given(SEEDS)
def test_line_counting(seed: int):
    check_line_counting(random.Random(seed))


@FAST
@given(SEEDS)
def test_envelope_rendering_reads_back_true_lines(seed: int):
    check_rendering(random.Random(seed))


@FAST
@given(SEEDS)
def test_normalizer_canonical_form(seed: int):
    check_normalizer(random.Random(seed))


@FAST
@given(SEEDS)
def test_follow_never_says_unchanged_for_different_text(seed: int):
    tally = FollowTally()
    check_follow(random.Random(seed), tally)
    assert tally.wrong_unchanged == 0
    assert tally.missed_unchanged == 0
    assert tally.wrong_numbers == 0
