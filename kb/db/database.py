"""The Postgres connection: a configured server or the embedded Postgres 18 + pgvector (design §13).

``resolve_database_url(settings)`` returns the URL of kb's database, starting the embedded server
(``kb.db.embedded_server``) under ``{storage_root}/postgres`` when ``KB_DATABASE_URL`` is unset.

Every connection kb opens passes through ``configure_connection`` (``connect``, the pool, the
migration runner, Procrastinate's connector through ``configure_async_connection``), which pins
the session settings kb relies on (``SESSION_SETTINGS`` and a ``search_path`` of the job queue's
schema plus pgvector's), so defaults from ``PGOPTIONS``, ``ALTER ROLE … SET`` or
``ALTER DATABASE … SET`` cannot change kb's behaviour.

Behind a transaction-mode pooler (PgBouncer ``pool_mode=transaction``, ``KB_DATABASE_POOLER=transaction``)
a client connection is not a server session: kb then disables server-side prepared statements
(psycopg ``prepare_threshold=None``), sets nothing at session level (it would land on whichever
server connection ran it), and keeps session work — the worker's LISTEN — on
``KB_DIRECT_DATABASE_URL`` when one is given (without one the worker polls).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

import psycopg
from psycopg.rows import DictRow, dict_row

from kb.db import application_name
from kb.db.embedded_server import (  # noqa: F401  (re-exported: callers start servers through here)
    EMBEDDED_DATABASE,
    embedded_bin_dir,
    forget_verified,
    parse_listen,
    postmaster_alive,
    running_server,
    start_embedded,
    stop_embedded,
    stopped_on_purpose,
)
from kb.db.sql import queries
from kb.errors import (
    ConfigurationError,
    DatabaseNotReady,
    DatabaseUnavailable,
    KbError,
    KnowledgeBaseNotFound,
    PermissionDenied,
    StatementCanceled,
    WorkspaceNotFound,
)
from kb.settings import Settings

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

Connection: TypeAlias = "psycopg.Connection[DictRow]"
"""Every connection kb opens (``connect``, the pools) returns rows as dicts (``dict_row``)."""

JOB_QUEUE_SCHEMA = "public"
"""The schema of Procrastinate's tables (where Procrastinate puts them, design §12). kb's
``search_path`` is this schema (plus pgvector's when that lives elsewhere), so Procrastinate's
unqualified names resolve there and its schema is created there, whatever the session default."""

POOLER_MODES = ("none", "transaction")
_transaction_pooled: set[str] = set()
_pool_timeouts: dict[str, float] = {}
_pooled_lock = threading.Lock()


def declare_pooler(url: str, mode: str) -> None:
    """Record that ``url`` reaches Postgres through a pooler in ``mode`` (``KB_DATABASE_POOLER``).

    ``"transaction"``: connections to ``url`` get no server-side prepared statements and no
    session-level settings (see the module docstring). ``"none"``: a plain server session.
    Raises ValueError for another mode.
    """
    if mode not in POOLER_MODES:
        raise ValueError(f"pooler mode {mode!r} is not one of {', '.join(POOLER_MODES)}")
    with _pooled_lock:
        if mode == "transaction":
            _transaction_pooled.add(url)
        else:
            _transaction_pooled.discard(url)


def declare_pool_timeout(url: str, seconds: float) -> None:
    """Record that callers wait at most ``seconds`` for a pooled connection to ``url``
    (``KB_POOL_TIMEOUT``) — kb's pools for it made from now on, and the job queue's."""
    with _pooled_lock:
        _pool_timeouts[url] = seconds


def pool_timeout(url: str) -> float:
    """Seconds a caller waits for a pooled connection to ``url``: its declared
    ``KB_POOL_TIMEOUT``, else ``POOL_TIMEOUT``."""
    return _pool_timeouts.get(url, POOL_TIMEOUT)


def is_transaction_pooled(url: str) -> bool:
    """True when ``url`` was declared to go through a transaction-mode pooler."""
    return url in _transaction_pooled


def require_knowledge_base(settings: Settings) -> None:
    """Raise KnowledgeBaseNotFound when the embedded default (no ``KB_DATABASE_URL``) finds no
    knowledge base in the storage root: no ``{storage_root}/postgres`` folder (design §2.1, §13).
    Creates, starts and deletes nothing: a mistyped ``KB_STORAGE_ROOT`` must not silently become
    a new, empty knowledge base for a command that only reads. With ``KB_DATABASE_URL`` the
    knowledge base is that server's, and a missing root is the store's to report (its
    repositories are missing)."""
    if settings.database_url:
        return
    root = settings.storage_root
    if (root / "postgres").is_dir():
        return
    found = "does not exist" if not root.exists() else "holds no embedded database (no postgres/ folder)"
    raise KnowledgeBaseNotFound(
        f"no knowledge base at {root}: the folder {found}. Check KB_STORAGE_ROOT, or create a "
        "knowledge base there with `kb import FOLDER --workspace 1` or `kb init`"
    )


def resolve_database_url(settings: Settings, *, create: bool = True) -> str:
    """The URL of kb's database: ``KB_DATABASE_URL``, or the embedded server (started if needed,
    listening on TCP too when ``KB_EMBEDDED_LISTEN`` says so). Declares ``KB_DATABASE_POOLER`` for
    a configured URL. ``create=False`` (a command that only reads): raise KnowledgeBaseNotFound
    instead of creating the embedded server in a storage root that has none
    (``require_knowledge_base``). Raises DatabaseUnavailable when the embedded server cannot start."""
    if not create:
        require_knowledge_base(settings)
    if settings.database_url:
        declare_pooler(settings.database_url, settings.database_pooler)
        url = settings.database_url
        if settings.direct_database_url:
            declare_pooler(settings.direct_database_url, "none")
    else:
        url = _start_embedded(settings.storage_root / "postgres", parse_listen(settings.embedded_listen))
    if settings.pool_timeout is not None:
        for declared in filter(None, (url, settings.direct_database_url)):
            declare_pool_timeout(declared, settings.pool_timeout)
    return url


def recheck_embedded(settings: Settings) -> str:
    """``resolve_database_url`` for the embedded server after a connection through its quick
    path failed: forget the recorded check and make the full one (start, ``wal_level``, database).
    Raises DatabaseUnavailable when the server cannot start."""
    pgdata = settings.storage_root / "postgres"
    forget_verified(pgdata)
    return _start_embedded(pgdata, parse_listen(settings.embedded_listen))


_embedded: dict[str, tuple[Path, tuple[str, int] | None]] = {}
"""The URLs of embedded servers this process started or found running, with their data directory
and TCP address (``_start_embedded``): the ones ``_ensure_embedded`` watches."""
_embedded_lock = threading.Lock()
_start_failed: dict[Path, tuple[float, DatabaseUnavailable]] = {}
RESTART_BACKOFF = 10.0
"""Seconds a process waits after a failed restart of its embedded server before it tries again;
meanwhile callers get that failure at once instead of another start attempt each."""


def _start_embedded(pgdata: Path, listen: tuple[str, int] | None) -> str:
    """``start_embedded`` for this process (design §13). The first start in a process is a
    command's own (``kb serve``, ``kb status``…) and starts even a server ``kb db-stop`` stopped;
    a later one (a new thread's KnowledgeBase in ``kb serve``, the supervised worker's restart)
    does not: it raises DatabaseUnavailable saying so (``_refuse_when_stopped``)."""
    pgdata = Path(pgdata).expanduser().resolve()
    if any(known == pgdata for known, _ in _embedded.values()) and not postmaster_alive(pgdata):
        _refuse_when_stopped(pgdata)
    url = start_embedded(pgdata, listen=listen)
    with _embedded_lock:
        _embedded[url] = (pgdata, listen)
    return url


def _refuse_when_stopped(pgdata: Path) -> None:
    """Raise DatabaseUnavailable when the embedded server in ``pgdata`` was stopped on purpose
    (``kb db-stop``) and not started since; return otherwise."""
    at = stopped_on_purpose(pgdata)
    if at is not None:
        raise DatabaseUnavailable(
            f"the embedded Postgres under {pgdata.parent} is not running: `kb db-stop` stopped it "
            f"({at}). `kb db-start` (or any kb command) starts it again"
        )


def _ensure_embedded(url: str) -> None:
    """Before a connection to an embedded server this process started (``_embedded``): when its
    postmaster is gone, raise DatabaseUnavailable at once if ``kb db-stop`` stopped it, else (it
    was killed or crashed) start it again — a long-running ``kb serve`` or ``kb worker`` heals
    itself, as any kb command would have started it. Without this, each pooled connection waited
    ``KB_POOL_TIMEOUT`` (30 s) for a server nobody would start, and was told to check
    KB_DATABASE_URL (design §13). Costs a read of ``postmaster.pid`` and a signal-0 when up."""
    entry = _embedded.get(url)
    if entry is None or postmaster_alive(entry[0]):
        return
    pgdata, listen = entry
    _refuse_when_stopped(pgdata)
    with _embedded_lock:
        if postmaster_alive(pgdata):  # another thread started it meanwhile
            return
        failed = _start_failed.get(pgdata)
        if failed is not None and time.monotonic() - failed[0] < RESTART_BACKOFF:
            raise failed[1]
        try:
            start_embedded(pgdata, listen=listen)
        except DatabaseUnavailable as exc:
            _start_failed[pgdata] = (time.monotonic(), exc)
            raise
        _start_failed.pop(pgdata, None)
    log.warning("the embedded Postgres under %s had stopped (not by kb db-stop): started it again", pgdata.parent)


def connected_clients(pgdata: Path) -> list[tuple[str, int]] | None:
    """Who else is connected to the embedded server in ``pgdata``: ``(application_name,
    connections)`` per client, kb's processes as ``kb <command> pid N`` (``kb.db.application_name``),
    replication senders (Zero) too; None when no server runs there. Raises DatabaseUnavailable when
    it runs but does not answer."""
    server = running_server(Path(pgdata).expanduser().resolve())
    if server is None:
        return None
    with connect(server.url("postgres"), autocommit=True) as conn:
        rows = conn.execute(queries["connected_clients"]).fetchall()
    return [(row["client"], row["connections"]) for row in rows]


def session_database_url(settings: Settings, database_url: str) -> str:
    """The URL for work that needs a real server session (LISTEN): ``KB_DIRECT_DATABASE_URL``, else
    ``database_url`` (which, behind a transaction-mode pooler, cannot LISTEN: the worker polls)."""
    return settings.direct_database_url or database_url


def tcp_database_url(settings: Settings) -> str | None:
    """The embedded server's TCP URL when ``KB_EMBEDDED_LISTEN`` is set (and no KB_DATABASE_URL), else None.

    For clients that need TCP (Rocicorp Zero, GUI tools); starts the server if needed.
    """
    if settings.database_url or not settings.embedded_listen:
        return None
    start_embedded(settings.storage_root / "postgres", listen=parse_listen(settings.embedded_listen))
    server = running_server(settings.storage_root / "postgres")
    return server.tcp_url(EMBEDDED_DATABASE) if server else None


def configure_connection(conn: Connection, *, local: bool = False) -> None:
    """Set on ``conn`` what kb relies on, whatever the session defaults say (design §13).

    One statement (``configure_session`` in sql/queries/connection.sql) pins ``search_path``
    (``JOB_QUEUE_SCHEMA``, then pgvector's schema if different), ``TimeZone`` UTC, ``DateStyle`` ISO,
    ``IntervalStyle``, ``default_transaction_isolation`` read committed, read-write transactions,
    and no ``statement_timeout`` / ``lock_timeout`` / ``idle_in_transaction_session_timeout`` /
    ``transaction_timeout`` (Postgres 17+) (kb
    bounds its own waits, e.g. the write lock's ``KB_LOCK_TIMEOUT``). ``local=True`` sets them for
    the open transaction only (the migration runner, which may be handed any connection); otherwise
    for the session: call it on a fresh connection, whose implicit transaction it then commits.
    Every connection kb opens passes through here. Raises psycopg.Error if the server refuses.
    """
    conn.execute(queries["configure_session"], {"job_schema": JOB_QUEUE_SCHEMA, "local": local})
    if not local and not conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        conn.commit()


async def configure_async_connection(conn: psycopg.AsyncConnection) -> None:
    """``configure_connection`` for an async connection (Procrastinate's connector pool and its
    LISTEN connection); leaves the connection idle, as a pool's ``configure`` must."""
    await conn.execute(queries["configure_session"], {"job_schema": JOB_QUEUE_SCHEMA, "local": False})
    if not conn.autocommit:
        await conn.commit()


def connection_kwargs(url: str) -> dict[str, Any]:
    """Extra psycopg connect arguments for ``url``: no server-side prepared statements behind a
    transaction-mode pooler (they would live on a server connection other clients get), and this
    process's ``application_name`` (``kb.db.application_name``, e.g. ``kb serve pid 4242``: what
    ``kb db-stop`` names, design §13) unless the URL or ``PGAPPNAME`` gives one."""
    kwargs: dict[str, Any] = {"prepare_threshold": None} if is_transaction_pooled(url) else {}
    if not _names_application(url):
        kwargs["application_name"] = application_name()
    return kwargs


@functools.lru_cache(maxsize=64)
def _names_application(url: str) -> bool:
    """Whether connections to ``url`` already get an ``application_name`` (the URL's own, or
    ``PGAPPNAME``): a DBA's choice stands. A URL that does not parse: True (connect reports it)."""
    if os.environ.get("PGAPPNAME"):
        return True
    try:
        return "application_name" in psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return True


def _unavailable(url: str, exc: BaseException) -> DatabaseUnavailable:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    embedded = _embedded.get(url)
    if embedded is not None:  # kb's own server: KB_DATABASE_URL is not set, nothing to check there
        pgdata = embedded[0]
        return DatabaseUnavailable(
            f"cannot connect to the embedded Postgres under {pgdata.parent}: {reason}. "
            f"Its log is {pgdata / 'log'}; `kb db-start` starts it if it is not running"
        )
    return DatabaseUnavailable(
        f"cannot connect to Postgres at {redact(url)}: {reason}. "
        "Check KB_DATABASE_URL, or unset it to use the embedded server."
    )


def _no_pooled_connection(url: str, connections, exc: BaseException) -> DatabaseUnavailable:
    """The KbError for a pool that gave no connection within its timeout: every connection busy
    (too many concurrent callers for POOL_MAX_SIZE), or the server unreachable."""
    stats = connections.get_stats()
    if stats.get("pool_size", 0) >= connections.max_size and not stats.get("pool_available"):
        return DatabaseUnavailable(
            f"all {connections.max_size} pooled connections to Postgres stayed busy for "
            f"{connections.timeout:g} s; retry, or make fewer calls at once from this process"
        )
    return _unavailable(url, exc)


def _lost(exc: BaseException) -> DatabaseUnavailable:
    """The KbError for a connection that broke while in use (server gone, backend terminated)."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return DatabaseUnavailable(f"the connection to Postgres was lost ({reason}); retry when the server is back")


_SESSION_ENDED = frozenset({"57P01", "57P02", "57P03"})
"""SQLSTATEs of a session the server ended: admin_shutdown (``pg_terminate_backend``, a fast
shutdown), crash_shutdown, cannot_connect_now (starting up or shutting down)."""


def connection_lost(exc: BaseException, broken: bool = False) -> bool:
    """True when ``exc`` means the connection to Postgres is gone, whatever psycopg's ``broken``
    flag says (it stays False when the loss surfaces in a pipeline, e.g. "cannot exit pipeline mode
    while busy", or while a pool commits): the connection ``broken``, a session the server ended
    (``_SESSION_ENDED``), a connection exception (SQLSTATE class 08), or an operational error the
    client raised itself with no SQLSTATE ("server closed the connection unexpectedly", "consuming
    input failed", "sending query failed")."""
    if broken:
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = getattr(exc, "sqlstate", None)
    return state is None or state in _SESSION_ENDED or state.startswith("08")


def _operational_error(exc: psycopg.OperationalError, broken: bool) -> KbError | None:
    """The KbError for an operational error of a connection (``broken``: it broke in use), or
    None for one kb does not translate (a lock timeout is the caller's to handle)."""
    if connection_lost(exc, broken):
        return _lost(exc)
    if isinstance(exc, psycopg.errors.QueryCanceled):
        reason = (str(exc).strip().splitlines() or ["canceled"])[0]
        return StatementCanceled(
            f"Postgres canceled this call's statement ({reason}), by an administrator "
            "or a server-side timeout; nothing of it was kept: retry"
        )
    return None


_MISSING_WORKSPACE = re.compile(r"Key \(workspace_id\)=\((\d+)\) is not present in table \"workspaces\"")


def deleted_workspace(exc: BaseException) -> WorkspaceNotFound | None:
    """WorkspaceNotFound when ``exc`` is a write referring to a workspace row that is not there (a
    foreign key to kb.workspaces: the workspace was deleted while the call ran, design §2.1), else
    None. Every table's workspace_id references kb.workspaces, so this covers each of them."""
    if not isinstance(exc, psycopg.errors.ForeignKeyViolation):
        return None
    found = _MISSING_WORKSPACE.search(exc.diag.message_detail or "")
    if found is None:
        return None
    return WorkspaceNotFound(
        f"workspace {found.group(1)} was deleted while this call ran; nothing was "
        "recorded. `kb workspaces` lists the workspaces there are"
    )


def permission_denied(exc: BaseException | None) -> PermissionDenied | None:
    """The PermissionDenied of a Postgres "permission denied" (42501), else None (design §16)."""
    if not isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return None
    role = exc.diag.message_primary or str(exc)
    return PermissionDenied(
        f"kb's database role may not do this ({role}); connect as a role that may (sql/roles.sql: "
        "kb_writer for kb's processes, kb_reader only reads)"
    )


@contextlib.contextmanager
def _lost_raises_unavailable(conn: Connection) -> Iterator[None]:
    """Inside the block, ``conn`` breaking (server gone, backend terminated) raises
    DatabaseUnavailable, a canceled statement StatementCanceled, and a write to a workspace
    deleted meanwhile WorkspaceNotFound (``deleted_workspace``); other errors of a healthy
    connection pass unchanged."""
    try:
        yield
    except psycopg.OperationalError as exc:
        if (translated := _operational_error(exc, conn.broken)) is None:
            raise
        raise translated from exc
    except psycopg.errors.ForeignKeyViolation as exc:
        raise (deleted_workspace(exc) or exc) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise (permission_denied(exc) or exc) from exc


class KbConnection(psycopg.Connection[DictRow]):
    """A psycopg connection whose ``with`` block turns a lost connection (the server went away, the
    backend was terminated) into DatabaseUnavailable, a canceled statement into StatementCanceled
    and a write to a workspace deleted meanwhile into WorkspaceNotFound, so no raw psycopg error
    escapes kb's facade (design §14). Other errors of a healthy connection (a lock timeout, another
    constraint) pass unchanged."""

    def __exit__(self, exc_type, exc_val, exc_tb):
        try:
            super().__exit__(exc_type, exc_val, exc_tb)  # commits a block that ended cleanly
        except psycopg.OperationalError as exc:  # the session ended before that commit
            if exc_val is not None or (translated := _operational_error(exc, self.broken)) is None:
                raise
            raise translated from exc
        if (
            isinstance(exc_val, psycopg.OperationalError)
            and (translated := _operational_error(exc_val, self.broken)) is not None
        ):
            raise translated from exc_val
        if (missing := deleted_workspace(exc_val)) is not None:
            raise missing from exc_val
        if (denied := permission_denied(exc_val)) is not None:
            raise denied from exc_val


PARKED_SECONDS = 5.0
"""How long a connection handed to ``park`` waits for the next ``connect`` before it is closed instead."""
_parked: dict[str, tuple[Connection, float]] = {}
_parked_lock = threading.Lock()


def park(conn: Connection, url: str) -> None:
    """Keep ``conn`` (opened by ``connect(url)``, idle) for this process's next ``connect(url)``
    within PARKED_SECONDS, which gets it instead of a new session: a one-shot command that opened
    a connection to check the schema then runs its own work on it, paying one connection set-up
    instead of two (design §13). A connection not idle (in a transaction), or broken, is closed
    instead; one kept longer than PARKED_SECONDS is closed by the next ``connect``, which opens its
    own (a session idle for long may have been ended by the server)."""
    if conn.closed or conn.broken or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.close()
        return
    with _parked_lock:
        replaced = _parked.pop(url, None)
        _parked[url] = (conn, time.monotonic())
    if replaced is not None:
        replaced[0].close()


def check_then_park(conn: Connection, url: str, check: Callable[[Connection], bool]) -> bool:
    """``check(conn)`` in a transaction of its own on ``conn`` (from ``connect(url)``); when it
    answers True the connection is parked (``park``) for the next ``connect(url)``, otherwise (or
    when it raises) closed. A connection lost meanwhile raises DatabaseUnavailable, as in a
    ``with connect(url)`` block."""
    try:
        with _lost_raises_unavailable(conn):
            answer = check(conn)
            conn.commit()  # ends the check's transaction: the connection is idle again
    except BaseException:
        conn.close()
        raise
    if answer:
        park(conn, url)
    else:
        conn.close()
    return answer


def _take_parked(url: str, autocommit: bool) -> Connection | None:
    """The connection ``park`` kept for ``url`` when it is still fresh and open, else None."""
    if not _parked:
        return None
    with _parked_lock:
        parked = _parked.pop(url, None)
    if parked is None:
        return None
    conn, since = parked
    if conn.closed or conn.broken or time.monotonic() - since > PARKED_SECONDS:
        conn.close()
        return None
    conn.autocommit = autocommit  # idle, so psycopg allows the switch
    return conn


def connect(url: str, *, autocommit: bool = False) -> Connection:
    """Open a psycopg connection with dict rows, configured by ``configure_connection`` (not behind
    a transaction-mode pooler, see the module docstring), or take the one ``park`` kept for ``url``.
    Raises DatabaseUnavailable naming the server; used as a context manager, a connection lost
    inside the block raises DatabaseUnavailable."""
    parked = _take_parked(url, autocommit)
    if parked is not None:
        return parked
    _ensure_embedded(url)
    try:
        conn = KbConnection.connect(url, autocommit=autocommit, row_factory=dict_row, **connection_kwargs(url))
    except psycopg.OperationalError as exc:
        raise _unavailable(url, exc) from exc
    except psycopg.ProgrammingError as exc:  # not a URL or conninfo string at all: a typo in a setting
        raise ConfigurationError(
            f"the database URL is not a Postgres URL or connection string ({str(exc).strip()}); check KB_DATABASE_URL, "
            "e.g. postgresql://user@host:5432/dbname, or unset it to use the embedded server"
        ) from None
    try:
        if not is_transaction_pooled(url):
            configure_connection(conn)
    except psycopg.OperationalError as exc:  # the session ended while it was being set up
        conn.close()
        raise (_operational_error(exc, conn.broken) or _unavailable(url, exc)) from exc
    except BaseException:
        conn.close()
        raise
    return conn


_pools: dict[str, ConnectionPool[Connection]] = {}
_pools_lock = threading.Lock()
POOL_MIN_SIZE = 2
"""Connections a pool keeps open (it grows to POOL_MAX_SIZE while callers wait)."""
POOL_MAX_SIZE = 8
POOL_TIMEOUT = 30.0


def _pool_configure(url: str):
    pooled = is_transaction_pooled(url)

    def configure(conn: Connection) -> None:
        conn.row_factory = dict_row
        if not pooled:
            configure_connection(conn)
        conn.commit()  # leave the connection idle, as the pool requires

    return configure


def _check_or_sweep(swept: list):
    """The pool's checkout check: one round trip (``check_connection``); when it fails, every idle
    connection of the pool (``swept[0]``) is checked at once and the dead ones replaced before the
    failure is raised. psycopg_pool itself checks one connection per attempt and backs off 1, 2,
    4 … s between failed ones, so after a server restart ended all 8 idle connections the next
    caller waited 30 s and got DatabaseUnavailable; now it waits about one back-off (~1 s)."""
    from psycopg_pool import ConnectionPool

    def check(conn: Connection) -> None:
        try:
            ConnectionPool.check_connection(conn)
        except Exception:
            if swept:
                swept[0].check()  # the others most likely ended with it
            raise

    return check


def pool(url: str, *, autocommit: bool = False) -> ConnectionPool[Connection]:
    """The process-wide connection pool for ``url`` (created and opened on first use).

    Connections have dict rows and are configured by ``configure_connection``. Pools are closed by
    ``close_pools()`` (also at interpreter exit). Raises DatabaseUnavailable when the server cannot
    be reached within ``pool_timeout(url)`` seconds (``KB_POOL_TIMEOUT``, default ``POOL_TIMEOUT``).

    ``autocommit``: a separate pool for one-statement reads on a hot path (the token check of
    every HTTP request, design §16): autocommit connections and no checkout probe, so a statement
    costs one round trip, not three (probe, statement, COMMIT). A connection whose backend ended
    while idle fails its statement instead of being replaced first; its caller retries once.
    """
    from psycopg_pool import ConnectionPool, PoolTimeout  # only processes that pool load it (design §13)

    key = f"{url}\x00autocommit" if autocommit else url
    with _pools_lock:
        existing = _pools.get(key)
        if existing is not None and not existing.closed:
            return existing
        connect(url).close()  # an unreachable server fails now (DatabaseUnavailable), not after POOL_TIMEOUT
        swept: list[ConnectionPool[Connection]] = []
        created = ConnectionPool(
            url,
            min_size=POOL_MIN_SIZE,
            max_size=POOL_MAX_SIZE,
            configure=_pool_configure(url),
            kwargs={**connection_kwargs(url), **({"autocommit": True} if autocommit else {})} or None,
            # one round trip per checkout, so a connection whose backend ended while idle (a
            # server restart, pg_terminate_backend) is replaced instead of failing its caller
            check=None if autocommit else _check_or_sweep(swept),
            timeout=pool_timeout(url),
            open=False,
            name="kb",
        )
        swept.append(created)
        try:
            created.open(wait=True, timeout=pool_timeout(url))
        except PoolTimeout as exc:  # the server answered just now: the wait was too short for it
            created.close()
            raise DatabaseUnavailable(
                f"Postgres at {redact(url)} answers, but kb's connection pool did not open its "
                f"{POOL_MIN_SIZE} connections within {pool_timeout(url):g} s: raise KB_POOL_TIMEOUT "
                "(seconds; default 30)"
            ) from exc
        except psycopg.OperationalError as exc:
            created.close()
            raise _unavailable(url, exc) from exc
        _pools[key] = created
        return created


@contextlib.contextmanager
def pooled_connection(url: str, *, autocommit: bool = False) -> Iterator[Connection]:
    """A pooled connection (dict rows, not autocommit) for the block; the pool takes it back after.
    ``autocommit``: from the autocommit pool (see ``pool``), for a one-statement read.

    An open transaction is committed on a clean exit and rolled back on error (psycopg_pool's rule).
    Raises DatabaseUnavailable when no connection can be had within ``POOL_TIMEOUT`` seconds (or the
    connection breaks in use), StatementCanceled for a statement Postgres canceled, and
    WorkspaceNotFound for a write to a workspace deleted meanwhile (``deleted_workspace``).
    """
    from psycopg_pool import PoolClosed, PoolTimeout

    broken = False
    _ensure_embedded(url)
    connections = pool(url, autocommit=autocommit)
    try:
        with connections.connection() as conn:
            try:
                yield conn
            except psycopg.OperationalError:
                broken = conn.broken
                raise
        # (the pool's COMMIT on a clean exit may find the connection lost: translated below)
    except PoolTimeout as exc:
        raise _no_pooled_connection(url, connections, exc) from exc
    except PoolClosed as exc:
        raise DatabaseUnavailable(
            "kb's connection pool was closed while this call was starting (the "
            "process is shutting down); retry in a process that is not"
        ) from exc
    except psycopg.OperationalError as exc:
        if (translated := _operational_error(exc, broken)) is None:
            raise
        raise translated from exc
    except psycopg.errors.ForeignKeyViolation as exc:
        raise (deleted_workspace(exc) or exc) from exc
    except psycopg.errors.InsufficientPrivilege as exc:
        raise (permission_denied(exc) or exc) from exc


@contextlib.contextmanager
def pooled_transaction(url: str) -> Iterator[Connection]:
    """Like ``transaction`` on a pooled connection: committed on clean exit, rolled back on error."""
    with pooled_connection(url) as conn:
        with conn.transaction():
            yield conn


def close_pools() -> None:
    """Close every connection pool this process opened, and a connection ``park`` still keeps
    (idempotent)."""
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for each in pools:
        each.close()
    with _parked_lock:
        parked = [conn for conn, _since in _parked.values()]
        _parked.clear()
    for conn in parked:
        conn.close()


atexit.register(close_pools)

_inherited: list[ConnectionPool[Connection] | Connection] = []


def _forget_pools_after_fork() -> None:
    """In a forked child: the parent's pooled and parked connections share its sockets, so the
    child must neither use nor close them (closing would end the parent's sessions). They are set
    aside, referenced forever so no finalizer runs, and the child opens its own on demand."""
    global _pools_lock, _parked_lock
    _inherited.extend(_pools.values())
    _pools.clear()
    _pools_lock = threading.Lock()
    _inherited.extend(conn for conn, _since in _parked.values())  # the parent's sessions too
    _parked.clear()
    _parked_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools_after_fork)


def redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and ``kb status``)."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable database URL>"
    if info.get("password"):
        info["password"] = "***"
    return psycopg.conninfo.make_conninfo("", **info)


@contextlib.contextmanager
def transaction(url: str) -> Iterator[Connection]:
    """A connection inside one transaction: committed on clean exit, rolled back on error."""
    conn = connect(url)
    try:
        with _lost_raises_unavailable(conn), conn.transaction():
            yield conn
    finally:
        conn.close()


def require_pgvector(conn: Connection, url: str) -> None:
    """Raise DatabaseNotReady if the server cannot provide pgvector ≥ 0.5 (design §13)."""
    row = conn.execute(queries["pgvector_available"]).fetchone()
    if row is None:
        raise DatabaseNotReady(
            f"the Postgres server at {redact(url)} has no pgvector extension. Install pgvector ≥ 0.5 "
            "on it (e.g. the pgvector/pgvector Docker image), or unset KB_DATABASE_URL to use "
            "kb's embedded Postgres, which ships it."
        )
    major, minor = (int(p) for p in row["default_version"].split(".")[:2])
    if (major, minor) < (0, 5):
        raise DatabaseNotReady(f"pgvector {row['default_version']} on {redact(url)} is too old; kb needs ≥ 0.5.")
