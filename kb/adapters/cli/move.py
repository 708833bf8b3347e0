"""``kb mv``: move a document or folder as one revision (SPEC §3), e.g. the fix ``kb fsck`` names
for a path too long to check out. Registered from ``kb.adapters.cli.main``."""

from __future__ import annotations

import click

from kb.paths import MAX_WORKSPACE_ID


@click.command("mv")
@click.argument("source")
@click.argument("destination")
@click.option("--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), required=True,
              help="Workspace id (a positive integer).")
@click.option("--overwrite", is_flag=True, help="Replace a document already at DESTINATION.")
@click.option("--author", help="Author of the revision (default: your user name).")
@click.option("--message", "-m", help="Revision message (default: 'docs: move N files').")
def move(source: str, destination: str, workspace: int, overwrite: bool, author: str | None,
         message: str | None) -> None:
    """Move the document or folder SOURCE to DESTINATION in one revision; history follows it.

    Example: kb mv "/documents/Old name.md" "/documents/Archive/New name.md" --workspace 1
    """
    from kb.adapters.cli.main import _open
    from kb.knowledge_base import default_author

    kb = _open()
    with kb.transaction(workspace, message, author or default_author()) as draft:
        draft.move(source, destination, overwrite=overwrite)
    revision = draft.revision
    click.echo("nothing moved" if revision is None else f"revision {revision.id}: moved {source} to {destination}")
