"""What each chunk gives the embedder and the full-text index besides its own text (design §7).

A chunk cut from the middle of a section does not say what it is about: "Annual subscriptions may
be refunded within 30 days" never names the page "Refund policy". So the embedder sees the
document's title and the chunk's heading path before the chunk text::

    Refund policy › Annual plans

    Annual subscriptions may be refunded within 30 days…

and the full-text index gets the same context with a higher weight. Where the chunk is cut is
unchanged (kb.chunking); the embedding cache key is the sha256 of exactly ``embedded_text(...)``,
so a retitle or a renamed heading re-embeds the chunks it changes and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kb.index.chunking import Chunk

CONTEXT_SEPARATOR = " › "
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def headings(text: str) -> list[tuple[int, int, str]]:
    """ATX headings of a markdown text outside fenced code: ``(start_char, level, title)``."""
    found: list[tuple[int, int, str]] = []
    fence: str | None = None
    offset = 0
    for line in text.split("\n"):
        stripped = line.rstrip("\r")
        opening = _FENCE.match(stripped)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
        elif opening:
            fence = opening.group(1)
        else:
            match = _HEADING.match(stripped)
            if match:
                found.append((offset, len(match.group(1)), match.group(2).strip()))
        offset += len(line) + 1
    return found


def heading_paths(text: str, chunks: Sequence[Chunk]) -> list[list[str]]:
    """For each chunk, the titles of the headings enclosing its first character (outermost
    first), not counting a heading the chunk itself starts with."""
    marks = headings(text)
    paths: list[list[str]] = []
    stack: list[tuple[int, str]] = []
    index = 0
    for chunk in chunks:
        while index < len(marks) and marks[index][0] < chunk.start_char:
            _, level, title = marks[index]
            while stack and stack[-1][0] >= level:
                stack.pop()
            stack.append((level, title))
            index += 1
        paths.append([title for _, title in stack])
    return paths


def context_line(title: str, path: Sequence[str]) -> str:
    """``title › heading › subheading`` (a heading repeating the title, e.g. the H1, is dropped)."""
    parts = [title.strip()] if title.strip() else []
    for heading in path:
        if heading and (not parts or heading.casefold() != parts[0].casefold()):
            parts.append(heading)
    return CONTEXT_SEPARATOR.join(parts)


def embedded_text(context: str, chunk_text: str) -> str:
    """The exact text the embedder sees for a chunk: its context line, a blank line, its text."""
    return f"{context}\n\n{chunk_text}" if context else chunk_text
