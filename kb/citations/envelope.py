"""The read contract's envelope (design §8): one rendering for search excerpts and full reads.

    <document title="Refund policy" path="/documents/Licenses/Refund policy.md" cite="[3]" view="excerpts" revision="9f2c…" score="0.3333">
        12  ## Annual plans
        13  Annual subscriptions may be refunded within 30 days…
    </document>

Line numbers are the document's true 1-based line numbers at that revision. Excerpts from chunks
without spans (legacy rows, §9) render un-numbered, and the envelope says ``numbered="false"``. A
search hit carries its fused score (``score``, four decimals; reads have none).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kb.lines import (
    check_offset,
    check_window_arguments,
    document_lines,  # noqa: F401  (re-exported: the one line counter, kb.lines)
)

GAP = "   ⋮"


@dataclass
class Envelope:
    """One document as shown to a reader: numbered lines (``line_no`` None when un-numbered)."""

    path: str
    title: str
    revision: str | None
    view: str
    lines: list[tuple[int | None, str]] = field(default_factory=list)
    cite: int | None = None
    score: float | None = None
    content_id: str | None = None
    """The blob id the lines were read from (what a citation handle is keyed on, design §8)."""
    total_lines: int | None = None
    """For a windowed read (``view="window"``): the document's line count at that revision."""

    @property
    def numbered(self) -> bool:
        """True when every line carries its true line number."""
        return all(n is not None for n, _ in self.lines)

    def window(self, offset: int = 0, limit: int | None = None) -> Envelope:
        """Lines ``offset+1 … offset+limit`` of this full-view envelope (``limit`` None: to the
        end), keeping their true numbers. The whole document stays ``view="full"``; anything less
        is ``view="window"`` with ``total_lines``. Raises InvalidInput for a negative or non-integer
        ``offset``/``limit``, OffsetOutOfRange (a subclass) for an offset past the last line
        (``offset`` = the line count is the end: an empty window)."""
        check_window_arguments(offset, limit)
        check_offset(self.path, offset, len(self.lines))
        end = len(self.lines) if limit is None else offset + limit
        if offset == 0 and end >= len(self.lines):
            return self
        return Envelope(
            self.path,
            self.title,
            self.revision,
            "window",
            self.lines[offset:end],
            self.cite,
            self.score,
            self.content_id,
            total_lines=len(self.lines),
        )

    def render(self) -> str:
        """The envelope text (design §8); non-contiguous excerpt ranges are separated by ``⋮``."""
        attrs = {"title": self.title, "path": self.path}
        if self.cite is not None:
            attrs["cite"] = f"[{self.cite}]"
        attrs["view"] = self.view
        attrs["revision"] = self.revision or ""
        if self.total_lines is not None:
            shown = [n for n, _ in self.lines if n is not None]
            attrs["lines"] = f"{shown[0]}-{shown[-1]}" if shown else "none"
            attrs["of"] = str(self.total_lines)
        if not self.numbered:
            attrs["numbered"] = "false"
        if self.score is not None:  # a search hit's fused score: there is no relevance threshold (design §8)
            attrs["score"] = f"{self.score:.4f}"
        head = " ".join(f'{k}="{attribute_value(str(v))}"' for k, v in attrs.items())
        body: list[str] = []
        previous: int | None = None
        for number, text in self.lines:
            if number is None:
                body.append(f"    {text}")
                continue
            if previous is not None and number != previous + 1:
                body.append(GAP)
            body.append(f"{number:>6}  {text}")
            previous = number
        return "\n".join([f"<document {head}>", *body, "</document>"])

    def as_json(self) -> dict:
        """``{path, title, revision, cite, lines: [[line_no, text], ...], score}`` (``--json``)."""
        return {
            "path": self.path,
            "title": self.title,
            "revision": self.revision,
            "cite": None if self.cite is None else f"[{self.cite}]",
            "view": self.view,
            "lines": [[n, t] for n, t in self.lines],
            "score": self.score,
            **({} if self.total_lines is None else {"total_lines": self.total_lines}),
        }


def attribute_value(value: str) -> str:
    """``value`` as the text of a double-quoted envelope attribute: ``&``, ``<``, ``>`` and ``"``
    escaped as character references, nothing else. An apostrophe stays as it is (it needs no
    escape there): a path such as ``/documents/Procédure d'escalade.md`` reads as the path, and
    copied from a search into ``kb read`` it names the document (design §8)."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def excerpt_lines(lines: list[str], spans: list[tuple[int, int]]) -> list[tuple[int, str]]:
    """Numbered lines covered by the union of 1-based inclusive ``spans``, in order, clamped."""
    wanted: set[int] = set()
    for start, end in spans:
        wanted.update(range(max(1, start), min(len(lines), end) + 1))
    return [(n, lines[n - 1]) for n in sorted(wanted)]
