"""Workspace locks (design §4).

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
from typing import TYPE_CHECKING, TypeVar

import psycopg

from kb.db import database
from kb.db.sql import queries
from kb.errors import LockTimeout, LockUnavailable, WorkspaceMoving, WrongNode
from kb.settings import Settings

if TYPE_CHECKING:
    from kb.db.database import Connection

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)

WRITE_LOCK_NAMESPACE = 7101
"""Advisory-lock namespace of the per-workspace write lock."""
INDEX_LOCK_NAMESPACE = 7102
"""Advisory-lock namespace of the per-workspace index lock (distinct from the write lock, §4)."""
CHUNK_LOCK_NAMESPACE = 7104
"""Advisory-lock namespace of the per-workspace chunk lock (``chunk_lock``)."""

# Lock order of a workspace. A transaction that takes more than one of these takes them in this
# order (it may skip any):
#
#  -1. write-key fence  a byte lock of .git/kb-write-keys.lock (kb.git.key_fence): a caller-keyed write
#                       or settle, before the write lock and never taken while holding it
#   0. write lock       pg_advisory_xact_lock(7101, ws)   locked_transaction / locked_pipeline: store
#                                                          revisions and their catch-up, the artifact
#                                                          layer, fsck, workspace deletion; first
#  0a. ref-update fence an flock of .git/kb-ref-update.lock (kb.git.ref_fence): held by a write-lock
#                       holder across its lock check and ref update only (it waits for nothing
#                       there); every catch-up under the write lock passes through it before it
#                       reads git's head. Only write-lock holders take it, so a waiter (holding the
#                       live lock) waits only for a holder whose session ended (design §3)
#   1. projection lock  pg_advisory_xact_lock(7103, ws)   kb.projection.project; workspace deletion
#   2. chunk lock       pg_advisory_xact_lock(7104, ws)   chunk_lock, taken before any row of 3-5 by:
#        the projection (right after 1), an index run's per-document transaction, the store's
#        catch-up when it records missing revisions, the artifact rule of revert/restore
#        (kb.artifact_rows.guard) and an artifact delete, the legacy seed's identity and chunk
#        adoption, a span-fill batch, the drift check's and the sweep's requeue of documents,
#        workspace deletion (after 0 and 1)
#   3. kb.documents rows                                   upsert / move / delete; the indexed row
#   4. kb.chunks rows, then the statistics rows their triggers keep (kb.lexeme_stats, kb.text_stats,
#      kb.document_terms, kb.document_lexeme_stats, kb.document_text_stats)
#   5. the kb.workspaces row                               set_projected_revision, set_index_stamp,
#                                                          record_revisions, the workspace's deletion
#
# Level 2 exists because levels 3 and 4 cannot be ordered row by row: an index run writes a
# document's chunks in several statements and the projection deletes documents one statement
# at a time (each cascading to chunks), and every statement's trigger locks statistics rows
# (sorted within the statement, not across statements); the indexer also updates its document's
# row after its chunks, and the projection locks document rows in path order over several
# statements. Without the chunk lock a projection that changed document A and deleted document B
# while an index run wrote A's chunks deadlocked ("deadlock detected": the projection waited for a
# statistics row the index run held, the index run for A's row); so did any other writer that
# deletes documents with chunks, writes chunks and then document rows, locks several document or
# chunk rows, or the workspace row before document rows, while a projection of the workspace ran.
#
# Who may skip level 2: a transaction that, when it locks its first row of 3-5, holds no other row
# of 3-5 and locks at most one document row and no chunk or statistics row before it ends (the
# artifact layer's save and revise: their document row, then the workspace row; an index run's
# mark_document_failed; set_index_stamp). It never holds what a projection or an index run waits
# for while it waits itself. Level 2 is never taken by a transaction that already holds a row of
# 3-5 (that inverts the order: it would wait for a projection that waits for its rows).
#
# Level 0 before 1 and 2: no holder of 1 or 2 ever waits for the write lock (the projection and
# index runs never take it), so a writer may wait for the chunk lock while it holds the write lock;
# other writers then wait for the write lock (bounded by KB_LOCK_TIMEOUT). With KB_LOCK_BACKEND=redis
# level 0 is the Redis lock, held around the transaction: the same order holds. The index lock
# (7102) sits outside this order: it is held on a connection of its own and only tried (the seed
# polls it before anything else), never waited for in Postgres.


def advisory_xact_lock(conn: Connection, namespace: int, workspace_id: int, timeout: float) -> None:
    """Take ``pg_advisory_xact_lock(namespace, workspace_id)`` in ``conn``'s open transaction.

    Waits at most ``timeout`` seconds, then raises LockTimeout (the transaction is then aborted
    and must be rolled back by the caller's context). Raises LockUnavailable if the connection died.
    """
    try:
        with conn.pipeline():  # one round trip: bound the wait, lock, unbound later statements
            lock_statements(conn, namespace, workspace_id, timeout)
    except psycopg.errors.LockNotAvailable:
        raise LockTimeout(workspace_id, timeout) from None
    except psycopg.OperationalError as exc:
        raise LockUnavailable(f"workspace {workspace_id}: Postgres lost while locking: {exc}") from exc


def lock_statements(conn: Connection, namespace: int, workspace_id: int, timeout: float) -> None:
    """Queue (in ``conn``'s pipeline or run) the bounded ``pg_advisory_xact_lock(namespace,
    workspace_id)``: waits at most ``timeout`` seconds, then fails with LockNotAvailable."""
    conn.execute(
        queries["lock_workspace_write_bounded"],
        {"timeout": f"{max(1, int(timeout * 1000))}ms", "namespace": namespace, "workspace_id": workspace_id},
    )


def chunk_lock(conn: Connection, workspace_id: int) -> None:
    """Take the workspace's chunk lock in ``conn``'s open transaction (level 2 of the lock order
    above), waiting for it: held until the transaction ends. A transaction that writes several of a
    workspace's document rows, any of its chunk or statistics rows, or document rows after the
    workspace row takes it before it locks any of them (never after: see the order above)."""
    conn.execute(queries["lock_workspace_chunks"], {"namespace": CHUNK_LOCK_NAMESPACE, "workspace_id": workspace_id})


@contextlib.contextmanager
def index_lock(database_url: str, workspace_id: int, wait: float = 0.0) -> Iterator[bool]:
    """The workspace's index lock (design §4) for the block; yields whether it was taken.

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
    database_url: str,
    workspace_id: int,
    settings: Settings,
    prepare: Callable[[], T] | None = None,
    *,
    moving_ok: bool = False,
    anywhere: bool = False,
) -> Iterator[tuple[Connection, T | None]]:
    """A Postgres transaction holding the workspace write lock until it has committed (design §3, §4).

    Order: take a connection from the process's pool (``kb.db.database.pool``; unreachable →
    DatabaseUnavailable before anything else runs: fail closed), run ``prepare()`` unlocked
    (idempotent slow work such as writing blobs), take the lock — the Redis lock
    (``KB_LOCK_BACKEND=redis``) or ``pg_advisory_xact_lock`` inside the transaction — then yield
    ``(conn, prepare's result)``. On a clean exit the transaction commits *before* the Redis lock is
    released, so the next holder always sees this holder's rows; on an exception it rolls back.
    Raises LockTimeout (with the workspace id), LockUnavailable, WorkspaceMoving and WrongNode
    (see ``locked_pipeline``; ``moving_ok`` and ``anywhere`` as there).
    """
    with locked_pipeline(
        database_url,
        workspace_id,
        settings,
        None if prepare is None else (lambda conn: prepare()),
        moving_ok=moving_ok,
        anywhere=anywhere,
    ) as (conn, prepared, _):
        yield conn, prepared


@contextlib.contextmanager
def locked_pipeline(
    database_url: str,
    workspace_id: int,
    settings: Settings,
    prepare: Callable[[Connection], T] | None = None,
    with_lock: Callable[[Connection, T | None], R] | None = None,
    connection: Connection | None = None,
    timeout: float | None = None,
    moving_ok: bool = False,
    anywhere: bool = False,
    before_lock: Callable[[Connection, T | None], None] | None = None,
) -> Iterator[tuple[Connection, T | None, R | None]]:
    """``locked_transaction`` whose ``prepare(conn)`` gets the connection (outside any transaction:
    it may commit work of its own, as group commit's queueing does) and whose ``with_lock(conn,
    prepared)`` runs its statements in the same round trip as taking the lock (it returns cursors,
    read once the block starts). ``connection``: an idle connection the caller holds, used instead
    of one from the pool. ``timeout``: seconds to wait for the lock, instead of
    ``settings.lock_timeout`` (LockTimeout still names the configured one). ``before_lock(conn, prepared)``:
    statements of the transaction queued ahead of the lock in its round trip, so the server runs
    them before it waits for the lock (a big revision's path changes, design §14); the caller
    undoes them under the lock when they turn out not to apply. Yields ``(conn, prepared,
    with_lock's result)``. Raises as ``locked_transaction``.

    Home node and move window (design §15): in the same round trip as the lock, the workspace's
    home node and open move window are read; while a window is open, or when this process's node
    (``KB_NODE``) is not the home and does not share its storage, the transaction rolls back (with
    whatever ``with_lock`` did) and WorkspaceMoving / WrongNode is raised before the block runs.
    The window is opened and the home flipped under this lock, so a writer that held it first has
    committed (its revision is in the copy) and every later one is refused: no revision lands in a
    copy that is not, or is about to stop being, the workspace's. ``moving_ok``: the window does not
    refuse (the settling of a write, ``write_outcome``; the move's catch-up on the home node);
    ``anywhere``: neither check (the move's own Postgres-only transactions, which run on any node).
    """
    with (
        contextlib.nullcontext(connection) if connection is not None else database.pooled_connection(database_url)
    ) as conn:  # pooled: no connect per commit
        prepared = prepare(conn) if prepare is not None else None
        with contextlib.ExitStack() as stack:
            if settings.lock_backend == "redis":
                from kb.db.redis_lock import RedisLock

                stack.enter_context(RedisLock(settings).hold(workspace_id))
            with conn.transaction():
                try:
                    with conn.pipeline():  # one round trip: bound the wait, lock, unbound, then with_lock
                        if before_lock is not None:
                            before_lock(conn, prepared)
                        if settings.lock_backend != "redis":
                            lock_statements(
                                conn,
                                WRITE_LOCK_NAMESPACE,
                                workspace_id,
                                settings.lock_timeout if timeout is None else timeout,
                            )
                        window = (
                            None
                            if anywhere
                            else conn.execute(queries["writes_refused_by_move"], {"workspace_id": workspace_id})
                        )
                        extra = with_lock(conn, prepared) if with_lock is not None else None
                except psycopg.errors.LockNotAvailable:
                    raise LockTimeout(workspace_id, settings.lock_timeout) from None
                except psycopg.OperationalError as exc:
                    raise LockUnavailable(f"workspace {workspace_id}: Postgres lost while locking: {exc}") from exc
                if window is not None and (found := window.fetchone()) is not None:
                    refuse_elsewhere(workspace_id, settings, found, moving_ok)  # rolls back what with_lock did
                locked_at = time.perf_counter()
                yield conn, prepared, extra
        log.debug("workspace %s: write lock held %.3f s", workspace_id, time.perf_counter() - locked_at)


def refuse_elsewhere(workspace_id: int, settings: Settings, found: dict, moving_ok: bool) -> None:
    """Raise WorkspaceMoving when ``found`` (a ``writes_refused_by_move`` row, read under the write
    lock) shows an open move window and not ``moving_ok``; WrongNode when the workspace's home
    node is another node whose storage this process does not share (design §15). A workspace
    without a home node yet (made before nodes) passes."""
    if found["move_id"] is not None and not moving_ok:
        raise WorkspaceMoving(workspace_id, found["target_node"], found["expires_at"], found["retry_after"])
    home = found["home_node"]
    if home is None or home == settings.node:
        return
    from kb.db.nodes import storage_id

    if found["home_storage_id"] is not None and found["home_storage_id"] == storage_id(settings.storage_root):
        return  # a node sharing this storage (a shared file system): the same repository
    raise WrongNode(
        f"workspace {workspace_id} is homed on node {home!r}, not this node {settings.node!r} (it was moved, or "
        f"this process runs as the wrong KB_NODE): nothing was written. Write through node {home!r} (a "
        "`kb serve` forwards it there), or set KB_NODE to the node whose storage root this is",
        node=home,
    )
