"""Commands on documents (design §3, §5, §8): ``kb import``, ``kb read``, ``kb ls``, ``kb new``,
``kb mv`` and ``kb edit``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import click

from kb.adapters.cli import interrupts, session
from kb.adapters.cli.counts import counted
from kb.adapters.cli.interrupts import settle, settled
from kb.adapters.cli.options import workspace_option
from kb.adapters.cli.terminal import shown, shown_on_terminal
from kb.errors import EditorFailed


@click.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@workspace_option()
@click.option("--prefix", help="Folder under /documents to import into.")
@click.option("--prune", is_flag=True, help="Also remove documents under the prefix that PATH no longer has.")
@click.option("--dry-run", is_flag=True, help="Record nothing: say what the import would add, modify, move and remove.")
@click.option("--message", "-m", help="Revision message (default: a summary).")
@click.option("--author", help="Author of the revision (default: your user name).")
def import_(
    path: Path,
    workspace: int,
    prefix: str | None,
    prune: bool,
    dry_run: bool,
    message: str | None,
    author: str | None,
) -> None:
    """Import every *.md (.MD too) under PATH into a workspace as one revision.

    Hidden files and folders, other files and symbolic links are skipped; each is named with the
    reason. A document kb stores but cannot index (not UTF-8, NUL bytes, over KB_MAX_INDEX_BYTES)
    is named too: it stays readable in git, and search does not find it. On a terminal, a live line
    on stderr shows the files found and read and the revision being recorded. --dry-run shows
    first what an import (with --prune: which removals) would record.

    Example: kb import ~/notes --workspace 1 --prefix Notes --prune --dry-run
    """
    kb = session.open_kb(create=True)  # the README's first command: it starts the knowledge base
    if dry_run:
        _preview_import(kb.import_folder(path, workspace, prefix=prefix, prune=prune, dry_run=True), workspace)
        return
    key = uuid.uuid4().hex
    existed = kb.store(workspace).exists()
    progress = _ImportLine() if sys.stderr.isatty() else None  # a script's capture gets the report only
    interrupts.mark(interrupts.WRITING)
    try:
        report = kb.import_folder(
            path,
            workspace,
            prefix=prefix,
            prune=prune,
            message=message,
            author=author,
            idempotency_key=key,
            progress=progress,
        )
    except KeyboardInterrupt:
        if progress is not None:
            progress.clear()
        settle(kb, workspace, key, "the import", lambda: _remove_empty_workspace(kb, workspace, existed))
    finally:
        if progress is not None:
            progress.clear()
    interrupts.mark(interrupts.RECORDED)
    if report.created_workspace:
        click.echo(f"created workspace {workspace}")
    if report.folder_renamed and prefix is not None:  # the path law changed the prefix: said, not silent
        click.echo(_prefix_renamed(prefix, report.folder, workspace))
    if report.revision is None:
        click.echo(f"no changes: {counted(report.documents_found, 'document')} already up to date")
    else:
        click.echo(f"revision {report.revision.id}")
    click.echo(
        f"documents: {report.documents_found} found, {report.added} added, {report.modified} modified, "
        f"{report.moved} moved, {report.removed} removed, {report.unchanged} unchanged; skipped {report.skipped_other} "
        f"other (non-markdown, links, non-UTF-8 names) and {report.skipped_hidden} hidden"
    )
    if report.moved and report.revision is not None:  # --prune found a file's bytes at a new path
        renamed = [c for c in report.revision.changes if c.change == "moved" and c.old_path]
        _echo_listed(
            [f"moved {shown(c.old_path)} → {shown(c.path)}: renamed in the folder (--prune)" for c in renamed],
            "moved {} more renamed in the folder (--prune)",
        )
    if report.removed and report.revision is not None:  # --prune: said by name, and how to undo it
        gone = [c.path for c in report.revision.changes if c.change == "removed"]
        _echo_listed(
            [f"removed {shown(removed)}: not in the folder (--prune)" for removed in gone],
            "removed {} more not in the folder (--prune)",
        )
        if report.revision.parent_id:
            click.echo(
                f"`kb restore PATH --revision {report.revision.parent_id[:12]} --workspace {workspace}` brings one back"
            )
    changed = {c.path for c in report.revision.changes} if report.revision is not None else set()
    _echo_followed(report, "imported", changed)
    _echo_kept_artifacts(report, workspace)
    _echo_skipped(report)
    if report.unindexable:
        click.echo(
            f"stored but not indexed ({len(report.unindexable)}): kept in git (`kb read`, `kb log` and "
            "citations work) but search will not find them; `kb status` counts them as unindexable. "
            "Fix the file and import again to index it:"
        )
        for unindexable, reason in report.unindexable.items():
            click.echo(f"  {shown(unindexable)}: {shown(reason)}")
    if report.revision is not None:
        from kb.jobs.worker import live_workers

        workers = live_workers(kb.database_url, kb.settings.worker_alive_seconds)
        if workers:
            click.echo(f"{workers} kb worker(s) running will index it; `kb status -w {workspace}` shows progress")
        else:
            click.echo(
                f"not indexed yet: run `kb worker --until-idle` (or keep `kb worker` or "
                f"`kb serve --with-worker` running), then `kb search QUERY -w {workspace}`"
            )
    _echo_renamed(report, preview=False)


def _echo_renamed(report, *, preview: bool) -> None:
    """The names the path law changed (``report.renamed``), a few as examples (design §2.2)."""
    if report.renamed:
        count = len(report.renamed)
        verb = "would be" if preview else "was" if count == 1 else "were"
        examples = ", ".join(f"{shown(old)} -> {shown(new)}" for old, new in _shown_renames(report.renamed, 3))
        click.echo(
            f"{count} {'name' if count == 1 else 'names'} {verb} made safe for every OS "
            f"({'e.g. ' if count > 3 else ''}{examples}); see docs/storage-and-paths.md"
        )


def _prefix_renamed(prefix: str, folder: str, workspace: int) -> str:
    """What ``kb import`` says when the path law (design §2) stored ``--prefix`` under another
    spelling: what was wrong with it, where the documents went, and the path to write from now on.
    A prefix in Unicode NFD looks the same as its NFC form on a terminal, so its decomposed
    characters are named (``e + U+0301``)."""
    import unicodedata

    reasons = []
    composed = unicodedata.normalize("NFC", prefix)
    if composed != prefix:
        marks = sorted({c for c in unicodedata.normalize("NFD", prefix) if unicodedata.combining(c)})
        named = ", ".join(f"U+{ord(c):04X} {unicodedata.name(c, '?')}" for c in marks[:3])
        reasons.append(
            f"it is in Unicode NFD: its accents are separate combining characters ({named}), "
            "as macOS file names and some keyboards give them; names are stored composed (NFC)"
        )
    if composed.strip("/") != folder.removeprefix("/documents").strip("/"):
        reasons.append("it holds characters some OS forbid in names (or a trailing dot or space); they were replaced")
    return (
        f"into {shown(folder)}: --prefix {ascii(prefix)} was changed because {'; and '.join(reasons)} "
        f"(docs/storage-and-paths.md). Write the stored spelling from now on, e.g. "
        f'kb ls "{shown(folder)}" -w {workspace}'
    )


def _shown_renames(renamed: dict[str, str], most: int) -> list[tuple[str, str]]:
    """Up to ``most`` of an import's renames to show, those a reader can see first: a name only
    brought to Unicode's composed form (NFC) looks the same before and after (design §2.2)."""
    import unicodedata

    def looks_same(old: str, new: str) -> bool:
        return new.endswith("/" + unicodedata.normalize("NFC", old).rsplit("/", 1)[-1])

    ordered = sorted(renamed.items(), key=lambda pair: looks_same(*pair))
    return [
        (old, f"{new} (the same letters, composed: NFC)" if looks_same(old, new) else new)
        for old, new in ordered[:most]
    ]


class _ImportLine:
    """``kb import``'s live line on a terminal's stderr (design §13): the markdown files found, the
    files read, the revision being recorded — a large import (25,000 files, ~9 s) otherwise shows
    nothing until its report. Redrawn at most every ``EVERY`` seconds and at each phase's end;
    ``clear`` erases it before the report is printed."""

    EVERY = 0.1

    def __init__(self) -> None:
        self._shown = float("-inf")
        self._drawn = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done != total and now - self._shown < self.EVERY:
            return
        self._shown = now
        if phase == "scanning":
            text = f"importing: {counted(done, 'markdown file')} found" + ("" if done == total else " so far")
        elif phase == "reading":
            text = f"importing: read {done}/{counted(total, 'file')}"
        else:
            text = f"importing: recording {counted(total, 'document')} as one revision"
        sys.stderr.write(f"\r\x1b[K{text}")
        sys.stderr.flush()
        self._drawn = True

    def clear(self) -> None:
        """Erase the line, if one is drawn."""
        if self._drawn:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._drawn = False


@click.command()
@click.argument("path")
@workspace_option()
@click.option("--revision", "-r", help="Revision id (default: HEAD).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of the envelope.")
@click.option("--chat", "-c", "chat", help="Read as this conversation: the envelope cites its handle (kb cite).")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Lines to skip.")
@click.option("--limit", type=click.IntRange(min=0), help="Most lines to show (default: to the end).")
def read(
    path: str, workspace: int, revision: str | None, as_json: bool, chat: str | None, offset: int, limit: int | None
) -> None:
    """Print one document's envelope: every line, or a window of lines with their true numbers.

    On a terminal, control characters in the text (escape sequences) are shown escaped (\\x1b);
    into a pipe or a file the text is written as stored.

    Asks the running `kb serve` when KB_SERVER_URL is set (without --chat). Example: kb read
    "/documents/Notes/Todo.md" --workspace 1 --chat c1 --offset 10 --limit 20
    """
    server = session.server() if chat is None else None
    if server:
        envelope = server.read_document(workspace, path, revision).window(offset, limit)
    else:
        from kb.adapters.cli.cite import read_in_chat

        envelope = read_in_chat(workspace, chat, path, revision, offset, limit)
    click.echo(
        json.dumps(envelope.as_json(), ensure_ascii=False, indent=2)
        if as_json
        else shown_on_terminal(envelope.render())
    )


@click.command()
@click.argument("path")
@workspace_option()
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

    # a blank EDITOR is unset (as git takes it): split, it named no program and kb ran the document
    command = (os.environ.get("EDITOR") or "").strip() or (os.environ.get("VISUAL") or "").strip() or "vi"

    def run_editor(file: Path) -> None:
        try:
            argv = shlex.split(command)
        except ValueError as exc:  # an unbalanced quote
            raise EditorFailed(f"editor {command!r} cannot be read as a command ({exc}); fix EDITOR") from None
        # The editor has the terminal: a Ctrl-C or Ctrl-\ typed there (vi's way out of a
        # command, nano's cursor position) reaches kb too, which killed the editor and dropped
        # the edit. kb ignores both until the editor exits, as git does; a handler, not SIG_IGN,
        # so the editor starts with the default dispositions (exec resets handlers).
        ignored = {number: signal.signal(number, _editor_has_the_terminal) for number in EDITOR_SIGNALS}
        try:
            code = subprocess.call([*argv, str(file)])
        except FileNotFoundError:
            raise EditorFailed(f"editor {command!r} not found; set EDITOR") from None
        except OSError as exc:  # not executable, a folder
            raise EditorFailed(f"editor {command!r} cannot be run ({exc.strerror}); set EDITOR") from None
        finally:
            for number, previous in ignored.items():
                signal.signal(number, previous)
        if code < 0:  # ended by a signal: a Ctrl-C typed in an editor that does not handle it
            raise EditorFailed(f"editor {command!r} was ended by {signal.Signals(-code).name}; nothing was recorded")
        if code != 0:
            raise EditorFailed(f"editor {command!r} exited with status {code}; nothing was recorded")

    kb = session.open_kb()
    result = settled(
        kb,
        workspace,
        "kb edit",
        lambda key: kb.edit_document(
            workspace, path, run_editor, author=author, message=message, committer=committer, idempotency_key=key
        ),
    )
    if result is None:
        click.echo("no changes; nothing recorded")
    else:
        verbs = [("created", result.added), ("updated", result.modified), ("removed", result.removed)]
        click.echo(
            f"revision {result.revision}: " + "; ".join(f"{verb} {', '.join(paths)}" for verb, paths in verbs if paths)
        )
        for merged in result.merged:
            click.echo(f"note: {merged} was changed by someone else meanwhile; both changes were merged")
        for overwritten in result.overwrote:
            hunks = result.lost_hunks.get(overwritten, [])
            where = ", ".join(f"line {h.start_line}" for h in hunks)
            click.echo(
                f"note: {overwritten} was changed by someone else meanwhile; your save replaced "
                + (f"their lines at {where} (still in history)" if hunks else "it")
            )


EDITOR_SIGNALS = (signal.SIGINT, signal.SIGQUIT)
"""The terminal's signals kb leaves to the editor ``kb edit`` runs, for as long as it runs."""


def _editor_has_the_terminal(signum, frame) -> None:
    """SIGINT/SIGQUIT while ``kb edit``'s editor runs: the editor's to handle, not kb's."""


@click.command("ls")
@click.argument("folder", default="/documents")
@workspace_option()
@click.option("--revision", "-r", help="Revision id (default: HEAD).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, path, kind} (as the MCP ls tool).")
def ls(folder: str, workspace: int, revision: str | None, as_json: bool) -> None:
    """List FOLDER (default: /documents): its folders, then its documents, one path a line
    (folders end in /); a document's path lists itself.

    Example: kb ls "/documents/Notes" --workspace 1
    """
    from kb.adapters.json_form import json_form

    entries = session.open_kb().ls(workspace, folder, revision)
    if as_json:
        click.echo(json.dumps(json_form(entries), ensure_ascii=False, indent=2))
        return
    for entry in entries:
        click.echo(shown(entry.path) + ("/" if entry.kind == "folder" else ""))


@click.command("new")
@click.argument("folder_or_title", metavar="[FOLDER]")
@click.argument("title", required=False, metavar="TITLE")
@workspace_option()
@click.option("--body", help="The document's text (default: read standard input when it is not a terminal).")
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--committer", help="Who records the revision (default: the author).")
@click.option("--message", "-m", help="Revision message (default: a summary such as 'docs: add 1 file').")
def new(
    folder_or_title: str,
    title: str | None,
    workspace: int,
    body: str | None,
    author: str | None,
    committer: str | None,
    message: str | None,
) -> None:
    """Create a document titled TITLE in FOLDER (default: /documents, the root); the path law
    picks a safe, unique file name (`` (2)`` when taken) and the title is kept as typed. Prints
    the final path on stdout and the revision it recorded on stderr. A workspace that does not
    exist yet is created (as kb import does).

    \b
    Examples:
      kb new "Client/Server FAQ" -w 1                     # prints /documents/Client_Server FAQ.md
      echo "- ship it" | kb new /documents/Plans "Q3 plan: draft?" -w 1
    """
    # One argument is the title (at the root); two are FOLDER TITLE, as before.
    folder, title = ("/documents", folder_or_title) if title is None else (folder_or_title, title)
    if not title.strip():
        raise click.BadParameter(
            'the title is empty; give the document a title, e.g. kb new "Meeting notes" -w 1', param_hint="TITLE"
        )
    from kb.paths import names_something

    if not names_something(title):  # only dots or control characters: it would be untitled.md
        raise click.BadParameter(
            f"the title {title!r} keeps no character in a file name (only dots or control characters); "
            'give the document a title, e.g. kb new "Meeting notes" -w 1',
            param_hint="TITLE",
        )
    if body is None:
        body = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    kb = session.open_kb(create=True)
    if not kb.store(workspace).exists():  # as kb import does: a first document starts a workspace
        kb.create_workspace(workspace)
        click.echo(f"created workspace {workspace}", err=True)

    def create(key: str):
        with kb.transaction(workspace, message, author, committer, idempotency_key=key) as tx:
            return tx, tx.create(folder, title, body)

    tx, document = settled(kb, workspace, "kb new", create)
    click.echo(document.path)  # alone on stdout: scripts take the path (kb read "$(kb new …)")
    if tx.revision is not None:
        click.echo(f"revision {tx.revision.id}", err=True)


@click.command("mv")
@click.argument("source")
@click.argument("destination")
@workspace_option()
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace a document already at DESTINATION; for a folder, merge into an existing folder there.",
)
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--message", "-m", help="Revision message (default: 'docs: move N files').")
def move(
    source: str, destination: str, workspace: int, overwrite: bool, author: str | None, message: str | None
) -> None:
    """Move the document or folder SOURCE to DESTINATION in one revision; history follows it.

    Example: kb mv "/documents/Old name.md" "/documents/Archive/New name.md" --workspace 1
    """
    kb = session.open_kb()
    revision = settled(
        kb,
        workspace,
        "kb mv",
        lambda key: kb.workspace(workspace).move(
            source, destination, overwrite=overwrite, message=message, author=author, idempotency_key=key
        ),
    )
    click.echo("nothing moved" if revision is None else f"revision {revision.id}: moved {source} to {destination}")


@click.command("rm")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@workspace_option()
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--message", "-m", help="Revision message (default: 'docs: remove N files').")
def remove(paths: tuple[str, ...], workspace: int, author: str | None, message: str | None) -> None:
    """Remove the documents or folders PATH... (a folder: every document under it) in one revision.
    History keeps them: `kb log` lists the revision and `kb revert REVISION` brings them back.

    Example: kb rm "/documents/Drafts/Old plan.md" /documents/Scratch --workspace 1
    """
    kb = session.open_kb()
    revision = settled(
        kb,
        workspace,
        "kb rm",
        lambda key: kb.workspace(workspace).remove(list(paths), message=message, author=author, idempotency_key=key),
    )
    if revision is None:
        click.echo("nothing removed")
        return
    removed = [c.path for c in revision.changes if c.change == "removed"]
    click.echo(f"revision {revision.id}: removed {counted(len(removed), 'document')}")


SHOWN_PER_REASON = 20
"""Paths an import's report names one by one for each reason (moved, removed, skipped); the rest
are counted."""


def _echo_listed(lines: list[str], more: str) -> None:
    """Echo the first SHOWN_PER_REASON of ``lines``, then ``more`` formatted with how many are left."""
    for line in lines[:SHOWN_PER_REASON]:
        click.echo(line)
    if len(lines) > SHOWN_PER_REASON:
        click.echo(more.format(len(lines) - SHOWN_PER_REASON))


def _echo_followed(report, verb: str, changed: set[str] | None = None) -> None:
    """The folder's files whose document kb moved since (``report.followed``): each went to the
    document where it lives now, not to a copy at its old path (design §3). ``changed``: the
    paths the revision changed — the others are counted, not listed (nothing happened to them)."""
    followed = report.followed if changed is None else {o: n for o, n in report.followed.items() if n in changed}
    _echo_listed(
        [f"{verb} {shown(old)} at {shown(now)}: kb moved that document there since" for old, now in followed.items()],
        verb + " {} more where kb moved their documents since",
    )
    if len(followed) < len(report.followed):
        same = len(report.followed) - len(followed)
        click.echo(
            f"{counted(same, 'file')} unchanged where kb moved {'its document' if same == 1 else 'their documents'}"
        )


def _echo_kept_artifacts(report, workspace: int) -> None:
    """The ARTIFACT documents ``--prune`` left although the folder lacks them (design §11)."""
    _echo_listed(
        [
            f"kept {shown(path)}: an ARTIFACT (id {document_id}), which --prune leaves; "
            f"`kb artifact delete {document_id} -w {workspace}` removes it"
            for path, document_id in report.kept_artifacts.items()
        ],
        "kept {} more ARTIFACT documents, which --prune leaves",
    )


def _echo_skipped(report) -> None:
    """The entries an import skipped, by reason (``report.skipped``)."""
    by_reason: dict[str, list[str]] = {}
    for entry in report.skipped:
        by_reason.setdefault(entry.reason, []).append(entry.path)
    for reason, paths in by_reason.items():
        _echo_listed(
            [f"skipped {shown(skipped)}: {shown(reason)}" for skipped in paths],
            "skipped {} more: " + reason.replace("{", "{{").replace("}", "}}"),
        )


def _preview_import(report, workspace: int) -> None:
    """What ``kb import --dry-run`` prints: the counts and paths an import would record."""
    click.echo(f"dry run: nothing recorded in workspace {workspace}; the import would record:")
    click.echo(
        f"documents: {report.documents_found} found, {report.added} to add, {report.modified} to modify, "
        f"{report.moved} to move, {report.removed} to remove, {report.unchanged} unchanged; skipped "
        f"{report.skipped_other} other (non-markdown, links, non-UTF-8 names) and {report.skipped_hidden} hidden"
    )
    _echo_listed(
        [
            f"would move {shown(old)} → {shown(new)}: renamed in the folder (--prune)"
            for old, new in report.moves.items()
        ],
        "would move {} more renamed in the folder (--prune)",
    )
    _echo_listed(
        [f"would remove {shown(removed)}: not in the folder (--prune)" for removed in report.removals],
        "would remove {} more not in the folder (--prune)",
    )
    _echo_listed([f"would add {shown(added)}" for added in report.additions], "would add {} more")
    _echo_listed([f"would modify {shown(changed)}" for changed in report.modifications], "would modify {} more")
    _echo_followed(report, "would import")
    _echo_kept_artifacts(report, workspace)
    _echo_skipped(report)
    for unindexable, reason in report.unindexable.items():
        click.echo(f"would store but not index {shown(unindexable)}: {shown(reason)}")
    _echo_renamed(report, preview=True)


def _remove_empty_workspace(kb, workspace: int, existed: bool) -> None:
    """After an interrupted import that recorded nothing: a first import made ``workspace``,
    which holds nothing now; leave no empty workspace behind."""
    from kb.errors import KbError

    store = kb.store(workspace)
    if not existed and store.exists() and store.head() is None:
        try:
            kb.delete_workspace(workspace, force=True)
        except KbError as exc:
            click.echo(f"kb: could not remove the empty workspace {workspace} ({exc})", err=True)


COMMANDS = [import_, read, ls, new, move, remove, edit]
