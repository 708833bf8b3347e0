"""The write-key fence: writes of one idempotency key, one at a time on the workspace's home
(design §3, "A retry while the first is in flight").

A caller's idempotency key is settled under the write lock (``KnowledgeStore.write_outcome``), but
a write holds that lock only while it records: before it, the writer prepares its change (reads
its turn's worktree, stages blobs, queues its intent). A retry — or a settle — of the same key
that took the write lock in that gap found the key unrecorded and answered "nothing recorded",
and the first write landed a moment later. The fence closes the gap: a keyed write holds its
key's fence from before it prepares until it has answered, and a retry or settle of that key
waits for the fence first, so it answers what the first write did.

The fence is a one-byte lock of the file ``.git/kb-write-keys.lock`` at an offset drawn from the
key's sha-256 (62 bits): an open-file-description lock (Linux ``F_OFD_SETLK``), so every process
writing the workspace — they all run on its home node, the only node that writes a workspace
(design §15) — agrees on it, every holder (a thread of this process too) has its own, a killed
holder releases it, and the file never grows. Only writes of the same key wait for each other: a
key sharing a lock with another key (once one of 256 stripe files) made an unrelated write wait
for a long one — a ``kb import`` preparing for minutes — and fail with a false LockTimeout. A
system without such locks (macOS) flocks one of :data:`STRIPES` stripe files instead, keys of a
stripe waiting for each other. A thread that holds a key's fence may take it again (a writer
settling its own write)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

FENCE_FILE = "kb-write-keys.lock"
"""The file whose bytes the keys lock, under the repository's ``.git``."""

STRIPE_FOLDER = "kb-write-keys"
"""Where a system without open-file-description locks (macOS) keeps the stripe files it flocks
instead, under the repository's ``.git``: keys sharing one of :data:`STRIPES` wait for each other."""

STRIPES = 256
"""Stripe files of that fallback."""

BYTE_LOCKS = hasattr(fcntl, "F_OFD_SETLK")
"""Whether this system has open-file-description byte locks (Linux); else the stripes' ``flock``."""

_POLL_SECONDS = 0.02
"""How often a waiter tries the lock again (a blocking ``F_OFD_SETLKW`` cannot wait with a bound)."""

_FLOCK = struct.Struct("hhqqi")
"""Linux's ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (0 for an OFD lock)."""

_held = threading.local()  # .held: the (fence file, key offset or 0 for a stripe) this thread holds


class KeyFenceTimeout(Exception):
    """The fence was not taken within the wait: a write of the same key is still in flight.
    ``waited`` in seconds."""

    def __init__(self, waited: float) -> None:
        self.waited = waited
        super().__init__(f"a write of this idempotency key is still in flight (waited {waited:g}s)")


def key_offset(key: str) -> int:
    """The byte of the fence file that ``key`` locks (62 bits of its sha-256)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") >> 2


def _open_fence(lock_file: Path) -> tuple[int, bool] | None:
    """``(descriptor, exclusive)`` of ``lock_file``, created when missing: read-write, so a key
    is locked for writing (one holder); read-only where the file system will not open it for
    writing (gone read-only, or not ours to write), so a settle there takes a shared lock, which
    still waits for a writer of the key. None when the file is missing and cannot be made: every
    writer makes it before its draft, so no write is in flight — a settle answers (design §3).
    Raises OSError for any other failure."""
    try:
        if not BYTE_LOCKS:  # the stripes' folder (the fence file's is .git itself, never made here)
            lock_file.parent.mkdir(exist_ok=True)
        return os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), True
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
    try:
        return os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC), False
    except FileNotFoundError:
        return None


def _try_lock(fd: int, offset: int, exclusive: bool) -> bool:
    """Lock byte ``offset`` of ``fd``'s file for this open file description (or, without byte
    locks, the whole stripe file with ``flock``); False when another holds it (or, for a shared
    lock, holds it for writing)."""
    try:
        if BYTE_LOCKS:
            kind = fcntl.F_WRLCK if exclusive else fcntl.F_RDLCK
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(kind, os.SEEK_SET, offset, 1, 0))
        else:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def _fence_file(git_dir: Path, offset: int) -> Path:
    """The file ``offset``'s key locks: the one fence file, or (without byte locks) its stripe's."""
    return git_dir / FENCE_FILE if BYTE_LOCKS else git_dir / STRIPE_FOLDER / f"{offset % STRIPES:03d}.lock"


@contextlib.contextmanager
def key_fence(git_dir: Path, key: str, timeout: float) -> Iterator[None]:
    """Hold ``key``'s fence for the block (see the module docstring).

    Args: ``git_dir`` the repository's ``.git`` folder; ``key`` the idempotency key as the caller
    gave it; ``timeout`` seconds to wait for another holder. A thread that already holds the
    key's fence goes on at once, and so does every caller when the fence file is missing and the
    file system will not make it (``_open_fence``). Raises KeyFenceTimeout after ``timeout``
    seconds, FileNotFoundError when ``git_dir`` does not exist (no repository: nothing to fence),
    OSError when the fence file cannot be opened or locked."""
    offset = key_offset(key)
    lock_file = _fence_file(git_dir, offset)
    mine = (lock_file, offset if BYTE_LOCKS else 0)  # a stripe's flock is the whole file's
    held: set[tuple[Path, int]] = _held.__dict__.setdefault("held", set())
    if mine in held:
        yield
        return
    if not git_dir.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no repository", str(git_dir))
    opened = _open_fence(lock_file)
    if opened is None:  # it cannot be made, so no writer holds it: nothing to wait for
        yield
        return
    fd, exclusive = opened
    try:
        deadline = time.monotonic() + timeout
        while not _try_lock(fd, offset, exclusive):
            if time.monotonic() >= deadline:
                raise KeyFenceTimeout(timeout)
            time.sleep(_POLL_SECONDS)
        held.add(mine)
        try:
            yield
        finally:
            held.discard(mine)
    finally:
        os.close(fd)  # closing the descriptor releases its lock
