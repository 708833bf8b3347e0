"""``kb workspaces`` and ``kb workspace delete`` (design §2.1, §6), registered by kb.adapters.cli.main."""

from __future__ import annotations

import dataclasses
import json

import click

from kb.adapters.cli import session
from kb.adapters.cli.counts import counted
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
        state = lag if s.index_state == "elsewhere" else f"{s.index_state}: {lag}" if lag else s.index_state
        click.echo(f"{s.id:>6}  {s.documents:>9}  {(s.head or '-')[:12]:<12}  {state}")


@click.group("workspace")
def workspace() -> None:
    """Manage one workspace.

    Example: kb workspace move 7 --to b
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
    kb = session.open_kb()
    if not yes:
        from kb.errors import WorkspaceNotFound

        known = {summary.id for summary in kb.list_workspaces()}
        if workspace_id not in known and not kb.store(workspace_id).exists():  # said before asking to confirm
            raise WorkspaceNotFound(f"workspace {workspace_id} does not exist; `kb workspaces` lists them")
        raise click.UsageError(f"deleting workspace {workspace_id} cannot be undone; pass --yes to confirm")
    report = kb.delete_workspace(workspace_id, force=force)
    click.echo(
        f"deleted workspace {report.id}: {counted(report.documents, 'document')}, {counted(report.folders, 'folder')}, "
        f"{counted(report.jobs, 'job')}; removed {counted(len(report.removed_paths), 'folder')} from disk"
    )


@workspace.command("move")
@click.argument("workspace_id", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID))
@click.option("--to", "target", metavar="NODE", help="The node to move it to (`kb nodes` lists them).")
@click.option("--abort", is_flag=True, help="Cancel the workspace's unfinished move: writes go on at its home.")
@click.option("--force", is_flag=True, help="Move even while turns are open on its home node (their changes stay).")
def move(workspace_id: int, target: str | None, abort: bool, force: bool) -> None:
    """Move a workspace's home to another node: a read-only window (writes fail with WorkspaceMoving,
    reads go on), the target node pulls and verifies the repository, the home flips in Postgres,
    the old copy is renamed aside. Both nodes' `kb serve` must run. Safe to interrupt: run the same
    command again to resume, or --abort; an abandoned window expires after KB_MOVE_WINDOW_SECONDS.

    Example: kb workspace move 1 --to b
    """
    if abort == (target is not None):
        raise click.UsageError("pass --to NODE to move the workspace, or --abort to cancel its move")
    kb = session.open_kb()
    if abort:
        row = kb.abort_move(workspace_id)
        if row is None:
            click.echo(f"workspace {workspace_id} has no move to cancel")
        elif row["step"] == "flipped":
            click.echo(
                f"workspace {workspace_id}'s move to {row['target_node']!r} had already flipped: it stays there "
                f"(move it back with `kb workspace move {workspace_id} --to {row['source_node']}`)"
            )
        else:
            click.echo(
                f"cancelled the move of workspace {workspace_id} to {row['target_node']!r} (at step {row['step']}); "
                "writes go on at its home node"
                + (
                    f"; the target's copy was not renamed aside: {row['discard_problem']}"
                    if "discard_problem" in row
                    else ""
                )
            )
        return
    assert target is not None
    kb.move_workspace(workspace_id, target, progress=click.echo, force=force)


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
    from kb.jobs.worker import live_workers

    kb = session.open_kb()
    job = kb.set_model(workspace_id, model)
    if job is None:
        click.echo(f"workspace {workspace_id}: already uses {model}, or a waiting switch covers it")
        return
    workers = live_workers(kb.database_url, kb.settings.worker_alive_seconds)
    then = (
        f"{workers} kb worker(s) running will re-embed it"  # counted as `kb import` counts them
        if workers
        else "run `kb worker --until-idle` (or keep `kb worker` running) to re-embed it"
    )
    click.echo(
        f"workspace {workspace_id}: switching to {model} (job {job}); {then}; "
        f"`kb status -w {workspace_id}` shows the model once switched"
    )


COMMANDS = [workspaces, workspace]
