"""The write-key fence: writes of one idempotency key, one at a time on the workspace's home
(design §3, "A retry while the first is in flight").

A caller's idempotency key is settled under the write lock (``KnowledgeStore.write_outcome``), but
a write holds that lock only while it records: before it, the writer prepares its change (reads
its turn's worktree, stages blobs, queues its intent). A retry — or a settle — of the same key
that took the write lock in that gap found the key unrecorded and answered "nothing recorded",
and the first write landed a moment later. The fence closes the gap: a keyed write holds its
key's fence from before it prepares until it has answered, and a retry or settle of that key
waits for the fence first, so it answers what the first write did.

The fence is an ``flock`` on one of :data:`STRIPES` files under ``.git/kb-write-keys/`` (by the
key's sha-256), so every process writing the workspace — they all run on its home node, the
only node that writes a workspace (design §15) — agrees on it, and a killed holder releases it.
Keys that share a stripe wait for each other: harmless (each write holds it for one commit), and
the folder never grows past :data:`STRIPES` files. Within a process a per-file re-entrant lock
(``kb.git.process_locks``) comes first, and a thread that holds a stripe may take it again (a
writer settling its own write)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from kb.git.process_locks import path_lock

STRIPES = 256
"""Lock files a workspace's keys are spread over."""

FENCE_FOLDER = "kb-write-keys"
"""The folder of the stripes' lock files, under the repository's ``.git``."""

_POLL_SECONDS = 0.02
"""How often a waiter tries the flock again (``flock`` itself cannot wait with a bound)."""

_held = threading.local()  # .paths: the stripe files this thread holds


class KeyFenceTimeout(Exception):
    """The fence was not taken within the wait: a write of the same key (or of a key sharing its
    stripe) is still in flight in another process. ``waited`` in seconds."""

    def __init__(self, waited: float) -> None:
        self.waited = waited
        super().__init__(f"a write of this idempotency key is still in flight (waited {waited:g}s)")


def stripe_file(git_dir: Path, key: str) -> Path:
    """The lock file of ``key``'s stripe under ``git_dir`` (the repository's ``.git``)."""
    stripe = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:2], "big") % STRIPES
    return git_dir / FENCE_FOLDER / f"{stripe:03d}.lock"


def _open_stripe(lock_file: Path) -> int | None:
    """A descriptor of ``lock_file`` to ``flock`` (read-only: ``flock`` needs no more, and a stripe
    file another user made opens so), created with its folder when missing. None when it is
    missing and the file system refuses to make it (read-only, or not ours to write): every writer
    makes its stripe file before its draft, so no write of the key is in flight — a settle on a
    repository gone read-only answers (design §3). Raises OSError for any other failure."""
    try:
        lock_file.parent.mkdir(exist_ok=True)
        return os.open(lock_file, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
    try:
        return os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def key_fence(git_dir: Path, key: str, timeout: float) -> Iterator[None]:
    """Hold ``key``'s fence for the block (see the module docstring).

    Args: ``git_dir`` the repository's ``.git`` folder; ``key`` the idempotency key as the caller
    gave it; ``timeout`` seconds to wait for another holder. A thread that already holds the
    stripe goes on at once, and so does every caller when the stripe file is missing and the file
    system will not make it (``_open_stripe``). Raises KeyFenceTimeout after ``timeout`` seconds,
    FileNotFoundError when ``git_dir`` does not exist (no repository: nothing to fence), OSError
    when the lock file cannot be opened."""
    lock_file = stripe_file(git_dir, key)
    held: set[Path] = _held.__dict__.setdefault("paths", set())
    if lock_file in held:
        yield
        return
    deadline = time.monotonic() + timeout
    thread_lock = path_lock(lock_file)
    if not thread_lock.acquire(timeout=max(timeout, 0.0)):
        raise KeyFenceTimeout(timeout)
    try:
        if not git_dir.is_dir():
            raise FileNotFoundError(errno.ENOENT, "no repository", str(git_dir))
        fd = _open_stripe(lock_file)
        if fd is None:  # it cannot be made, so no writer holds it: nothing to wait for
            yield
            return
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise KeyFenceTimeout(timeout) from None
                    time.sleep(_POLL_SECONDS)
            held.add(lock_file)
            try:
                yield
            finally:
                held.discard(lock_file)
        finally:
            os.close(fd)  # closing the descriptor releases the flock
    finally:
        thread_lock.release()
