"""``kb ls``: a folder's documents and folders at a revision, mirroring ``KnowledgeBase.ls`` (the
committed counterpart of the MCP ``ls`` tool, ``Turn.ls``). Registered from ``kb.adapters.cli.main``."""

from __future__ import annotations

import json

import click

from kb.paths import MAX_WORKSPACE_ID


@click.command("ls")
@click.argument("folder", default="/documents")
@click.option("--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), required=True,
              help="Workspace id (a positive integer).")
@click.option("--revision", "-r", help="Revision id (default: HEAD).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of {name, path, kind} (as the MCP ls tool).")
def ls(folder: str, workspace: int, revision: str | None, as_json: bool) -> None:
    """List FOLDER (default: /documents): its folders, then its documents, one path a line
    (folders end in /); a document's path lists itself.

    Example: kb ls "/documents/Notes" --workspace 1
    """
    from kb.adapters.cli.main import _open
    from kb.adapters.json_form import json_form

    entries = _open().ls(workspace, folder, revision)
    if as_json:
        click.echo(json.dumps(json_form(entries), ensure_ascii=False, indent=2))
        return
    for entry in entries:
        click.echo(entry.path + ("/" if entry.kind == "folder" else ""))
