"""Golden cases of the citation normalizer (design §8): exact output text and citations.

Handles: [1] numbered, 10 lines; [2] shown un-numbered, 5 lines; [3] numbered, 20 lines; [4]
numbered, an empty document. Each case: input, output text, citations left, unknown handles
dropped, citations degraded to document level.
"""

from __future__ import annotations

import pytest

from kb.citations.normalizer import Citation, HandleInfo, normalize, parse_citation
from kb.errors import InvalidCitation, InvalidInput

HANDLES = {1: HandleInfo(True, 10), 2: HandleInfo(False, 5), 3: HandleInfo(True, 20), 4: HandleInfo(True, 0)}

GOLDEN = [
    ("See [1].", "See [1].", ["[1]"], [], []),
    ("See [1:L3].", "See [1:L3].", ["[1:L3]"], [], []),
    ("See [1:L3-L5].", "See [1:L3-L5].", ["[1:L3-L5]"], [], []),
    ("See [1:L3-5].", "See [1:L3-L5].", ["[1:L3-L5]"], [], []),
    ("See [1:l3-l5].", "See [1:L3-L5].", ["[1:L3-L5]"], [], []),
    ("See [1: L3 - L5].", "See [1:L3-L5].", ["[1:L3-L5]"], [], []),
    ("See [1:L3–L5] and [1:L3—5].", "See [1:L3-L5] and [1:L3-L5].", ["[1:L3-L5]", "[1:L3-L5]"], [], []),
    ("See [1, 3:L4-L6].", "See [1][3:L4-L6].", ["[1]", "[3:L4-L6]"], [], []),
    ("See [1; 3:L4].", "See [1][3:L4].", ["[1]", "[3:L4]"], [], []),
    ("See [1][3].", "See [1][3].", ["[1]", "[3]"], [], []),
    ("See [1][3:L2-L3][1].", "See [1][3:L2-L3][1].", ["[1]", "[3:L2-L3]", "[1]"], [], []),
    ("See [1:L5-L3].", "See [1:L3-L5].", ["[1:L3-L5]"], [], []),
    ("See [1:L8-L40].", "See [1:L8-L10].", ["[1:L8-L10]"], [], []),
    ("See [1:L0].", "See [1:L1].", ["[1:L1]"], [], []),
    ("See [1:L0-L2].", "See [1:L1-L2].", ["[1:L1-L2]"], [], []),
    ("See [1:L11].", "See [1].", ["[1]"], [], []),  # beyond the last line: no line of it, not line 10
    ("See [3:L25-L30].", "See [3].", ["[3]"], [], []),
    ("See [3:L30-L12].", "See [3:L12-L20].", ["[3:L12-L20]"], [], []),
    ("See [2:L2-L3].", "See [2].", ["[2]"], [], ["[2]"]),
    ("See [2].", "See [2].", ["[2]"], [], []),
    ("See [1, 2:L1, 3:L1].", "See [1][2][3:L1].", ["[1]", "[2]", "[3:L1]"], [], ["[2]"]),
    ("See [4:L1].", "See [4].", ["[4]"], [], ["[4]"]),
    ("See [9].", "See.", [], [9], []),
    ("See [9] now.", "See now.", [], [9], []),
    ("[9] opens the line.", "opens the line.", [], [9], []),
    ("Line one.\n[9] opens line two.", "Line one.\nopens line two.", [], [9], []),
    ("See [1, 9].", "See [1].", ["[1]"], [9], []),
    ("See [9, 1:L2].", "See [1:L2].", ["[1:L2]"], [9], []),
    ("See [9][1].", "See [1].", ["[1]"], [9], []),
    ("Before [9], after.", "Before, after.", [], [9], []),
    ("See [1, 1, 1:L2].", "See [1][1:L2].", ["[1]", "[1:L2]"], [], []),
    ("Task list:\n- [x] done\n- [ ] todo\n- [X] done", "Task list:\n- [x] done\n- [ ] todo\n- [X] done", [], [], []),
    ("Link [[Refund policy]] and [[1]].", "Link [[Refund policy]] and [[1]].", [], [], []),
    ("A [link](https://x.y/1) and [1](https://x.y).", "A [link](https://x.y/1) and [1](https://x.y).", [], [], []),
    ("Reference [text][1] and [1][ref].", "Reference [text][1] and [1][ref].", [], [], []),
    ("[1]: https://example.com/def", "[1]: https://example.com/def", [], [], []),
    ("  [1]: https://example.com/indented-def", "  [1]: https://example.com/indented-def", [], [], []),
    (
        "Code `x = a[1]` and a[1] and f(x)[2] and m[1][2].",
        "Code `x = a[1]` and a[1] and f(x)[2] and m[1][2].",
        [],
        [],
        [],
    ),
    ("Inline ``a `[1]` b`` then [1].", "Inline ``a `[1]` b`` then [1].", ["[1]"], [], []),
    ("```\nsee [1:L2]\n```\nthen [1:L2].", "```\nsee [1:L2]\n```\nthen [1:L2].", ["[1:L2]"], [], []),
    ("~~~python\nitems[3]\n[3]\n~~~\n[3]", "~~~python\nitems[3]\n[3]\n~~~\n[3]", ["[3]"], [], []),
    ("```\nunclosed [1]\nstill code [3]", "```\nunclosed [1]\nstill code [3]", [], [], []),
    ("Escaped \\[1] and real [1].", "Escaped \\[1] and real [1].", ["[1]"], [], []),
    ("Time [10:30] and [1:30] are not citations.", "Time [10:30] and [1:30] are not citations.", [], [], []),
    ("退款政策[1]。年度计划[3:L2-L3]。", "退款政策[1]。年度计划[3:L2-L3]。", ["[1]", "[3:L2-L3]"], [], []),
    ("Édition[1] et café [3].", "Édition[1] et café [3].", ["[3]"], [], []),
    ("Trailing [1]", "Trailing [1]", ["[1]"], [], []),
    ("Before,[1:L2]after", "Before,[1:L2]after", ["[1:L2]"], [], []),
    ("(see [1:L2])", "(see [1:L2])", ["[1:L2]"], [], []),
    ("Footnote [^1] and [1a] and [ 1 ] and [01].", "Footnote [^1] and [1a] and [1] and [1].", ["[1]", "[1]"], [], []),
    ("Two brackets [1] [3] spaced.", "Two brackets [1] [3] spaced.", ["[1]", "[3]"], [], []),
    ("Nested [[1]] and [1]] and [[1].", "Nested [[1]] and [1]] and [[1].", [], [], []),
    (
        "Huge [123456789012] is not a handle and [999999999] is unknown.",
        "Huge [123456789012] is not a handle and is unknown.",
        [],
        [999999999],
        [],
    ),
    ("Empty doc [4] [4:L1-L3].", "Empty doc [4] [4].", ["[4]", "[4]"], [], ["[4]"]),
    (
        "`[1]` at start and [1] after; ``` inline ``` [3:L1]",
        "`[1]` at start and [1] after; ``` inline ``` [3:L1]",
        ["[1]", "[3:L1]"],
        [],
        [],
    ),
]


@pytest.mark.parametrize(("source", "text", "citations", "unknown", "degraded"), GOLDEN)
def test_golden(source, text, citations, unknown, degraded):
    result = normalize(source, HANDLES.get, drop_unknown=True)
    assert result.text == text
    assert [str(c) for c in result.citations] == citations
    assert result.unknown == unknown
    assert [str(c) for c in result.degraded] == degraded


def test_there_are_at_least_forty_golden_cases():
    assert len(GOLDEN) >= 40


def test_normalizing_normalized_text_changes_nothing():
    for source, text, citations, _, _ in GOLDEN:
        again = normalize(text, HANDLES.get, drop_unknown=True)
        assert again.text == text, source
        assert [str(c) for c in again.citations] == citations
        assert not again.unknown and not again.adjusted


def test_adjusted_reports_clamped_and_swapped_ranges():
    result = normalize("[1:L5-L3] [3:L18-L30] [1:L2]", HANDLES.get)
    assert [(raw, str(c)) for raw, c in result.adjusted] == [("[1:L5-L3]", "[1:L3-L5]"), ("[3:L18-L30]", "[3:L18-L20]")]
    assert not result.beyond


def test_a_range_wholly_past_the_end_cites_the_document_not_its_last_line():
    """design §8: [2:L500] of a 21-line document was clamped to [2:L21], an unrelated line, said
    only on stderr; a range that names no line of the document cites the whole document and is
    reported apart from the clamped ones."""
    result = normalize("see [3:L500] and [3:L21-L40] and [3:L20-L40]", HANDLES.get)
    assert result.text == "see [3] and [3] and [3:L20]"
    assert [(raw, str(c)) for raw, c in result.beyond] == [("[3:L500]", "[3]"), ("[3:L21-L40]", "[3]")]
    assert [(raw, str(c)) for raw, c in result.adjusted] == [("[3:L20-L40]", "[3:L20]")]
    assert result.as_json()["beyond"] == [["[3:L500]", "[3]"], ["[3:L21-L40]", "[3]"]]


@pytest.mark.parametrize(
    ("written", "citation"),
    [
        ("[3:L12-L14]", Citation(3, 12, 14)),
        ("3:L12-14", Citation(3, 12, 14)),
        ("[3]", Citation(3)),
        (" [3:L14-L12] ", Citation(3, 12, 14)),
        ("[3:L7]", Citation(3, 7, 7)),
        ("[3:l7–9]", Citation(3, 7, 9)),
    ],
)
def test_parse_citation(written, citation):
    assert parse_citation(written) == citation


@pytest.mark.parametrize("written", ["", "see [3]", "[3][4]", "[1, 2]", "[x]", "[3:L0]", "[3:12]", None, 7])
def test_parse_citation_refuses_anything_else(written):
    with pytest.raises(InvalidCitation):
        parse_citation(written)


def test_normalize_refuses_non_text():
    with pytest.raises(InvalidInput):
        normalize(b"[1]", HANDLES.get)


def test_normalize_refuses_a_lone_surrogate_naming_it():
    """A lone surrogate (a JSON ``"\\udfff"``) has no UTF-8 form: the text was rewritten and its
    answer could be neither sent nor written back (kb serve: a 500). It is InvalidInput."""
    with pytest.raises(InvalidInput, match=r"lone surrogate \(U\+DFFF at character 8\)"):
        normalize("see [1] \udfff", HANDLES.get)
