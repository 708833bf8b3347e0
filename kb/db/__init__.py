"""Postgres (design §1, §4, §12): connections, the embedded server, named queries, migrations,
the publication and the advisory locks.
"""

from __future__ import annotations

import os

_process_name = "kb"


def name_process(name: str) -> None:
    """Name this process's connections to Postgres from now on: ``application_name`` is ``name``
    and the pid (``application_name``). The CLI names each command's (``kb serve``, ``kb import``),
    so ``kb db-stop`` and ``pg_stat_activity`` tell who is connected (design §13). Kept here, out of
    ``kb.db.database``, so naming costs the CLI no import of psycopg."""
    global _process_name
    _process_name = name


def application_name() -> str:
    """This process's ``application_name`` on its connections, e.g. ``kb serve pid 4242``: at most
    63 bytes, as Postgres keeps (NAMEDATALEN - 1)."""
    return f"{_process_name} pid {os.getpid()}".encode()[:63].decode(errors="ignore")
