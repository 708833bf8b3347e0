"""``kb serve`` (SPEC §13, issue 15): the HTTP JSON API, optionally with the worker in-process.

Registered from ``kb/adapters/cli/main.py``; FastAPI and uvicorn are imported only when the command runs (the
``serve`` extra: ``pip install -e '.[serve]'``).
"""

from __future__ import annotations

import click

from kb.errors import ConfigurationError


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535), help="TCP port.")
@click.option("--with-worker", is_flag=True, help="Also run the Procrastinate worker in this process.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1),
              help="Jobs the in-process worker runs at once.")
@click.option("--author", help='Whom MCP turns record as author, "Name <mail>" (default: your user name).')
def serve(host: str, port: int, with_worker: bool, concurrency: int, author: str | None) -> None:
    """Serve the HTTP JSON API (search, read, log, status, turns; OpenAPI docs at /docs, health at
    /health and /ready; the MCP endpoint at /mcp/<workspace>) until SIGTERM or Ctrl-C, which finish in-flight requests and the jobs in
    hand. Point the CLI at it with KB_SERVER_URL=http://HOST:PORT.

    Example: kb serve --port 8765 --with-worker
    """
    try:
        from kb.adapters.http.server import serve as run_server
    except ImportError as exc:
        raise ConfigurationError(
            f"kb serve needs the serve extra ({exc.name} is missing): pip install -e '.[serve]'"
        ) from None
    from kb.settings import Settings

    run_server(Settings(), host=host, port=port, with_worker=with_worker, concurrency=concurrency,
               mcp_author=author)
