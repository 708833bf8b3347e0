"""A short sample of the keyed-retry stress (tests/support/keyed_retry_stress.py; longer runs:
``bin/stress_keyed_retries.py``): processes and threads send one write under one idempotency key at
once, one process killed while it holds the key's fence; every caller must get the same revision
and the write must land once (design §3)."""

from __future__ import annotations

from support.keyed_retry_stress import stress_keyed_retries


def test_the_same_keyed_write_sent_at_once_lands_once_and_every_caller_gets_its_revision(kb):
    kb.create_workspace(1)
    with kb.transaction(1, "base", "t") as tx:
        tx.write("/documents/base.md", "base\n")
    report = stress_keyed_retries(kb, 1, rounds=2, processes=3, threads=6)
    assert report.counts["bad_rounds"] == 0, report.faults
    assert report.counts["killed"] == 1 and report.counts["key"] >= 10 and report.counts["other"] >= 4, report.counts
