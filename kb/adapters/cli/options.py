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


author_option = click.option("--author", help="Author of the revision (default: your user name).")
"""``--author``: whom a revision records as its author (design §3)."""
