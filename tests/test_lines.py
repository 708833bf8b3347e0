"""The one line counter (design §8): the rules, and that chunk spans, envelopes and turns
agree with it."""

from __future__ import annotations

import pytest

from kb.index.chunking import Chunker
from kb.lines import document_lines, line_count, line_starts


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
