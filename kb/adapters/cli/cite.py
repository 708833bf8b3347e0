"""``kb cite …``: a chat's citations from the command line (design §8), mirroring
``kb.citations.conversation(workspace_id, chat_id)``: ``normalize``, ``resolve``, ``list``, ``forget``.
(``kb search --chat`` and ``kb read --chat`` are the conversation's search and read.)
"""

from __future__ import annotations

import json

import click

from kb.adapters.cli import session
from kb.adapters.cli.options import workspace_option
from kb.adapters.cli.terminal import shown, shown_on_terminal

chat_option = click.option(
    "--chat", "-c", "chat", required=True, help="The conversation's id (any text up to 200 characters)."
)


def _conversation(workspace: int, chat: str):
    """The chat's conversation, of the KnowledgeBase this command opens (and closes)."""
    return session.open_kb().conversation(workspace, chat)


def _echo_json(value) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2, default=str))


@click.group()
def cite() -> None:
    """Normalize, resolve, list and forget a chat's citations.

    Example: kb search "refunds" -w 1 --chat c1 && kb cite resolve "[1:L3-L4]" --chat c1 -w 1 --follow
    """


@cite.command()
@click.argument("source", metavar="[FILE]", default="-", type=click.File("rb"))
@chat_option
@workspace_option()
@click.option("--json", "as_json", is_flag=True, help="Print text, citations, unknown, degraded and adjusted as JSON.")
@click.option(
    "--in-place", "-i", "in_place", is_flag=True, help="Write the normalized text back to FILE instead of printing it."
)
@click.option(
    "--drop-unknown",
    is_flag=True,
    help="Remove citations of handles the chat does not have (default: keep them as written).",
)
def normalize(source, chat: str, workspace: int, as_json: bool, in_place: bool, drop_unknown: bool) -> None:
    """Print FILE (default: standard input) with its citations written canonically: [3], [3:L4],
    [3:L4-L6]. FILE itself is left as it is unless --in-place.

    Citations of handles the chat does not have are kept as written and reported on stderr
    (--drop-unknown removes them), ranges clamped, code left alone. A chat with no handles at all
    is an error (exit 1) and FILE is left as it is.

    Examples: echo "Refunds take 30 days [1:L4-6]." | kb cite normalize --chat c1 -w 1;
    kb cite normalize answer.md --in-place --chat c1 -w 1
    """
    from kb.errors import InvalidInput, OutputFileError

    if in_place and source.name in ("-", "<stdin>"):
        raise OutputFileError(
            "--in-place needs a FILE to rewrite, not standard input; name the file "
            "(kb cite normalize answer.md --in-place …) or drop --in-place"
        )
    data = source.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{source.name} is not UTF-8 text (byte {exc.start}); convert it to UTF-8 first") from None
    result = _conversation(workspace, chat).normalize(text, drop_unknown=drop_unknown)
    if in_place:
        _rewrite(source.name, result.text, changed=result.text != text)
    if as_json:
        _echo_json(result.as_json())
        return
    if not in_place:
        click.echo(result.text, nl=not result.text.endswith("\n"))
    if result.unknown:
        action = "dropped" if drop_unknown else "kept, unknown to this chat"
        click.echo(f"kb: {action}: {', '.join(f'[{n}]' for n in result.unknown)}", err=True)
    if result.adjusted:
        click.echo(
            "kb: line ranges adjusted to the documents: "
            + ", ".join(f"{raw} → {citation}" for raw, citation in result.adjusted),
            err=True,
        )
    if result.beyond:
        click.echo(
            "kb: beyond the document's last line, cited as the whole document: "
            + ", ".join(f"{raw} → {citation}" for raw, citation in result.beyond),
            err=True,
        )
    if result.degraded:
        click.echo(f"kb: shown un-numbered, cited as whole documents: {', '.join(map(str, result.degraded))}", err=True)


def _rewrite(name: str, text: str, *, changed: bool) -> None:
    """``kb cite normalize --in-place``: replace the file ``name`` with ``text`` (a temporary file
    renamed over it, with its permissions, so a failure leaves the old file whole); says on stderr
    what it did (stdout stays empty, or the --json result)."""
    import os
    import shutil
    import tempfile

    from kb.errors import OutputFileError

    if not changed:
        click.echo(f"kb: {name}: unchanged, its citations are already canonical", err=True)
        return
    folder = os.path.dirname(os.path.abspath(name))
    try:
        handle, temporary = tempfile.mkstemp(prefix=".kb-normalize-", dir=folder)
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(text.encode("utf-8"))
            shutil.copymode(name, temporary)
            os.replace(temporary, name)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        raise OutputFileError(
            f"cannot rewrite {name}: {exc.strerror or exc}; make it and its folder "
            "writable, or drop --in-place and redirect the output"
        ) from None
    click.echo(f"kb: {name}: citations normalized", err=True)


@cite.command()
@click.argument("citation")
@chat_option
@workspace_option()
@click.option(
    "--follow", is_flag=True, help="Also say where the cited lines are at HEAD (unchanged / changed / deleted)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the resolution as JSON.")
def resolve(citation: str, chat: str, workspace: int, follow: bool, as_json: bool) -> None:
    """Print the text CITATION names, as the chat was shown it (read at the handle's revision).

    Example: kb cite resolve "[1:L3-L4]" --chat c1 -w 1 --follow
    """
    resolution = _conversation(workspace, chat).resolve(citation, follow=follow)
    if as_json:
        _echo_json(resolution.as_json())
    else:
        click.echo(shown_on_terminal(resolution.render()))  # the document's lines, as kb read shows them


@cite.command("list")
@chat_option
@workspace_option()
@click.option("--json", "as_json", is_flag=True, help="Print the handles as JSON.")
def list_(chat: str, workspace: int, as_json: bool) -> None:
    """List the chat's handles: number, numbered or not, revision, path and title.

    Example: kb cite list --chat c1 -w 1
    """
    handles = _conversation(workspace, chat).handles()
    if as_json:
        _echo_json([h.as_json() for h in handles])
    elif not handles:
        click.echo(f"chat {chat!r} has no handles")
    for h in [] if as_json else handles:
        click.echo(
            f"[{h.n}]\t{'numbered' if h.numbered else 'un-numbered'}\t{h.revision[:12]}\t{shown(h.path)}\t{shown(h.title)}"
        )


@cite.command()
@chat_option
@workspace_option()
def forget(chat: str, workspace: int) -> None:
    """Delete the chat's handles (its next search starts again at [1]).

    Example: kb cite forget --chat c1 -w 1
    """
    count = _conversation(workspace, chat).forget()
    click.echo(f"forgot {count} handle{'' if count == 1 else 's'} of chat {chat!r}")


def search_in_chat(workspace: int, chat: str, query: str, k: int):
    """``kb search --chat``: the conversation's search (envelopes cite the chat's handles)."""
    return _conversation(workspace, chat).search(query, k)


def read_in_chat(workspace: int, chat: str | None, path: str, revision: str | None, offset: int, limit: int | None):
    """``kb read [--chat] [--offset --limit]``: a windowed read; registered as a handle with a chat."""
    if chat is None:
        return session.open_kb().read_document(workspace, path, revision).window(offset, limit)
    return _conversation(workspace, chat).read(path, revision, offset, limit)


COMMANDS = [cite]
