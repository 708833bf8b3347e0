"""Projection of git into ``documents`` and ``folders`` rows (SPEC §6), converging to HEAD.

Idempotent and order-free: it diffs the last projected revision's tree against HEAD (or, the first
time, the whole tree against the rows), follows the moves the store recorded so a moved document
keeps its row id, upserts changed documents (preserving type, metadata and title), deletes rows
whose file is gone, and derives folder rows from document paths and ``.keep`` files.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

import psycopg

from kb.paths import unique_identifier_hash
from kb.repository import Repository
from kb.sql import queries

PROJECTION_LOCK_NAMESPACE = 7103
KEEP = ".keep"


@dataclass
class ProjectionResult:
    """What one projection run changed (document and folder row ids by event)."""

    revision: str | None
    created: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    folders_created: list[int] = field(default_factory=list)
    folders_deleted: list[int] = field(default_factory=list)


def title_from_path(virtual_path: str) -> str:
    """Title of a document that no row claims: its file name without ``.md``."""
    name = posixpath.basename(virtual_path)
    return name[:-3] if name.lower().endswith(".md") else name


def _virtual(repo_path: str) -> str:
    return "/" + repo_path


def _folders_of(paths: list[str]) -> set[str]:
    folders: set[str] = set()
    for path in paths:
        parent = posixpath.dirname(path)
        while parent not in ("/documents", "/", "") and parent not in folders:
            folders.add(parent)
            parent = posixpath.dirname(parent)
    return folders


def project(conn: psycopg.Connection, repo: Repository, workspace: dict, *, force: bool = False) -> ProjectionResult:
    """Converge the workspace's rows to ``repo``'s HEAD inside ``conn``'s open transaction.

    ``workspace`` is its ``kb.workspaces`` row. Returns the row ids it changed. ``force`` compares
    the whole tree with the rows even when HEAD is already projected (``reindex``, SPEC §7).
    """
    ws = workspace["id"]
    conn.execute(queries["lock_projection"], {"namespace": PROJECTION_LOCK_NAMESPACE, "workspace_id": ws})
    head = repo.head()
    result = ProjectionResult(head)
    projected = workspace["last_projected_revision"]
    if head is None or (head == projected and not force):
        return result
    head_tree = repo.tree_id(head)
    files = {_virtual(p): blob for p, blob in repo.walk(head_tree, "documents")}
    documents = {p: blob for p, blob in files.items() if posixpath.basename(p) != KEEP}
    rows = {r["path"]: r for r in conn.execute(queries["document_paths"], {"workspace_id": ws})}

    # 1. recorded moves since the last projection keep document (and folder) ids
    projected_seq = 0
    if projected:
        found = conn.execute(queries["revision_seq"], {"workspace_id": ws, "revision_id": projected}).fetchone()
        projected_seq = found["seq"] if found else 0
    for move in conn.execute(
        queries["moves_since"], {"workspace_id": ws, "after_seq": projected_seq, "upto_seq": 2**62}
    ).fetchall():
        old, new = _virtual(move["old_path"]), _virtual(move["new_path"])
        if old in rows and new in documents:
            if new in rows and new != old:
                deleted = conn.execute(queries["delete_document"], {"workspace_id": ws, "path": new}).fetchone()
                result.deleted.append(deleted["id"])
            moved = conn.execute(
                queries["move_document"], {"workspace_id": ws, "old_path": old, "new_path": new}
            ).fetchone()
            rows[new] = {**rows.pop(old), "path": new}
            result.moved.append(moved["id"])

    # 2. upsert changed documents, delete vanished ones
    for path, blob in documents.items():
        if path in rows and rows[path]["content_id"] == blob:
            continue
        row = conn.execute(
            queries["upsert_document"],
            {"workspace_id": ws, "path": path, "title": title_from_path(path),
             "uid_hash": unique_identifier_hash("NOTE", path, ws), "content_id": blob,
             "revision_id": head},
        ).fetchone()
        if row is not None:
            (result.created if row["inserted"] else result.updated).append(row["id"])
    for path in set(rows) - set(documents):
        gone = conn.execute(queries["delete_document"], {"workspace_id": ws, "path": path}).fetchone()
        if gone:
            result.deleted.append(gone["id"])

    # 3. folders: implied by document paths or a .keep; moved folders keep their ids
    wanted = _folders_of(list(files))
    folder_rows = {r["path"]: r["id"] for r in conn.execute(queries["folder_paths"], {"workspace_id": ws})}
    for stale in sorted(set(folder_rows) - wanted):
        removed = conn.execute(queries["delete_folder"], {"workspace_id": ws, "path": stale}).fetchone()
        if removed:
            result.folders_deleted.append(removed["id"])
    for path in sorted(wanted - set(folder_rows)):
        parent = posixpath.dirname(path)
        added = conn.execute(
            queries["insert_folder"],
            {"workspace_id": ws, "path": path, "name": posixpath.basename(path),
             "parent_path": None if parent == "/documents" else parent},
        ).fetchone()
        if added:
            result.folders_created.append(added["id"])
    conn.execute(queries["set_projected_revision"], {"workspace_id": ws, "revision_id": head})
    return result
