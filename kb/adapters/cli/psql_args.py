"""The command line ``kb psql`` runs: psql's own options, connected the way kb is.

``kb psql ARGS`` hands ARGS to psql but first puts kb's connection in psql's database position.
psql reads a database named as ``-d NAME``, ``--dbname=NAME`` or its first plain argument, and a
bare name there would replace kb's whole connection with psql's defaults (its default local
socket, which kb's embedded server does not use). So a database name given in any of those forms
becomes kb's connection with that database (same server, user and socket); a connection string
or URL given there is the user's own and is used as given. Every other argument goes to psql
unchanged, in order.
"""

from __future__ import annotations

from psycopg.conninfo import make_conninfo

SHORT_WITH_VALUE = frozenset("cdfFhLopPRTUv")
"""psql's one-letter options that take a value (``psql --help``)."""

LONG_WITH_VALUE = frozenset(
    {
        "command",
        "dbname",
        "file",
        "field-separator",
        "host",
        "log-file",
        "output",
        "port",
        "pset",
        "record-separator",
        "table-attr",
        "username",
        "variable",
        "set",
    }
)
"""psql's long options that take a value (``--name VALUE`` or ``--name=VALUE``)."""


def is_connection_string(text: str) -> bool:
    """True for what psql reads as a whole connection, not a database name: a URL or ``key=value``."""
    return "=" in text or text.startswith(("postgresql://", "postgres://"))


def psql_arguments(database_url: str, args: list[str] | tuple[str, ...]) -> list[str]:
    """psql's arguments (without the program) for ``kb psql ARGS`` on kb's ``database_url``.

    The first is the connection: ``database_url``, or it with the database the user named (``-d
    NAME``, ``--dbname NAME``, ``--dbname=NAME``, ``-tAd NAME``, or the first plain argument);
    a connection string or URL the user gave instead is kept as given. The rest are ARGS without
    that database, in order (a second plain argument stays psql's user name). Raises nothing;
    psql itself reports a malformed command line.
    """
    rest: list[str] = []
    database: str | None = None
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg[2:].partition("=")
            if name == "dbname":
                if not eq:
                    value = items[i] if i < len(items) else ""
                    i += 1
                database = value
                continue
            rest.append(arg)
            if name in LONG_WITH_VALUE and not eq and i < len(items):
                rest.append(items[i])
                i += 1
            continue
        if arg.startswith("-") and len(arg) > 1:
            kept = "-"
            for position, letter in enumerate(arg[1:], start=1):
                if letter not in SHORT_WITH_VALUE:
                    kept += letter
                    continue
                value = arg[position + 1 :]
                if not value and i < len(items):
                    value = items[i]
                    i += 1
                if letter == "d":
                    database = value
                    if kept != "-":
                        rest.append(kept)
                else:
                    rest.extend([kept + letter, value] if value else [kept + letter])
                kept = ""
                break
            if kept and kept != "-":
                rest.append(kept)
            continue
        if database is None:
            database = arg  # psql [OPTION]... [DBNAME [USERNAME]]
            continue
        rest.append(arg)
    if database is None:
        connection = database_url
    elif is_connection_string(database):
        connection = database
    else:
        connection = make_conninfo(database_url, dbname=database)
    return [connection, *rest]
