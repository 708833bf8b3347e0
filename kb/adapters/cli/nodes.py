"""``kb nodes`` (design §15): the registered nodes, their heartbeats and workspaces; registered by
kb.adapters.cli.main."""

from __future__ import annotations

import json

import click

from kb.adapters.cli import session
from kb.adapters.cli.terminal import shown


@click.group("nodes", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def nodes(ctx: click.Context, as_json: bool) -> None:
    """List the nodes sharing this database: name, up or down (down = no heartbeat for
    KB_NODE_STALE_SECONDS, default 30), heartbeat age, workspaces homed there, URL, storage root.
    This process's node (KB_NODE) is marked with *.

    Example: kb nodes --json
    """
    if ctx.invoked_subcommand is not None:
        return
    kb = session.open_kb()
    stale, here = kb.settings.node_stale_seconds, kb.settings.node
    listed = kb.nodes()
    if as_json:
        for node in listed:
            click.echo(
                json.dumps(
                    {
                        "name": node.name,
                        "up": node.is_up(stale),
                        "heartbeat_age": round(node.heartbeat_age, 1),
                        "workspaces": node.workspaces,
                        "url": node.url,
                        "storage_root": node.storage_root,
                        "storage_id": node.storage_id,
                    }
                )
            )
        return
    if not listed:
        click.echo("no nodes registered (a node registers when its `kb serve` or `kb worker` starts)")
        return
    width = max(len(n.name) for n in listed) + 1
    click.echo(f"  {'node':<{width}}  {'state':<5}  {'heartbeat':>10}  {'workspaces':>10}  url / storage root")
    for n in listed:
        mark = "*" if n.name == here else " "
        state = "up" if n.is_up(stale) else "down"
        click.echo(
            f"{mark} {shown(n.name):<{width}}  {state:<5}  {_age(n.heartbeat_age):>10}  {n.workspaces:>10}  "
            f"{shown(n.url or '-')}  {shown(str(n.storage_root))}"
        )
    click.echo(f"(down: no heartbeat for {stale:g} s, KB_NODE_STALE_SECONDS)")


@nodes.command("forget")
@click.argument("name")
def forget(name: str) -> None:
    """Remove a node's row: one renamed (a new KB_NODE on the same storage) or retired leaves it,
    shown as down for good. Refused while workspaces are homed on it (move them first: `kb
    workspace move N --to OTHER`) or while it is up.

    Example: kb nodes forget vm
    """
    session.open_kb().forget_node(name)
    click.echo(f"forgot node {name!r}")


def _age(seconds: float) -> str:
    """``4s ago``, ``3m12s ago``, ``2h05m ago``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s ago"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s ago"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m ago"


COMMANDS = [nodes]
