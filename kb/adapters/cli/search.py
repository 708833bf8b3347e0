"""``kb search`` (design §8): hybrid search, through a running ``kb serve`` when KB_SERVER_URL is set."""

from __future__ import annotations

import json

import click

from kb.adapters.cli import session
from kb.adapters.cli.options import workspace_option
from kb.adapters.cli.terminal import shown_on_terminal


class _QueryCommand(click.Command):
    """A command taking a free-text query: an unknown option (a query starting with "-" read as
    options) gets the hint to put the query after "--"; one close to a real option is a typo, told
    only click's "Did you mean"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            if exc.possibilities:  # a mistyped option (--workspce): click's "Did you mean" is the help
                raise
            hint = f'; a query that starts with "-" goes after "--": kb {self.name} -w 1 -- "-rf flag"'
            raise click.NoSuchOption(
                exc.option_name, exc.message.rstrip(".") + hint, exc.possibilities, exc.ctx
            ) from None


@click.command(cls=_QueryCommand)
@click.argument("query")
@workspace_option()
@click.option("-k", "k", default=5, show_default=True, type=click.IntRange(min=1, max=100), help="Documents to return.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of envelopes.")
@click.option("--chat", "-c", "chat", help="Search as this conversation: envelopes cite its handles (kb cite).")
def search(query: str, workspace: int, k: int, as_json: bool, chat: str | None) -> None:
    """Hybrid search; prints line-numbered envelopes (design §8).

    Asks the running `kb serve` when KB_SERVER_URL is set (without --chat). Example: kb search
    "refund for an annual subscription" --workspace 1 -k 3 --chat c1. A query that starts with
    "-" goes after "--": kb search --workspace 1 -- "-rf flag"
    """
    server = session.server() if chat is None else None
    if server:
        hits, hint = server.search(workspace, query, k)
    else:
        kb = session.open_kb()
        if chat is not None:
            from kb.adapters.cli.cite import search_in_chat

            hits = search_in_chat(workspace, chat, query, k)
        else:
            hits = kb.search(workspace, query, k)
        hint = kb.index_freshness(workspace).hint()
    if hint:
        click.echo(f"kb: {hint}", err=True)
    if as_json:
        click.echo(json.dumps([h.as_json() for h in hits], ensure_ascii=False, indent=2))
    else:
        click.echo(shown_on_terminal("\n".join(h.render() for h in hits)) if hits else "no results")


COMMANDS = [search]
