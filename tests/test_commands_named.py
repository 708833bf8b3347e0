"""Every ``kb`` command a message or docstring of kb names exists (design §13): an error that
says what to do must name a command the CLI has. ("List the workspaces with kb workspace list"
named none: the command is ``kb workspaces``.)"""

from __future__ import annotations

import re
from pathlib import Path

import click

from kb.adapters.cli.main import main

SOURCE = Path(__file__).resolve().parents[1] / "kb"

# `kb X` or `kb X Y` between backticks, and kb GROUP WORD where a message tells to run it (a string's
# start, or after with/run/use/try)
BACKTICKED = re.compile(r"`kb ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
CONTEXT = click.Context(main)
COMMANDS = {name: main.get_command(CONTEXT, name) for name in main.list_commands(CONTEXT)}
GROUPS = [name for name, command in COMMANDS.items() if isinstance(command, click.Group)]
IN_PROSE = re.compile(rf"(?:[\"'`]|\b(?:with|run|use|try) )kb ({'|'.join(map(re.escape, GROUPS))}) ([a-z][a-z-]*)\b")


def _named() -> set[tuple[str, str | None, str]]:
    found = set()
    for path in SOURCE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for pattern in (BACKTICKED, IN_PROSE):
            for match in pattern.finditer(text):
                found.add((match.group(1), match.group(2), f"{path.relative_to(SOURCE.parent)}"))
    return found


def test_every_kb_command_named_in_kbs_source_exists():
    missing = []
    for name, sub, where in sorted(_named(), key=lambda n: (n[2], n[0], n[1] or "")):
        command = COMMANDS.get(name)
        if command is None:
            missing.append(f"{where}: kb {name}")
        elif sub is not None and isinstance(command, click.Group) and sub not in command.list_commands(CONTEXT):
            missing.append(f"{where}: kb {name} {sub}")
    assert GROUPS and not missing, missing
