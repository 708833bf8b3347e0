"""The lines of documents a grep pattern matches, under a time bound (design §5, §16).

A turn's ``grep`` takes a regular expression from its caller — in ``kb serve``, from any read
token. Python's ``re`` cannot be stopped: a pattern whose backtracking explodes (``(a|aa)+$``
doubles its work with each character of a line of a's) holds the interpreter lock for hours, and
with it every thread of the server. So the pattern runs on the ``regex`` engine in its
``re``-compatible mode (``VERSION0``: ``re``'s syntax and answers), which takes a timeout: one
:class:`LinePattern` may spend at most ``seconds`` matching, all its documents together, then
raises InvalidPattern.

A line matches when the pattern matches it alone (``kb.lines.document_lines``: without its
``\\r`` or the first line's BOM). The engine's per-call cost with a timeout (~2.6 µs) made one call
a line 10× slower than ``re`` over a 6,600-page grep, so a document is searched whole instead (as
it is, or its lines joined by ``\\n`` when it has a ``\\r`` or a BOM), from the start of a line to
its next match; the line holding that match is then checked alone, and the search goes on from the
next line — one call for a document without a match, two for each matching line. A match that
runs past its line's end leaves the next line to be searched from its start, so every line the
pattern matches alone is found. What a whole document would answer otherwise than its lines alone
is matched line by line instead (``LOOKS_PAST_A_LINE``): ``\\A`` and ``\\Z`` mean one line's start
or end, and a lookaround looks past a line's end (``(?<!\\s)b`` fails on the ``b`` after a line
break in a document, though the line ``b`` alone matches).

A pattern without any of the characters that make a regular expression more than its letters
(``REGEX_CHARACTERS``: no ``. ^ $ * + ? { } [ ] \\ | ( )``) is a literal: its search is linear in the
text whatever the text holds, so it runs on ``re`` — the same answers, without the timeout's cost
per call (about half a literal grep over 6,600 pages). The time budget is then checked between
searches.
"""

from __future__ import annotations

import re
import time
from typing import Any

from kb.errors import InvalidPattern
from kb.lines import BOM, document_lines

REGEX_CHARACTERS = frozenset(".^$*+?{}[]\\|()")
"""Characters that make a pattern more than a literal; a pattern with none of them runs on ``re``."""
LOOKS_PAST_A_LINE = ("\\A", "\\Z", "(?=", "(?!", "(?<=", "(?<!")
"""Pattern text whose answer in a whole document can differ from its answer on each line alone
(anchors of the string, lookarounds): such a pattern is matched line by line. An escaped ``\\(?=``
holds one too and only costs the slower scan."""


class LinePattern:
    """A compiled grep pattern with its time budget (``seconds`` of matching from creation).

    Raises InvalidPattern when ``pattern`` does not compile."""

    def __init__(self, pattern: str, *, ignore_case: bool, seconds: float) -> None:
        self._literal = not REGEX_CHARACTERS.intersection(pattern)
        if self._literal:  # linear whatever the text: re, without a timeout (see the module)
            self._compiled: Any = re.compile(pattern, re.MULTILINE | (re.IGNORECASE if ignore_case else 0))
        else:
            import regex as engine  # re's syntax, with the time limit re lacks

            flags = engine.VERSION0 | engine.MULTILINE | (engine.IGNORECASE if ignore_case else 0)
            try:
                self._compiled = engine.compile(pattern, flags)
            except (engine.error, ValueError, OverflowError) as exc:
                raise InvalidPattern(f"grep pattern {pattern!r} does not compile: {exc}") from None
        self.pattern, self.seconds = pattern, seconds
        self._by_line = any(part in pattern for part in LOOKS_PAST_A_LINE)
        self._deadline = time.monotonic() + seconds

    def _search(self, text: str, pos: int, where: str):
        try:
            if self._literal:
                found = self._compiled.search(text, pos)
                if time.monotonic() > self._deadline:
                    raise TimeoutError
                return found
            return self._compiled.search(text, pos, timeout=max(self._deadline - time.monotonic(), 0.001))
        except TimeoutError:
            raise InvalidPattern(
                f"grep pattern {self.pattern!r} took more than {self.seconds:g} s to match (stopped in {where}): "
                "nested repetition such as (a+)+ or (a|aa)+ can take exponential time on a long line; "
                "simplify the pattern"
            ) from None

    def lines(self, path: str, text: str) -> list[tuple[int, str]]:
        """``(line number, line)`` of each line of ``text`` (the document at ``path``, named in
        errors) that the pattern matches alone, in order. Raises InvalidPattern past the budget."""
        if self._by_line:
            lines = document_lines(text)
            return [(n, line) for n, line in enumerate(lines, start=1) if self._search(line, 0, f"{path}, line {n}")]
        # searched as the lines are matched alone: without \r before a \n or a BOM (most
        # documents have neither, and are searched as they are)
        scanned = "\n".join(document_lines(text)) if "\r" in text or text.startswith(BOM) else text
        match = self._search(scanned, 0, path)
        if match is None:  # most documents of a grep: no line is split or counted
            return []
        lines = document_lines(text)
        index = scanned.count("\n", 0, match.start())
        found: list[tuple[int, str]] = []
        while index < len(lines):  # an empty match past the last line's end is no line's
            if self._search(lines[index], 0, f"{path}, line {index + 1}") is not None:
                found.append((index + 1, lines[index]))
            end = scanned.find("\n", match.start())
            if end < 0:
                break
            match = self._search(scanned, end + 1, path)
            if match is None:
                break
            index += 1 + scanned.count("\n", end + 1, match.start())
        return found
