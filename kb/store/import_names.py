"""The names ``kb import`` gives: each file and folder of the source folder gets its document path
under the path law (design §2.2), and keeps it import after import (design §3: identity).

Names that collide (``a:b.md`` and ``a_b.md`` both make ``a_b.md``) get `` (2)``, `` (3)`` …; files
and folders share one namespace per folder. In each folder, names are claimed in two rounds:

1. an entry keeps the name an earlier import gave it: a colliding file whose bytes its name or one
   of its `` (n)`` variants holds at HEAD, a colliding folder whose files' bytes one holds (the
   most of them wins; its own name before a variant on a tie);
2. the others claim theirs in sorted source order.

So removing or adding one of colliding files never hands a document to another file, whichever
it is. A file edited since is not recognized by its bytes: it takes its name in round 2, in the
order every import of kb has used, so colliding files edited together keep their documents too;
only an edit in the same import that removes or adds a colliding file can hand its document over.
Only colliding names cost a read (their bytes are hashed); the rest claim without one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kb.paths import ROOT, NameRegistry, name_key, safe_filename, safe_folder_segment, suffixed_from

Parts = tuple[str, ...]
Content = Callable[[Parts], str]
"""``content(source parts) -> blob id`` of a source file (read once, then remembered)."""


@dataclass(frozen=True)
class _Entry:
    """A file or folder of a source folder: ``parts`` relative to the source, ``safe`` its name
    under the path law."""

    parts: Parts
    safe: str
    folder: bool

    @property
    def name(self) -> str:
        return self.parts[-1]


def plan_paths(
    relative: list[Parts],
    prefix: Parts,
    existing: Mapping[str, str] | None = None,
    content: Content | None = None,
) -> dict[Parts, str]:
    """Map each source relative path (sorted segment tuples) to its repo path ``documents/...``.

    ``existing``: ``{virtual path: blob id}`` at HEAD, where an earlier import left its names;
    ``content``: the blob id of a source file, asked only for names that collide. Without them
    (a first import) names are claimed by rounds 2 and 3 alone.
    """
    existing = existing or {}
    folders: dict[Parts, list[_Entry]] = {}  # source folder -> its entries, by name
    for parts in relative:
        for depth in range(1, len(parts)):
            if parts[:depth] not in folders:
                folders[parts[:depth]] = []
                folder = _Entry(parts[:depth], safe_folder_segment(parts[depth - 1]), True)
                folders.setdefault(parts[: depth - 1], []).append(folder)
        folders.setdefault(parts[:-1], []).append(_Entry(parts, safe_filename(parts[-1]), False))
    present = _present(existing, prefix)
    planned: dict[Parts, str] = {}
    destination: dict[Parts, Parts] = {(): prefix}
    for source_folder in sorted(folders):  # a folder sorts before what it holds
        into = destination[source_folder]
        entries = sorted(folders[source_folder], key=lambda e: e.name)

        def held(entry: _Entry, name: str, into: Parts = into) -> int:
            return _held(entry, (*into, name), existing, present, relative, content)

        for entry, name in _claim(entries, present.get(into, {}), held).items():
            if entry.folder:
                destination[entry.parts] = (*into, name)
            else:
                planned[entry.parts] = "/".join((ROOT, *into, name))
    return {parts: planned[parts] for parts in relative}


def _present(existing: Mapping[str, str], prefix: Parts) -> dict[Parts, dict[str, str | None]]:
    """``{folder under documents/: {name: blob id of a document, None for a folder}}`` at HEAD,
    for the folders under ``prefix``."""
    present: dict[Parts, dict[str, str | None]] = {}
    for virtual, blob in existing.items():
        segments = tuple(virtual.split("/")[2:])  # "", "documents", ...
        if segments[: len(prefix)] != prefix or len(segments) == len(prefix):
            continue
        for depth in range(len(prefix), len(segments)):
            last = depth == len(segments) - 1
            present.setdefault(segments[:depth], {})[segments[depth]] = blob if last else None
    return present


def _held(
    entry: _Entry,
    at: Parts,
    existing: Mapping[str, str],
    present: dict[Parts, dict[str, str | None]],
    relative: list[Parts],
    content: Content | None,
) -> int:
    """How much of ``entry`` HEAD holds at ``at`` (under ``documents/``): 1 when the file's bytes
    are the document there; for a folder, how many of its files' bytes are found under it."""
    if content is None:
        return 0
    blob = present.get(at[:-1], {}).get(at[-1])
    if not entry.folder:
        return int(blob is not None and content(entry.parts) == blob)
    if blob is not None or at not in present:
        return 0
    below = "/" + "/".join((ROOT, *at)) + "/"
    blobs = {b for virtual, b in existing.items() if virtual.startswith(below)}
    depth = len(entry.parts)
    return sum(1 for parts in relative if parts[:depth] == entry.parts and content(parts) in blobs)


def _claim(
    entries: list[_Entry], present: dict[str, str | None], held: Callable[[_Entry, str], int]
) -> dict[_Entry, str]:
    """The name of each of one folder's ``entries`` (sorted by name), in the rounds the module
    says; ``present``: the names in the folder at HEAD; ``held(entry, name)``: how much of
    ``entry`` HEAD holds at ``name``."""
    groups: dict[str, list[_Entry]] = {}
    for entry in entries:
        groups.setdefault(name_key(entry.safe), []).append(entry)
    contested = {key for key, group in groups.items() if len(group) > 1}
    variants = {name: base for name in present if (base := suffixed_from(name)) is not None}
    for name, base in variants.items():
        if base in groups:  # an earlier import suffixed a name of this folder
            contested |= {base, name_key(name)} & groups.keys()
    pairs = []
    for name in present if contested else ():
        for key in {name_key(name), variants.get(name)} & contested:
            for entry in groups[key]:
                score = held(entry, name)
                if score:
                    pairs.append(((-score, name_key(name) != key, entry.name, name), entry, name))
    registry = NameRegistry()
    chosen: dict[_Entry, str] = {}
    for _, entry, name in sorted(pairs, key=lambda pair: pair[0]):  # round 1
        if entry not in chosen and name not in registry:
            registry.add(name)
            chosen[entry] = name
    for entry in entries:  # round 2: sorted order, as every import has claimed (no swap for an edit)
        if entry not in chosen:
            chosen[entry] = registry.claim(entry.safe)
    return chosen
