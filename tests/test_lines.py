"""The one line counter (design §8): the rules, and that chunk spans, envelopes and turns
agree with it."""

from __future__ import annotations

import pytest

from kb.index.chunking import Chunker
from kb.lines import document_lines, line_count, line_span, line_starts


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("", []),
        ("a", ["a"]),
        ("a\n", ["a"]),
        ("a\n\n", ["a", ""]),
        ("\n", [""]),
        ("a\r\nb\r\n", ["a", "b"]),
        ("a\r\nb", ["a", "b"]),
        ("a\r", ["a"]),
        ("a\rb\nc", ["a\rb", "c"]),  # a lone CR does not split
        ("a\u2028b\u2029c\n", ["a\u2028b\u2029c"]),  # nor do the Unicode line/paragraph separators
        ("a\x0cb\x0bc\x85d\x1ce\n", ["a\x0cb\x0bc\x85d\x1ce"]),  # form feed, VT, NEL, FS
        ("\ufeff# Title\nbody\n", ["# Title", "body"]),  # a BOM belongs to line 1, not its text
        ("\ufeff", [""]),
    ],
)
def test_rules(text, lines):
    assert document_lines(text) == lines
    assert document_lines(text.encode("utf-8")) == lines
    assert line_count(text) == len(lines)


def test_invalid_utf8_never_moves_a_line_boundary():
    assert document_lines(b"a\xff\nb\xfe\xfd\nc") == ["a\ufffd", "b\ufffd\ufffd", "c"]


def test_chunk_spans_turn_reads_and_the_counter_agree(kb):
    text = "\ufeff# Title\r\n\r\nintro\u2028same line\x0cstill\r\n\r\n" + "".join(
        f"para {i}\rwith a lone CR\r\n\r\n" for i in range(60)
    )
    lines = document_lines(text)
    starts = line_starts(text)
    chunks = Chunker(chunk_size=32).chunk(text)
    assert len(chunks) > 3
    for chunk in chunks:  # the span's lines hold exactly the chunk's characters
        end_of_line = starts[chunk.end_line] - 1 if chunk.end_line < len(starts) else len(text)
        assert starts[chunk.start_line - 1] <= chunk.start_char < chunk.end_char <= end_of_line
        first = text[starts[chunk.start_line - 1] : chunk.start_char].lstrip("\ufeff")
        assert lines[chunk.start_line - 1].startswith(first)
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "alice") as tx:
        tx.write("/documents/odd.md", text)
    turn = kb.turn(1, "t1")
    assert [t for _, t in turn.read("/documents/odd.md").lines] == lines
    assert [t for _, t in kb.read_document(1, "/documents/odd.md").lines] == lines
    hits = turn.grep("lone CR", "/documents/odd.md")
    assert [h.line_number for h in hits] == [n for n, t in enumerate(lines, 1) if "lone CR" in t]
    turn.abort()


def test_kept_lines_are_equal_blocks_in_order_and_find_few_edits_among_many_alike():
    """``kept_lines`` (blame's alignment, design §17): every block it gives is equal in both texts
    and the blocks increase in both; among 200 000 alike lines two changed lines are all that is
    not kept (no anchor, too long for difflib: the shortest edit script), and a rewrite of them
    keeps nothing."""
    import random

    from kb.lines import kept_lines

    rng = random.Random(7)
    for _ in range(300):
        old = [rng.choice("ab-") for _ in range(rng.randint(0, 40))]
        new = [rng.choice("ab-z") for _ in range(rng.randint(0, 40))]
        previous_i = previous_j = 0
        for i, j, size in kept_lines(old, new):
            assert size > 0 and i >= previous_i and j >= previous_j and old[i : i + size] == new[j : j + size]
            previous_i, previous_j = i + size, j + size
    alike = ["-"] * 200_000
    edited = ["# Title", *alike[1:100_000], "middle", *alike[100_001:]]
    kept_new = {j + n for _, j, size in kept_lines(alike, edited) for n in range(size)}
    assert len(kept_new) == 199_998 and 0 not in kept_new and 100_000 not in kept_new
    assert kept_lines(alike, ["="] * 200_000) == []


def test_a_one_line_span_is_said_as_one_line():
    """ "lines 10-10" was printed for one line (``kb cite resolve --follow``, the document page's
    notes): one line is "line 10", the page's capitalised note agreeing with it."""
    from kb.adapters.http.ui.pages import highlight_within

    assert (line_span(10, 10), line_span(10, 12), line_span(3, 5, "–")) == ("line 10", "lines 10-12", "lines 3–5")
    assert highlight_within((9, 9), 4) == (None, "Line 9 is past the end: the document has 4 lines here.")
    assert highlight_within((8, 9), 4) == (None, "Lines 8–9 are past the end: the document has 4 lines here.")
    assert highlight_within((4, 9), 4) == ((4, 4), "The document ends at line 4: line 4 is shown.")
    assert highlight_within((2, 9), 4) == ((2, 4), "The document ends at line 4: lines 2–4 are shown.")
