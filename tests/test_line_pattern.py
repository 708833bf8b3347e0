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


FRAGMENTS = [
    "a",
    "b",
    "é",
    ".",
    "^",
    "$",
    "|",
    "(",
    ")",
    "+",
    "*",
    "?",
    r"\s",
    r"\S",
    r"\w",
    r"\W",
    r"\d",
    r"\b",
    r"\B",
    r"[^\w]",
    r"[\sa]",
    r"[^\sb]",
    "{e<=1}",  # fuzzy matching in regex, literal text in re
    "{1,2}",
    "{,2}",
    "{ 1}",
    "[[:alpha:]]",  # a POSIX class in regex, a set and a ']' in re
    "(?-i:a)",  # scoped flags turning a flag off
    "(?i:A)",
    "(?-m:^a)",
    "(?-m:b$)",
    "(?-s:.)",
    "(?s:.)",
    "(?a:\\w)",
    "(?>a+)",
    "a++",
    "(?P<g>a)(?P=g)",
    "(a)?(?(1)b|x)",
    r"\p{L}",  # regex-only syntax: refused as re refuses it
    "(?V1)",
    r"\L<words>",
    "(?|a|b)",
    "(?r)a",
    r"\K",
    r"\N{LATIN SMALL LETTER E WITH ACUTE}",
]
TEXT = [
    "a",
    "b",
    "A",
    "é",
    "e\u0301",
    " ",
    "\n",
    "\r\n",
    "\x1c",
    "\u00a0",
    "{",
    "}",
    "e",
    "<",
    "=",
    "1",
    "²",
    "٣",
    ":",
    "]",
    "_",
    "İ",
    "i",
]


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=5).map("".join),
    st.lists(st.sampled_from(TEXT), max_size=30).map("".join),
    st.booleans(),
)
def test_grep_follows_re_on_what_re_and_regex_read_differently(pattern, text, ignore_case):
    """Whatever the pattern, grep answers as re does: re's errors are InvalidPattern (regex-only
    syntax included), and re's literals, classes and scoped flags keep re's meaning."""
    try:
        expected = one_by_one(pattern, text, ignore_case)
    except re.error:
        with pytest.raises(InvalidPattern, match="does not compile"):
            LinePattern(pattern, ignore_case=ignore_case, seconds=60)
        return
    assert LinePattern(pattern, ignore_case=ignore_case, seconds=60).lines("/documents/t.md", text) == expected


@pytest.mark.parametrize("depth", [200, 5000])
def test_deeply_nested_groups_are_refused_or_matched_not_a_crash(depth):
    """A pattern nested thousands deep made re's parser (and regex's compiler) recurse past
    Python's limit: a RecursionError escaped grep. It is an InvalidPattern; a nesting re accepts
    matches as re does."""
    pattern = "(" * depth + "a" + ")" * depth
    try:
        expected = one_by_one(pattern, "a\nb", False)
    except RecursionError:
        with pytest.raises(InvalidPattern, match="too deeply nested"):
            LinePattern(pattern, ignore_case=False, seconds=60)
        return
    assert LinePattern(pattern, ignore_case=False, seconds=60).lines("/documents/t.md", "a\nb") == expected


def test_counted_repeats_too_large_to_spell_out_are_refused():
    """regex writes a counted repeat out item by item when it compiles: a{1000000000} exhausted
    the memory of the process (kb serve with it). Past MAX_EXPANSION items the pattern is refused."""
    for pattern in ("a{1000000000}", "(?:a{1000}){1000}", "(?:(?:x{100}){100}){100}"):
        with pytest.raises(InvalidPattern, match="counted repeats"):
            LinePattern(pattern, ignore_case=False, seconds=60)
    assert LinePattern("x{2,1000}", ignore_case=False, seconds=60).lines("/d/t.md", "xx\nx") == [(1, "xx")]


def test_a_pattern_whose_backtracking_explodes_stops_at_the_bound():
    """(a|aa)+$ on a line of 40 a's and a b: re would run for hours; the bound stops it with an
    error naming the document and what to do."""
    matcher = LinePattern(r"(a|aa)+$", ignore_case=False, seconds=0.3)
    with pytest.raises(InvalidPattern, match=r"took more than 0.3 s .*/documents/evil\.md.*simplify the pattern"):
        matcher.lines("/documents/evil.md", "# Evil\n\n" + "a" * 40 + "b\n")


def test_a_pattern_that_does_not_compile_is_invalid():
    with pytest.raises(InvalidPattern, match="does not compile"):
        LinePattern("(", ignore_case=False, seconds=1)
    with pytest.raises(InvalidPattern, match=r"bad escape \\p.*Python re's syntax"):
        LinePattern(r"\p{L}", ignore_case=False, seconds=1)  # regex would read a Unicode property


def test_a_literal_pattern_keeps_the_time_bound_between_documents():
    """A literal runs on ``re`` (linear, no timeout per call); its budget is checked after each
    search, so a grep over many documents still stops at the bound."""
    matcher = LinePattern("needle", ignore_case=False, seconds=0)
    with pytest.raises(InvalidPattern, match=r"took more than 0 s .*/documents/hay\.md"):
        matcher.lines("/documents/hay.md", "hay\n" * 10)


def test_a_refused_pattern_is_quoted_as_typed_and_a_bad_escape_says_re_has_none():
    """A new user's ``\\p{L}`` was shown as '\\\\p{L}' with the advice to escape a literal."""
    with pytest.raises(InvalidPattern) as refused:
        LinePattern("\\p{L}+", ignore_case=False, seconds=1)
    assert "grep pattern '\\p{L}+' does not compile: bad escape \\p" in str(refused.value)
    assert "no \\p{…} classes" in str(refused.value)
    with pytest.raises(InvalidPattern, match="escape a character meant literally") as refused:
        LinePattern("(a\n", ignore_case=False, seconds=1)
    assert "'(a\\n'" in str(refused.value)  # a line break is shown escaped


CASED = ["s", "S", "\u017f", "k", "K", "\u212a", "i", "I", "\u0130", "\u0131", "\u03c3", "\u03c2", "\u03a3"]
CASED += ["\u00df", "\u1e9e", "\u01c4", "\u01c5", "\u01c6", "\ufb00", "\u0390", "\u1fd3", "\u00e9", "\u00c9", "b", "1"]
CASE_FRAGMENTS = ["[a-z]", "[^a-z]", "[A-Z]", "[k-s]", "[^b]", "[\\w\u03c3]", "[^\\W\u0131]", "(?a:", "(?-i:", ")"]


@settings(max_examples=1500, deadline=None)
@given(
    st.lists(st.sampled_from(CASED + CASE_FRAGMENTS + ["(?i)", "(?ai)", "(?i:"]), min_size=1, max_size=4).map("".join),
    st.lists(st.sampled_from(CASED + ["\n", " "]), max_size=12).map("".join),
    st.booleans(),
)
def test_ignoring_case_matches_as_re_lowercases(pattern, text, ignore_case):
    """re ignores case by lowercasing (plus its extra cases, only ASCII letters under (?a)); regex
    by Unicode's case folding and without regard to (?a): (?i)İ found no I, (?i)[^a-z] found ı,
    (?ai)ς found σ and (?i)ß no ẞ. Grep answers as re does, line by line. (The reference matches
    at each position: re.search itself misses (?i)(?a:\\W) on ǅ, a prefix check of CPython's.)"""
    try:
        compiled = re.compile(pattern, re.MULTILINE | (re.IGNORECASE if ignore_case else 0))
    except re.error:
        return
    lines = document_lines(text)
    expected = [
        (n, line) for n, line in enumerate(lines, 1) if any(compiled.match(line, at) for at in range(len(line) + 1))
    ]
    assert LinePattern(pattern, ignore_case=ignore_case, seconds=60).lines("/documents/t.md", text) == expected


@pytest.mark.parametrize("pattern", ["\u0130", "[a-z]", "[^a-z]", "(?a:\u03c2)", "\u00df", "(?i:[\\w\u03c3])"])
def test_every_case_variant_re_matches_and_no_other(pattern):
    """Each character case concerns, tried alone against a pattern ignoring case: grep's lines
    are re's (İ matches i and I in re; [^a-z] does not match ı, K or ſ)."""
    from kb.turns.line_pattern import _case_relevant

    text = "\n".join(map(chr, _case_relevant()))
    assert LinePattern(pattern, ignore_case=True, seconds=60).lines("/documents/t.md", text) == one_by_one(
        pattern, text, True
    )


@pytest.mark.parametrize("pattern", [r"(?>(x|\n)*)$", r"(x|\n)*+$", r"(?>\s*)b", r"[^b]++c"])
def test_an_atomic_group_does_not_hide_a_line_behind_the_next(pattern):
    """An atomic group or possessive repeat that takes a line break in the whole document keeps
    it: the line's own match (stopping at its end) is never tried, and a line the pattern matches
    alone was missed ((?>(x|\\n)*)$ on 'a\\na': line 1 matches alone)."""
    for text in ("a\na", "a\nbb", " \n b", "a\nc\n", "\u00c9\r\n\u00c9\u03a3"):
        assert LinePattern(pattern, ignore_case=False, seconds=60).lines("/d/t.md", text) == one_by_one(
            pattern, text, False
        )


def test_repeated_classes_are_bounded_by_what_they_spell_out():
    """A class is one pattern item, but regex holds a copy of it for each repeat and re's \\w is
    written as thousands of characters: \\w{199000} took 10 GB, (?:\\b){20000} 4 GB, and
    (?i)(?:[a-z]{1000}){199} crashed the process in regex. Past MAX_SPELLED characters of
    classes spelled out the pattern is refused; a class repeated a thousand times still runs."""
    for pattern in (r"\w{5000}", r"(?:\b){1000}", r"(?i)(?:[a-z]{1000}){199}", r"(?:(?:\W){100}){50}"):
        with pytest.raises(InvalidPattern, match="spell out more than"):
            LinePattern(pattern, ignore_case=False, seconds=60)
    assert LinePattern(r"\w{2,1000}", ignore_case=True, seconds=60).lines("/d/t.md", "ab\n.") == [(1, "ab")]
