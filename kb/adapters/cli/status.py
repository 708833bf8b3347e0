"""What state kb is in (design §7, §14): ``kb status`` and ``kb fsck``."""

from __future__ import annotations

import json
import sys

import click

from kb.adapters.cli import session
from kb.adapters.cli.counts import counted
from kb.adapters.cli.options import workspace_option
from kb.adapters.cli.terminal import shown


def _age(waited) -> str:
    """A wait (a timedelta, or seconds as ``kb serve`` sends it) as ``41s``, ``2m 05s`` or
    ``3h 12m``; ``-`` for none."""
    if waited is None:
        return "-"
    seconds = int(waited.total_seconds() if hasattr(waited, "total_seconds") else waited)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


@click.command()
@workspace_option(required=False, help="Workspace id.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole status as one JSON object.")
def status(workspace: int | None, as_json: bool) -> None:
    """Head, index stamp, jobs waiting/running/failed, chunk and document counts.

    Asks the running `kb serve` when KB_SERVER_URL is set. Example: kb status --workspace 1
    """
    server = session.server()
    if server:
        info = server.status(workspace)
    else:
        from kb.index.embedding import describe_configured_model

        kb = session.open_kb()
        info = kb.status(workspace)
        info["embedding_model"] = describe_configured_model(kb.settings)  # never loads the model
    if as_json:
        click.echo(json.dumps(info, default=str, indent=2))
        return
    if "database" in info:  # kb serve tells an admin token only (design §16)
        click.echo(f"database:   {info['database']}")
    ws = info.get("workspace")
    if ws:  # the workspace's own model first: the default below is not necessarily it (design §7)
        model = ws.get("model") or "the default below (not chosen yet: the first index run picks it)"
        switching = f" (switching to {ws['next_model']})" if ws.get("next_model") else ""
        click.echo(f"model:      {model}{switching} (workspace {ws['id']}'s)")
    click.echo(
        f"embedder:   {info['embedding_model']}, the default (KB_EMBEDDING_MODEL) for workspaces "
        "without a model of their own"
    )
    jobs = ", ".join(f"{j['queue']}/{j['status']}={j['jobs']}" for j in info["jobs"]) or "none"
    click.echo(f"jobs:       {jobs}{' (this workspace)' if workspace else ''}")
    if ws:
        click.echo(f"workspace:  {ws['id']}")
        click.echo(f"head:       {ws['head']}")
        click.echo(f"index stamp:{' ' if ws['index_stamp'] else ''}{ws['index_stamp'] or ' (never indexed)'}")
        # the counts are the projection's rows: revisions it has not reached have none yet
        unprojected = ws.get("projected") != (ws.get("recorded_head") or ws["head"])
        click.echo(
            f"documents:  {ws['documents']} ({ws['pending']} pending, {ws['failed']} failed, "
            f"{ws['quarantined']} quarantined, {ws['unindexable']} unindexable)"
            + (
                (
                    f"; revisions after {ws['projected'][:12]} are not projected yet"
                    if ws.get("projected")
                    else "; no revision is projected yet"
                )
                + ", their documents not counted here: `kb worker --until-idle` (or `kb index`) brings them in"
                if unprojected
                else ""
            )
        )
        click.echo(f"chunks:     {ws['chunks']}")
        if ws.get("home_node"):
            click.echo(f"home node:  {ws['home_node']} (`kb nodes` shows whether it is up)")
        for problem in ws["problems"]:
            click.echo(f"  {problem['status']}: {shown(problem['path'])}: {shown(str(problem['index_error']))}")
        migration = ws.get("migration")  # seeded from a legacy knowledge base
        if migration:
            click.echo(
                f"authority:  {'kb (flipped ' + str(migration['flipped_at']) + ')' if migration['flipped'] else 'legacy (not flipped)'}"
                f"; seeded {migration['seeded_at']} from legacy workspace {migration['legacy_workspace']}, "
                f"parity {'ok' if migration['parity_ok'] else 'FAILED'}"
            )
            click.echo(
                f"spans:      {migration['chunks_without_spans'] or 0} chunks without spans, "
                f"{migration['documents_stale'] or 0} documents stale"
            )
        for finding in ws.get("drift", []):
            click.echo(
                f"drift:      {finding['kind']}: {finding['findings']} ({finding['repaired']} repaired) "
                f"at {finding['checked_at']}"
            )
        remote = ws.get("remote")
        if remote:
            click.echo(
                f"remote:     {shown(remote['url'])} ({shown(remote['branch'])}): pushed "
                f"{remote['last_pushed_revision'] or 'nothing yet'}"
                f"{' (behind HEAD)' if remote['behind'] else ''}"
            )
            if remote["last_push_error"]:
                click.echo(f"  last push error: {shown(remote['last_push_error'])}")
    for lag in info.get("index_lag", []):
        behind = lag["revisions_behind"]
        click.echo(
            f"index lag:  workspace {lag['workspace_id']}: {behind} revision{'' if behind == 1 else 's'} behind, "
            f"{lag['documents_failed']} failed, {lag['documents_quarantined']} quarantined"
        )
    for queue in info.get("job_health", []):
        click.echo(
            f"queue {queue['queue']} (all workspaces): {queue['todo']} waiting, {queue['doing']} running, "
            f"{queue['failed']} failed, oldest waiting {_age(queue['oldest_waiting'])}"
        )
    if info["blocked_jobs"] or info["scheduled_jobs"]:
        from kb.jobs.worker import describe_blocked, describe_scheduled  # psycopg: only when needed
    for job in info["blocked_jobs"]:
        click.echo(f"blocked:    {describe_blocked(job)}")
    for job in info["scheduled_jobs"]:
        click.echo(f"later:      {describe_scheduled(job)}")


@click.command()
@workspace_option()
def fsck(workspace: int) -> None:
    """Check a workspace with git's own fsck, remove stale git locks, record revisions git has
    and Postgres lacks (deferring their index jobs), and repair a stale working tree.

    Exits 1 when git reports errors or an artifact blob is missing or corrupt. Example: kb fsck --workspace 1
    """
    report = session.open_kb().fsck(workspace)
    click.echo(f"git fsck --strict: {'ok' if report.git_ok else 'ERRORS'}")
    for line in report.git_messages:
        click.echo(f"    {line}")
    for lock in report.stale_locks_removed:
        click.echo(f"removed stale lock {lock}")
    for revision in report.recorded:
        click.echo(f"recorded revision {revision.id} ({len(revision.changes)} paths) that Postgres lacked")
    if report.index_repaired:
        click.echo(f"rebuilt the git index from HEAD: git could not read it ({report.index_repaired})")
    if report.worktree_repaired:
        click.echo(f"repaired working tree: {len(report.worktree_repaired)} paths")
        for path in report.worktree_repaired[:10]:
            click.echo(f"    {path}")
    if report.set_aside:
        click.echo(
            f"kept {counted(len(report.set_aside), 'changed file')} no revision holds (edited or added by hand in "
            f"the working tree) at {report.set_aside_folder} before the repair; to record one, "
            "`kb import` or `kb new` it (the working tree follows HEAD)"
        )
        for path in report.set_aside[:10]:
            click.echo(f"    {path}")
    for pack in report.temporary_packs_removed:
        click.echo(f"removed temporary pack {pack} (a killed import's)")
    for path in report.overlong_paths:
        click.echo(
            f"path too long to check out ({len(path.encode('utf-8', 'surrogateescape')) - 11} bytes below /documents): {path}\n"
            f"    fix: {report.fix_for(path)}"
        )
    for problem in report.artifact_problems:
        click.echo(f"artifact ERROR: {problem}")
    if report.remote_problem:
        click.echo(f"remote ERROR: {report.remote_problem}")
    if report.artifact_orphans_removed:
        click.echo(f"removed {len(report.artifact_orphans_removed)} unreferenced artifact blobs")
    if report.ok and not (
        report.recorded
        or report.worktree_repaired
        or report.stale_locks_removed
        or report.overlong_paths
        or report.index_repaired
    ):
        click.echo("clean: git, Postgres history and working tree agree")
    if not report.ok:
        sys.exit(1)


COMMANDS = [status, fsck]
