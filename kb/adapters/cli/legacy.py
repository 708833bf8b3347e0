"""``kb seed``, ``kb spans`` and ``kb drift``: migrating a legacy knowledge base (design §9,
§10). Registered by ``kb/adapters/cli/main.py``; the facade is imported inside the commands."""

from __future__ import annotations

import json

import click

from kb.adapters.cli import session
from kb.adapters.cli.counts import counted
from kb.adapters.cli.options import workspace_option
from kb.errors import InvalidInput


@click.command("seed")
@click.option("--from-dsn", "dsn", metavar="DSN", help="Postgres URL of the legacy database (schema legacy).")
@click.option("--legacy-workspace", type=int, help="Workspace id in the legacy tables.")
@workspace_option(help="The workspace id in kb.")
@click.option("--yes", is_flag=True, help="Write the seed revision (default: dry run, nothing written).")
@click.option("--flip", is_flag=True, help="After parity passed in this run, make kb the authority.")
@click.option("--unflip", is_flag=True, help="Hand authority back to the legacy system (nothing else).")
@click.option("--force", is_flag=True, help="Seed a flipped workspace anyway (reverts edits made in kb).")
@click.option("--out", "out", type=click.Path(dir_okay=False), help="Write one JSON line per legacy document.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def seed(dsn, legacy_workspace, workspace, yes, flip, unflip, force, out, as_json) -> None:
    """Seed a workspace from a legacy knowledge base (design §10): dry run unless --yes.

    Prints documents, folders, skipped rows with reasons, path collisions and bytes. With --yes:
    one seed revision, byte parity check, legacy ids/types/titles kept, legacy vectors adopted
    without embedding when the legacy model is the active one.

    Example: kb seed --from-dsn postgresql://app@db/legacy --legacy-workspace 3 -w 5 --yes --flip
    """
    kb = session.open_kb(create=True)  # seeds a new knowledge base from legacy rows
    if unflip:
        if yes or flip:
            raise InvalidInput("--unflip hands authority back on its own; do not combine it with --yes or --flip")
        changed = kb.set_authority(workspace, flipped=False)
        click.echo(
            f"workspace {workspace}: {'authority handed back to the legacy system' if changed else 'was not flipped'}"
        )
        return
    if dsn is None or legacy_workspace is None:
        raise InvalidInput("--from-dsn and --legacy-workspace are required (or --unflip alone)")
    report = kb.seed(
        dsn,
        legacy_workspace,
        workspace,
        yes=yes,
        flip=flip,
        force=force,
        progress=None if as_json else lambda message: click.echo(message, err=True),
    )
    if out:
        report.write_jsonl(out)
    if as_json:
        click.echo(json.dumps(report.summary(), indent=2, default=str))
        return
    s = report.summary()
    click.echo(
        f"{'dry run: ' if report.dry_run else ''}legacy workspace {legacy_workspace} at {report.source} "
        f"→ workspace {workspace}"
    )
    click.echo(f"documents:  {s['documents']} ({s['bytes']:,} bytes) in {s['folders']} legacy folders")
    click.echo(f"skipped:    {s['skipped']}")
    for entry in report.skipped:
        click.echo(f"  {entry.reason:<8} legacy {entry.legacy_id}: {entry.title!r}")
    click.echo(f"collisions: {s['collisions']}")
    for entry in report.collisions:
        click.echo(f"  legacy {entry.legacy_id}: {entry.title!r} → {entry.path}")
    click.echo(
        f"models:     legacy {report.legacy_model!r}, active {report.active_model!r}"
        + ("" if report.models_match else f" — {report.chunks_to_reembed} chunks to re-embed")
    )
    if report.dry_run:
        click.echo("nothing written; pass --yes to seed")
        return
    click.echo(f"revision:   {report.revision or 'none (already seeded, nothing changed)'}")
    parity = report.parity
    click.echo(
        f"parity:     {'ok' if parity.ok else 'FAILED'} ({parity.checked} paths; {len(parity.missing)} missing, "
        f"{len(parity.extra)} extra, {len(parity.mismatched)} mismatched)"
    )
    for kind in ("missing", "extra", "mismatched"):
        for path in getattr(parity, kind):
            click.echo(f"  {kind}: {path}")
    if report.not_adopted:
        click.echo(
            f"not adopted: {counted(len(report.not_adopted), 'document')} another writer removed or moved after the "
            "seed revision; seed again to adopt what remains"
        )
        for path in report.not_adopted:
            click.echo(f"  not adopted: {path}")
    click.echo(
        f"adopted:    {counted(report.documents_adopted, 'document')}, {counted(report.chunks_adopted, 'chunk')} (no embedding); "
        f"{counted(report.documents_to_index, 'document')} queued for indexing"
    )
    click.echo(f"authority:  {'kb (flipped)' if report.flipped else 'legacy (not flipped)'}")


@click.group("spans")
def spans() -> None:
    """The span fill of adopted legacy chunks (design §9): status, pause, resume, run-once.

    Example: kb spans status
    """


@spans.command("status")
@workspace_option(required=False, help="One workspace.")
@click.option("--json", "as_json", is_flag=True)
def spans_status(workspace, as_json) -> None:
    """Pause flag, batch size, throttle, and the backlog per workspace (view kb.span_backlog).

    Example: kb spans status -w 5
    """
    info = session.open_kb().span_fill().status(workspace)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    c = info["control"]
    click.echo(
        f"span fill:  {'PAUSED' if c['paused'] else 'active'}; batch {c['batch_documents']} documents, "
        f"throttle {c['throttle_ms']} ms"
    )
    for b in info["backlog"]:
        click.echo(
            f"workspace {b['workspace_id']}{' (flipped)' if b['flipped'] else ''}: "
            f"{b['chunks_without_spans']} chunks / {b['documents_without_spans']} documents without spans, "
            f"{b['documents_stale']} stale; last run {b['last_run_status'] or '-'}"
            f" ({b['last_run_documents_per_second'] or '-'} documents/s)"
        )


@spans.command("pause")
def spans_pause() -> None:
    """Pause the span fill; a running fill stops within one batch.

    Same as: UPDATE kb.span_fill_control SET paused = true. Example: kb spans pause
    """
    session.open_kb().span_fill().pause()
    click.echo("span fill paused")


@spans.command("resume")
def spans_resume() -> None:
    """Resume the span fill (the next run continues where the last stopped).

    Example: kb spans resume
    """
    session.open_kb().span_fill().resume()
    click.echo("span fill resumed")


@spans.command("run-once")
@workspace_option(required=False, help="Only this workspace.")
@click.option("--max-batches", type=click.IntRange(min=1), help="Stop after this many batches.")
@click.option("--defer", is_flag=True, help="Queue the run for a worker instead of running it here.")
def spans_run_once(workspace, max_batches, defer) -> None:
    """Run the span fill now, in this process (or queue it with --defer).

    Example: kb spans run-once -w 5
    """
    fill = session.open_kb().span_fill()
    if defer:
        job = fill.defer()
        click.echo(f"queued job {job}" if job else "a span fill is already waiting")
        return
    report = fill.run(workspace, max_batches=max_batches)
    click.echo(
        f"filled {counted(report.documents_filled, 'document')} ({counted(report.chunks_filled, 'chunk')}), "
        f"{report.documents_stale} stale, {counted(report.batches, 'batch', 'batches')} in {report.seconds:.1f} s"
        + (" — stopped: paused" if report.paused else "")
    )


@click.command("drift")
@workspace_option(required=False, help="One seeded workspace.")
@click.option("--json", "as_json", is_flag=True)
def drift(workspace, as_json) -> None:
    """Compare git HEAD with document/chunk rows of flipped workspaces; repair Postgres only.

    Example: kb drift -w 5
    """
    reports = session.open_kb().drift_check(workspace)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in reports], indent=2))
        return
    if not reports:
        click.echo("no flipped workspace to check")
    for r in reports:
        d = r.as_dict()
        found = ", ".join(f"{k}={v}" for k, v in d["findings"].items()) or "no drift"
        click.echo(
            f"workspace {r.workspace_id}: {r.skipped or found}; repaired {r.repaired}"
            + (" (capped: the rest needs an operator)" if r.capped else "")
        )


COMMANDS = [seed, spans, drift]
