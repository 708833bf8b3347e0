"""A short sample of the outcome stress (tests/support/outcome_stress.py; runs and figures:
``bin/stress_outcomes.py``): writers write while every backend of the test's database is
terminated every 0.1-0.6 s (those inside a transaction: see ``TERMINATE``); every answer must be the truth, and a retry with the write's
idempotency key must not apply it twice (design §3)."""

from __future__ import annotations

from support.outcome_stress import stress_outcomes


def test_writes_under_connection_kills_are_answered_truthfully_and_applied_at_most_once(kb):
    report = stress_outcomes(kb, 1, seconds=5, writers=2, seed=3, targets="busy")
    assert report.counts["misreported"] == 0 and report.counts["applied_twice"] == 0, report.faults
    assert report.counts["unknown_settled_wrongly"] == 0, report.faults
    assert report.counts["kills"] > 5 and report.counts["writes"] > 20, report.counts
