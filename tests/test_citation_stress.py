"""A short sample of the citation stress (tests/support/citation_stress.py; long runs:
``bin/stress_citations.py``): searches checked against ``git show`` while commits, projections,
index runs and reindexes race, then convergence (design §7, §8)."""

from __future__ import annotations

from support.citation_stress import stress

from kb.index.embedding import HashingEmbedder


def test_searches_racing_writes_and_index_runs_cite_git_s_lines_and_the_index_converges(kb):
    kb.use_embedder(HashingEmbedder())
    report = stress(kb, 1, seconds=8, seed=7)
    assert report.faults == [], report.fault_counts
    assert report.counts["search"] > 20 and report.counts["envelope"] > 100, report.counts
    assert report.counts["commit"] > 10 and report.counts["index"] > 0 and report.counts["project"] > 0, report.counts
