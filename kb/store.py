"""The store (SPEC §3): transactions applied in call order, one revision per clean exit, reads,
revert/restore, and catching Postgres up with git.

``KnowledgeStore`` is the porcelain over one workspace's repository (``kb.repository``). A commit
connects to Postgres first (unreachable → nothing is written: fail closed), writes the draft's blobs
unlocked, takes the workspace write lock (§4), records any revision git has and Postgres lacks,
builds the tree in the object store from HEAD's tree plus the change set, advances the branch ref
with a compare-and-swap, writes the revision row, per-path history rows and the deferred jobs in
that same transaction, refreshes the working tree, then commits Postgres (``kb.faults`` names these
steps for crash tests). A crash between the ref update and the Postgres commit leaves a revision git
has and Postgres lacks; the next commit, ``reconcile()`` (the sweep) or ``kb fsck`` records it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg

from kb import artifact_rows, database
from kb.draft import BlobRef, Draft, repo_path_of
from kb.commit_checks import check_case_collisions
from kb.errors import (
    CommitOutcomeUnknown, DatabaseUnavailable, InvalidInput, InvalidWorkspace, KbError, PathExists,
    RevisionNotFound, StorageError, WorkspaceNotFound,
)
from kb.faults import fault_point
from kb.history import PathChange, Revision, changes_from_git, read_history, record_missing, record_revision
from kb.locks import locked_transaction
from kb.merge import MergedBlob, merge_staged
from kb.paths import StorePath
from kb.repository import Repository
from kb.settings import Settings
from kb.sql import queries
from kb.titles import record_titles, rename_taken

__all__ = ["Draft", "KnowledgeStore", "PathChange", "Revision", "check_workspace_id", "defer_convergence", "summarize"]

log = logging.getLogger(__name__)

PROJECTION_TASK = "kb.project_changes"
INDEX_TASK = "kb.index_changes"


def check_workspace_id(workspace_id: object) -> int:
    """Return ``workspace_id`` as an int if it is a positive integer, else raise InvalidWorkspace."""
    if isinstance(workspace_id, bool) or not isinstance(workspace_id, int) or workspace_id <= 0:
        raise InvalidWorkspace(f"workspace ids are positive integers, got {workspace_id!r}")
    return workspace_id


def check_commit_text(message: str | None, author: str, committer: str | None) -> None:
    """Refuse commit text git and Postgres cannot both hold (SPEC §14): a NUL anywhere, a line
    break in an identity. Raises InvalidInput naming the field."""
    for field, value, single_line in (("message", message, False), ("author", author, True),
                                      ("committer", committer, True)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidInput(f"{field} must be text, not {type(value).__name__}")
        if "\x00" in value:
            raise InvalidInput(f"the {field} contains a NUL character; remove it")
        if single_line and ("\n" in value or "\r" in value):
            raise InvalidInput(f"the {field} {value!r} spans several lines; use one line")


def summarize(changes: list[PathChange]) -> str:
    """Deterministic commit message for a change set, e.g. ``docs: add 2 files, remove 1`` (SPEC §3)."""
    counts: dict[str, int] = {}
    for change in changes:
        if change.change != "moved_away":
            counts[change.change] = counts.get(change.change, 0) + 1
    words = {"added": "add", "modified": "update", "removed": "remove", "moved": "move"}
    kinds = [k for k in ("added", "modified", "removed", "moved") if counts.get(k)]
    if not kinds:
        return "docs: no changes"
    first, *rest = kinds
    noun = "file" if counts[first] == 1 else "files"
    return "docs: " + ", ".join([f"{words[first]} {counts[first]} {noun}", *(f"{words[k]} {counts[k]}" for k in rest)])


def _worktree_changes(changes: Iterator[PathChange] | list[PathChange]) -> dict[str, str | None]:
    """``{repo path: blob id or None}`` that a sequence of path changes leaves (last one wins)."""
    result: dict[str, str | None] = {}
    for change in changes:
        result[change.path] = None if change.change in ("removed", "moved_away") else change.content_id
    return result


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

    def close(self) -> None:
        """Close the repository if open (idempotent); the next use reopens it."""
        if self._repository is not None:
            self._repository.close()
            self._repository = None

    def exists(self) -> bool:
        """True when the workspace has a repository."""
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
        revision = self.repository.resolve(revision) if revision else self.head()
        return self.repository.read(revision, repo_path_of(path, allow_keep=True))

    def read_as_of(self, revision: str, path: str | StorePath) -> bytes:
        """Bytes of a document at ``revision`` (SPEC §3, citations §8)."""
        return self.read(path, revision)

    def list_paths(self, revision: str | None = None) -> dict[str, str]:
        """``{virtual path: content id}`` of every document at HEAD (or ``revision``)."""
        tree = self.repository.tree_id(self.repository.resolve(revision) if revision else self.head())
        return {"/" + p: blob for p, blob in self.repository.walk(tree, "documents")}

    def list_changes(self, revision: str) -> list[PathChange]:
        """Changes of ``revision`` against its parent (virtual paths, sorted), with the moves the
        store recorded (from Postgres); for a revision Postgres lacks, from git with exact-content
        moves inferred. Raises RevisionNotFound."""
        revision = self.repository.resolve(revision)
        with database.transaction(self.database_url) as conn:
            rows = conn.execute(
                queries["revision_changes"], {"workspace_id": self.workspace_id, "revision_id": revision}
            ).fetchall()
        changes = [PathChange(**row) for row in rows] or changes_from_git(self.repository, revision)
        return [c.virtual() for c in changes]

    def history(self, path: str | StorePath | None = None, limit: int = 50) -> list[Revision]:
        """Revisions newest first, from Postgres (SPEC §3); for one path, following recorded moves.

        ``limit`` ≥ 1. Raises WorkspaceNotFound for a workspace without a repository, InvalidPath.
        """
        self.repository  # noqa: B018  (raises WorkspaceNotFound)
        repo_path = None if path is None else repo_path_of(path, allow_keep=True)
        with database.transaction(self.database_url) as conn:
            return read_history(conn, self.workspace_id, repo_path, max(1, int(limit)))

    # -- writes --------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self, message: str | None, author: str, committer: str | None = None) -> Iterator[Draft]:
        """Yield a Draft; on clean exit record exactly one revision (``draft.revision``), or None
        if the net change is empty. An exception records nothing (SPEC §3).

        Raises InvalidInput (NUL in the message, a NUL or line break in author/committer) before
        anything is written, WorkspaceNotFound, LockTimeout, LockUnavailable, DatabaseUnavailable,
        PathExists.
        """
        check_commit_text(message, author, committer)
        repo = self.repository
        draft = Draft(repo, repo.tree_id(repo.head()))
        yield draft
        try:
            draft.revision = self.commit_draft(draft, message, author, committer or author)
        except (psycopg.Error, OSError, DatabaseUnavailable) as exc:
            raise write_failure(self.workspace_id, draft.pending, exc) from exc

    def _stage(self, draft: Draft) -> dict[str, str | None]:
        """Write the draft's new bytes as blobs (idempotent, unlocked); ``{repo path: blob or None}``."""
        repo, staged, pending = self.repository, {}, []
        for path, value in draft._overlay.items():
            if value is None or isinstance(value, BlobRef):
                staged[path] = None if value is None else value.id
            else:
                pending.append(path)
        for path, blob in zip(pending, repo.add_blobs(draft._overlay[p] for p in pending)):
            staged[path] = blob
        return staged

    def _stage_merged(self, draft: Draft) -> tuple[dict[str, str | None], dict[str, MergedBlob]]:
        """Unlocked: stage the draft's blobs and merge its ``write_merged`` paths with the head
        as it is now (redone under the lock only for paths whose head blob moved meanwhile).
        Raises WorkspaceNotFound when the workspace was deleted since the draft began."""
        try:
            staged = self._stage(draft)
        except FileNotFoundError:
            if self.exists():
                raise
            raise WorkspaceNotFound(f"workspace {self.workspace_id} was deleted; nothing was recorded") from None
        if not draft._merge_requests:
            return staged, {}
        repo = self.repository
        return staged, merge_staged(repo, draft._merge_requests, staged, repo.tree_id(repo.head()))

    def _merge_with_head(self, draft: Draft, staged: dict[str, str | None], head_tree: bytes | None,
                         premerged: dict[str, MergedBlob]) -> dict[str, str | None]:
        """Under the lock: three-way merge the draft's ``write_merged`` paths with the current head
        (SPEC §5); returns the staged blobs with merged ones substituted and fills ``draft.merges``."""
        if not draft._merge_requests:
            return staged
        merged = merge_staged(self.repository, draft._merge_requests, staged, head_tree, premerged)
        draft.merges = {"/" + p: m.outcome for p, m in merged.items() if m.outcome is not None}
        return {**staged, **{p: m.blob for p, m in merged.items()}}

    def commit_draft(self, draft: Draft, message: str | None, author: str, committer: str) -> Revision | None:
        """Record ``draft`` on top of the *current* head as one revision (see the module docstring).

        Returns the Revision (virtual paths), or None when the net change is empty.
        """
        if draft.is_empty():
            return None
        repo = self.repository
        with locked_transaction(self.database_url, self.workspace_id, self.settings, lambda: self._stage_merged(draft)) \
                as (conn, (staged, premerged)):
            repo.clear_stale_locks()
            workspace = self._workspace_row(conn)
            if self._catch_up(conn, workspace):
                workspace = self._workspace_row(conn)
            head = repo.head()
            head_tree = repo.tree_id(head)
            staged = self._merge_with_head(draft, staged, head_tree, premerged)
            staged = rename_taken(repo, draft, staged, head_tree)  # create-by-title race (SPEC §2.2)
            effective: dict[str, str | None] = {}
            changes: dict[str, PathChange] = {}
            at_head = repo.lookup_many(head_tree, staged)
            for path, blob in staged.items():
                old = at_head[path][1] if at_head[path] and at_head[path][0] == "file" else None
                if old == blob:
                    continue
                effective[path] = blob
                kind = "added" if old is None else ("removed" if blob is None else "modified")
                changes[path] = PathChange(path, kind, blob)
            if not effective:
                return None
            self._check_tree(head_tree, effective, at_head)
            check_case_collisions(repo, head_tree, effective, at_head)
            # Kinds before any move is applied, so the order of moves never matters (a swap
            # p <-> q records two moves whichever is seen first).
            kinds = {path: change.change for path, change in changes.items()}
            for new, origin in draft.moves().items():
                if new not in changes or kinds.get(origin) not in ("removed", "modified"):
                    continue
                target, source = changes[new], changes[origin]
                changes[new] = PathChange(new, "moved", target.content_id, old_path=origin,
                                          new_path=target.new_path)
                if source.change == "moved":  # the source is itself a move's destination
                    changes[origin] = PathChange(origin, "moved", source.content_id,
                                                 old_path=source.old_path, new_path=new)
                else:
                    changes[origin] = PathChange(
                        origin, "moved_away" if kinds[origin] == "removed" else "modified",
                        source.content_id, new_path=new,
                    )
            ordered = tuple(sorted(changes.values(), key=lambda c: c.path))
            text = message or summarize(list(ordered))
            commit = repo.make_commit(repo.build_tree(head_tree, list(effective.items())), head, text, author, committer)
            artifact_rows.guard(conn, self.workspace_id, effective, draft.artifact_access, commit.id.decode())
            for hook in draft.on_record:  # e.g. the artifact layer's generation check (SPEC §11)
                hook(conn, head_tree, commit.id.decode())
            fault_point("objects_written")
            revision = Revision(commit.id.decode(), workspace["revision_count"] + 1, head, author, committer,
                                text, None, ordered)
            with conn.pipeline():  # one round trip for the revision's rows and jobs
                record_revision(conn, self.workspace_id, revision, commit.commit_time)
                record_titles(conn, self.workspace_id, revision.seq, draft.titles())
                defer_convergence(conn, self.workspace_id)
            draft.pending = revision.id
            if not repo.advance(head, revision.id):
                raise KbError(
                    f"workspace {self.workspace_id}: the branch moved while the write lock was held; "
                    "another process writes without the lock. Nothing was recorded."
                )
            fault_point("ref_advanced")
            try:
                refused = repo.refresh_worktree(
                    effective.items(), {p: v for p, v in draft._overlay.items()
                                        if isinstance(v, bytes) and p not in draft._merge_requests},
                    moves=draft.moves(),
                )
                if refused:
                    log.warning("workspace %s: %d paths of %s not checked out (%s…); `kb fsck` lists them",
                                self.workspace_id, len(refused), revision.id, refused[0][:80])
            except OSError as exc:  # the working tree is a convenience; git and Postgres are not
                log.warning("workspace %s: working tree not refreshed after %s (%s); `kb fsck` repairs it",
                            self.workspace_id, revision.id, exc)
            fault_point("before_pg_commit")
        return Revision(revision.id, revision.seq, head, author, committer, text, None,
                        tuple(c.virtual() for c in ordered))

    def _check_tree(self, head_tree: bytes | None, effective: dict[str, str | None],
                    at_head: dict[str, tuple[str, str] | None]) -> None:
        """Raise PathExists if applying ``effective`` to HEAD would put a document under a document
        (possible when a concurrent revision created a file where this draft made a folder).
        ``at_head``: ``Repository.lookup_many`` of the changed paths in ``head_tree``."""
        repo, folders_ok = self.repository, set()
        for path, blob in effective.items():
            if blob is None:
                continue
            parts = path.split("/")
            for i in range(2, len(parts)):
                folder = "/".join(parts[:i])
                if folder in folders_ok:
                    continue
                if (effective[folder] if folder in effective else repo.lookup(head_tree, folder)) is not None:
                    raise PathExists(f"cannot write /{path}: /{folder} is a document (changed meanwhile)")
                folders_ok.add(folder)
            if at_head.get(path) and at_head[path][0] == "folder" and any(
                effective.get(p, b) is not None for p, b in repo.walk(head_tree, path)
            ):
                raise PathExists(f"cannot write /{path}: it became a folder holding documents meanwhile")

    def _workspace_row(self, conn: psycopg.Connection) -> dict:
        row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        if row is None and not self.exists():  # deleted while this writer waited for the lock
            raise WorkspaceNotFound(f"workspace {self.workspace_id} was deleted; nothing was recorded")
        if row is None:
            conn.execute(queries["ensure_workspace"], {"workspace_id": self.workspace_id})
            row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        return row

    def _catch_up(self, conn: psycopg.Connection, workspace: dict) -> list[Revision]:
        """Under the write lock: record revisions git has and Postgres lacks, defer their jobs, and
        refresh the working tree for the paths they touched (a crashed writer may have left it)."""
        missing = record_missing(conn, self.repository, workspace)
        if missing:
            artifact_rows.recover(conn, self.workspace_id, (r.message for r in missing))
            defer_convergence(conn, self.workspace_id)
            try:  # the working tree is a convenience: never let it stop Postgres catching up
                self.repository.refresh_worktree(
                    _worktree_changes([c for r in missing for c in r.changes]).items()
                )
            except OSError as exc:
                log.warning("workspace %s: working tree not refreshed while catching up (%s); `kb fsck` "
                            "repairs it", self.workspace_id, exc)
        return [
            Revision(r.id, r.seq, r.parent_id, r.author, r.committer, r.message, r.committed_at,
                     tuple(c.virtual() for c in r.changes))
            for r in missing
        ]

    def reconcile(self) -> list[Revision]:
        """Record every revision git has and Postgres lacks, with history rows and deferred
        projection/index jobs (SPEC §3; the periodic sweep and ``kb fsck`` call this).

        Cheap when nothing is missing (one row read, no lock). Returns the revisions recorded,
        oldest first (virtual paths). Raises WorkspaceNotFound, HistoryDiverged, LockTimeout.
        """
        repo = self.repository
        with database.transaction(self.database_url) as conn:
            row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        if row is not None and row["head_revision"] == repo.head():
            return []
        with locked_transaction(self.database_url, self.workspace_id, self.settings) as (conn, _):
            return self._catch_up(conn, self._workspace_row(conn))

    def revert(self, revision: str, author: str, committer: str | None = None,
               message: str | None = None) -> Revision | None:
        """Record a new forward revision that puts every path ``revision`` touched back to its state
        in ``revision``'s parent (SPEC §3). A recorded move is undone as a move when the moved
        document is still where the revision put it. Returns None when there is nothing to undo.

        Raises RevisionNotFound (unknown id, or not in this workspace's history), PathExists when a
        path to restore is now a folder holding documents, LockTimeout.
        """
        repo = self.repository
        revision = repo.resolve(revision)
        target = repo.commit(revision)
        with database.transaction(self.database_url) as conn:
            recorded = conn.execute(
                queries["revision_exists"], {"workspace_id": self.workspace_id, "revision_id": revision}
            ).fetchone()
        if recorded is None and revision not in repo.ancestry(repo.head()):
            raise RevisionNotFound(f"revision {revision} is not in workspace {self.workspace_id}'s history")
        parent_tree = repo.tree_id(target.parents[0].decode()) if target.parents else None
        changes = self.list_changes(revision)
        first_line = target.message.decode("utf-8", errors="replace").splitlines()[0] if target.message else ""
        text = message or f'Revert "{first_line}"\n\nThis reverts revision {revision}.'
        with self.transaction(text, author, committer) as draft:
            draft.artifact_access = artifact_rows.ACCESS_BUMP  # SPEC §11: revert bumps generations
            written = {c.path: c.content_id for c in changes}
            for change in changes:
                # undo a move as a move while the document is still where the revision put it and
                # its old path is free or holds what this revision wrote there (move-then-write)
                if (change.change == "moved" and draft.content_id(change.path) == change.content_id
                        and draft.content_id(change.old_path) in (None, written.get(change.old_path))):
                    draft.move(change.path, change.old_path, overwrite=True)
            touched = {p for c in changes for p in (c.path, c.old_path, c.new_path) if p}
            for path in sorted(touched):
                blob = repo.lookup(parent_tree, path[1:])
                if blob is None:
                    if draft.exists(path):
                        draft.remove(path)
                elif draft.content_id(path) != blob:
                    draft.write(path, repo.blob(blob), allow_keep=True)
        return draft.revision

    def restore(self, path: str | StorePath, revision: str, author: str, committer: str | None = None,
                message: str | None = None) -> Revision | None:
        """Bring one document back as it was at ``revision``, as a new forward revision (SPEC §3).

        Returns None when HEAD already holds those bytes there. Raises RevisionNotFound,
        DocumentNotFound (no document at ``path`` in ``revision``), InvalidPath, PathExists.
        """
        revision = self.repository.resolve(revision)
        data = self.read_as_of(revision, path)
        virtual = StorePath.parse(str(path), allow_keep=True).virtual
        text = message or f"restore {virtual} from revision {revision[:12]}"
        with self.transaction(text, author, committer) as draft:
            draft.artifact_access = artifact_rows.ACCESS_BUMP  # SPEC §11: restore bumps generations
            draft.write(virtual, data, allow_keep=True)
        return draft.revision


def write_failure(workspace_id: int, pending: str | None, exc: BaseException) -> KbError:
    """The KbError for a Postgres or file-system failure during a commit (SPEC §3, §14): when the
    branch may have moved (``pending`` set), CommitOutcomeUnknown naming that revision; otherwise
    DatabaseUnavailable / StorageError saying nothing was recorded."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if pending is not None:
        return CommitOutcomeUnknown(workspace_id, pending, reason)
    if isinstance(exc, OSError):
        return StorageError(f"workspace {workspace_id}: the file system refused the write ({reason}); "
                            "nothing was recorded. Free space or fix permissions, then retry.")
    return DatabaseUnavailable(f"workspace {workspace_id}: Postgres failed during the write ({reason}); "
                               "nothing was recorded. Retry when the server is back.")


def defer_convergence(conn: psycopg.Connection, workspace_id: int) -> None:
    """Defer the projection and index jobs for a workspace in ``conn``'s transaction (SPEC §3, §7),
    and the push job when the workspace has a git remote (SPEC §13, ``kb.remotes``).

    Both jobs converge to HEAD, so a waiting job with the same queueing lock already covers this.
    """
    for queue, task in (("projection", PROJECTION_TASK), ("index", INDEX_TASK)):
        defer_job(conn, queue, task, workspace_id)
    conn.execute(queries["defer_push_if_remote"], {"workspace_id": workspace_id})  # SPEC §13, if any


DEFER_WHEN_DUE_TASK = "kb.defer_when_due"


def job_lock(queue: str, workspace_id: int) -> str:
    """The Procrastinate lock a due job of ``queue`` runs under: ``"projection:{ws}"`` or
    ``"index:{ws}"``. Projection and indexing never share a lock, so projection never waits for an
    index run or an index retry (issue 19); each job also takes its own advisory lock (SPEC §4)."""
    return f"{'projection' if queue == 'projection' else 'index'}:{workspace_id}"


def defer_job(conn, queue: str, task: str, workspace_id: int, *, queueing_lock: str | None = None,
              delay_seconds: float = 0) -> int | None:
    """Defer ``task(workspace_id=…)`` on ``queue`` in ``conn``'s transaction; returns the job id,
    or None when a waiting job with the same queueing lock covers it (default ``"{queue}:{ws}"``;
    ``"{queue}-delayed:{ws}"`` for a delayed one, so a job scheduled later never covers a due one).

    A due job runs under ``job_lock(queue, ws)`` (serialized per workspace and concern, SPEC §7).
    ``delay_seconds > 0`` schedules it for later *without any lock*: Procrastinate's fetch treats
    a waiting job as holding its lock even before its ``scheduled_at``, so a delayed job carrying
    the lock would hold back every due job of the workspace (issue 19). The delayed job is a
    ``kb.defer_when_due`` that, once due, defers the real job with its lock (coalesced with one
    already waiting).
    """
    if delay_seconds > 0:
        args = {"workspace_id": workspace_id, "task": task, "queue": queue}
        lock, task = None, DEFER_WHEN_DUE_TASK
        queueing_lock = queueing_lock or f"{queue}-delayed:{workspace_id}"
    else:
        args, lock = {"workspace_id": workspace_id}, job_lock(queue, workspace_id)
    row = conn.execute(
        queries["defer_job"],
        {"queue": queue, "task": task, "lock": lock,
         "queueing_lock": queueing_lock or f"{queue}:{workspace_id}",
         "args": json.dumps(args), "delay_seconds": delay_seconds},
    ).fetchone()
    return row["id"] if row else None
