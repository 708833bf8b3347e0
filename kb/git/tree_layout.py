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
import itertools
import stat
import threading

from dulwich.errors import ObjectFormatException
from dulwich.objects import FixedSha, ObjectID, Tree, parse_tree

from kb.git.byte_diff import repeated_run

DIR_MODE_PREFIXES = (b"4", b"04")
BULK_CHANGES = 32
"""Change sets larger than this and than a quarter of the tree are applied by one sort."""
LAYOUT_CACHE_SIZE = 32
"""Layouts kept per repository (most recently used): the trees the next revisions build on."""
DERIVE_MIN_ENTRIES = 128
"""Trees from this many entries are bases :func:`derive` reads other versions of a folder from."""
DERIVE_MAX_PARSED = 64
"""Entries :func:`derive` parses in Python at most; a bigger change is left to dulwich's C parser."""


class TreeLayout:
    """The entries of one tree in git order: ``keys`` (name, ``name/`` for a folder) and the raw
    entry bytes ``chunks`` at the same positions. Treat as immutable once built."""

    __slots__ = ("keys", "chunks", "_starts")

    def __init__(self, keys: list[bytes], chunks: list[bytes]) -> None:
        self.keys = keys
        self.chunks = chunks
        self._starts: list[int] | None = None

    def starts(self) -> list[int]:
        """The offset of each entry in the tree's text, then the text's length (computed once)."""
        if self._starts is None:
            self._starts = list(itertools.accumulate(map(len, self.chunks), initial=0))
        return self._starts

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
                keys.append(name + b"/" if raw.startswith(DIR_MODE_PREFIXES, position) else name)
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


def derive(base: Tree, layout: TreeLayout, raw: bytes, sha: bytes) -> tuple[Tree, TreeLayout, frozenset[bytes]] | None:
    """The tree whose text is ``raw`` (id ``sha``, hex, already checked by the caller), read as a
    revision of ``base`` (laid out as ``layout``): another process's version of a big folder.
    Entry by entry, each run of entries ``raw`` repeats from the base's text is taken over whole
    (``kb.git.byte_diff.repeated_run``); only the other entries are parsed, by dulwich's own parser
    (design §2.1). Returns the tree (entry dict, text and id set, equal to dulwich's parse of
    ``raw``), its layout and the names whose entry differs from the base's; None when more than
    DERIVE_MAX_PARSED entries differ, or they do not parse into unique names in git order (the
    caller then has dulwich parse the whole text)."""
    old = base.as_raw_string()
    starts = layout.starts()
    keys: list[bytes] = []
    chunks: list[bytes] = []
    runs: list[tuple[int, int, int]] = []  # (position in keys, first, last + 1 old entry taken over)
    fresh: list[int] = []  # positions in keys of the entries parsed here
    offset = 0
    while offset < len(raw):
        try:
            space = raw.index(b" ", offset)
            nul = raw.index(b"\0", space)
        except ValueError:
            return None
        name = raw[space + 1 : nul]
        key = name + b"/" if raw.startswith(DIR_MODE_PREFIXES, offset) else name
        j, k = repeated_run(old, starts, layout.keys, raw, offset, key, len(raw))
        if k > j:
            runs.append((len(keys), j, k))
            keys += layout.keys[j:k]
            chunks += layout.chunks[j:k]
            offset += starts[k] - starts[j]
            continue
        if len(fresh) == DERIVE_MAX_PARSED:
            return None
        fresh.append(len(keys))
        keys.append(key)
        chunks.append(raw[offset : nul + 21])
        offset = nul + 21
    if offset != len(raw):
        return None
    try:
        parsed = list(parse_tree(b"".join(chunks[i] for i in fresh), sha_len=20))
    except (ObjectFormatException, ValueError):
        return None
    names = [chunks[i][chunks[i].index(b" ") + 1 : chunks[i].index(b"\0")] for i in fresh]
    if [name for name, _, _ in parsed] != names:
        return None
    # git order holds within each run (the base's); check it where runs and parsed entries meet
    seams = set(fresh) | {i + 1 for i in fresh} | {position for position, _, _ in runs}
    if any(0 < i < len(keys) and keys[i - 1] >= keys[i] for i in seams):
        return None
    entries = dict(base._entries)
    removed = {}
    taken = 0
    for _, j, k in runs:  # runs are in base order (keys ascend): the base entries between them went
        if j < taken:
            return None
        for chunk in layout.chunks[taken:j]:
            name = chunk[chunk.index(b" ") + 1 : chunk.index(b"\0")]
            if name not in entries:
                return None
            removed[name] = entries.pop(name)
        taken = k
    for chunk in layout.chunks[taken:]:
        name = chunk[chunk.index(b" ") + 1 : chunk.index(b"\0")]
        if name not in entries:
            return None
        removed[name] = entries.pop(name)
    added = {}
    for name, mode, hexsha in parsed:
        if name in entries or name in added:
            return None
        added[name] = entries[name] = (mode, ObjectID(hexsha))
    changed = frozenset(name for name in removed.keys() | added.keys() if removed.get(name) != added.get(name))
    tree = Tree()
    tree._entries = entries
    tree._chunked_text = [raw]
    tree._sha = FixedSha(sha)
    tree._needs_serialization = False
    return tree, TreeLayout(keys, chunks), changed


class LayoutCache:
    """Layouts by tree id (bytes hex), least recently used dropped beyond ``size``; the layouts of
    trees of DERIVE_MIN_ENTRIES entries or more are also found by their first entry's key, as
    bases another version of the same folder is read from (:func:`derive`)."""

    def __init__(self, size: int = LAYOUT_CACHE_SIZE) -> None:
        self._size = size
        self._layouts: collections.OrderedDict[bytes, TreeLayout] = collections.OrderedDict()
        self._by_first: dict[bytes, bytes] = {}  # first entry's key -> id of a big tree
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
            if len(layout.keys) >= DERIVE_MIN_ENTRIES:
                self._by_first[layout.keys[0]] = tree_id
            if len(self._layouts) > self._size:
                dropped, old = self._layouts.popitem(last=False)
                if old.keys and self._by_first.get(old.keys[0]) == dropped:
                    del self._by_first[old.keys[0]]

    def base_for(self, first_key: bytes) -> tuple[bytes, TreeLayout] | None:
        """``(tree id, layout)`` of the latest big tree whose first entry's key is ``first_key``
        (its name, ``name/`` for a folder), or None."""
        with self._lock:
            tree_id = self._by_first.get(first_key)
            layout = None if tree_id is None else self._layouts.get(tree_id)
            return None if layout is None else (tree_id, layout)

    def has_bases(self) -> bool:
        """Whether any big tree's layout is cached (else :meth:`base_for` finds nothing)."""
        return bool(self._by_first)

    def clear(self) -> None:
        """Forget every layout."""
        with self._lock:
            self._layouts.clear()
            self._by_first.clear()
