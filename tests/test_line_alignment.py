"""kb.lines.KeptLinesMatcher (design §8, §17): difflib's opcodes over kept_lines' alignment, which
citation follow-ups and the revision pages' diffs use — any read token asks for them, and
difflib's own alignment is quadratic when lines repeat (30 000 alike lines took minutes)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kb.citations.follow import map_range
from kb.lines import KeptLinesMatcher


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "", "---"]), max_size=40),
    st.lists(st.sampled_from(["a", "b", "", "---"]), max_size=40),
)
def test_opcodes_turn_the_old_lines_into_the_new(old: list[str], new: list[str]) -> None:
    rebuilt: list[str] = []
    for tag, i1, i2, j1, j2 in KeptLinesMatcher(old, new).get_opcodes():
        if tag == "equal":
            assert old[i1:i2] == new[j1:j2]
            rebuilt += old[i1:i2]
        else:
            rebuilt += new[j1:j2]
    assert rebuilt == new


def test_a_repeated_line_cited_in_a_long_text_of_alike_lines_follows_an_insertion_above() -> None:
    """A citation of one of 30 000 alike lines, after a line was inserted above it: still the same
    line, one further down (difflib's matcher took minutes on this text, per follow-up)."""
    old = ["- item"] * 30_000
    new = old[:100] + ["- inserted"] + old[100:]
    mapped = map_range(old, new, 20_000, 20_000)
    assert (mapped.status, mapped.start, mapped.end) == ("unchanged", 20_001, 20_001)
    grouped = list(KeptLinesMatcher(old, new).get_grouped_opcodes(3))  # the revision page's diff
    assert [(tag, i1, i2, j1, j2) for group in grouped for tag, i1, i2, j1, j2 in group if tag != "equal"] == [
        ("insert", 100, 100, 100, 101)
    ]
