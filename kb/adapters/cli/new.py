"""``kb new``: create a document by its title (issue 13; SPEC §2.2, §5), registered from kb.adapters.cli.main."""

from __future__ import annotations

import sys

import click

from kb.paths import MAX_WORKSPACE_ID


@click.command("new")
@click.argument("folder")
@click.argument("title")
@click.option("--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), required=True,
              help="Workspace id (a positive integer).")
@click.option("--body", help="The document's text (default: read standard input when it is not a terminal).")
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--committer", help="Who records the revision (default: the author).")
@click.option("--message", "-m", help="Revision message (default: a summary such as 'docs: add 1 file').")
def new(folder: str, title: str, workspace: int, body: str | None, author: str | None,
        committer: str | None, message: str | None) -> None:
    """Create a document in FOLDER titled TITLE; the path law picks a safe, unique file name
    (`` (2)`` when taken) and the title is kept as typed. Prints the final path.

    Example: echo "- ship it" | kb new /documents/Plans "Q3 plan: draft?" -w 1
    """
    from kb.adapters.cli.main import _open

    if body is None:
        body = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    with _open().transaction(workspace, message, author, committer) as tx:
        document = tx.create(folder, title, body)
    click.echo(document.path)
