"""git's lock-file protocol (design §2.1): a file ``X`` is rewritten through ``X.lock``, created
exclusively, written, then renamed over ``X``; whoever cannot create the lock waits a moment for
its holder, as git's own commands wait for each other (``core.filesRefLockTimeout``). kb's writers
of the index file and of the branch ref both take their lock here."""

from __future__ import annotations

import os
import time
from pathlib import Path


def create_lock_file(lock: Path | str, wait_seconds: float) -> int:
    """Create ``lock`` exclusively for writing (mode 0644) and return its descriptor, waiting up
    to ``wait_seconds`` while another process holds it (backing off from 1 ms to 50 ms between
    tries: a person's ``git status`` or ``git gc``'s ``pack-refs`` holds one for a moment).
    Raises FileExistsError when it is still held then, OSError when it cannot be made."""
    deadline = time.monotonic() + wait_seconds
    pause = 0.001
    while True:
        try:
            return os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
