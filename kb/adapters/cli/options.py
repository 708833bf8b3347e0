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


_CONTROL_NAMES = {"\n": ", a line break", "\r": ", a carriage return", "\t": ", a tab", "\x1b": ", an escape"}


def checked_author(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback for ``--author``: refuses, as the command starts, an identity holding a
    control character — a line break (a leading one too), a tab, an escape, any of Unicode's Cc —
    or one no revision can record (``kb.store.knowledge_store.check_commit_text``: a NUL, a lone
    surrogate, too long), with click's usage error (exit 2) naming the option, the character and
    where. ``kb serve`` and ``kb mcp`` started with a line break in it and failed every turn they
    recorded, later, for a reason nobody could fix from the client; a tab or an escape went into
    every revision's header (design §5, §13)."""
    if value is None:
        return None
    import unicodedata

    from kb.errors import InvalidInput
    from kb.store.knowledge_store import check_commit_text

    for at, character in enumerate(value):
        if unicodedata.category(character) == "Cc":
            raise click.BadParameter(
                f"{value!r} holds a control character (U+{ord(character):04X}{_CONTROL_NAMES.get(character, '')}) "
                f'at character {at + 1}; give one line of text, e.g. "Ada Lovelace <ada@example.com>"',
                ctx=ctx,
                param=param,
            )
    try:
        check_commit_text(None, value, None)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    return value


author_option = click.option(
    "--author", callback=checked_author, help="Author of the revision (default: your user name)."
)
"""``--author``: whom a revision records as its author (design §3)."""
