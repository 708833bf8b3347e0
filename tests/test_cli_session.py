"""Every ``kb`` command closes the KnowledgeBase it opens (design §13): the command modules open
kb through ``kb.adapters.cli.session.open_kb`` only, which closes it when the command ends."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from kb.adapters.cli.main import main
from kb.knowledge_base import KnowledgeBase


@pytest.fixture
def opened_and_closed(monkeypatch):
    """Counts of KnowledgeBase objects opened and closed (the real methods still run)."""
    counts = {"opened": 0, "closed": 0}
    real_open, real_close = KnowledgeBase.open.__func__, KnowledgeBase.close

    def counting_open(cls, *args, **kwargs):
        counts["opened"] += 1
        return real_open(cls, *args, **kwargs)

    def counting_close(self):
        counts["closed"] += 1
        return real_close(self)

    monkeypatch.setattr(KnowledgeBase, "open", classmethod(counting_open))
    monkeypatch.setattr(KnowledgeBase, "close", counting_close)
    return counts


@pytest.mark.parametrize(
    "args",
    [
        ["artifact", "list", "-w", "1"],
        ["remote", "show", "-w", "1"],  # no remote: exits 1, and still closes kb
        ["ls", "-w", "1"],
        ["status", "-w", "1"],
    ],
)
def test_each_command_closes_the_knowledge_base_it_opened(kb, kb_env, opened_and_closed, args):
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/a.md", "a\n")
    result = CliRunner().invoke(main, args, env=kb_env)
    assert result.exit_code in (0, 1), result.output
    assert opened_and_closed["opened"] == 1
    assert opened_and_closed["closed"] == 1


def test_every_command_help_has_an_example():
    def commands(group, prefix=""):
        context = click.Context(group)
        for name in group.list_commands(context):  # loads the group's commands (kb's are lazy)
            command = group.get_command(context, name)
            yield prefix + name, command
            if isinstance(command, click.Group):
                yield from commands(command, prefix + name + " ")

    missing = [name for name, command in commands(main) if "Example" not in (command.help or "")]
    assert missing == []
