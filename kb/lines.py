"""Line counting — the one definition every line number in kb is produced and consumed with (design §8).

Chunk spans at cut time (:mod:`kb.index.chunking`), the envelope rendering of search and reads
(:mod:`kb.citations.envelope`), ``turn.read``/``turn.grep`` (:mod:`kb.turns.turn`), the citation normalizer and
resolution (:mod:`kb.citations.conversation`) all count lines here, so a number shown to a reader resolves to
the same text later. The rules:

- only ``\\n`` splits lines; a ``\\r`` right before it (CRLF) or at the very end of the text is not
  part of the line's text;
- a text ending in ``\\n`` has no empty last line after it; the empty text has no lines;
- nothing else splits or shifts lines: a lone ``\\r``, U+2028/U+2029, form feed, vertical tab, NEL
  and the other characters Python's ``str.splitlines`` splits on stay inside their line;
- a byte-order mark at the start of the text belongs to line 1 and is not part of its text.

Bytes are decoded as UTF-8 with undecodable bytes replaced (U+FFFD): each bad byte stays on its
own line, so replacement never moves a line boundary.
"""

from __future__ import annotations

import bisect

from kb.errors import InvalidInput, OffsetOutOfRange

BOM = "\ufeff"


def decode_text(data: bytes | str) -> str:
    """``data`` as text (UTF-8, undecodable bytes → U+FFFD); text is returned unchanged."""
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data


def document_lines(data: bytes | str) -> list[str]:
    """The lines of a document: ``lines[n - 1]`` is the text of line ``n`` (rules above).

    ``data`` is the document's bytes (decoded as UTF-8, see :func:`decode_text`) or text.
    ``"a\\r\\nb"`` → ``["a", "b"]``; ``"a\\n"`` → ``["a"]``; ``""`` → ``[]``;
    ``"a\\u2028b\\rc"`` → ``["a\\u2028b\\rc"]``.
    """
    text = decode_text(data)
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if lines and lines[0].startswith(BOM):
        lines[0] = lines[0][len(BOM) :]
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def line_count(data: bytes | str) -> int:
    """How many lines :func:`document_lines` finds in ``data``."""
    return len(document_lines(data))


def line_starts(text: str) -> list[int]:
    """Character offsets at which each line of ``text`` starts (line 1 starts at 0).

    Consistent with :func:`document_lines`: the character at offset ``o`` lies on line
    ``line_of(line_starts(text), o)``. (For a text ending in ``\\n`` the last entry is the offset
    one past the end, which holds no character.)
    """
    starts = [0]
    index = text.find("\n")
    while index != -1:
        starts.append(index + 1)
        index = text.find("\n", index + 1)
    return starts


def line_of(starts: list[int], offset: int) -> int:
    """1-based line number holding character ``offset`` of the text ``starts`` was computed from."""
    return bisect.bisect_right(starts, offset)


def check_window_arguments(offset: object, limit: object) -> None:
    """Refuse a window's ``offset`` (lines skipped) and ``limit`` (most lines shown, None: to the
    end) unless each is a whole number ≥ 0 (not a bool, float or string): InvalidInput. One check
    for every reader (``Envelope.window``, ``Turn.read``, the MCP and HTTP reads through them)."""
    for name, value in (("offset", offset), ("limit", limit)):
        if name == "limit" and value is None:  # no limit: to the end
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"{name} must be a whole number ≥ 0, got {value!r}")


def check_offset(path: str, offset: int, total_lines: int) -> None:
    """Refuse a window that starts past the end: ``offset`` (lines skipped) above ``total_lines``,
    the document's line count, raises OffsetOutOfRange saying how many lines ``path`` has.
    ``offset == total_lines`` is the end of the document (an empty window), as a pager's last
    page; a negative offset is the caller's own check."""
    if offset > total_lines:
        raise OffsetOutOfRange(
            f"offset {offset} is past the end of {path}: it has {total_lines} "
            f"line{'' if total_lines == 1 else 's'}; use an offset ≤ {total_lines} (the lines to skip)"
        )
