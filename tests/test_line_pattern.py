"""kb.turns.line_pattern (design §5, §16): a grep's lines are the lines the pattern matches alone,
as Python's re matches them one by one, though a document is searched whole; and a pattern whose
backtracking explodes stops at the time bound instead of holding the interpreter."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kb.errors import InvalidPattern
from kb.lines import document_lines
from kb.turns.line_pattern import LinePattern

PATTERNS = [
    "a",
    "^a",
    "a$",
    "^$",
    "^",
    "$",
    "b+",
    "a b",
    r"a\sb",
    r"\s",
    r"\s+$",
    "[ab]{2}",
    r"^\s*$",
    "a|^b",
    "(?i)A",
    "(?s)a.b",
    r"\bab\b",
    r"a.*b",
    r"x*",
    r"\Aa",
    r"b\Z",
    r"a(?!\s)",  # lookarounds see past a line's end in a whole document: each line alone instead
    r"a(?=\s|$)",
    r"(?<!\s)b",
    r"(?<=b)a",
    r"a(?!$)",
    "é",
    "",  # literals (no regular-expression character) run on re itself: the same answers
    "ab",
    " a",
    "xé",
]


def one_by_one(pattern: str, text: str, ignore_case: bool) -> list[tuple[int, str]]:
    """The reference: re over each line of the document alone."""
    compiled = re.compile(pattern, re.MULTILINE | (re.IGNORECASE if ignore_case else 0))
    return [(n, line) for n, line in enumerate(document_lines(text), start=1) if compiled.search(line)]


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from(PATTERNS),
    st.lists(st.sampled_from(["a", "b", "A", " ", "\n", "\r", "\r\n", "\ufeff", "é", "x", "\t"]), max_size=40).map(
        "".join
    ),
    st.booleans(),
)
def test_lines_are_the_lines_re_matches_one_by_one(pattern, text, ignore_case):
    matcher = LinePattern(pattern, ignore_case=ignore_case, seconds=60)
    assert matcher.lines("/documents/t.md", text) == one_by_one(pattern, text, ignore_case)


def test_a_pattern_whose_backtracking_explodes_stops_at_the_bound():
    """(a|aa)+$ on a line of 40 a's and a b: re would run for hours; the bound stops it with an
    error naming the document and what to do."""
    matcher = LinePattern(r"(a|aa)+$", ignore_case=False, seconds=0.3)
    with pytest.raises(InvalidPattern, match=r"took more than 0.3 s .*/documents/evil\.md.*simplify the pattern"):
        matcher.lines("/documents/evil.md", "# Evil\n\n" + "a" * 40 + "b\n")


def test_a_pattern_that_does_not_compile_is_invalid():
    with pytest.raises(InvalidPattern, match="does not compile"):
        LinePattern("(", ignore_case=False, seconds=1)


def test_a_literal_pattern_keeps_the_time_bound_between_documents():
    """A literal runs on ``re`` (linear, no timeout per call); its budget is checked after each
    search, so a grep over many documents still stops at the bound."""
    matcher = LinePattern("needle", ignore_case=False, seconds=0)
    with pytest.raises(InvalidPattern, match=r"took more than 0 s .*/documents/hay\.md"):
        matcher.lines("/documents/hay.md", "hay\n" * 10)
