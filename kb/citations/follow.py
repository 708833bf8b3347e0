"""Where cited lines are now (design §8 ``follow=True``): mapping a line range between two texts.

Pure: given the lines of the cited revision and the lines of the same document at HEAD (after
following its recorded moves, :mod:`kb.citations.conversation`), say whether the cited lines are
``unchanged`` (with their line numbers at HEAD, which may have shifted), ``changed`` (with the
lines at HEAD that stand where they stood), or ``deleted``.

A cited block that occurs exactly once in both texts maps straight to its one copy (the
unique-anchor idea of patience diff). The one guarantee: ``unchanged`` is only ever answered after comparing the text — the lines at the
returned numbers equal the cited lines exactly. The alignment is ``kb.lines.KeptLinesMatcher`` (difflib's ``SequenceMatcher``
over whole lines, no junk heuristic, in bounded time on repeated lines); when it splits the cited range (repeated lines can make the
longest-match alignment pick another copy of part of it) the exact cited block is searched for
between the nearest aligned lines around the range — never elsewhere in the document, so a
deleted passage is not "found" in an unrelated copy of the same text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kb.lines import KeptLinesMatcher

Status = Literal["unchanged", "changed", "deleted"]


@dataclass(frozen=True)
class LineMapping:
    """The cited range at HEAD: ``status`` and 1-based inclusive ``start``/``end`` there (None
    when ``deleted``)."""

    status: Status
    start: int | None = None
    end: int | None = None


def _block_positions(lines: list[str], block: list[str]) -> list[int]:
    """0-based indexes at which ``block`` occurs as consecutive lines of ``lines``."""
    if not block or len(block) > len(lines):
        return []
    first, size = block[0], len(block)
    return [i for i in range(len(lines) - size + 1) if lines[i] == first and lines[i : i + size] == block]


def map_range(old: list[str], new: list[str] | None, start: int, end: int) -> LineMapping:
    """Map lines ``start``..``end`` (1-based, inclusive, within ``old``) of ``old`` onto ``new``.

    ``new`` None means the document is gone at HEAD → ``deleted``. Raises ValueError for a range
    outside ``old``.
    """
    if not 1 <= start <= end <= len(old):
        raise ValueError(f"lines {start}-{end} are outside a {len(old)}-line text")
    if new is None:
        return LineMapping("deleted")
    cited = old[start - 1 : end]
    in_new = _block_positions(new, cited)
    if len(in_new) == 1 and len(_block_positions(old, cited)) == 1:
        # the passage occurs once before and once after: it is the same passage (the idea of
        # patience diff: unique lines anchor the alignment), wherever repeated lines around it moved
        return LineMapping("unchanged", in_new[0] + 1, in_new[0] + len(cited))
    matcher = KeptLinesMatcher(old, new)
    opcodes = matcher.get_opcodes()
    equal_map: dict[int, int] = {}
    for tag, i1, i2, j1, _ in opcodes:
        if tag == "equal":
            for offset in range(i2 - i1):
                equal_map[i1 + offset] = j1 + offset
    first, last = start - 1, end - 1
    mapped = [equal_map.get(i) for i in range(first, last + 1)]
    if (
        all(m is not None for m in mapped)
        and mapped[-1] - mapped[0] == last - first
        and new[mapped[0] : mapped[-1] + 1] == cited
    ):
        return LineMapping("unchanged", mapped[0] + 1, mapped[-1] + 1)
    # The alignment split the cited range (repeated lines). Look for the exact block only between
    # the nearest aligned lines around it: where the cited lines must stand if they are intact.
    before = max((equal_map[i] for i in range(first) if i in equal_map), default=-1)
    after = min((equal_map[i] for i in range(last + 1, len(old)) if i in equal_map), default=len(new))
    copies = [j - before - 1 for j in in_new if before < j and j + len(cited) <= after]
    if copies:
        anchor = _new_position(opcodes, first) - (before + 1)
        nearest = min(copies, key=lambda j: (abs(j - anchor), j)) + before + 1
        return LineMapping("unchanged", nearest + 1, nearest + len(cited))
    lo = _new_position(opcodes, first)
    hi = _new_position(opcodes, last, at_end=True)
    if hi < lo:
        return LineMapping("deleted")
    return LineMapping("changed", lo + 1, hi + 1)


def _new_position(opcodes: Sequence[tuple[str, int, int, int, int]], i: int, at_end: bool = False) -> int:
    """0-based line of the new text standing where old line ``i`` stood. In an ``equal`` block the
    line itself; in a ``replace`` block its replacement's first (``at_end``: last) line; in a
    ``delete`` block the line after (``at_end``: before) the gap — so a range wholly deleted maps
    to an empty range (end before start)."""
    for tag, i1, i2, j1, j2 in opcodes:
        if i1 <= i < i2:
            if tag == "equal":
                return j1 + (i - i1)
            if tag == "replace":
                return j2 - 1 if at_end else j1
            return j1 - 1 if at_end else j1  # delete
    return opcodes[-1][4] - 1 if opcodes else -1


def follow_history(cited_lines: list[str], versions: list[list[str] | None], start: int, end: int) -> LineMapping:
    """Map lines ``start``..``end`` of ``cited_lines`` through the document's later versions, oldest
    first (``None``: the document was removed in that revision; a later version brings it back),
    one recorded edit at a time — small steps align far better than the two ends.

    ``unchanged`` only when the lines at the answered numbers of the last version equal the cited
    lines; ``deleted`` when the last version is None or the lines were deleted on the way.
    Raises ValueError for a range outside ``cited_lines``.
    """
    if not 1 <= start <= end <= len(cited_lines):
        raise ValueError(f"lines {start}-{end} are outside a {len(cited_lines)}-line text")
    cited = cited_lines[start - 1 : end]
    current, lo, hi = cited_lines, start, end
    status: Status = "unchanged"
    for version in versions:
        if version is None or version is current:
            continue
        step = map_range(current, version, lo, hi)
        if step.status == "deleted":
            return LineMapping("deleted")
        status = "changed" if status == "changed" or step.status == "changed" else "unchanged"
        current, lo, hi = version, step.start, step.end
    if versions and versions[-1] is None:
        return LineMapping("deleted")
    if status == "changed" and current[lo - 1 : hi] == cited:
        status = "unchanged"  # changed on the way and changed back: the text is the cited text
    if status == "unchanged" and current[lo - 1 : hi] != cited:
        status = "changed"  # a range that grew or shrank on the way
    return LineMapping(status, lo, hi)
