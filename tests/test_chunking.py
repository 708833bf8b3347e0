"""design §7: chunks carry exact offsets and true line spans, computed at cut time."""

from __future__ import annotations

import pytest
from support.corpus import corpus_path, markdown_files

from kb.citations.envelope import document_lines
from kb.index.chunking import Chunker, line_of, line_starts


def test_line_of():
    text = "a\nbb\n\nccc"
    starts = line_starts(text)
    assert [line_of(starts, i) for i in range(len(text))] == [1, 1, 2, 2, 2, 3, 4, 4, 4]


@pytest.mark.parametrize("language", ["en", "de", "ja", "ar"])
def test_spans_match_the_file_on_real_corpus(language):
    chunker = Chunker(64)
    for path in markdown_files(corpus_path(language)):
        text = path.read_text(encoding="utf-8")
        lines = document_lines(text)
        for chunk in chunker.chunk(text):
            assert text[chunk.start_char : chunk.end_char] == chunk.text
            assert chunk.text.strip() == chunk.text and chunk.text
            # the span's lines, joined, contain the chunk; the first and last lines hold its ends
            covered = "\n".join(lines[chunk.start_line - 1 : chunk.end_line])
            assert chunk.text.replace("\r", "") in covered.replace("\r", "")
            assert chunk.text.split("\n")[0].rstrip("\r") in lines[chunk.start_line - 1]
            assert chunk.text.split("\n")[-1].rstrip("\r") in lines[chunk.end_line - 1]


def test_whitespace_only_documents_have_no_chunks():
    assert Chunker().chunk("  \n\n\t\n") == []
