"""``kb workspaces`` and ``kb workspace delete`` (design §2.1, §6), registered by kb.adapters.cli.main."""

from __future__ import annotations

import dataclasses
import json

import click

from kb.adapters.cli import session
from kb.paths import MAX_WORKSPACE_ID


@click.command("workspaces")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def workspaces(as_json: bool) -> None:
    """List workspaces: id, documents, git head, index state (indexed, behind and what it waits
    for, problems, empty).

    Example: kb workspaces --json
    """
    summaries = session.open_kb().list_workspaces()
    if as_json:
        for summary in summaries:
            click.echo(json.dumps(dataclasses.asdict(summary)))
        return
    if not summaries:
        click.echo("no workspaces")
        return
    click.echo(f"{'id':>6}  {'documents':>9}  {'head':<12}  index")
    for s in summaries:
        lag = s.describe_lag()
        state = f"{s.index_state}: {lag}" if lag else s.index_state
        click.echo(f"{s.id:>6}  {s.documents:>9}  {(s.head or '-')[:12]:<12}  {state}")


@click.group("workspace")
def workspace() -> None:
    """Manage one workspace.

    Example: kb workspace delete 7 --yes
    """


@workspace.command("delete")
@click.argument("workspace_id", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID))
@click.option("--yes", is_flag=True, help="Confirm: the deletion cannot be undone.")
@click.option("--force", is_flag=True, help="Delete even while a turn of it is open or a job of it runs.")
def delete(workspace_id: int, yes: bool, force: bool) -> None:
    """Delete a workspace and everything it owns: repository, document/folder rows, chunks, history,
    jobs, turn worktrees (subscribers of kb_events are told each row went). Refused while a turn
    is open unless --force.

    Example: kb workspace delete 7 --yes
    """
    if not yes:
        raise click.UsageError(f"deleting workspace {workspace_id} cannot be undone; pass --yes to confirm")
    report = session.open_kb().delete_workspace(workspace_id, force=force)
    click.echo(
        f"deleted workspace {report.id}: {report.documents} documents, {report.folders} folders, "
        f"{report.jobs} jobs; removed {len(report.removed_paths)} folders from disk"
    )


@workspace.command("set-model")
@click.argument("workspace_id", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID))
@click.argument("model")
def set_model(workspace_id: int, model: str) -> None:
    """Switch a workspace's embedding model: minilm, use-m3, e5-small, hashing, openai:<model>, a
    model directory, or auto (picked by the documents' languages). A worker re-embeds the
    workspace in the background (through the embedding cache); search answers from the old
    vectors until the switch (design §7).

    Example: kb workspace set-model 2 use-m3 && kb worker --until-idle
    """
    job = session.open_kb().set_model(workspace_id, model)
    if job is None:
        click.echo(f"workspace {workspace_id}: already uses {model}, or a waiting switch covers it")
    else:
        click.echo(f"workspace {workspace_id}: switching to {model} (job {job}); run `kb worker` to re-embed")


COMMANDS = [workspaces, workspace]
