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
import difflib
from collections import Counter

from kb.errors import InvalidInput, OffsetOutOfRange

BOM = "\ufeff"


def line_span(start: int, end: int, dash: str = "-") -> str:
    """``line 10`` for a one-line span, ``lines 10-12`` for more (``dash`` joins the two)."""
    return f"line {start}" if start == end else f"lines {start}{dash}{end}"


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
        last = (
            "it has no lines to show (use offset 0)"
            if total_lines == 0
            else f"offset {total_lines - 1} shows its last line (an offset counts the lines skipped)"
        )
        raise OffsetOutOfRange(
            f"offset {offset} is past the end of {path}: it has {total_lines} "
            f"line{'' if total_lines == 1 else 's'}; {last}"
        )


MATCHER_CELLS = 40_000
"""Largest ``len(old) * len(new)`` handed whole to difflib's matcher (see :func:`kept_lines`)."""
EDIT_STEPS = 2_000_000
"""Budget of a long stretch's shortest-edit search: edits tried × lines (see :func:`kept_lines`)."""


def kept_lines(old: list[str], new: list[str]) -> list[tuple[int, int, int]]:
    """The lines ``new`` kept from ``old``: blocks ``(i, j, size)`` with ``old[i:i+size] ==
    new[j:j+size]``, increasing in both ``i`` and ``j`` (difflib's matching blocks, without the
    closing empty one). Blame (design §17) carries each kept line's origin through them.

    The common head and tail are kept; what lies between goes to difflib's ``SequenceMatcher``
    (no junk heuristic: blank lines must match too) when it is within ``MATCHER_CELLS`` (lines ×
    lines). Its time grows with that product when lines repeat (a separator, a blank line: 20 000
    alike took ~100 s), so in a longer stretch lines that occur once in each text anchor the
    alignment (the longest increasing run of them, as patience diff takes them)
    and the stretches between anchors are matched the same way; a stretch with no anchor goes to
    difflib if it is within ``MATCHER_CELLS``, else to Myers' shortest edit script when that
    needs at most ``EDIT_STEPS // lines`` edits (a few lines changed among many alike), else its
    lines count as not kept (a rewrite).
    """
    blocks: list[tuple[int, int, int]] = []
    stack = [(0, len(old), 0, len(new))]
    while stack:
        i1, i2, j1, j2 = stack.pop()
        head = 0
        while i1 + head < i2 and j1 + head < j2 and old[i1 + head] == new[j1 + head]:
            head += 1
        tail = 0
        while i2 - tail > i1 + head and j2 - tail > j1 + head and old[i2 - tail - 1] == new[j2 - tail - 1]:
            tail += 1
        if head:
            blocks.append((i1, j1, head))
        if tail:
            blocks.append((i2 - tail, j2 - tail, tail))
        i1, j1, i2, j2 = i1 + head, j1 + head, i2 - tail, j2 - tail
        if i1 == i2 or j1 == j2:
            continue
        if (i2 - i1) * (j2 - j1) <= MATCHER_CELLS:
            matcher = difflib.SequenceMatcher(None, old[i1:i2], new[j1:j2], autojunk=False)
            blocks += [(i1 + a, j1 + b, n) for a, b, n in matcher.get_matching_blocks() if n]
            continue
        anchors = _unique_anchors(old, new, i1, i2, j1, j2)
        if not anchors:  # too long for difflib: few edits, or a rewrite (nothing kept)
            blocks += _few_edits(old, new, i1, i2, j1, j2, EDIT_STEPS // (i2 - i1 + j2 - j1))
            continue
        previous_i, previous_j = i1, j1
        for i, j in anchors:
            stack.append((previous_i, i, previous_j, j))
            blocks.append((i, j, 1))
            previous_i, previous_j = i + 1, j + 1
        stack.append((previous_i, i2, previous_j, j2))
    blocks.sort()
    merged: list[tuple[int, int, int]] = []
    for i, j, n in blocks:  # adjacent blocks joined, as difflib gives them
        if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            merged[-1] = (merged[-1][0], merged[-1][1], merged[-1][2] + n)
        else:
            merged.append((i, j, n))
    return merged


def _unique_anchors(old: list[str], new: list[str], i1: int, i2: int, j1: int, j2: int) -> list[tuple[int, int]]:
    """Pairs ``(i, j)`` of a line occurring once in ``old[i1:i2]`` and once in ``new[j1:j2]``,
    the longest run of them increasing in both (patience sorting)."""
    in_old = Counter(old[i1:i2])
    in_new = Counter(new[j1:j2])
    where_new = {line: j for j, line in enumerate(new[j1:j2], j1) if in_new[line] == 1 and in_old[line] == 1}
    pairs = [(i, where_new[line]) for i, line in enumerate(old[i1:i2], i1) if line in where_new]
    tops: list[int] = []  # tops[k]: the smallest j ending an increasing run of k + 1 pairs
    ends: list[int] = []  # ends[k]: index in pairs of that pair
    back: list[int] = []  # back[p]: index of the pair before pair p in its run (-1: none)
    for p, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(tops, j)
        back.append(ends[k - 1] if k else -1)
        if k == len(tops):
            tops.append(j)
            ends.append(p)
        else:
            tops[k], ends[k] = j, p
    run: list[tuple[int, int]] = []
    p = ends[-1] if ends else -1
    while p != -1:
        run.append(pairs[p])
        p = back[p]
    return run[::-1]


def _few_edits(
    old: list[str], new: list[str], i1: int, i2: int, j1: int, j2: int, most: int
) -> list[tuple[int, int, int]]:
    """Blocks ``(i, j, 1)`` kept by the shortest edit script from ``old[i1:i2]`` to ``new[j1:j2]``
    (Myers' O((N+M)D) greedy search), or none when it needs more than ``most`` edits."""
    n, m = i2 - i1, j2 - j1
    shift = most + 1
    reach = [0] * (2 * most + 3)  # reach[k + shift]: furthest old index on diagonal k = i - j
    trace: list[list[int]] = []
    for d in range(most + 1):
        trace.append(reach[:])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and reach[k - 1 + shift] < reach[k + 1 + shift]):
                i = reach[k + 1 + shift]
            else:
                i = reach[k - 1 + shift] + 1
            j = i - k
            while i < n and j < m and old[i1 + i] == new[j1 + j]:
                i, j = i + 1, j + 1
            reach[k + shift] = i
            if i >= n and j >= m:
                return _kept_by_trace(trace, shift, n, m, i1, j1)
    return []


def _kept_by_trace(trace: list[list[int]], shift: int, n: int, m: int, i1: int, j1: int) -> list[tuple[int, int, int]]:
    """Walk :func:`_few_edits`' search back from its end: the diagonal steps are the kept lines."""
    kept: list[tuple[int, int, int]] = []
    i, j = n, m
    for d in range(len(trace) - 1, -1, -1):
        reach = trace[d]
        k = i - j
        down = k == -d or (k != d and reach[k - 1 + shift] < reach[k + 1 + shift])  # an insertion
        previous_k = k + 1 if down else k - 1
        previous_i = reach[previous_k + shift]
        previous_j = previous_i - previous_k
        while i > previous_i and j > previous_j:
            i, j = i - 1, j - 1
            kept.append((i1 + i, j1 + j, 1))
        if d > 0:
            i, j = previous_i, previous_j
    return kept


class KeptLinesMatcher(difflib.SequenceMatcher):
    """difflib's SequenceMatcher over two texts' lines whose alignment is ``kept_lines``' (bounded
    time on long texts of repeated lines, where difflib's own is quadratic): ``get_opcodes`` and
    ``get_grouped_opcodes`` work on it as on difflib's. For citation follow-ups (design §8) and
    the revision pages' diffs (§17), which any read token can ask for."""

    def __init__(self, old: list[str], new: list[str]) -> None:
        self._old, self._new = old, new
        super().__init__(None, old, new, autojunk=False)

    def get_matching_blocks(self) -> list[difflib.Match]:
        """``kept_lines``' blocks and difflib's closing empty one."""
        found = [difflib.Match(i, j, size) for i, j, size in kept_lines(self._old, self._new)]
        return [*found, difflib.Match(len(self._old), len(self._new), 0)]
