"""The derived index and its jobs (design §6, §7): ``kb worker``, ``kb index``,
``kb rebuild-projection``, ``kb reindex``, ``kb sweep``, ``kb prepare-model``."""

from __future__ import annotations

import sys

import click

from kb.adapters.cli import session
from kb.adapters.cli.counts import counted
from kb.adapters.cli.options import workspace_option


@click.command()
@click.option(
    "--until-idle", is_flag=True, help="Exit 0 once no job is due or runnable (jobs scheduled for later are listed)."
)
@click.option("--concurrency", default=1, show_default=True, help="Jobs run at once.")
@click.option("--quiet", "-q", is_flag=True, help="No per-job progress lines (the summary is still printed).")
def worker(until_idle: bool, concurrency: int, quiet: bool) -> None:
    """Run the Procrastinate worker for kb's queues (projection, index, maintenance), including
    the periodic sweep, stalled-job retry, job cleanup and worktree janitor.

    Shows each job's progress on stderr (a live line on a terminal; otherwise a line every
    KB_PROGRESS_INTERVAL seconds, default 5, while a job runs) and a summary at the end.
    SIGINT/SIGTERM finish the jobs in hand, then stop (with --until-idle: the summary, exit 130); a
    second one puts them back in the queue at their next checkpoint and stops.
    Example: kb worker --until-idle
    """
    from kb.jobs.worker import ProgressDisplay, describe_blocked

    kb = session.open_kb(create=True)  # may run before the first import
    report = kb.run_worker(
        until_idle=until_idle,
        concurrency=concurrency,
        display=None if quiet else ProgressDisplay(every=kb.settings.progress_interval),
    )
    click.echo(report.summary())
    later = report.later()
    click.echo(later if later else "no job is scheduled for later")
    for job in report.blocked:
        click.echo(f"blocked: {describe_blocked(job)}")
    if report.interrupted:  # a signal stopped it before the queue was idle (design §7)
        click.echo("interrupted before the queue was idle: run `kb worker --until-idle` again to go on", err=True)
        sys.exit(130)
    if until_idle:
        failed = sum(j["jobs"] for j in kb.status()["jobs"] if j["status"] == "failed")
        if failed:
            click.echo(f"{failed} failed job(s) in the queue; see kb status")


@click.command()
@workspace_option()
def index(workspace: int) -> None:
    """Project and index a workspace up to HEAD in this process (no worker needed).

    Example: kb index --workspace 1
    """
    from rich.progress import Progress

    kb = session.open_kb()
    with Progress(transient=True) as bar:
        task = bar.add_task("indexing", total=None)
        report = kb.index(
            workspace, progress=lambda done, total, _report: bar.update(task, completed=done, total=total)
        )
    click.echo(
        f"indexed {counted(report.documents_indexed, 'document')} ({counted(report.chunks_written, 'chunk')} written, "
        f"{report.chunks_reused} reused, {report.embeddings_computed} embedded, "
        f"{report.embeddings_cached} from cache); failed {report.documents_failed}; stamp {report.revision}"
    )


@click.command("rebuild-projection")
@workspace_option()
def rebuild_projection(workspace: int) -> None:
    """Re-derive documents/folders rows from git HEAD; ids of existing rows stay the same.

    Deletes nothing a client holds: rows whose file exists are kept and repaired, missing folder
    rows come back. Example: kb rebuild-projection --workspace 1
    """
    result = session.open_kb().rebuild_projection(workspace)
    click.echo(
        f"projected {result.revision}: documents {len(result.created)} created, {len(result.updated)} "
        f"updated, {len(result.deleted)} deleted; folders {len(result.folders_created)} created, "
        f"{len(result.folders_deleted)} deleted"
    )


@click.command()
@workspace_option()
@click.option("--defer", "defer_", is_flag=True, help="Queue it for a worker instead of running here.")
def reindex(workspace: int, defer_: bool) -> None:
    """Rebuild a workspace's index from git HEAD (upsert + prune; resumes an interrupted one).

    Unchanged chunks keep their rows and cached embeddings, so a second reindex embeds nothing.
    Progress is in the kb.index_runs table. Example: kb reindex --workspace 1
    """
    kb = session.open_kb()
    if defer_:
        job = kb.defer_reindex(workspace)
        click.echo(f"reindex job {job} queued" if job else "a reindex of this workspace is already queued")
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("reindexing", total=None)
        report = kb.reindex(
            workspace, progress=lambda done, total, _report: bar.update(task, completed=done, total=total)
        )
    if report.skipped_locked:
        click.echo("another index run holds this workspace's index lock; it converges to HEAD itself")
        return
    click.echo(
        f"reindexed {counted(report.documents_indexed, 'document')}{' (resumed)' if report.resumed else ''} "
        f"({counted(report.chunks_written, 'chunk')} written, {report.chunks_reused} reused, "
        f"{report.embeddings_computed} embedded, {report.embeddings_cached} from cache, "
        f"cache hits {report.cache_hit_ratio:.0%}); failed {report.documents_failed}, "
        f"unindexable {report.documents_unindexable}; stamp {report.revision}"
        + (
            f"; {moved} moved, changed or deleted while the run read them (the next run takes them)"
            if (moved := report.documents_superseded + report.documents_gone)
            else ""
        )
    )


@click.command()
def sweep() -> None:
    """Defer projection/index jobs for every workspace lagging git HEAD (what the periodic
    kb.sweep task does every minute), recording revisions made with git outside kb first. A
    workspace whose repository cannot be read is skipped with the reason, the others are swept,
    and the exit status is 1.

    Example: kb sweep
    """
    report = session.open_kb().sweep()
    click.echo(
        f"checked {counted(report.checked, 'workspace')}; projection deferred for {report.projection_deferred}, "
        f"index deferred for {report.index_deferred}"
    )
    if report.damaged:  # each was logged to stderr as "sweep: workspace N skipped: …"
        sys.exit(1)


@click.command("prepare-model")
def prepare_model() -> None:
    """Load the embedding model KB_EMBEDDING_MODEL names, now: MiniLM or a model directory is
    exported to ONNX once (with torch, 5-20 s) into KB_MODEL_CACHE, so that neither the first
    index nor the first search waits for it (design §7). Prints how the model runs. Needs no
    database. Example: kb prepare-model
    """
    from kb.index.embedding import SentenceTransformerEmbedder, make_embedder
    from kb.index.onnx_embedder import OnnxEmbedder

    embedder = make_embedder(session.settings())
    if isinstance(embedder, OnnxEmbedder):
        runtime = f"onnxruntime, export in {embedder.folder}"
    elif isinstance(embedder, SentenceTransformerEmbedder):
        runtime = "torch (no ONNX export: see the warning above, or install onnxruntime and tokenizers)"
    else:
        runtime = "nothing to export"
    click.echo(f"{embedder.model} ({embedder.dim}-d): {runtime}")


COMMANDS = [worker, index, rebuild_projection, reindex, sweep, prepare_model]
