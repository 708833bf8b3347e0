"""Process-wide locks keyed by a file-system path (design §4: threads of one process).

``flock`` excludes other *processes* (and other open file descriptions), but state shared by the
threads of one process — a ``Repository``'s parsed index, the folders two turns create and remove
— also needs a lock that every object in this process naming the same file agrees on, whichever
``KnowledgeBase`` or ``Repository`` instance a thread goes through. ``path_lock(path)`` is that lock:
one ``threading.RLock`` per resolved path, for the life of the process.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_locks: dict[str, threading.RLock] = {}
_registry = threading.Lock()


def path_lock(path: Path | str) -> threading.RLock:
    """The process-wide re-entrant lock of ``path`` (the same object for every spelling of the
    same absolute path). Never raises; the file need not exist."""
    key = os.path.abspath(os.fspath(path))
    lock = _locks.get(key)
    if lock is None:
        with _registry:
            lock = _locks.setdefault(key, threading.RLock())
    return lock
