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
import itertools
import os
import struct
from pathlib import Path

from kb.git.byte_diff import repeated_run
from kb.git.lock_files import create_lock_file
from kb.git.process_locks import path_lock

_HEADER = struct.Struct(">4sLL")
_ENTRY = struct.Struct(">LLLLLLLLLL20sH")  # ctime s/ns, mtime s/ns, dev, ino, mode, uid, gid, size, sha, flags
_FLAGS = struct.Struct(">H")
_EXTENDED = 0x4000
_NAMEMASK = 0x0FFF
LOCK_WAIT_SECONDS = 2.0
"""How long ``write`` waits for another process's ``index.lock`` before giving up."""
PATCH_MAX_PARSED = 256
"""Entries a re-read parses one by one before it parses the rest of the file in one go."""
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
        self._data: bytes | None = None  # the file as last read or written, while the entries are its
        # (without its checksum once written: _patch compares entries only)

    def _stat_signature(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def load(self) -> None:
        """(Re)parse the file unless it is unchanged since this object last read or wrote it.

        Another process's rewrite (a revision's refresh) usually changes a few entries: when this
        object still holds the bytes it last read or wrote, only those entries are parsed again
        (``_patch``); the others are the same bytes, so the same entries (design §2.1). Raises
        UnsupportedIndex, OSError."""
        signature = self._stat_signature()
        if signature is not None and signature == self._signature:
            return
        previous, self._data = self._data, None
        if signature is None:
            self.names, self.entries, self.version = [], [], 2
            self._signature = None
            return
        data = self.path.read_bytes()
        magic, version, count = _HEADER.unpack_from(data, 0)
        if magic != b"DIRC" or version not in (2, 3):
            self.names, self.entries, self.version = [], [], 2
            raise UnsupportedIndex(f"index version {version} is not handled here")
        try:
            patched = previous is not None and version == self.version and self._patch(previous, data, count)
        except (ValueError, struct.error):  # malformed: the whole parse below fails as it always did
            patched = False
        except UnsupportedIndex:
            self.names, self.entries, self.version = [], [], 2
            raise
        if not patched:
            self.names, self.entries, self.version = [], [], version
            offset = self._parse(data, _HEADER.size, count, self.names, self.entries)
            self._check_extensions(data, offset)
        self._data = data
        self._signature = signature

    @staticmethod
    def _parse(data: bytes, offset: int, count: int, names: list[bytes], entries: list[bytes]) -> int:
        """Append ``count`` entries parsed from ``data`` at ``offset``; returns the offset after them."""
        # One pass, inlined (O(entries) in Python: per entry only the flags are unpacked).
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
        return offset

    @staticmethod
    def _check_extensions(data: bytes, offset: int) -> None:
        """Raise UnsupportedIndex for an extension (from ``offset`` to the checksum) not handled here."""
        while offset < len(data) - 20:  # extensions: 4-byte signature, 4-byte size, payload
            signature_bytes, size = struct.unpack_from(">4sL", data, offset)
            if signature_bytes not in _SAFE_EXTENSIONS:
                raise UnsupportedIndex(f"index extension {signature_bytes!r} is not handled here")
            offset += 8 + size

    def _patch(self, old: bytes, data: bytes, count: int) -> bool:
        """Bring ``names``/``entries`` (parsed from ``old``) to ``data`` (same version): entry by
        entry, each run of entries ``data`` repeats from ``old`` is taken over whole
        (``kb.git.byte_diff.repeated_run``), so only the changed entries and one entry per run are
        parsed. Past PATCH_MAX_PARSED parsed entries the rest is parsed in one go. False when
        ``data`` is too short for its entries (the caller parses it whole and fails as that
        does). Raises UnsupportedIndex, ValueError or struct.error (malformed entries)."""
        stop = len(data) - 20
        if stop < _HEADER.size:
            return False
        starts = list(itertools.accumulate(map(len, self.entries), initial=_HEADER.size))
        old_names, old_entries = self.names, self.entries
        names: list[bytes] = []
        entries: list[bytes] = []
        offset, parsed = _HEADER.size, 0
        while len(names) < count:
            if offset + _ENTRY.size > stop:
                return False
            at = len(names)
            end = self._parse(data, offset, 1, names, entries)
            if end > stop:
                return False
            j, k = repeated_run(old, starts, old_names, data, offset, names[at], stop)
            k = min(k, j + count - at)
            if k > j:  # the run's entries are these bytes: take them over (the parsed one is entry j)
                del names[at:], entries[at:]
                names += old_names[j:k]
                entries += old_entries[j:k]
                offset += starts[k] - starts[j]
                continue
            offset, parsed = end, parsed + 1
            if parsed > PATCH_MAX_PARSED:  # a rewrite, not a few changes: parse the rest in one go
                offset = self._parse(data, offset, count - len(names), names, entries)
                break
        self._check_extensions(data, offset)
        self.names, self.entries = names, entries
        return True

    def update(self, path: bytes, st: os.stat_result | None, sha_hex: str | None, mode: int = 0o100644) -> None:
        """Set (``st`` and ``sha_hex`` given) or delete (None) the stage-0 entry of ``path``."""
        self._data = None  # the entries no longer are the file's
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
        self._data = None  # the entries may no longer be the file's
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
        fd = create_lock_file(lock, LOCK_WAIT_SECONDS)  # a person's `git status` may hold it a moment
        try:
            for part in (body, hashlib.sha1(body).digest()):  # not joined: the body is ~100 bytes per entry
                view = memoryview(part)
                while view:
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(lock, self.path)
        self._signature = self._stat_signature()
        self._data = body  # the file but its checksum: what _patch compares
