"""What stored text may do to a person's terminal (design §16): an agent's document, a commit
message, an author, a title, a file name can hold escape sequences (ESC, OSC: a title change, a
hyperlink, a cleared screen, text hidden by cursor moves; bidi overrides that reorder what is
shown) that a terminal would act on when ``kb`` prints them.

Two rules, one character set (``UNSAFE``: C0 and C1 controls, DEL, the bidi controls):

- :func:`shown` — every field the CLI prints in its own lines (``kb log``'s authors and messages,
  ``kb blame``, ``kb cite list``, ``kb artifact``, ``kb ls``, ``kb status``, token and node names,
  error messages): always escaped (``\\x1b``, ``\\u202e``), into a terminal or a pipe, since those
  lines are written for a person (``--json`` gives the exact text to scripts);
- :func:`shown_on_terminal` — a document's own text as ``kb read`` and ``kb search`` print it:
  escaped when stdout is a terminal, else unchanged, so ``kb read … > file`` keeps the document's
  bytes as they are.
"""

from __future__ import annotations

import re
import sys
import unicodedata

UNSAFE = "\\x00-\\x1f\\x7f-\\x9f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069"
"""Characters a terminal acts on or that reorder the text shown around them."""
_FIELD = re.compile(f"[{UNSAFE}]")
_LINES = re.compile(f"(?![\\t\\n])[{UNSAFE}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str, *, lines: bool = False) -> str:
    """``text`` (stored, untrusted) as the CLI prints it in its own output: every unsafe character
    escaped (``\\x1b``, ``\\u202e``), tab and newline too unless ``lines`` (a multi-line message).
    Whatever stdout is."""
    return (_LINES if lines else _FIELD).sub(_escape, text)


def shown_on_terminal(text: str) -> str:
    """``text`` as ``kb`` prints a document's lines: unsafe characters but tab and newline
    escaped (``\\x1b``) when stdout is a terminal, else unchanged."""
    if not sys.stdout.isatty():
        return text
    return shown(text, lines=True)


def display_width(text: str) -> int:
    """Columns ``text`` takes on a terminal: a wide (East Asian W/F) character two, a combining
    mark none, any other one."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def fitted(text: str, columns: int) -> str:
    """``text`` cut to ``columns`` terminal columns, its last one ``…`` when it was cut."""
    if display_width(text) <= columns:
        return text
    kept, used = [], 0
    for c in text:
        width = display_width(c)
        if used + width > columns - 1:
            break
        kept.append(c)
        used += width
    return "".join(kept) + "…" if columns > 0 else ""
