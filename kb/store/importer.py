"""``kb import``: a folder of markdown becomes one revision (issue 2, SPEC §2.2).

Every ``*.md`` under the folder (recursively) becomes ``documents/[PREFIX/]<relative path>`` with
each segment passed through the path law; folder and file names that collide case- or
NFC-insensitively get `` (2)``, `` (3)`` … in sorted source order, so the result is deterministic.
Hidden files and folders (``.obsidian/``, ``.trash/``) are skipped; other files are skipped and
counted. Unchanged content records nothing; ``prune`` also removes documents under the prefix
that the folder no longer has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kb.errors import ImportSourceError, InvalidInput
from kb.paths import NameRegistry, safe_filename, safe_folder_segment
from kb.store.knowledge_store import KnowledgeStore, Revision


@dataclass
class ImportReport:
    """Outcome of one import: the revision (None when nothing changed) and counts."""

    workspace_id: int
    created_workspace: bool
    revision: Revision | None
    documents_found: int = 0
    skipped_other: int = 0
    skipped_hidden: int = 0
    added: int = 0
    modified: int = 0
    removed: int = 0
    unchanged: int = 0
    renamed: dict[str, str] = field(default_factory=dict)


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a byte name that is not UTF-8 (os.walk's surrogate escapes)
        return False
    return True


def scan(source: Path) -> tuple[list[tuple[str, ...]], int, int]:
    """Relative paths (as segment tuples, sorted) of the markdown files under ``source``, the count
    of other entries skipped, and of hidden entries skipped.

    Skipped as "other": non-markdown files, symbolic links (never followed: a link could pull in
    files from outside the folder), and files or folders whose names are not valid UTF-8.
    """
    found: list[tuple[str, ...]] = []
    other = hidden = 0
    for root, dirs, files in os.walk(source):
        hidden += sum(1 for d in dirs if d.startswith("."))
        kept = []
        for d in sorted(dirs):
            if d.startswith("."):
                continue
            if not _utf8(d) or (Path(root) / d).is_symlink():
                other += 1
                continue
            kept.append(d)
        dirs[:] = kept
        rel_root = Path(root).relative_to(source).parts
        for name in files:
            path = Path(root) / name
            if name.startswith("."):
                hidden += 1
            elif (name.lower().endswith(".md") and _utf8(name) and not path.is_symlink()
                  and path.is_file()):
                found.append((*rel_root, name))
            else:
                other += 1
    return sorted(found), other, hidden


def plan_paths(relative: list[tuple[str, ...]], prefix: tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """Map each source relative path to its repo path ``documents/...`` under the path law.

    Folder and file names share one namespace per folder; collisions are resolved in order.
    """
    registries: dict[tuple[str, ...], NameRegistry] = {}
    folders: dict[tuple[str, ...], tuple[str, ...]] = {(): prefix}
    planned: dict[tuple[str, ...], str] = {}
    for parts in relative:
        for depth in range(1, len(parts)):
            source_folder = parts[:depth]
            if source_folder not in folders:
                parent = folders[source_folder[:-1]]
                safe = safe_folder_segment(parts[depth - 1])
                folders[source_folder] = (*parent, registries.setdefault(parent, NameRegistry()).claim(safe))
        parent = folders[parts[:-1]]
        name = safe_filename(parts[-1])
        final = registries.setdefault(parent, NameRegistry()).claim(name)
        planned[parts] = "/".join(("documents", *parent, final))
    return planned


def import_prefix(prefix: str | None) -> tuple[str, ...]:
    """Folder segments under ``documents/`` for ``--prefix``: ``Notes/2026``, ``/Notes`` and
    ``/documents/Notes`` all name ``documents/Notes...``; each segment passes through the path
    law (SPEC §2.2). Raises InvalidInput for ``.``/``..`` segments rather than guessing."""
    text = (prefix or "").strip().strip("/")
    if text == "documents":
        text = ""
    elif text.startswith("documents/"):
        text = text[len("documents/"):]
    parts = [p for p in text.split("/") if p.strip()]
    if any(p.strip() in (".", "..") for p in parts):
        raise InvalidInput(f"prefix={prefix!r} contains '.' or '..'; name a folder under /documents",
                           cli=f"--prefix {prefix!r} contains '.' or '..'; name a folder under /documents")
    return tuple(safe_folder_segment(p) for p in parts)


def import_folder(
    store: KnowledgeStore,
    source: Path,
    *,
    prefix: str | None = None,
    prune: bool = False,
    message: str | None = None,
    author: str = "kb-import",
) -> ImportReport:
    """Import ``source`` into the store's workspace as one revision (created if needed).

    Raises ImportSourceError when ``source`` is not a readable directory; LockTimeout etc. from
    the commit. Nothing is written on error.
    """
    source = Path(source).expanduser()
    if not source.exists():
        raise ImportSourceError(f"{source} does not exist; pass a folder of markdown files")
    if not source.is_dir():
        raise ImportSourceError(f"{source} is not a folder; pass a folder of markdown files")
    source = source.resolve()
    prefix_parts = import_prefix(prefix)
    relative, other, hidden = scan(source)
    planned = plan_paths(relative, prefix_parts)
    created = not store.exists()
    if created:
        store.create()
    report = ImportReport(store.workspace_id, created, None, len(relative), other, hidden)
    existing = store.list_paths() if store.head() else {}
    root = "/" + "/".join(("documents", *prefix_parts))
    text = message or f"import {len(relative)} documents from {source.name}"
    with store.transaction(text, author) as draft:
        for parts, repo_path in planned.items():
            data = source.joinpath(*parts).read_bytes()
            if "/".join(parts) != repo_path.split("/", 1 + len(prefix_parts))[-1]:
                report.renamed["/".join(parts)] = "/" + repo_path
            draft.write(repo_path, data)
        if prune:
            wanted = {"/" + p for p in planned.values()}
            for virtual in existing:
                if (virtual == root or virtual.startswith(root + "/")) and virtual not in wanted:
                    if not virtual.endswith("/.keep"):
                        draft.remove(virtual)
    report.revision = draft.revision
    if draft.revision is not None:
        for change in draft.revision.changes:
            if change.change == "added":
                report.added += 1
            elif change.change == "modified":
                report.modified += 1
            elif change.change == "removed":
                report.removed += 1
    report.unchanged = len(relative) - report.added - report.modified
    return report
