"""The ``kb`` command line (design §13): one click group; the commands live in modules by concept
(documents, history, search, index, status, database, workspaces, nodes, citations, artifacts, remotes,
legacy migration, servers), each listing its commands in ``COMMANDS``.

Every command exits non-zero with a one-line reason on bad input, never a traceback (set
``KB_DEBUG=1`` to see one for an unexpected failure). Commands open kb through
``kb.adapters.cli.session.open_kb``, which closes it when the command ends.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import sys

import click

from kb.adapters.cli import session
from kb.adapters.cli.terminal import shown
from kb.db import name_process
from kb.errors import KbError

COMMAND_MODULES = {
    "database": ("init", "db-url", "psql", "db-stop", "db-start"),
    "documents": ("import", "read", "ls", "new", "mv", "rm", "edit"),
    "history": ("log", "blame", "revert", "restore", "write-outcome"),
    "search": ("search",),
    "index": ("worker", "index", "rebuild-projection", "reindex", "sweep", "prepare-model"),
    "status": ("status", "fsck"),
    "workspaces": ("workspaces", "workspace"),
    "nodes": ("nodes",),
    "cite": ("cite",),
    "artifact": ("artifact",),
    "remote": ("remote",),
    "legacy": ("seed", "spans", "drift"),
    "servers": ("serve", "mcp"),
    "tokens": ("token",),
}
"""The modules of ``kb.adapters.cli`` by the commands each lists in ``COMMANDS``: a command's module
is imported when the command runs, so ``kb log`` does not load the other thirteen (design §13);
``kb --help`` loads them all (tests/test_cli_startup.py checks this table against them)."""
_MODULE_OF = {command: module for module, commands in COMMAND_MODULES.items() for command in commands}


class _Group(click.Group):
    """kb's command group: a KbError becomes one line and exit 1, an unexpected error one line
    and exit 2 (a traceback with KB_DEBUG=1), a closed pipe a quiet exit 141. Its commands are
    loaded from their modules when first asked for (``COMMAND_MODULES``)."""

    def _load(self, module: str) -> None:
        for command in importlib.import_module(f"kb.adapters.cli.{module}").COMMANDS:
            self.add_command(command)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            if cmd_name in _MODULE_OF:
                self._load(_MODULE_OF[cmd_name])
            else:  # a misspelling: click suggests the closest of all the commands there are
                self.list_commands(ctx)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        for module in COMMAND_MODULES:
            self._load(module)
        return super().list_commands(ctx)

    def invoke(self, ctx):
        given = list(ctx.args)  # the command's own arguments, before it parses them (for _interrupted)
        try:
            return super().invoke(ctx)
        except KbError as exc:
            click.echo(
                f"kb: error: {shown(exc.cli_message, lines=True)}", err=True
            )  # the CLI's spelling of what to pass
            sys.exit(1)
        except KeyboardInterrupt:
            # Ctrl-C: exit 130 as a shell expects, saying what is known of a write in flight
            # (design §3: a revision lands whole or not at all), not click's bare "Aborted!"
            click.echo(_interrupted(ctx.invoked_subcommand, given), err=True)
            sys.exit(130)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:
            # The reader went away (`kb log | head`): stop quietly, as other Unix tools do, with
            # the exit status of SIGPIPE; stdout is pointed at /dev/null so the interpreter's
            # final flush does not raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except Exception as exc:  # unexpected: one line unless debugging
            if session.is_settings_error(exc):  # a KB_* environment variable pydantic refused
                from kb.settings import settings_error

                click.echo(f"kb: error: {settings_error(exc)}", err=True)
                sys.exit(1)
            if os.environ.get("KB_DEBUG"):
                raise
            click.echo(
                f"kb: unexpected error: {type(exc).__name__}: {shown(str(exc), lines=True)} (KB_DEBUG=1 shows a traceback)",
                err=True,
            )
            sys.exit(2)
        finally:
            gc.enable()  # paused by session.pause_gc_while_loading for a quick command


REVISION_COMMANDS = frozenset({"new", "mv", "rm", "edit", "revert", "restore", "import"})
"""Commands that record a revision: a Ctrl-C may come before or after it landed. Each settles
its write by its key itself (``kb.adapters.cli.interrupts``); a Ctrl-C before its write began or
after it returned ends here, and is told which (``interrupts.write_state``)."""


def _interrupted(command: str | None, args: list[str]) -> str:
    """What ``command`` (given ``args``) interrupted by Ctrl-C outside its keyed write says: for
    one recording a revision, that none was recorded (interrupted before its write began), that
    its write finished (after it), or — never expected, the write settles itself — that it may
    have landed and how to see whether it did; for any other, only that it was interrupted."""
    if command not in REVISION_COMMANDS:
        return "kb: interrupted"
    workspace = "N"
    for i, arg in enumerate(args):
        if arg in ("--workspace", "-w") and i + 1 < len(args):
            workspace = args[i + 1]
        elif arg.startswith("--workspace="):
            workspace = arg.split("=", 1)[1]
    workspace = shown(workspace)
    from kb.adapters.cli import interrupts

    state = interrupts.write_state()
    if state == interrupts.NOT_BEGUN:
        return f"kb: interrupted before `kb {command}` began to write: no revision was recorded"
    if state == interrupts.RECORDED:
        return (
            f"kb: interrupted after `kb {command}` finished writing (what it recorded landed whole): "
            f"`kb log -n 3 --workspace {workspace}` shows it"
        )
    return (
        f"kb: interrupted: the revision `kb {command}` was recording may or may not have landed (a revision "
        f"lands whole or not at all; git may hold it before Postgres records it): `kb sweep` records it "
        f"if it landed (as the worker's sweep does within a minute), then `kb log -n 3 --workspace {workspace}` shows it"
    )


@click.group(cls=_Group, context_settings={"max_content_width": 120})
@click.version_option(package_name="kb", message="kb %(version)s")
@click.pass_context
def main(ctx: click.Context) -> None:
    """kb — a git-native knowledge base on Postgres.

    Settings come from KB_* environment variables (see the README).

    Example: kb import ~/notes --workspace 1 && kb worker --until-idle && kb search "refunds" -w 1
    """
    session.pause_gc_while_loading(ctx.invoked_subcommand)
    name_process(f"kb {ctx.invoked_subcommand}")  # who is connected, for kb db-stop (design §13)
    # psycopg's and psycopg_pool's warnings about connections they discard (a Ctrl-C in
    # mid-statement, a session ended under the command) are their bookkeeping, not the command's
    # outcome, which kb reports itself: with no handler of their own Python printed them on stderr.
    # A server (kb serve, kb mcp), which configures logging, still logs them.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())


if __name__ == "__main__":
    main()
