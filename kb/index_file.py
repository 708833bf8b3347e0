"""Patch a few entries of a git index file without decoding all of them (SPEC §2.1, §5).

After every commit the workspace's persistent working tree and index are refreshed for the changed
paths. dulwich's ``Index`` decodes every entry into objects and encodes them again: ~0.3 s at 6,600
documents, O(workspace) on every commit. This module walks the entry table by offsets only (each
entry's length follows from its flags), keeps untouched entries as raw byte slices, and writes
the result with a fresh checksum: a commit's index cost becomes a byte copy.

Supports index versions 2 and 3 without split-index/sparse-directory extensions; anything else
returns False so the caller falls back to dulwich.
"""

from __future__ import annotations

import hashlib
import os
import struct

from dulwich.file import GitFile

_ENTRY = struct.Struct(">10I20sH")
_SAFE_TO_DROP = {b"TREE", b"UNTR", b"REUC", b"EOIE", b"IEOT", b"FSMN"}


def _entries(data: bytes) -> tuple[int, dict[bytes, bytes]] | None:
    if data[:4] != b"DIRC" or len(data) < 32:
        return None
    version, count = struct.unpack_from(">II", data, 4)
    if version not in (2, 3):
        return None
    offset, entries = 12, {}
    for _ in range(count):
        flags = struct.unpack_from(">H", data, offset + 60)[0]
        header = 64 if flags & 0x4000 else 62
        if flags & 0x3000:  # merge stages: not something kb's repositories hold
            return None
        namelen = flags & 0xFFF
        if namelen == 0xFFF:
            namelen = data.index(b"\0", offset + header) - offset - header
        path = data[offset + header: offset + header + namelen]
        length = ((header + namelen + 8) // 8) * 8
        entries[path] = data[offset: offset + length]
        offset += length
    end = len(data) - 20
    while offset < end:  # extensions: drop only those that are caches
        signature = data[offset: offset + 4]
        if signature not in _SAFE_TO_DROP:
            return None
        offset += 8 + struct.unpack_from(">I", data, offset + 4)[0]
    return version, entries


def _entry(path: bytes, sha_hex: str, st: os.stat_result | None, mode: int) -> bytes:
    if st is None:
        fields = (0,) * 6 + (mode, 0, 0, 0)
    else:
        fields = (int(st.st_ctime), st.st_ctime_ns % 1_000_000_000, int(st.st_mtime),
                  st.st_mtime_ns % 1_000_000_000, st.st_dev & 0xFFFFFFFF, st.st_ino & 0xFFFFFFFF,
                  mode, st.st_uid, st.st_gid, st.st_size & 0xFFFFFFFF)
    raw = _ENTRY.pack(*fields, bytes.fromhex(sha_hex), min(len(path), 0xFFF)) + path
    return raw + b"\0" * (8 - len(raw) % 8)


def patch_index(index_path: str, changes: list[tuple[str, str | None, os.stat_result | None]],
                mode: int = 0o100644) -> bool:
    """Apply ``(path, blob id or None to remove, stat of the written file)`` to the index at
    ``index_path`` (created if absent). Returns False, writing nothing, when the file uses a
    format this module does not patch (the caller then uses dulwich)."""
    try:
        with open(index_path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        data = b"DIRC" + struct.pack(">II", 2, 0) + hashlib.sha1(b"DIRC" + struct.pack(">II", 2, 0)).digest()
    parsed = _entries(data)
    if parsed is None:
        return False
    version, entries = parsed
    for path, sha, st in changes:
        key = path.encode()
        if sha is None:
            entries.pop(key, None)
        else:
            entries[key] = _entry(key, sha, st, mode)
    if version == 3 and not any(struct.unpack_from(">H", e, 60)[0] & 0x4000 for e in entries.values()):
        version = 2
    body = b"".join([b"DIRC", struct.pack(">II", version, len(entries)), *(entries[k] for k in sorted(entries))])
    with GitFile(index_path, "wb") as out:
        out.write(body + hashlib.sha1(body).digest())
    return True
