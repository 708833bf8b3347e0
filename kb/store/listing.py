"""What a revision's tree holds at a path, for readers (design §2.3, §3): a folder's entries
(``ls``) and, when a path holds no document, the error that says what is there instead — a folder,
or a document whose path differs only in letter case (or Unicode normalization).

The committed view (``KnowledgeStore.ls``, ``kb ls``) and a turn's view (``Turn.ls``, the MCP ``ls``
tool) build their entries with :func:`folder_entries`, so both list the same way.
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass

from kb.errors import DocumentNotFound, IsAFolder, KbError
from kb.paths import StorePath, name_key

KEEP = ".keep"
"""The marker file of an empty folder (design §1); never listed."""


@dataclass(frozen=True)
class Entry:
    """One child of a folder: ``kind`` is ``"file"`` or ``"folder"``; ``path`` is virtual."""

    name: str
    path: str
    kind: str


def folder_entries(folder: StorePath, children: Iterable[tuple[str, str]]) -> list[Entry]:
    """Entries of ``folder`` from its ``(name, kind)`` children: ``.keep`` hidden, folders first,
    then files, each by name."""
    entries = [Entry(name, folder.child(name).virtual, kind) for name, kind in children if name != KEEP]
    return sorted(entries, key=lambda e: (e.kind != "folder", e.name))


def list_tree(
    repository, tree_id: bytes | None, path: StorePath, revision: str | None, workspace_id: int
) -> list[Entry]:
    """The entries of the folder ``path`` in ``tree_id`` (a document path lists itself; the root
    of an empty workspace lists nothing). Raises DocumentNotFound when nothing is at ``path``,
    naming the path as the tree spells it when only letter case differs."""
    rp = path.repo_path
    if path.parts and repository.lookup(tree_id, rp) is not None:
        return [Entry(path.name, path.virtual, "file")]
    children = repository.list_folder(tree_id, rp)
    if not children and path.parts and not repository.is_folder(tree_id, rp):
        raise DocumentNotFound(
            f"no folder or document at {_quoted(path.virtual)} in revision {revision or '(empty)'}"
            + _what_instead(repository, tree_id, rp, revision, workspace_id, listing=True)
        )
    return folder_entries(path, children)


def not_a_document(
    repository, tree_id: bytes | None, repo_path: str, revision: str | None, workspace_id: int
) -> KbError:
    """The error for a read of ``repo_path`` that found no document in ``tree_id`` (the tree of
    ``revision``): IsAFolder (suggesting to list it) when a folder is there, else DocumentNotFound,
    with "did you mean" when a path differing only in case is there. Costs one folder read per
    path segment, so call it on the error path only."""
    virtual = "/" + repo_path
    if repository.is_folder(tree_id, repo_path):
        return IsAFolder(
            f"{virtual} is a folder, not a document; list it with "
            f"{_ls_command(repository, virtual, revision, workspace_id)}"
        )
    return DocumentNotFound(
        f"no document at {_quoted(virtual)} in revision {revision or '(empty)'}"
        + _what_instead(repository, tree_id, repo_path, revision, workspace_id)
    )


def _quoted(path: str) -> str:
    """``path`` in single quotes, as a shell takes it back (``shlex`` quoting when it holds a
    quote itself: Python's repr would escape it with a backslash a shell keeps)."""
    return f"'{path}'" if "'" not in path else shlex.quote(path)


def _ls_command(repository, virtual: str, revision: str | None, workspace_id: int) -> str:
    """The ``kb ls`` command that lists ``virtual`` in ``revision``: ``--revision`` only when
    that is not HEAD (an older tree may hold a folder HEAD no longer has)."""
    at = f" --revision {revision[:12]}" if revision and revision != repository.head() else ""
    return f"`kb ls {shlex.quote(virtual)} --workspace {workspace_id}{at}`"


def _what_instead(
    repository, tree_id: bytes | None, repo_path: str, revision: str | None, workspace_id: int, listing: bool = False
) -> str:
    """What to type instead of a path that holds nothing: ``"; did you mean '/documents/Todo.md'?"``
    when ``tree_id`` holds it spelled otherwise (letter case, NFC/NFD: the collision key
    ``name_key``, design §2.2) or with the ``.md`` left off (the ``kb ls`` that lists it when that
    is a folder and ``listing`` is false: a read), else the listing of its nearest folder that
    exists, as the tree spells it; for an empty workspace, how documents get there."""
    if tree_id is None:
        return f"; the workspace has no revision yet: `kb import FOLDER --workspace {workspace_id}` adds documents"
    candidates = [repo_path] if repo_path.casefold().endswith(".md") else [repo_path, repo_path + ".md"]
    for candidate in candidates:  # as typed, then with the .md a user leaves off
        spelled, complete = _as_spelled(repository, tree_id, candidate)
        if not complete or spelled == repo_path:  # nothing there, or exactly what was not found
            continue
        if not listing and repository.is_folder(tree_id, spelled):
            return f"; {_quoted('/' + spelled)} is a folder: {_ls_command(repository, '/' + spelled, revision, workspace_id)} lists it"
        if spelled != candidate and unicodedata.normalize("NFC", spelled) == unicodedata.normalize("NFC", candidate):
            form = "NFC" if unicodedata.is_normalized("NFC", spelled) else "NFD"
            return (
                f"; a name there has the same letters in other code points (Unicode {form}): "
                f"{_ls_command(repository, '/' + spelled.rpartition('/')[0], revision, workspace_id)} "
                "prints it to copy"
            )
        return f"; did you mean {_quoted('/' + spelled)}?"
    folder, _ = _as_spelled(repository, tree_id, repo_path.rpartition("/")[0], folders_only=True)
    return f"; {_ls_command(repository, '/' + folder, revision, workspace_id)} lists what is there"


def _as_spelled(repository, tree_id: bytes, repo_path: str, folders_only: bool = False) -> tuple[str, bool]:
    """``repo_path`` as ``tree_id`` spells it, segment by segment under each name's collision key
    (letter case, NFC/NFD: ``name_key``, design §2.2; an exact name wins over a variant, a ``.keep``
    marker is never one; only folders with ``folders_only``), walking down from the root: ``(the
    deepest path found, True when every segment was)``. One folder read per segment found
    (``Repository.folder_keys``, cached per tree), so a path of thousands of segments costs what
    the tree's own depth costs."""
    root, *below = repo_path.split("/")  # "documents": StorePath holds nothing else
    found = root
    for segment in below:
        variants = repository.folder_keys(tree_id, found).get(name_key(segment), ())
        names = [name for name, kind in variants if name.casefold() != KEEP and (kind == "folder" or not folders_only)]
        if not names:
            return found, False
        found = f"{found}/{segment if segment in names else names[0]}"
    return found, True
