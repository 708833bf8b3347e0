"""design §16: a document's escape sequences reach a person's terminal only as visible text —
``kb read``, ``kb search`` and ``kb blame`` printed an agent's ESC/OSC sequences raw (a window
title set, the screen cleared, lines hidden by cursor moves); into a pipe
``kb read``'s text is unchanged, ``kb blame``'s (a listing for a person) still escaped."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from support.commands import run_cli

from kb.adapters.cli.terminal import display_width

HOSTILE = "# Note\n\nplain \x1b]0;pwned\x07 then \x1b[2J cleared\n"


def _on_a_terminal(env: dict[str, str], *args: str, columns: int = 0) -> str:
    """What ``kb ARGS`` writes to stdout when stdout is a pseudo-terminal (read from its master),
    ``columns`` wide when given."""
    master, slave = pty.openpty()
    if columns:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
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


def test_blame_fits_the_terminal_and_escapes_its_text_into_a_pipe_too(kb, kb_env):
    """kb blame's text column ran past the terminal's width (every long line wrapped under the
    next), and into a pipe its control characters went out raw. On a terminal each line is cut
    to the width with '…' (a wide character counting two columns); into a pipe lines are whole;
    control characters are escaped both ways (--json gives the exact text)."""
    kb.create_workspace(1)
    long_line = "word " * 40 + "end"
    with kb.transaction(1, "long", "agent") as tx:
        tx.write(
            "/documents/Long.md",
            f"# Long\n\n{long_line}\n漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字漢字\nplain \x1b[2J\tx\n",
        )
    shown = _on_a_terminal(kb_env, "blame", "/documents/Long.md", "-w", "1", columns=60)
    lines = shown.replace("\r\n", "\n").splitlines()
    assert len(lines) == 5, shown
    assert all(display_width(line) <= 60 for line in lines), [display_width(x) for x in lines]
    assert lines[2].endswith("…") and lines[3].endswith("…") and "\\x1b[2J" in lines[4], shown
    piped = run_cli(kb_env, "blame", "/documents/Long.md", "-w", "1").stdout
    assert long_line in piped and "\x1b" not in piped and "\\x1b[2J" in piped
