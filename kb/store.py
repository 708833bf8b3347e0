"""The store (SPEC §3): transactions applied in call order, one revision per clean exit, reads,
and history served from Postgres.

``KnowledgeStore`` is the porcelain over one workspace's repository (``kb.repository``). A commit
builds its tree in the object store from HEAD's tree plus the draft's change set, takes the
workspace write lock (§4) inside a Postgres transaction, advances the branch ref with a
compare-and-swap, writes the revision row, per-path history rows and the deferred jobs in that same
transaction, refreshes the working tree, then commits Postgres. A crash between the ref update and
the Postgres commit leaves a revision git has and Postgres lacks; ``kb fsck`` and the sweep record it.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from kb import database
from kb.errors import DocumentNotFound, InvalidWorkspace, KbError, PathExists, WorkspaceNotFound
from kb.locks import write_lock
from kb.paths import StorePath
from kb.repository import Repository
from kb.settings import Settings
from kb.sql import queries

PROJECTION_TASK = "kb.project_changes"
INDEX_TASK = "kb.index_changes"


def check_workspace_id(workspace_id: object) -> int:
    """Return ``workspace_id`` as an int if it is a positive integer, else raise InvalidWorkspace."""
    if isinstance(workspace_id, bool) or not isinstance(workspace_id, int) or workspace_id <= 0:
        raise InvalidWorkspace(f"workspace ids are positive integers, got {workspace_id!r}")
    return workspace_id


@dataclass(frozen=True)
class PathChange:
    """One path's change in a revision. ``change``: added|modified|removed|moved|moved_away."""

    path: str
    change: str
    content_id: str | None = None
    old_path: str | None = None
    new_path: str | None = None


@dataclass(frozen=True)
class Revision:
    """A recorded revision (git commit) with its path changes."""

    id: str
    seq: int
    parent_id: str | None
    author: str
    committer: str
    message: str
    committed_at: datetime | None
    changes: tuple[PathChange, ...] = ()


@dataclass(frozen=True)
class _BlobRef:
    id: str


@dataclass
class Draft:
    """The change set of one transaction, applied in call order against the base tree.

    Paths are caller paths (``/documents/...`` or ``documents/...``), parsed by StorePath (§2.3).
    ``revision`` is set when the transaction's block exits cleanly (None for a net-empty change).
    """

    _repo: Repository
    _base_tree: bytes | None
    _overlay: dict[str, bytes | _BlobRef | None] = field(default_factory=dict)
    _moves: dict[str, str] = field(default_factory=dict)
    _dirs: set[str] = field(default_factory=set)
    revision: Revision | None = None

    def _set(self, repo_path: str, value: "bytes | _BlobRef | None") -> None:
        self._overlay[repo_path] = value
        if value is not None:
            parent = posixpath.dirname(repo_path)
            while parent and parent not in self._dirs:
                self._dirs.add(parent)
                parent = posixpath.dirname(parent)

    def _current(self, repo_path: str) -> bytes | _BlobRef | None:
        if repo_path in self._overlay:
            return self._overlay[repo_path]
        blob_id = self._repo.lookup(self._base_tree, repo_path)
        return None if blob_id is None else _BlobRef(blob_id)

    def _files_under(self, folder: str) -> list[str]:
        prefix = folder + "/"
        found = {p for p, _ in self._repo.walk(self._base_tree, folder)}
        found |= {p for p in self._overlay if p.startswith(prefix)}
        return sorted(p for p in found if self._current(p) is not None)

    def exists(self, path: str | StorePath) -> bool:
        """True when a document exists at ``path`` as of the calls made so far."""
        return self._current(_repo_path(path)) is not None

    def read(self, path: str | StorePath) -> bytes:
        """Bytes at ``path`` as of the calls made so far; raises DocumentNotFound."""
        value = self._current(_repo_path(path))
        if value is None:
            raise DocumentNotFound(f"no document at {_virtual(path)}")
        return value if isinstance(value, bytes) else self._repo.blob(value.id)

    def write(self, path: str | StorePath, data: bytes | str, *, allow_keep: bool = False) -> None:
        """Create or replace the document at ``path`` (str is encoded as UTF-8)."""
        repo_path = _repo_path(path, allow_keep=allow_keep)
        if repo_path in self._dirs or self._repo.is_folder(self._base_tree, repo_path):
            if self._files_under(repo_path):
                raise PathExists(f"{_virtual(path)} is a folder; cannot write a document there")
        self._set(repo_path, data.encode("utf-8") if isinstance(data, str) else bytes(data))

    def remove(self, path: str | StorePath) -> None:
        """Remove the document (or every document of the folder) at ``path``; DocumentNotFound if none."""
        repo_path = _repo_path(path, allow_keep=True)
        targets = [repo_path] if self._current(repo_path) is not None else self._files_under(repo_path)
        if not targets:
            raise DocumentNotFound(f"cannot remove {_virtual(path)}: no such document or folder")
        for target in targets:
            self._set(target, None)
            self._moves.pop(target, None)

    def move(self, src: str | StorePath, dst: str | StorePath, *, overwrite: bool = False) -> None:
        """Move a document (or a whole folder) from ``src`` to ``dst``; the move is recorded.

        Raises DocumentNotFound when ``src`` does not exist, PathExists when ``dst`` exists and
        ``overwrite`` is False.
        """
        src_path, dst_path = _repo_path(src, allow_keep=True), _repo_path(dst, allow_keep=True)
        if src_path == dst_path:
            return
        if self._current(src_path) is not None:
            pairs = [(src_path, dst_path)]
        else:
            files = self._files_under(src_path)
            if not files:
                raise DocumentNotFound(f"cannot move {_virtual(src)}: no such document or folder")
            if dst_path.startswith(src_path + "/"):
                raise PathExists(f"cannot move folder {_virtual(src)} into itself")
            pairs = [(f, dst_path + f[len(src_path):]) for f in files]
        for old, new in pairs:
            if self._current(new) is not None and not overwrite:
                raise PathExists(
                    f"cannot move {_virtual(old)} to {_virtual(new)}: a document exists there "
                    "(pass overwrite=True to replace it)"
                )
        for old, new in pairs:
            self._set(new, self._current(old))
            self._set(old, None)
            origin = self._moves.pop(old, old)
            self._moves.pop(new, None)
            if origin != new:
                self._moves[new] = origin

    def is_empty(self) -> bool:
        """True when no call has been made (the net change may still be empty)."""
        return not self._overlay


def _repo_path(path: str | StorePath, *, allow_keep: bool = False) -> str:
    if isinstance(path, StorePath):
        return path.repo_path
    return StorePath.parse(path, allow_keep=allow_keep).repo_path


def _virtual(path: str | StorePath) -> str:
    return str(path) if isinstance(path, StorePath) else path


def summarize(changes: list[PathChange]) -> str:
    """Deterministic commit message for a change set, e.g. ``docs: add 2 files, remove 1``."""
    counts: dict[str, int] = {}
    for change in changes:
        if change.change != "moved_away":
            counts[change.change] = counts.get(change.change, 0) + 1
    words = {"added": "add", "modified": "update", "removed": "remove", "moved": "move"}
    parts = [f"{words[k]} {counts[k]}" for k in ("added", "modified", "removed", "moved") if counts.get(k)]
    if not parts:
        return "docs: no changes"
    first, *rest = parts
    noun = "file" if sum(counts.values()) == 1 else "files"
    return "docs: " + ", ".join([f"{first} {noun}", *rest])


class KnowledgeStore:
    """The store of one workspace: repository at ``{storage_root}/knowledge_store/{id}`` + Postgres."""

    def __init__(self, settings: Settings, database_url: str, workspace_id: int) -> None:
        self.settings = settings
        self.database_url = database_url
        self.workspace_id = check_workspace_id(workspace_id)
        self.path: Path = settings.knowledge_store / str(workspace_id)
        self._repository: Repository | None = None

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def repository(self) -> Repository:
        """The workspace's git repository; raises WorkspaceNotFound when it has none yet."""
        if self._repository is None:
            try:
                self._repository = Repository.open(self.path)
            except FileNotFoundError:
                raise WorkspaceNotFound(
                    f"workspace {self.workspace_id} does not exist; create it with "
                    f"`kb import PATH --workspace {self.workspace_id}`"
                ) from None
        return self._repository

    def exists(self) -> bool:
        """True when the workspace has a repository and a row."""
        return (self.path / ".git").is_dir()

    def create(self) -> bool:
        """Create the repository and the workspace row if missing; True when newly created."""
        with database.transaction(self.database_url) as conn:
            row = conn.execute(queries["ensure_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        created = row is not None or not self.exists()
        self._repository = Repository.create(self.path)
        return created

    # -- reads (no lock) -----------------------------------------------------------------
    def head(self) -> str | None:
        """Hex id of the newest revision, or None for an empty workspace."""
        return self.repository.head()

    def read(self, path: str | StorePath, revision: str | None = None) -> bytes:
        """Bytes of a document at HEAD (or ``revision``); raises DocumentNotFound/RevisionNotFound."""
        return self.repository.read(revision or self.head(), _repo_path(path, allow_keep=True))

    def read_as_of(self, revision: str, path: str | StorePath) -> bytes:
        """Bytes of a document at ``revision`` (SPEC §3, citations §8)."""
        return self.read(path, revision)

    def list_paths(self, revision: str | None = None) -> dict[str, str]:
        """``{virtual path: content id}`` of every document at HEAD (or ``revision``)."""
        tree = self.repository.tree_id(revision or self.head())
        return {"/" + p: blob for p, blob in self.repository.walk(tree, "documents")}

    def list_changes(self, revision: str) -> list[PathChange]:
        """Changes of ``revision`` against its parent, with recorded moves (from Postgres)."""
        self.repository.commit(revision)
        with database.transaction(self.database_url) as conn:
            rows = conn.execute(
                queries["revision_changes"], {"workspace_id": self.workspace_id, "revision_id": revision}
            ).fetchall()
        if rows:
            return [PathChange(**row) for row in rows]
        parents = self.repository.parents(revision)
        old_tree = self.repository.tree_id(parents[0]) if parents else None
        return [
            PathChange(c.path, c.kind, c.new_id)
            for c in self.repository.diff(old_tree, self.repository.tree_id(revision))
        ]

    def history(self, path: str | StorePath | None = None, limit: int = 50) -> list[Revision]:
        """Revisions newest first, from Postgres (SPEC §3); for one path, following recorded moves.

        Raises WorkspaceNotFound for a workspace without a repository.
        """
        self.repository  # noqa: B018  (raises WorkspaceNotFound)
        params = {"workspace_id": self.workspace_id, "limit": limit}
        with database.transaction(self.database_url) as conn:
            if path is None:
                rows = conn.execute(queries["workspace_history"], params).fetchall()
                return [
                    Revision(
                        r["id"], r["seq"], r["parent_id"], r["author"], r["committer"], r["message"],
                        r["committed_at"], tuple(PathChange("/" + p, "") for p in r["paths"]),
                    )
                    for r in rows
                ]
            current, max_seq, result = _repo_path(path, allow_keep=True), 2**62, []
            while current and len(result) < limit:
                rows = conn.execute(
                    queries["path_history"],
                    {**params, "path": current, "max_seq": max_seq, "limit": limit - len(result)},
                ).fetchall()
                current = None
                for r in rows:
                    change = PathChange(
                        "/" + r["path"], r["change"], r["content_id"],
                        r["old_path"] and "/" + r["old_path"], r["new_path"] and "/" + r["new_path"],
                    )
                    result.append(
                        Revision(r["id"], r["seq"], r["parent_id"], r["author"], r["committer"],
                                 r["message"], r["committed_at"], (change,))
                    )
                    if r["change"] == "moved" and r["old_path"]:
                        current, max_seq = r["old_path"], r["seq"] - 1
                        break
            return result

    # -- writes --------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, message: str | None, author: str, committer: str | None = None) -> Iterator[Draft]:
        """Yield a Draft; on clean exit record exactly one revision (``draft.revision``), or None
        if the net change is empty. An exception records nothing (SPEC §3).

        Raises WorkspaceNotFound, LockTimeout, LockUnavailable, DatabaseUnavailable.
        """
        repo = self.repository
        draft = Draft(repo, repo.tree_id(repo.head()))
        yield draft
        draft.revision = self.commit_draft(draft, message, author, committer or author)

    def commit_draft(self, draft: Draft, message: str | None, author: str, committer: str) -> Revision | None:
        """Record ``draft`` on top of the current head as one revision (see module docstring)."""
        if draft.is_empty():
            return None
        repo = self.repository
        # Blobs first, outside the lock: writing objects is idempotent and slow work (§4).
        staged: dict[str, str | None] = {}
        for path, value in draft._overlay.items():
            if value is None:
                staged[path] = None
            elif isinstance(value, _BlobRef):
                staged[path] = value.id
            else:
                staged[path] = repo.add_blob(value)
        with database.transaction(self.database_url) as conn, write_lock(conn, self.workspace_id, self.settings):
            workspace = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
            if workspace is None:
                raise WorkspaceNotFound(f"workspace {self.workspace_id} has no row; run `kb fsck`")
            head = repo.head()
            head_tree = repo.tree_id(head)
            effective: list[tuple[str, str | None]] = []
            changes: dict[str, PathChange] = {}
            for path, blob_id in staged.items():
                old = repo.lookup(head_tree, path)
                if old == blob_id:
                    continue
                effective.append((path, blob_id))
                kind = "added" if old is None else ("removed" if blob_id is None else "modified")
                changes[path] = PathChange(path, kind, blob_id)
            if not effective:
                return None
            for new, origin in draft._moves.items():
                if new in changes and changes[new].change != "removed" and origin in changes \
                        and changes[origin].change == "removed":
                    changes[new] = PathChange(new, "moved", changes[new].content_id, old_path=origin)
                    changes[origin] = PathChange(origin, "moved_away", None, new_path=new)
            ordered = sorted(changes.values(), key=lambda c: c.path)
            text = message or summarize(ordered)
            tree = repo.build_tree(head_tree, effective)
            commit = repo.make_commit(tree, head, text, author, committer)
            revision_id = commit.id.decode()
            seq = workspace["revision_count"] + 1
            self._record(conn, revision_id, seq, head, author, committer, text, commit.commit_time, ordered)
            if not repo.advance(head, revision_id):
                raise KbError(
                    f"workspace {self.workspace_id}: the branch moved while the write lock was held; "
                    "another process writes without the lock. Nothing was recorded."
                )
            repo.refresh_worktree(effective)
        return Revision(revision_id, seq, head, author, committer, text, None, tuple(ordered))

    def _record(self, conn, revision_id, seq, parent, author, committer, message, when, changes) -> None:
        ws = self.workspace_id
        conn.execute(
            queries["insert_revision"],
            {"workspace_id": ws, "id": revision_id, "seq": seq, "parent_id": parent, "author": author,
             "committer": committer, "message": message, "committed_at": when},
        )
        with conn.cursor() as cur:
            cur.executemany(
                queries["insert_path_change"],
                [
                    {"workspace_id": ws, "revision_id": revision_id, "seq": seq, "path": c.path,
                     "change": c.change, "old_path": c.old_path, "new_path": c.new_path,
                     "content_id": c.content_id}
                    for c in changes
                ],
            )
        conn.execute(queries["advance_workspace_head"], {"workspace_id": ws, "revision_id": revision_id, "seq": seq})
        defer_convergence(conn, ws)


def defer_convergence(conn, workspace_id: int) -> None:
    """Defer the projection and index jobs for a workspace in ``conn``'s transaction (SPEC §3, §7).

    Both jobs converge to HEAD, so a waiting job with the same queueing lock already covers this.
    """
    for queue, task in (("projection", PROJECTION_TASK), ("index", INDEX_TASK)):
        defer_job(conn, queue, task, workspace_id)


def defer_job(conn, queue: str, task: str, workspace_id: int, *, queueing_lock: str | None = None,
              delay_seconds: float = 0) -> int | None:
    """Defer ``task(workspace_id=…)`` on ``queue`` in ``conn``'s transaction; returns the job id,
    or None when a waiting job with the same queueing lock (default ``"{queue}:{ws}"``) covers it.

    Every kb job of a workspace runs under the lock ``"ws:{ws}"`` (serialized, SPEC §7);
    ``delay_seconds`` schedules it for later.
    """
    row = conn.execute(
        queries["defer_job"],
        {"queue": queue, "task": task, "lock": f"ws:{workspace_id}",
         "queueing_lock": queueing_lock or f"{queue}:{workspace_id}",
         "args": json.dumps({"workspace_id": workspace_id}), "delay_seconds": delay_seconds},
    ).fetchone()
    return row["id"] if row else None
