"""A fast updater for a workspace's git index file (``.git/index``, format versions 2 and 3).

The working tree is refreshed after every commit (design §2.1) so ``git status`` stays clean. That
needs the index entries of the changed paths updated. dulwich parses and re-serializes every entry
in Python on each write (~0.25 s per write at 20k documents, inside the write lock), so this module
keeps the parsed index in memory as raw per-entry byte strings, replaces only the changed entries,
and writes header + entries + checksum in one go. The cache is trusted only while the file's
(inode, size, mtime) are the ones it last wrote or read; otherwise the file is parsed again.

Optional extensions (cache-tree ``TREE``, untracked cache ``UNTR``, ``EOIE``, ``IEOT``) are dropped
on write — git rebuilds them — which also keeps a stale cache-tree from ever describing the new
tree wrongly. Index v4 (path compression) and split or sparse indexes raise
:class:`UnsupportedIndex`; the caller then falls back to dulwich.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import struct
import time
from pathlib import Path

from kb.git.process_locks import path_lock

_HEADER = struct.Struct(">4sLL")
_ENTRY = struct.Struct(">LLLLLLLLLL20sH")  # ctime s/ns, mtime s/ns, dev, ino, mode, uid, gid, size, sha, flags
_FLAGS = struct.Struct(">H")
_EXTENDED = 0x4000
_NAMEMASK = 0x0FFF
LOCK_WAIT_SECONDS = 2.0
"""How long ``write`` waits for another process's ``index.lock`` before giving up."""
_SAFE_EXTENSIONS = {b"TREE", b"UNTR", b"EOIE", b"IEOT", b"REUC", b"FSMN"}


class UnsupportedIndex(Exception):
    """The index uses a format this updater does not handle (v4, split index, sparse index)."""


def _entry_length(name_length: int, extended: bool) -> int:
    fixed = _ENTRY.size + (2 if extended else 0)
    return (fixed + name_length + 8) & ~7


def order_problem(path: Path) -> str | None:
    """What breaks git's order in the index file at ``path``: a path listed twice at one stage
    (``'documents/a.md' is listed twice``) or entries out of order (``unordered entries at …``),
    as two writers at once once left it — ``git status`` then shows committed files as added and
    ``git fsck`` dies with "unordered stage entries in index"; ``git ls-files`` does not check.
    None when the order is sound, the file is absent, or its format is not parsed here (v4,
    split) — git's own read is the check for those. Raises OSError when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _HEADER.size + 20:
        return "the index file is truncated"
    magic, version, count = _HEADER.unpack_from(data, 0)
    if magic != b"DIRC" or version not in (2, 3):
        return None
    offset, previous = _HEADER.size, None
    for _ in range(count):
        if offset + _ENTRY.size > len(data) - 20:
            return "the index file is truncated"
        flags = _FLAGS.unpack_from(data, offset + _ENTRY.size - 2)[0]
        start = offset + _ENTRY.size + (2 if flags & _EXTENDED else 0)
        length = flags & _NAMEMASK
        if length == _NAMEMASK:
            length = data.index(b"\0", start) - start
        key = (data[start : start + length], (flags >> 12) & 3)
        if previous is not None and key <= previous:
            name = key[0].decode(errors="replace")
            return (
                f"'{name}' is listed twice (unordered stage entries)"
                if key == previous
                else f"unordered stage entries at '{name}'"
            )
        previous = key
        offset += (start - offset + length + 8) & ~7
    return None


class IndexFile:
    """The parsed index of one repository: sorted paths and their raw entry bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.version = 2
        self.names: list[bytes] = []
        self.entries: list[bytes] = []
        self._signature: tuple[int, int, int] | None = None

    def _stat_signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def load(self) -> None:
        """(Re)parse the file unless it is unchanged since this object last read or wrote it."""
        signature = self._stat_signature()
        if signature is not None and signature == self._signature:
            return
        self.names, self.entries, self.version = [], [], 2
        if signature is None:
            self._signature = None
            return
        data = self.path.read_bytes()
        magic, version, count = _HEADER.unpack_from(data, 0)
        if magic != b"DIRC" or version not in (2, 3):
            raise UnsupportedIndex(f"index version {version} is not handled here")
        self.version = version
        # One pass, inlined (this runs whenever another process wrote the index: O(entries) in
        # Python, so per entry only the flags are unpacked).
        offset, names, entries = _HEADER.size, self.names, self.entries
        flags_of, fixed = _FLAGS.unpack_from, _ENTRY.size
        for _ in range(count):
            flags = flags_of(data, offset + fixed - 2)[0]
            start = offset + fixed + (2 if flags & _EXTENDED else 0)
            length = flags & _NAMEMASK
            if length == _NAMEMASK:
                length = data.index(b"\0", start) - start
            end = offset + ((start - offset + length + 8) & ~7)
            names.append(data[start : start + length])
            entries.append(data[offset:end])
            offset = end
        while offset < len(data) - 20:  # extensions: 4-byte signature, 4-byte size, payload
            signature_bytes, size = struct.unpack_from(">4sL", data, offset)
            if signature_bytes not in _SAFE_EXTENSIONS:
                raise UnsupportedIndex(f"index extension {signature_bytes!r} is not handled here")
            offset += 8 + size
        self._signature = signature

    def update(self, path: bytes, st: os.stat_result | None, sha_hex: str | None, mode: int = 0o100644) -> None:
        """Set (``st`` and ``sha_hex`` given) or delete (None) the stage-0 entry of ``path``."""
        i = bisect.bisect_left(self.names, path)
        present = i < len(self.names) and self.names[i] == path
        if st is None:
            if present:
                del self.names[i], self.entries[i]
            return
        flags = min(len(path), _NAMEMASK)
        head = _ENTRY.pack(
            int(st.st_ctime) & 0xFFFFFFFF,
            st.st_ctime_ns % 1_000_000_000,
            int(st.st_mtime) & 0xFFFFFFFF,
            st.st_mtime_ns % 1_000_000_000,
            st.st_dev & 0xFFFFFFFF,
            st.st_ino & 0xFFFFFFFF,
            mode,
            st.st_uid & 0xFFFFFFFF,
            st.st_gid & 0xFFFFFFFF,
            st.st_size & 0xFFFFFFFF,
            bytes.fromhex(sha_hex),
            flags,
        )
        entry = head + path + b"\0" * (_entry_length(len(path), False) - len(head) - len(path))
        if present:
            self.entries[i] = entry
        else:
            self.names.insert(i, path)
            self.entries.insert(i, entry)

    def move_many(self, pairs: list[tuple[bytes, bytes]]) -> set[bytes]:
        """Give the stage-0 entry of each ``old`` the path ``new`` (``(old, new)`` pairs), its stat
        data and blob kept: for files whose folder was renamed on disk, which leaves the files' own
        inodes untouched. One re-sort for the batch. Returns the ``new`` paths done; a pair whose
        ``old`` has no plain entry, or whose ``new`` already has one, is left alone."""
        by_name = dict(zip(self.names, self.entries))
        done: set[bytes] = set()
        if len(by_name) != len(self.names):  # conflict stages share a name: leave such an index alone
            return done
        for old, new in pairs:
            entry = by_name.get(old)
            if entry is None or new in by_name:
                continue
            fields = _ENTRY.unpack_from(entry, 0)
            if fields[11] & _EXTENDED:
                continue
            head = _ENTRY.pack(*fields[:11], (fields[11] & ~_NAMEMASK) | min(len(new), _NAMEMASK))
            del by_name[old]
            by_name[new] = head + new + b"\0" * (_entry_length(len(new), False) - len(head) - len(new))
            done.add(new)
        if done:
            self.names = sorted(by_name)
            self.entries = [by_name[name] for name in self.names]
        return done

    def describes(self, path: bytes, st: os.stat_result, sha_hex: str) -> bool:
        """True when the entry of ``path`` records blob ``sha_hex`` and the file's ``st`` (size,
        mtime, inode) is unchanged since: the file on disk holds exactly that blob."""
        i = bisect.bisect_left(self.names, path)
        if i == len(self.names) or self.names[i] != path:
            return False
        fields = _ENTRY.unpack_from(self.entries[i], 0)
        return (
            fields[10] == bytes.fromhex(sha_hex)
            and fields[9] == st.st_size & 0xFFFFFFFF
            and fields[2] == int(st.st_mtime) & 0xFFFFFFFF
            and fields[3] == st.st_mtime_ns % 1_000_000_000
            and fields[5] == st.st_ino & 0xFFFFFFFF
        )

    def write(self) -> None:
        """Write header + entries + SHA-1 through ``index.lock`` and an atomic rename, holding the
        process-wide lock of the index file (``kb.git.process_locks``): two threads of one process
        never write it at once, whichever object they hold. Callers hold ``worktree_lock`` too
        (the parsed entries are shared state). Raises OSError (``FileExistsError`` when another
        process holds ``index.lock`` longer than LOCK_WAIT_SECONDS)."""
        with path_lock(self.path):
            self._write()

    def _write(self) -> None:
        body = _HEADER.pack(b"DIRC", self.version, len(self.entries)) + b"".join(self.entries)
        lock = self.path.with_name(self.path.name + ".lock")
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:  # a person's `git status` may hold index.lock for a moment
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        try:
            view = memoryview(body + hashlib.sha1(body).digest())
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(lock, self.path)
        self._signature = self._stat_signature()
