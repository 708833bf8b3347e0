"""Incremental serialization of git tree objects (design §2.1: O(changed entries) writes).

A git tree object is its entries in git's tree order (a folder sorts as ``name/``), each one
``<octal mode> <name>\\0<20-byte sha>``. dulwich rebuilds that text in Python from the entry dict
(sorting every entry) and parses the whole text again whenever a tree is copied, so changing one
entry of a 4,612-entry folder cost ~50 ms per revision. A :class:`TreeLayout` keeps a tree's
entries as two parallel lists, the sort keys and the raw entry bytes; a new tree is its base's
layout with the changed entries spliced in by bisection, joined, and hashed: the Python work
grows with the changed entries, the rest is one C-level join and one SHA-1 of the text.

:func:`apply_changes` returns a dulwich ``Tree`` whose entry dict, raw text and id are already
set (nothing is re-serialized or re-parsed when it is written to the object store or looked up),
and the new layout, so the next revision on top of it starts from a warm layout too.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import stat
import threading

from dulwich.objects import FixedSha, ObjectID, Tree

_DIR_MODE_PREFIXES = (b"4", b"04")
BULK_CHANGES = 32
"""Change sets larger than this and than a quarter of the tree are applied by one sort."""
LAYOUT_CACHE_SIZE = 32
"""Layouts kept per repository (most recently used): the trees the next revisions build on."""


class TreeLayout:
    """The entries of one tree in git order: ``keys`` (name, ``name/`` for a folder) and the raw
    entry bytes ``chunks`` at the same positions. Treat as immutable once built."""

    __slots__ = ("keys", "chunks")

    def __init__(self, keys: list[bytes], chunks: list[bytes]) -> None:
        self.keys = keys
        self.chunks = chunks

    @classmethod
    def of(cls, tree: Tree) -> TreeLayout | None:
        """The layout of an existing tree, from its raw text (O(entries), once per tree).
        None when the text is not in git order (a malformed tree from elsewhere): the caller
        then lets dulwich re-serialize it, which sorts."""
        raw = tree.as_raw_string()
        keys: list[bytes] = []
        chunks: list[bytes] = []
        position, end = 0, len(raw)
        try:
            while position < end:
                space = raw.index(b" ", position)
                nul = raw.index(b"\0", space)
                stop = nul + 21
                name = raw[space + 1 : nul]
                keys.append(name + b"/" if raw.startswith(_DIR_MODE_PREFIXES, position) else name)
                chunks.append(raw[position:stop])
                position = stop
        except ValueError:
            return None
        if position != end or any(a >= b for a, b in zip(keys, keys[1:])):
            return None
        return cls(keys, chunks)


def entry_bytes(name: bytes, mode: int, hexsha: bytes) -> bytes:
    """One tree entry as git writes it (``100644 a.md\\0<sha>``; ``40000`` for a folder)."""
    return b"%o %s\0%s" % (mode, name, bytes.fromhex(hexsha.decode("ascii")))


def _key(name: bytes, mode: int) -> bytes:
    return name + b"/" if stat.S_ISDIR(mode) else name


def apply_changes(
    base: Tree | None, layout: TreeLayout | None, changes: dict[bytes, tuple[int, bytes] | None]
) -> tuple[Tree, TreeLayout] | None:
    """A new tree = ``base`` (with its ``layout``; both None for an empty base) with ``changes``
    (``{name: (mode, hex sha), or None to delete}``) applied. Returns the tree, its id and raw
    text already set, and its layout. Cost: O(changes · log entries) in Python plus a copy of
    the entry dict and one join and SHA-1 of the tree's text. Deleting an absent name is a no-op.
    None when ``layout`` does not describe ``base`` (the caller then serializes in full).
    """
    entries = dict(base._entries) if base is not None else {}
    keys = list(layout.keys) if layout is not None else []
    chunks = list(layout.chunks) if layout is not None else []
    if len(changes) > BULK_CHANGES and len(changes) * 4 > len(keys):
        return _apply_in_bulk(entries, keys, chunks, changes)
    for name, change in changes.items():
        old = entries.pop(name, None)
        if old is not None:
            key = _key(name, old[0])
            i = bisect.bisect_left(keys, key)
            if i == len(keys) or keys[i] != key:
                return None
            del keys[i], chunks[i]
        if change is not None:
            mode, hexsha = change
            key = _key(name, mode)
            i = bisect.bisect_left(keys, key)
            keys.insert(i, key)
            chunks.insert(i, entry_bytes(name, mode, hexsha))
            entries[name] = (mode, ObjectID(hexsha))
    return _finish(entries, keys, chunks)


def _apply_in_bulk(
    entries: dict, keys: list[bytes], chunks: list[bytes], changes: dict[bytes, tuple[int, bytes] | None]
) -> tuple[Tree, TreeLayout] | None:
    """:func:`apply_changes` for a change set about as big as the tree (a folder filled or emptied
    by a move): one sort instead of an insertion per entry."""
    by_key = dict(zip(keys, chunks))
    for name, change in changes.items():
        old = entries.pop(name, None)
        if old is not None and by_key.pop(_key(name, old[0]), None) is None:
            return None
        if change is not None:
            mode, hexsha = change
            by_key[_key(name, mode)] = entry_bytes(name, mode, hexsha)
            entries[name] = (mode, hexsha)
    keys = sorted(by_key)
    return _finish(entries, keys, [by_key[key] for key in keys])


def _finish(entries: dict, keys: list[bytes], chunks: list[bytes]) -> tuple[Tree, TreeLayout]:
    """The Tree (entries, raw text and id set) and layout for entries already in git order."""
    raw = b"".join(chunks)
    sha = hashlib.sha1(b"tree %d\0" % len(raw))
    sha.update(raw)
    tree = Tree()
    tree._entries = entries
    tree._chunked_text = [raw]
    tree._sha = FixedSha(sha.hexdigest())
    tree._needs_serialization = False
    return tree, TreeLayout(keys, chunks)


class LayoutCache:
    """Layouts by tree id (bytes hex), least recently used dropped beyond ``size``."""

    def __init__(self, size: int = LAYOUT_CACHE_SIZE) -> None:
        self._size = size
        self._layouts: collections.OrderedDict[bytes, TreeLayout] = collections.OrderedDict()
        self._lock = threading.Lock()  # threads share a Repository and its cache (design §4)

    def get(self, tree: Tree) -> TreeLayout | None:
        """The layout of ``tree`` (computed from its raw text on a miss); None when malformed."""
        layout = self.peek(tree.id)
        if layout is not None:
            return layout
        layout = TreeLayout.of(tree)
        if layout is not None:
            self.put(tree.id, layout)
        return layout

    def peek(self, tree_id: bytes) -> TreeLayout | None:
        """The cached layout of ``tree_id``, or None (never computed here)."""
        with self._lock:
            layout = self._layouts.get(tree_id)
            if layout is not None:
                self._layouts.move_to_end(tree_id)
            return layout

    def put(self, tree_id: bytes, layout: TreeLayout) -> None:
        """Remember ``layout`` as the layout of ``tree_id``."""
        with self._lock:
            self._layouts[tree_id] = layout
            self._layouts.move_to_end(tree_id)
            if len(self._layouts) > self._size:
                self._layouts.popitem(last=False)

    def clear(self) -> None:
        """Forget every layout."""
        with self._lock:
            self._layouts.clear()
