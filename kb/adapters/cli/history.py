"""A workspace's history (design §3): ``kb log``, ``kb blame``, ``kb revert``, ``kb restore``."""

from __future__ import annotations

import json
import shlex
import shutil
import sys

import click

from kb.adapters.cli import session
from kb.adapters.cli.options import workspace_option
from kb.adapters.cli.terminal import fitted, shown

ALL_REVISIONS = 2**31 - 1
"""The most revisions ``kb log`` asks for (the store's MAX_HISTORY_LIMIT): what ``-n 0`` asks."""


@click.command()
@click.argument("path", required=False)
@workspace_option()
@click.option(
    "--limit",
    "-n",
    default=20,
    show_default=True,
    type=click.IntRange(min=0, max=ALL_REVISIONS),
    help="Most revisions to show, newest first (0: all of them).",
)
def log(path: str | None, workspace: int, limit: int) -> None:
    """Revisions newest first (id, author, date, message, paths changed). When more revisions
    than --limit exist, a note on stderr says so and how to see them.

    Asks the running `kb serve` when KB_SERVER_URL is set. Example: kb log --workspace 1 "/documents/Notes/Todo.md"
    """
    shown_at_most = limit or ALL_REVISIONS
    # one more than shown, to know whether the listing was cut (it is said, never silent)
    asked = shown_at_most + 1 if shown_at_most < ALL_REVISIONS else shown_at_most
    revisions = (session.server() or session.open_kb()).history(workspace, path, asked)
    cut = len(revisions) > shown_at_most
    revisions = revisions[:shown_at_most]
    quoted = "" if path is None else f" {shown(shlex.quote(path))}"  # a name's control characters escaped
    if not revisions and path is not None:
        click.echo(
            f"note: no revision changed a document at {path} (if it is a folder, each of its documents "
            f"has its own log: `kb ls{quoted} --workspace {workspace}` lists them; "
            f"`kb log --workspace {workspace}` alone shows every revision)",
            err=True,
        )
    for revision in revisions:
        when = revision.committed_at.isoformat(timespec="seconds") if revision.committed_at else ""
        click.echo(f"{revision.id}  {shown(revision.author)}  {when}")
        click.echo(f"    {shown(revision.message.splitlines()[0]) if revision.message else ''}")
        sources = {c.old_path for c in revision.changes if c.change == "moved"}
        paths = [_describe(c) for c in revision.changes if not (c.change == "moved_away" and c.path in sources)]
        for changed in paths[:10]:
            click.echo(f"    {shown(changed)}")
        if len(paths) > 10:
            click.echo(f"    … and {len(paths) - 10} more")
    if cut:
        click.echo(
            f"note: more revisions exist than the {shown_at_most} shown: "
            f"`kb log{quoted} --workspace {workspace} -n 0` shows them all (-n N the newest N)",
            err=True,
        )


BLAME_NAME_CHARS = 24
"""The widest author column ``kb blame`` prints (longer names are cut)."""


def _author_name(author: str) -> str:
    """``Zoë`` of ``Zoë <zoe@example.com>``; the whole text when it holds no ``<mail>``."""
    name, bracket, _ = author.partition(" <")
    return name.strip() if bracket and name.strip() else author


@click.command()
@click.argument("path")
@workspace_option()
@click.option("--json", "as_json", is_flag=True, help="Print the lines and their revisions as JSON.")
def blame(path: str, workspace: int, as_json: bool) -> None:
    """Each line of a document at HEAD with the revision that last changed it (id, author, date),
    following its recorded moves — what `git blame` answers, from kb's history (design §17).
    Asks the running `kb serve` when KB_SERVER_URL is set.

    On a terminal each line is cut to its width (a cut line ends with …); into a pipe or a file
    lines are whole. Control characters in the text are shown escaped (\\x1b), tabs as spaces,
    either way: --json gives the exact text.

    Example: kb blame "/documents/Notes/Todo.md" --workspace 1
    """
    found = (session.server() or session.open_kb()).blame(workspace, path)
    if as_json:
        click.echo(json.dumps(found.as_json(), ensure_ascii=False, indent=2))
        return
    width = len(str(len(found.lines)))
    # the author's name without the mail, as git blame shows it, in a column as wide as the
    # longest name shown (at most BLAME_NAME_CHARS): "Zoë <zoe@example.com>" was cut to "Zoë <zoe@example"
    names = {line.revision.author: shown(_author_name(line.revision.author)) for line in found.lines if line.revision}
    column = min(max((len(name) for name in names.values()), default=0), BLAME_NAME_CHARS)
    columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for line in found.lines:
        origin = line.revision
        if origin is None:  # HEAD's text not recorded yet (a revision Postgres has not seen)
            prefix = f"{'(not recorded yet)':<{column + 22}} {line.number:>{width}}) "
        else:
            when = origin.committed_at.date().isoformat() if origin.committed_at else ""
            prefix = f"{origin.id[:10]} {names[origin.author][:column]:<{column}} {when:<10} {line.number:>{width}}) "
        text = (prefix + shown(line.text.expandtabs(8))).rstrip()
        click.echo(text if columns is None else fitted(text, columns))
    if not found.complete:
        click.echo(
            "note: the history was read back as far as the oldest revision shown; its lines may be older",
            err=True,
        )


def _describe(change) -> str:
    """One line for a path change in ``kb log``: ``moved /a.md -> /b.md``, ``added /c.md`` …"""
    if change.change == "moved" and change.old_path:
        return f"moved    {change.old_path} -> {change.path}"
    if change.change == "moved_away" and change.new_path:
        return f"moved    {change.path} -> {change.new_path}"
    return f"{change.change or 'changed':<8} {change.path}"


@click.command()
@click.argument("revision")
@workspace_option()
@click.option("--message", "-m", help='Revision message (default: Revert "<message>").')
@click.option("--author", help="Author of the revision (default: your user name).")
def revert(revision: str, workspace: int, message: str | None, author: str | None) -> None:
    """Record a new revision that undoes REVISION (the paths it touched go back to their state
    before it). History is never rewritten.

    Example: kb revert 9f2c41d0e6b1a3c5d7e9f1a2b4c6d8e0f1a3b5c7 --workspace 1
    """
    from kb.adapters.cli.interrupts import settled  # here: kb log and blame never need it

    kb = session.open_kb()
    result = settled(
        kb,
        workspace,
        "kb revert",
        lambda key: kb.revert(workspace, revision, author=author, message=message, idempotency_key=key),
    )
    click.echo("nothing to revert: the workspace already matches" if result is None else _described(result))


@click.command()
@click.argument("path")
@workspace_option()
@click.option("--revision", "-r", required=True, help="Revision whose version of PATH to bring back.")
@click.option("--message", "-m", help="Revision message (default: restore PATH from revision R).")
@click.option("--author", help="Author of the revision (default: your user name).")
def restore(path: str, workspace: int, revision: str, message: str | None, author: str | None) -> None:
    """Bring one document back as it was at a revision, as a new revision.

    PATH is the document's path at that revision, or where it is now when moves took it there
    since (as kb log PATH follows it).

    Example: kb restore "/documents/Notes/Todo.md" --revision 9f2c41d0 --workspace 1
    """
    from kb.adapters.cli.interrupts import settled  # here: kb log and blame never need it

    kb = session.open_kb()
    result = settled(
        kb,
        workspace,
        "kb restore",
        lambda key: kb.restore(workspace, path, revision, author=author, message=message, idempotency_key=key),
    )
    # the document restored is the one at PATH then, wherever later moves took it (design §3)
    said = f"unchanged: the document that was {path} then holds that version already"
    click.echo(said if result is None else _described(result))


def _described(revision) -> str:
    """``revision <id>: created …; updated …; removed …; moved … to …`` for a recorded Revision,
    its paths escaped (``shown``: a name may hold U+200F, which reorders a terminal's line)."""
    verbs = {"added": "created", "modified": "updated", "removed": "removed"}
    parts: dict[str, list[str]] = {}
    for change in revision.changes:
        if change.change in verbs:
            parts.setdefault(verbs[change.change], []).append(shown(change.path))
        elif change.change == "moved":
            parts.setdefault("moved", []).append(f"{shown(change.old_path)} to {shown(change.path)}")
    return f"revision {revision.id}" + (
        ": " + "; ".join(f"{verb} {', '.join(paths)}" for verb, paths in parts.items()) if parts else ""
    )


@click.command("write-outcome")
@click.argument("key")
@workspace_option()
def write_outcome(key: str, workspace: int) -> None:
    """Settle a write by its idempotency key (design §3): prints the revision it recorded, or says
    it recorded none (exit status 1). What a CommitOutcomeUnknown error tells you to run.

    Example: kb write-outcome order-17 --workspace 1
    """
    revision = session.open_kb().write_outcome(workspace, key)
    if revision is None:
        click.echo(f"write {key!r} recorded nothing in workspace {workspace}; a retry is safe")
        raise SystemExit(1)
    click.echo(f"write {key!r} landed as revision {revision.id} (seq {revision.seq})")


COMMANDS = [log, blame, revert, restore, write_outcome]
