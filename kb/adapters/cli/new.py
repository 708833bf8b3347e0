"""``kb new``: create a document by its title (issue 13; SPEC §2.2, §5), registered from kb.adapters.cli.main."""

from __future__ import annotations

import sys

import click

from kb.paths import MAX_WORKSPACE_ID


@click.command("new")
@click.argument("folder_or_title", metavar="[FOLDER]")
@click.argument("title", required=False, metavar="TITLE")
@click.option("--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), required=True,
              help="Workspace id (a positive integer).")
@click.option("--body", help="The document's text (default: read standard input when it is not a terminal).")
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--committer", help="Who records the revision (default: the author).")
@click.option("--message", "-m", help="Revision message (default: a summary such as 'docs: add 1 file').")
def new(folder_or_title: str, title: str | None, workspace: int, body: str | None, author: str | None,
        committer: str | None, message: str | None) -> None:
    """Create a document titled TITLE in FOLDER (default: /documents, the root); the path law
    picks a safe, unique file name (`` (2)`` when taken) and the title is kept as typed. Prints
    the final path. A workspace that does not exist yet is created (as kb import does).

    \b
    Examples:
      kb new "Client/Server FAQ" -w 1                     # prints /documents/Client_Server FAQ.md
      echo "- ship it" | kb new /documents/Plans "Q3 plan: draft?" -w 1
    """
    from kb.adapters.cli.main import _open

    # One argument is the title (at the root); two are FOLDER TITLE, as before.
    folder, title = ("/documents", folder_or_title) if title is None else (folder_or_title, title)

    if body is None:
        body = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    kb = _open()
    if not kb.store(workspace).exists():  # as kb import does: a first document starts a workspace
        kb.create_workspace(workspace)
        click.echo(f"created workspace {workspace}", err=True)
    with kb.transaction(workspace, message, author, committer) as tx:
        document = tx.create(folder, title, body)
    click.echo(document.path)
