"""A command's session with kb (design §13): its settings, the one ``KnowledgeBase`` it opens and
closes, the client of a running ``kb serve``, and the collector pause of quick commands.

Every command module opens kb through :func:`open_kb` (never ``KnowledgeBase.open`` itself), so
every KnowledgeBase a command opens is closed when the command ends.
"""

from __future__ import annotations

import gc
import os
import sys
from typing import TYPE_CHECKING, TypeGuard

import click

if TYPE_CHECKING:
    from pydantic import ValidationError

    from kb.adapters.http.client import ServerClient
    from kb.knowledge_base import KnowledgeBase
    from kb.settings import Settings

QUICK_COMMANDS = frozenset({"read", "ls", "log", "status", "search", "show", "db-url"})
"""Commands a user runs interactively and waits for; they load their modules with the cyclic
garbage collector paused (design §13)."""


def settings() -> Settings:
    """``kb.settings.Settings()`` from the environment; pydantic is imported only by commands that
    need settings (a command answered by ``kb serve`` never does, design §13). Raises pydantic's
    ValidationError for a refused ``KB_*`` variable (the group turns it into one line)."""
    from kb.settings import Settings

    return Settings()


def open_kb(*, migrate: bool = True, create: bool = False) -> KnowledgeBase:
    """The KnowledgeBase of the running command, closed when the command ends (design §13).

    ``migrate=False`` (``kb init``) leaves the schema to the caller. ``create=True`` for the
    commands that may start a knowledge base from nothing (``kb init``, ``kb import``, ``kb new``,
    ``kb worker``, ``kb seed``, ``kb token create``; ``kb serve`` opens its own); every other command refuses a storage root that holds
    none (KnowledgeBaseNotFound, design §2.1) instead of creating an empty one there. Must run
    inside a click command. Raises DatabaseUnavailable, DatabaseNotReady, MigrationError,
    ConfigurationError.
    """
    from kb.knowledge_base import KnowledgeBase

    # a quick command's first connection is the one that checked the schema (design §13)
    quick = click.get_current_context().info_name in QUICK_COMMANDS
    chosen = settings()
    # the embedded default about to start a knowledge base from nothing: said, with where, since a
    # forgotten or mistyped KB_STORAGE_ROOT otherwise shows only "created workspace 2" (design §2.1)
    new = create and not chosen.database_url and not (chosen.storage_root / "postgres").is_dir()
    if new:
        _refuse_a_new_local_base_beside_a_server(chosen)
    _say_when_local_despite_server()
    try:
        kb = KnowledgeBase.open(chosen, migrate=migrate, reuse_connection=quick, create=create)
    finally:
        modules_loaded()
    if new:
        click.echo(
            f"kb: started a new knowledge base at {chosen.storage_root} (KB_STORAGE_ROOT; "
            "`kb workspaces` lists what it holds)",
            err=True,
        )
    click.get_current_context().call_on_close(kb.close)
    return kb


SERVER_COMMANDS = ("search", "read", "log", "blame", "status")
"""The commands that ask ``kb serve`` when KB_SERVER_URL is set (``server``)."""
PROCESS_COMMANDS = frozenset({"serve", "worker", "mcp", "sweep"})
"""Commands that are kb's own processes: KB_SERVER_URL in their environment concerns others."""


def _say_when_local_despite_server() -> None:
    """With KB_SERVER_URL set, a command that works on this machine's database and storage says
    so on stderr (once): a user who pointed the CLI at a server otherwise cannot tell that
    ``kb ls`` or ``kb mv`` did not go through it (design §13)."""
    if not (os.environ.get("KB_SERVER_URL") or os.environ.get("kb_server_url")):  # noqa: SIM112
        return
    context = click.get_current_context(silent=True)
    if context is None or context.info_name in PROCESS_COMMANDS or context.meta.get("kb.local_said"):
        return
    context.meta["kb.local_said"] = True
    name = context.command_path.removeprefix(context.find_root().info_name or "").strip() or "this command"
    # a command kb serve answers is local only with an option it does not take (`kb search --chat`)
    what = f"`kb {name}` with these options works" if name in SERVER_COMMANDS else f"`kb {name}` works"
    click.echo(
        f"note: {what} on this machine's database and storage, not through KB_SERVER_URL "
        f"(only {', '.join(SERVER_COMMANDS)} ask kb serve)",
        err=True,
    )


def _refuse_a_new_local_base_beside_a_server(chosen: Settings) -> None:
    """With KB_SERVER_URL set, a command that would start a knowledge base from nothing on this
    machine (``kb new``, ``kb import``, ``kb seed``, ``kb token create``) is refused with
    KnowledgeBaseNotFound: the user pointed the CLI at a server, and a write landing in a private
    new embedded Postgres that nobody else sees, answered with success and a note, was lost work
    for them (design §13). ``kb init`` (asked for by name) and kb's own processes still create."""
    from kb.errors import KnowledgeBaseNotFound

    if not (os.environ.get("KB_SERVER_URL") or os.environ.get("kb_server_url")):  # noqa: SIM112
        return
    context = click.get_current_context(silent=True)
    if context is None or context.info_name in PROCESS_COMMANDS or context.info_name == "init":
        return
    name = context.command_path.removeprefix(context.find_root().info_name or "").strip() or "this command"
    raise KnowledgeBaseNotFound(
        f"KB_SERVER_URL is set, but `kb {name}` works on this machine's database and storage, and "
        f"{chosen.storage_root} holds no knowledge base (KB_STORAGE_ROOT): nothing was written. Write "
        "through the server (its turn API, docs/turns.md, or its MCP endpoint), or unset KB_SERVER_URL "
        "to start a knowledge base on this machine (`kb init`)"
    )


def server() -> ServerClient | None:
    """A client of the running ``kb serve`` named by KB_SERVER_URL, or None (design §13); it
    sends KB_TOKEN as its API token (design §16)."""
    # The environment variable itself: no pydantic import on this path (Settings.server_url
    # documents it; settings read names case-insensitively, hence both spellings).
    url = os.environ.get("KB_SERVER_URL") or os.environ.get("kb_server_url")  # noqa: SIM112
    if not url:
        return None
    from kb.adapters.http.client import ServerClient

    modules_loaded()
    token = os.environ.get("KB_TOKEN") or os.environ.get("kb_token")  # noqa: SIM112
    return ServerClient(url, token)


def is_settings_error(exc: Exception) -> TypeGuard[ValidationError]:
    """True for pydantic's ValidationError, told without importing pydantic (a command answered
    by ``kb serve`` never loads it)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(exc, pydantic.ValidationError)


def pause_gc_while_loading(command: str | None) -> None:
    """Pause the cyclic garbage collector while a quick command imports kb's dependencies.

    Importing psycopg, pydantic and dulwich allocates hundreds of thousands of objects that all
    stay alive, so the collections their allocation triggers find nothing to free, yet cost a
    tenth of the start-up (measured by bin/bench_cli_startup.py). ``modules_loaded`` (after
    opening kb) moves those objects out of the collector's view and resumes it; the group resumes
    it in any case when the command ends. Other commands (worker, serve, import) run with the
    collector untouched.
    """
    if command in QUICK_COMMANDS:
        gc.disable()


def modules_loaded() -> None:
    """Resume the collector paused by ``pause_gc_while_loading``, after freezing what start-up
    allocated (those objects live as long as the process: no collection has to walk them)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()
