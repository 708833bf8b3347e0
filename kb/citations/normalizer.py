"""The citation normalizer (design §8): what a model writes back, in one canonical form.

Pure: no database, no repository. It reads the citations in a model's answer, checks them against
what the conversation was shown (a ``lookup`` from handle number to :class:`HandleInfo`), and
rewrites each into the canonical form ``[n]``, ``[n:Lx]`` or ``[n:Lx-Ly]``, one citation per
bracket.

Accepted forms (``L`` in either case, ``-``, ``–`` or ``—`` between the numbers, spaces allowed
around ``:``, ``,`` and the dash)::

    [3]   [3:L12]   [3:L12-L14]   [3:L12-14]   [1, 3:L4-L6]   [1][3]

Rules:

- a line range is clamped to the document's length at the handle's revision and a reversed range
  swapped (``adjusted`` reports both); a range that starts beyond the document's last line names
  no line of it, so it is not clamped onto an unrelated last line: it cites the whole document,
  reported in ``beyond``;
- the line qualifier is stripped where the handle was rendered un-numbered (``degraded``), and
  where the document has no lines;
- an unknown handle is dropped from the text and reported (``unknown``); a bracket left with no
  citation disappears together with the space before it;
- never touched: inline code and fenced code blocks, ``[x]``/``[ ]`` task boxes,
  ``[[wiki links]]``, ``[text](url)`` and ``[1](url)`` links, reference links ``[text][1]`` and
  definitions ``[1]: url``, escaped ``\\[1]``, and index expressions such as ``a[1]``,
  ``f(x)[2]`` or ``m[1][2]`` (a bracket glued to a word, ``)`` or a non-citation ``]``);
  ``[10:30]`` (no ``L``) is not a citation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from kb.errors import InvalidCitation

_NUMBER = r"\d{1,9}"
_ITEM = rf"\s*({_NUMBER})(?:\s*:\s*[Ll]\s*({_NUMBER})(?:\s*[-–—]\s*[Ll]?\s*({_NUMBER}))?)?\s*"
_ITEM_RE = re.compile(_ITEM)
_ITEM_NC = rf"\s*{_NUMBER}(?:\s*:\s*[Ll]\s*{_NUMBER}(?:\s*[-–—]\s*[Ll]?\s*{_NUMBER})?)?\s*"
_GROUP_RE = re.compile(rf"\[{_ITEM_NC}(?:[,;]{_ITEM_NC})*\]")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})")
_BACKTICKS = re.compile(r"`+")
_GLUED_BEFORE = re.compile(r"[A-Za-z0-9_)\\\[]")  # ASCII only: CJK prose cites glued, 政策[1]


@dataclass(frozen=True)
class Citation:
    """A citation of handle ``handle``, lines ``start``..``end`` (1-based, inclusive) or the whole
    document (both None). ``str()`` is the canonical form: ``[3]``, ``[3:L12]``, ``[3:L12-L14]``."""

    handle: int
    start: int | None = None
    end: int | None = None

    def __str__(self) -> str:
        if self.start is None:
            return f"[{self.handle}]"
        if self.end is None or self.end == self.start:
            return f"[{self.handle}:L{self.start}]"
        return f"[{self.handle}:L{self.start}-L{self.end}]"

    @property
    def has_lines(self) -> bool:
        """True when the citation names lines (not the whole document)."""
        return self.start is not None


@dataclass(frozen=True)
class HandleInfo:
    """What the normalizer needs to know of a handle: whether the conversation was shown numbered
    lines of it, and the document's line count at the handle's revision."""

    numbered: bool
    line_count: int


@dataclass
class NormalizedText:
    """The normalizer's result.

    ``text``: the answer with canonical citations; ``citations``: every citation left in ``text``,
    in order; ``unknown``: the handle numbers dropped; ``degraded``: citations whose line qualifier
    was stripped because the handle was rendered un-numbered (or its document is empty);
    ``adjusted``: ``(as written, as normalized)`` for clamped or swapped ranges; ``beyond``:
    ``(as written, as normalized)`` for ranges wholly past the document's end, cited as the whole
    document.
    """

    text: str
    citations: list[Citation] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    degraded: list[Citation] = field(default_factory=list)
    adjusted: list[tuple[str, Citation]] = field(default_factory=list)
    beyond: list[tuple[str, Citation]] = field(default_factory=list)

    def as_json(self) -> dict:
        """``{text, citations: ["[3:L4-L6]", ...], unknown, degraded, adjusted, beyond}``."""
        return {
            "text": self.text,
            "citations": [str(c) for c in self.citations],
            "unknown": self.unknown,
            "degraded": [str(c) for c in self.degraded],
            "adjusted": [[raw, str(c)] for raw, c in self.adjusted],
            "beyond": [[raw, str(c)] for raw, c in self.beyond],
        }


def _items(group: str) -> list[tuple[int, int | None, int | None, str]]:
    """``(handle, start, end, raw)`` of each item of a bracket group's text (brackets included)."""
    result = []
    for raw in re.split(r"[,;]", group[1:-1]):
        m = _ITEM_RE.fullmatch(raw)
        assert m is not None  # the group regex admitted it
        start = int(m.group(2)) if m.group(2) else None
        end = int(m.group(3)) if m.group(3) else start
        result.append((int(m.group(1)), start, end, raw.strip()))
    return result


def parse_citation(text: str) -> Citation:
    """Parse one citation as written, e.g. ``"[3:L12-L14]"``, ``"3:L12-14"`` or ``"[3]"``.

    Returns the Citation as written (no clamping: that needs the handle, see :func:`normalize`);
    a reversed range is swapped. Raises InvalidCitation for anything else, including several
    citations in one bracket.
    """
    stripped = text.strip() if isinstance(text, str) else ""
    candidate = stripped if stripped.startswith("[") else f"[{stripped}]"
    if not _GROUP_RE.fullmatch(candidate):
        raise InvalidCitation(f"{text!r} is not a citation; write it as [n], [n:Lx] or [n:Lx-Ly] (e.g. [3:L12-L14])")
    items = _items(candidate)
    if len(items) != 1:
        raise InvalidCitation(f"{text!r} holds {len(items)} citations; resolve them one at a time")
    handle, start, end, _ = items[0]
    if start is not None and (start < 1 or end < 1):
        raise InvalidCitation(f"{text!r}: line numbers start at 1")
    if start is not None and end < start:
        start, end = end, start
    return Citation(handle, start, end)


def _fence_closes(line: str, marker: str) -> bool:
    """Whether ``line`` closes a fence opened with ``marker`` (CommonMark: at most 3 spaces of
    indentation, at least as many of the same character, nothing after but spaces)."""
    indent = len(line) - len(line.lstrip(" "))
    body = line.strip(" \t\r")
    return indent <= 3 and len(body) >= len(marker) and set(body) == {marker[0]}


def _fenced_regions(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` character ranges of fenced code blocks (an unclosed fence runs to the end)."""
    regions = []
    offset, open_at, marker = 0, None, ""
    for line in text.split("\n"):
        if open_at is None:
            m = _FENCE_OPEN.match(line)
            if m and not (m.group(1)[0] == "`" and "`" in line[m.end() :]):
                open_at, marker = offset, m.group(1)
        elif _fence_closes(line, marker):
            regions.append((open_at, offset + len(line)))
            open_at = None
        offset += len(line) + 1
    if open_at is not None:
        regions.append((open_at, len(text)))
    return regions


def _code_span_regions(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """Inline code spans in ``text[start:end]`` (CommonMark: a run of N backticks closed by the
    next run of exactly N); an unclosed run is literal backticks."""
    regions: list[tuple[int, int]] = []
    pos = start
    while True:
        m = _BACKTICKS.search(text, pos, end)
        if m is None:
            return regions
        run = m.group(0)
        closing = re.compile(rf"(?<!`){run}(?!`)")
        c = closing.search(text, m.end(), end)
        if c is None:
            pos = m.end()
            continue
        regions.append((m.start(), c.end()))
        pos = c.end()


def protected_regions(text: str) -> list[tuple[int, int]]:
    """Sorted ``(start, end)`` ranges of ``text`` the normalizer never touches: fenced code
    blocks and inline code spans."""
    fences = _fenced_regions(text)
    regions: list[tuple[int, int]] = []
    pos = 0
    for a, b in fences:
        regions += _code_span_regions(text, pos, a)
        regions.append((a, b))
        pos = b
    regions += _code_span_regions(text, pos, len(text))
    return regions


def _is_citation_context(text: str, start: int, end: int, previous_citation_end: int) -> bool:
    """Whether the bracket group at ``text[start:end]`` stands where a citation can stand."""
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    if before == "]":
        return start == previous_citation_end  # [1][3] yes; m[1][2] and [text][1] no
    if before and _GLUED_BEFORE.match(before):
        return False  # a[1], f(x)[2], \[1], [[1]]
    if after in ("(", "]"):
        return False  # [1](url), [[1]]
    if after == "[" and not _GROUP_RE.match(text, end):
        return False  # [1][ref]: a reference-style link
    line_start = text.rfind("\n", 0, start) + 1
    if after == ":" and text[line_start:start].strip(" ") == "" and start - line_start <= 3:
        return False  # [1]: https://…  (a link reference definition)
    return True


def _strip_trailing_blanks(out: list[str]) -> None:
    """Remove spaces and tabs at the end of the text assembled in ``out`` (in place)."""
    while out and not out[-1].rstrip(" \t"):
        out.pop()
    if out:
        out[-1] = out[-1].rstrip(" \t")


def check_text(text: object) -> None:
    """Raise InvalidInput (kb.errors) unless ``text`` is a string with a UTF-8 form: a lone
    surrogate (a JSON ``"\\ud800"`` escape, bytes that were not UTF-8 read with surrogateescape) has
    none, so the normalized text could be neither answered nor written back (design §8)."""
    from kb.errors import InvalidInput

    if not isinstance(text, str):
        raise InvalidInput(f"the text to normalize must be a string, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"the text to normalize holds a lone surrogate (U+{ord(text[exc.start]):04X} at character {exc.start}), "
            "half of a UTF-16 pair that no UTF-8 text can carry; send valid Unicode"
        ) from None


def normalize(text: str, lookup: Callable[[int], HandleInfo | None], *, drop_unknown: bool = False) -> NormalizedText:
    """Rewrite the citations of ``text`` canonically (rules in the module docstring, design §8).

    ``lookup(n)`` returns the HandleInfo of handle ``n``, or None when the conversation has no
    such handle. An unknown handle is listed in ``unknown`` and kept as written (``[9]`` stays
    ``[9]``), so no text is lost; with ``drop_unknown`` it is removed instead. Raises InvalidInput
    (kb.errors) when ``text`` is not text (``check_text``).
    """
    check_text(text)
    result = NormalizedText(text="")
    out: list[str] = []
    pos = 0
    previous_citation_end = -1
    regions = protected_regions(text)
    region_index = 0
    scan = 0
    while True:
        m = _GROUP_RE.search(text, scan)
        if m is None:
            break
        while region_index < len(regions) and regions[region_index][1] <= m.start():
            region_index += 1
        if region_index < len(regions) and regions[region_index][0] <= m.start():
            scan = regions[region_index][1]  # inside code: skip the whole region
            continue
        if region_index < len(regions) and regions[region_index][0] < m.end():
            scan = m.start() + 1  # the group runs into code; not a citation
            continue
        if not _is_citation_context(text, m.start(), m.end(), previous_citation_end):
            scan = m.start() + 1
            continue
        kept = []
        written: list[str] = []  # the group's pieces in order: known citations and kept unknown ones
        for handle, start, end, raw in _items(m.group(0)):
            info = lookup(handle)
            if info is None:
                result.unknown.append(handle)
                if not drop_unknown and f"[{raw}]" not in written:
                    written.append(f"[{raw}]")
                continue
            citation = Citation(handle)
            if start is not None:
                if not info.numbered or info.line_count == 0:
                    result.degraded.append(citation)
                elif min(start, end) > info.line_count:  # names no line of it: the whole document
                    result.beyond.append((f"[{raw}]", citation))
                else:
                    lo, hi = sorted((start, end))
                    lo = min(max(lo, 1), info.line_count)
                    hi = min(max(hi, 1), info.line_count)
                    citation = Citation(handle, lo, hi)
                    if (lo, hi) != (start, end):
                        result.adjusted.append((f"[{raw}]", citation))
            if citation not in kept:
                kept.append(citation)
                written.append(str(citation))
        out.append(text[pos : m.start()])
        resume = m.end()
        if written:
            out.append("".join(written))
        else:
            after = text[m.end()] if m.end() < len(text) else ""
            if after == "" or after in " \t\r\n.,;:!?)":
                _strip_trailing_blanks(out)  # "see [9]." → "see."; also after dropped neighbours [9][8]
            if after == " " and (not out or out[-1].endswith("\n")):
                resume += 1  # a dropped citation opening a line takes its following space along
        result.citations += kept
        pos = scan = resume
        previous_citation_end = m.end()
    out.append(text[pos:])
    result.text = "".join(out)
    return result
