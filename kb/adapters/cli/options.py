"""Options several ``kb`` commands share, each declared once (design §13)."""

from __future__ import annotations

from collections.abc import Callable

import click

from kb.paths import MAX_WORKSPACE_ID


def workspace_option(
    *,
    required: bool = True,
    help: str = "Workspace id (a positive integer).",
) -> Callable:
    """``--workspace/-w``: a workspace id in 1..MAX_WORKSPACE_ID, passed as ``workspace``.

    ``required=False`` for commands that act on every workspace without one (``kb status``);
    ``help`` says what the workspace is to that command.
    """
    return click.option(
        "--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), required=required, help=help
    )


def checked_author(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback for ``--author`` (or ``--committer``): refuses, as the command starts, an
    identity no revision can record — a control character (a line break, even a leading one, a
    tab, an escape), a NUL, a lone surrogate (``kb.store.knowledge_store.check_commit_text``) —
    with click's usage error (exit 2) naming the option. A long-running command (``kb serve``,
    ``kb mcp``) started with one and failed every turn it recorded, later, for a reason nobody could
    fix from the client (design §5, §13)."""
    if value is None:
        return None
    from kb.errors import InvalidInput
    from kb.store.knowledge_store import check_commit_text

    try:
        check_commit_text(None, value, None)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


author_option = click.option(
    "--author", callback=checked_author, help="Author of the revision (default: your user name)."
)
"""``--author``: whom a revision records as its author (design §3)."""
