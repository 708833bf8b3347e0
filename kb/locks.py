"""Workspace locks (SPEC §4).

The default write lock is ``pg_advisory_xact_lock(WRITE_LOCK_NAMESPACE, workspace_id)`` taken
inside the Postgres transaction that records the revision: it is released with that transaction
(or with a crashed holder's connection), so there is no TTL to outlive. The wait is bounded by
``KB_LOCK_TIMEOUT`` (seconds) and then raises LockTimeout. If Postgres is unreachable the
transaction never opens, so no git write happens (fail closed). ``locked_transaction`` is the one
entry point writers use; with ``KB_LOCK_BACKEND=redis`` it holds the Redis lock until the Postgres
transaction has committed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import psycopg

from kb import database
from kb.errors import LockTimeout, LockUnavailable
from kb.settings import Settings
from kb.sql import queries

T = TypeVar("T")
log = logging.getLogger(__name__)

WRITE_LOCK_NAMESPACE = 7101
"""Advisory-lock namespace of the per-workspace write lock."""
INDEX_LOCK_NAMESPACE = 7102
"""Advisory-lock namespace of the per-workspace index lock (distinct from the write lock, §4)."""


def advisory_xact_lock(conn: psycopg.Connection, namespace: int, workspace_id: int, timeout: float) -> None:
    """Take ``pg_advisory_xact_lock(namespace, workspace_id)`` in ``conn``'s open transaction.

    Waits at most ``timeout`` seconds, then raises LockTimeout (the transaction is then aborted
    and must be rolled back by the caller's context). Raises LockUnavailable if the connection died.
    """
    try:
        with conn.pipeline():  # one round trip: bound the wait, lock, unbound later statements
            conn.execute(queries["set_lock_timeout"], {"timeout": f"{max(1, int(timeout * 1000))}ms"})
            conn.execute(queries["lock_workspace_write"], {"namespace": namespace, "workspace_id": workspace_id})
            conn.execute(queries["set_lock_timeout"], {"timeout": "0"})
    except psycopg.errors.LockNotAvailable:
        raise LockTimeout(workspace_id, timeout) from None
    except psycopg.OperationalError as exc:
        raise LockUnavailable(f"workspace {workspace_id}: Postgres lost while locking: {exc}") from exc


@contextlib.contextmanager
def index_lock(database_url: str, workspace_id: int, wait: float = 0.0) -> Iterator[bool]:
    """The workspace's index lock (SPEC §4) for the block; yields whether it was taken.

    Tries for up to ``wait`` seconds (every 0.1 s). A transaction-level advisory lock held by a
    transaction kept open on its own connection for the whole block: released when the block ends
    or the holder's connection closes (kill -9), and correct behind a transaction-mode pooler too
    (an open transaction pins its server connection; a session lock would stay behind on a pooled
    one). Used by index runs and the legacy seed.
    """
    params = {"namespace": INDEX_LOCK_NAMESPACE, "workspace_id": workspace_id}
    deadline = time.monotonic() + wait
    with database.transaction(database_url) as conn:
        locked = conn.execute(queries["try_index_lock"], params).fetchone()["locked"]
        while not locked and time.monotonic() < deadline:
            time.sleep(0.1)
            locked = conn.execute(queries["try_index_lock"], params).fetchone()["locked"]
        yield locked


@contextlib.contextmanager
def locked_transaction(
    database_url: str, workspace_id: int, settings: Settings, prepare: Callable[[], T] | None = None
) -> Iterator[tuple[psycopg.Connection, T | None]]:
    """A Postgres transaction holding the workspace write lock until it has committed (SPEC §3, §4).

    Order: take a connection from the process's pool (``kb.database.pool``; unreachable →
    DatabaseUnavailable before anything else runs: fail closed), run ``prepare()`` unlocked (idempotent slow work such as writing blobs), take the lock
    — the Redis lock (``KB_LOCK_BACKEND=redis``) or ``pg_advisory_xact_lock`` inside the
    transaction — then yield ``(conn, prepare's result)``. On a clean exit the transaction commits
    *before* the Redis lock is released, so the next holder always sees this holder's rows; on an
    exception it rolls back. Raises LockTimeout (with the workspace id), LockUnavailable.
    """
    with database.pooled_connection(database_url) as conn:  # a pooled connection: no connect per commit
        prepared = prepare() if prepare is not None else None
        with contextlib.ExitStack() as stack:
            if settings.lock_backend == "redis":
                from kb.redis_lock import RedisLock

                stack.enter_context(RedisLock(settings).hold(workspace_id))
            with conn.transaction():
                if settings.lock_backend != "redis":
                    advisory_xact_lock(conn, WRITE_LOCK_NAMESPACE, workspace_id, settings.lock_timeout)
                locked_at = time.perf_counter()
                yield conn, prepared
        log.debug("workspace %s: write lock held %.3f s", workspace_id, time.perf_counter() - locked_at)
