"""The ``kb`` command line (design §13): one click group; the commands live in modules by concept
(documents, history, search, index, status, database, workspaces, nodes, citations, artifacts, remotes,
legacy migration, servers), each listing its commands in ``COMMANDS``.

Every command exits non-zero with a one-line reason on bad input, never a traceback (set
``KB_DEBUG=1`` to see one for an unexpected failure). Commands open kb through
``kb.adapters.cli.session.open_kb``, which closes it when the command ends.
"""

from __future__ import annotations

import gc
import os
import sys

import click

from kb.adapters.cli import (
    artifact,
    cite,
    database,
    documents,
    history,
    index,
    legacy,
    nodes,
    remote,
    search,
    servers,
    session,
    status,
    tokens,
    workspaces,
)
from kb.errors import KbError


class _Group(click.Group):
    """kb's command group: a KbError becomes one line and exit 1, an unexpected error one line
    and exit 2 (a traceback with KB_DEBUG=1), a closed pipe a quiet exit 141."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KbError as exc:
            click.echo(f"kb: error: {exc.cli_message}", err=True)  # the CLI's spelling of what to pass
            sys.exit(1)
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
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
            click.echo(f"kb: unexpected error: {type(exc).__name__}: {exc} (KB_DEBUG=1 shows a traceback)", err=True)
            sys.exit(2)
        finally:
            gc.enable()  # paused by session.pause_gc_while_loading for a quick command


@click.group(cls=_Group, context_settings={"max_content_width": 120})
@click.version_option(package_name="kb", message="kb %(version)s")
@click.pass_context
def main(ctx: click.Context) -> None:
    """kb — a git-native knowledge base on Postgres.

    Settings come from KB_* environment variables (see the README).

    Example: kb import ~/notes --workspace 1 && kb worker --until-idle && kb search "refunds" -w 1
    """
    session.pause_gc_while_loading(ctx.invoked_subcommand)


for _module in (
    database,
    documents,
    history,
    search,
    index,
    status,
    workspaces,
    nodes,
    cite,
    artifact,
    remote,
    legacy,
    servers,
    tokens,
):
    for _command in _module.COMMANDS:
        main.add_command(_command)

if __name__ == "__main__":
    main()
