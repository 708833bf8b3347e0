"""design §16: a document's escape sequences reach a person's terminal only as visible text —
``kb read``, ``kb search`` and ``kb blame`` printed an agent's ESC/OSC sequences raw (a window
title set, the screen cleared, lines hidden by cursor moves); into a pipe the text is unchanged."""

from __future__ import annotations

import os
import pty
import subprocess
import sys

from support.commands import run_cli

HOSTILE = "# Note\n\nplain \x1b]0;pwned\x07 then \x1b[2J cleared\n"


def _on_a_terminal(env: dict[str, str], *args: str) -> str:
    """What ``kb ARGS`` writes to stdout when stdout is a pseudo-terminal (read from its master)."""
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", *args], env=env, stdout=slave, stderr=subprocess.PIPE
    )
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    assert process.wait(timeout=120) == 0, process.stderr.read() if process.stderr else ""
    return output.decode()


def test_escape_sequences_are_shown_not_acted_on(kb, kb_env):
    kb.create_workspace(1)
    with kb.transaction(1, "hostile", "agent") as tx:
        tx.write("/documents/Note.md", HOSTILE)
    for args in (("read", "/documents/Note.md"), ("blame", "/documents/Note.md")):
        shown = _on_a_terminal(kb_env, *args, "-w", "1")
        assert "\x1b" not in shown and "\x07" not in shown, (args, shown)
        assert "\\x1b]0;pwned\\x07" in shown and "\\x1b[2J" in shown, (args, shown)
    piped = run_cli(kb_env, "read", "/documents/Note.md", "-w", "1").stdout  # scripts get the text as it is
    assert "\x1b]0;pwned\x07" in piped
