"""``kb mcp``: kb's tools for AI agents over the Model Context Protocol on stdio (issue 16).

stdout carries protocol messages only: opening the knowledge base (embedded server start,
migrations), model loading and every log line go to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import sys

import click

from kb.paths import MAX_WORKSPACE_ID


@click.command("mcp")
@click.option("--workspace", "-w", "workspace", type=click.IntRange(min=1, max=MAX_WORKSPACE_ID), required=True,
              help="Workspace id (a positive integer).")
@click.option("--author", help='Whose changes the turns record, "Name <mail>" (default: your user name).')
@click.option("--chat", "chat_id", help="Conversation id: reuse it to keep citation handles and to "
              "recover a turn left by a crashed server (default: a new id per process).")
def mcp_command(workspace: int, author: str | None, chat_id: str | None) -> None:
    """Serve kb over MCP on stdin/stdout for one workspace (one conversation and one turn).

    The client's tools: search, read, ls, glob, grep, write, edit, move, remove, mkdir, commit,
    abort, resolve_citation, normalize_citations; documents are resources kb://workspace/N/documents/….
    The turn is committed when the client disconnects.

    Example (an MCP client's server entry): kb mcp --workspace 1 --author "Ada <ada@example.com>"
    """
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, force=True)
    from kb.knowledge_base import KnowledgeBase, default_author
    from kb.adapters.mcp.server import run_stdio
    from kb.settings import Settings

    with contextlib.redirect_stdout(sys.stderr):
        kb = KnowledgeBase.open(Settings())
        kb.store(workspace).repository  # noqa: B018  (WorkspaceNotFound before the client connects)
    run_stdio(kb, workspace_id=workspace, author=author or default_author(), chat_id=chat_id)
