"""What documents' text may do to a person's terminal (design §16): an agent's document can hold
escape sequences (ESC, OSC: a title change, a hyperlink, a cleared screen, text hidden by cursor
moves) that a terminal would act on when ``kb read``, ``kb search`` or ``kb blame`` print it. On
a terminal, control characters other than tab and newline are shown as ``\\x1b``-style escapes;
into a pipe or a file the text goes unchanged (what ``--json`` and scripts read)."""

from __future__ import annotations

import re
import sys

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown_on_terminal(text: str) -> str:
    """``text`` as ``kb`` prints a document's lines: control characters but tab and newline
    escaped (``\\x1b``) when stdout is a terminal, else unchanged."""
    if not sys.stdout.isatty():
        return text
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
