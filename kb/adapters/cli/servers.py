"""kb's servers (design §13): ``kb serve``, the HTTP JSON API (optionally with the worker
in-process), and ``kb mcp``, kb's tools for AI agents over the Model Context Protocol on stdio.

FastAPI and uvicorn are imported only when ``kb serve`` runs (the ``serve`` extra:
``pip install -e '.[serve]'``). For ``kb mcp``, stdout carries protocol messages only: opening the
knowledge base (embedded server start, migrations), model loading and every log line go to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import sys

import click

from kb.adapters.cli import session
from kb.adapters.cli.options import checked_author, workspace_option
from kb.errors import ConfigurationError
from kb.extras import install_command


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option("--with-worker", is_flag=True, help="Also run the Procrastinate worker in this process.")
@click.option(
    "--concurrency",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="Jobs the in-process worker runs at once.",
)
@click.option(
    "--author",
    callback=checked_author,
    help='Whom MCP turns record as author, "Name <mail>" (default: the API token of each chat).',
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Serve without API tokens: anyone who reaches the port may read, write and delete (trusted networks only).",
)
def serve(
    host: str, port: int, with_worker: bool, concurrency: int, author: str | None, insecure_no_auth: bool
) -> None:
    """Serve the HTTP JSON API (search, read, log, status, turns; OpenAPI docs at /docs, health at
    /health and /ready; the MCP endpoint at /mcp/<workspace>) until SIGTERM or Ctrl-C, which finish in-flight requests and the jobs in
    hand. Point the CLI at it with KB_SERVER_URL=http://HOST:PORT and KB_TOKEN.

    Every route but /health and /ready needs 'Authorization: Bearer <token>' (kb token create);
    a non-loopback --host with no token defined is refused unless --insecure-no-auth.

    Example: kb serve --port 8765 --with-worker
    """
    try:
        from kb.adapters.http.server import serve as run_server
    except ImportError as exc:
        raise ConfigurationError(
            f"kb serve needs the serve extra ({exc.name} is missing): {install_command('serve')}"
        ) from None
    run_server(
        session.settings(),
        host=host,
        port=port,
        with_worker=with_worker,
        concurrency=concurrency,
        mcp_author=author,
        insecure_no_auth=insecure_no_auth,
    )


@click.command("mcp")
@workspace_option()
@click.option(
    "--author", callback=checked_author, help='Whose changes the turns record, "Name <mail>" (default: your user name).'
)
@click.option(
    "--chat",
    "chat_id",
    help="Conversation id: reuse it to keep citation handles and to "
    "recover a turn left by a crashed server (default: a new id per process).",
)
def mcp_command(workspace: int, author: str | None, chat_id: str | None) -> None:
    """Serve kb over MCP on stdin/stdout for one workspace (one conversation and one turn).

    The client's tools: search, read, ls, glob, grep, write, edit, move, remove, mkdir, commit,
    abort, resolve_citation, normalize_citations; documents are resources kb://workspace/N/documents/….
    The turn is committed when the client disconnects.

    Example (an MCP client's server entry): kb mcp --workspace 1 --author "Ada <ada@example.com>"
    """
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, force=True)
    from kb.adapters.mcp.server import run_stdio
    from kb.knowledge_base import default_author

    with contextlib.redirect_stdout(sys.stderr):
        kb = session.open_kb()
        kb.store(workspace).require_exists()  # before the client connects
    run_stdio(kb, workspace_id=workspace, author=author or default_author(), chat_id=chat_id)


COMMANDS = [serve, mcp_command]
