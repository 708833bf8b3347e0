"""Checks a change set must pass against the tree a revision is actually built on (design §2.2, §3).

A draft checks each call against the tree its transaction *started* from. Between that start and
the commit, other writers may have committed: the store therefore re-checks, under the workspace
write lock, against HEAD's tree — the tree the new revision's tree is built from. Here:
names that differ only in case or Unicode normalization from a sibling that HEAD (or the same
change set) already holds, which would not check out on macOS or Windows (two racing writers of
``Foo.md`` and ``FOO.md``, or of ``Café.md`` in NFC and NFD).

The cost grows with the changed paths and the folders they touch, not with the workspace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kb.errors import PathExists
from kb.paths import describe_name, name_key

if TYPE_CHECKING:
    from kb.git.repository import Repository


def check_case_collisions(
    repo: Repository,
    head_tree: bytes | None,
    effective: dict[str, str | None],
    at_head: dict[str, tuple[str, str] | None] | None = None,
) -> None:
    """Raise PathExists when applying ``effective`` (``{repo path: blob id, None = delete}``) to
    ``head_tree`` would leave two entries of one folder whose names differ only in case or Unicode
    normalization (``name_key``). A name that already exists at HEAD is always fine (its spelling
    is the one in use); a sibling that ``effective`` removes entirely no longer collides.
    ``at_head``: ``repo.lookup_many(head_tree, …)`` of at least the written paths, if at hand."""
    at_head = at_head if at_head is not None else repo.lookup_many(head_tree, effective)
    added = [p for p, blob in effective.items() if blob is not None and not at_head.get(p)]
    if not added:
        return
    new_children: dict[str, dict[str, set[str]]] = {}
    for path in added:
        parts = path.split("/")
        for depth in range(2, len(parts) + 1):
            parent, name = "/".join(parts[: depth - 1]), parts[depth - 1]
            new_children.setdefault(parent, {}).setdefault(name_key(name), set()).add(name)
    siblings: dict[str, dict[str, tuple[tuple[str, str], ...]]] = {}

    def head_siblings(parent: str) -> dict[str, tuple[tuple[str, str], ...]]:  # one lookup per folder
        if parent not in siblings:
            siblings[parent] = repo.folder_keys(head_tree, parent)
        return siblings[parent]

    def survives(path: str, kind: str) -> bool:
        if kind == "file":
            return effective.get(path, "") is not None
        prefix = path + "/"
        if any(p.startswith(prefix) for p in added):
            return True
        return any(effective.get(p, blob) is not None for p, blob in repo.walk(head_tree, path))

    checked: set[str] = set()
    for path in added:
        parts = path.split("/")
        for depth in range(2, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if prefix in checked:
                continue
            checked.add(prefix)
            parent, name = "/".join(parts[: depth - 1]), parts[depth - 1]
            key = name_key(name)
            existing = dict(head_siblings(parent).get(key, ()))
            if name in existing:  # this spelling exists at HEAD
                continue
            others = [(o, k) for o, k in existing.items() if survives(f"{parent}/{o}", k)]
            others += [(o, "new") for o in new_children.get(parent, {}).get(key, ()) if o != name]
            if others:
                other = sorted(o for o, _ in others)[0]
                raise PathExists(
                    f"cannot write /{path}: {describe_name(name)} differs only in case or Unicode "
                    f"normalization from {describe_name(other)} in /{parent}, which "
                    f"{'this change also creates' if (other, 'new') in others else 'another revision created meanwhile'}"
                    "; the tree would not check out on macOS or Windows. Use the existing name. "
                    "Nothing was recorded."
                )
