"""The ref-update fence: a settle never answers while a writer that lost its lock may still move
the branch (design §3, "A writer whose lock ended").

A writer moves the branch under the workspace write lock, and the lock is a Postgres session's
(or a Redis lease): it can end while the writer's process goes on. So the writer checks, one round
trip, that its lock is still held, then compare-and-swaps the ref — and between the two its
session may be terminated. Another writer that takes the lock in that gap is safe (its own
compare-and-swap fails and it settles by key), but a *settle* is not: it takes the lock, finds
nothing new in git, sees the key unrecorded and answers "nothing was recorded" — and a moment
later the old holder's ref update lands the very write it answered for.

The fence closes that gap: a writer holds it from *before* its lock check until its ref update
is done, and a settle, once it holds the write lock, passes through it before it reads git's
head. A writer that entered first finishes its update and the settle sees it; one that enters
after the settle took the lock finds its lock gone at the check and moves nothing.

It is an exclusive ``flock`` of ``.git/kb-ref-update.lock``: every process writing the workspace
runs on its home node (design §15), each holder opens its own descriptor (a thread of this process
excludes another), and a killed holder releases it. It is held for one round trip and one fsync.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

FENCE_FILE = "kb-ref-update.lock"
"""The file the fence flocks, under the repository's ``.git``."""

_POLL_SECONDS = 0.01
"""How often a waiter tries the fence again (a blocking flock cannot wait with a bound)."""


class RefFenceTimeout(Exception):
    """The fence stayed held for the whole wait (``waited``, in seconds): a writer is stopped
    between its lock check and its ref update (a process halted by a debugger or SIGSTOP)."""

    def __init__(self, waited: float) -> None:
        self.waited = waited
        super().__init__(f"a writer held the branch's ref-update fence for {waited:g}s")


@contextlib.contextmanager
def ref_fence(git_dir: Path, timeout: float) -> Iterator[None]:
    """Hold the ref-update fence of the repository whose ``.git`` is ``git_dir`` for the block.

    ``timeout``: seconds to wait at most (RefFenceTimeout after it). On a file system that will not open the file for writing (gone read-only) it is
    locked through a read-only descriptor; when it is missing there and cannot be made, no
    writer can hold it (each made it before its ref update, and none can move a ref there), so
    the block runs unfenced. Raises FileNotFoundError when ``git_dir`` is missing (no
    repository), OSError when the lock file cannot be opened or locked otherwise."""
    path = git_dir / FENCE_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if not (isinstance(exc, PermissionError) or exc.errno == errno.EROFS):
            raise
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if not git_dir.is_dir():
                raise
            yield  # never made, and cannot be: nobody is inside it
            return
    try:
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if waited >= timeout:
                    raise RefFenceTimeout(round(waited, 3)) from None
                time.sleep(_POLL_SECONDS)
        yield
    finally:
        os.close(fd)  # releases the flock
