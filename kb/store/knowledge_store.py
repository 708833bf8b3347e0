"""The store (design §3): transactions applied in call order, one revision per clean exit, reads,
and catching Postgres up with git.

``KnowledgeStore`` is the porcelain over one workspace's repository (``kb.git.repository``). A commit
connects to Postgres first (unreachable → nothing is written: fail closed), writes the draft's blobs
unlocked, takes the workspace write lock (§4), records any revision git has and Postgres lacks,
builds the tree in the object store from HEAD's tree plus the change set, writes the revision row,
per-path history rows and the deferred jobs in that same transaction, advances the branch ref with a
compare-and-swap (fsynced), then commits Postgres (``kb.faults`` names these steps for crash tests)
and, outside the lock, refreshes the working tree. A crash between the ref update and the Postgres
commit leaves a revision git has and Postgres lacks; the next commit, ``reconcile()`` (the sweep)
or ``kb fsck`` records it.

Plain drafts are group-committed (``kb.store.group_commit``, design §14): queued, then recorded with the
other queued drafts by whichever writer holds the lock, each as its own revision with its own
outcome, all in one Postgres transaction and one ref update.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from kb.db import database, nodes
from kb.db.locks import chunk_lock, locked_pipeline, locked_transaction
from kb.db.sql import queries
from kb.errors import (
    CommitOutcomeUnknown,
    DatabaseUnavailable,
    DocumentNotFound,
    HistoryDiverged,
    InvalidInput,
    KbError,
    LockTimeout,
    LockUnavailable,
    PathExists,
    RevisionNotFound,
    StorageError,
    WorkspaceNotFound,
    WriteLockLost,
    WrongNode,
)
from kb.faults import fault_point
from kb.git.key_fence import KeyFenceTimeout, key_fence
from kb.git.maintenance import (
    PACK_BACKSTOP_EVERY,
    PACK_BACKSTOP_LOOSE,
    PACK_BACKSTOP_SAMPLE,
    estimated_loose_objects,
    pack_workspace,
)
from kb.git.ref_fence import RefFenceTimeout, ref_fence
from kb.git.repository import Repository
from kb.paths import StorePath, check_workspace_id
from kb.settings import Settings
from kb.store import artifact_rows, group_commit, repository_guard, write_keys
from kb.store.authors import git_identity
from kb.store.commit_checks import check_case_collisions
from kb.store.draft import BlobRef, Draft, repo_path_of
from kb.store.history import (
    PathChange,
    Revision,
    changes_from_git,
    forget_changes,
    moved_away,
    moved_away_to,
    read_history,
    record_changes_ahead,
    record_missing,
    record_revisions,
)
from kb.store.history import moved_to as history_moved_to
from kb.store.history import path_in_revision as history_path_in_revision
from kb.store.job_deferral import defer_convergence, defer_packing
from kb.store.listing import Entry, list_tree, not_a_document
from kb.store.moved_edits import follow_moved_edits
from kb.store.titles import record_titles, rename_taken

if TYPE_CHECKING:
    from dulwich.objects import Commit

    from kb.db.database import Connection
    from kb.git.merge import MergedBlob
    from kb.git.worktree_refresh import PendingRefresh

__all__ = ["Draft", "KnowledgeStore", "PathChange", "Revision", "check_workspace_id", "summarize"]

log = logging.getLogger(__name__)

_SETTLED_BY_KEY = (DatabaseUnavailable, LockUnavailable, CommitOutcomeUnknown)
"""kb's errors of a commit that ``transaction`` settles by the write's key (or that already say
the outcome is unknown), design §3; any other KbError of a queued write is settled where it
is raised (``_commit_queued``)."""

PREBUILD_PATHS = 256
"""Staged paths from which a writer checks and builds its revision's tree before the write lock
(``KnowledgeStore._prebuild``): below it, building twice when the head moves meanwhile costs more
than the lock time it saves."""


def _prebuildable(draft: Draft, staged: dict[str, str | None]) -> bool:
    """Whether ``draft`` is built before the write lock (``KnowledgeStore._prebuild``): at least
    PREBUILD_PATHS paths, and no merges or titles, which are settled against the head under it."""
    return len(staged) >= PREBUILD_PATHS and not draft.merge_requests() and not draft.titles()


TURN_TRAILER = "Turn:"
"""How a turn's revision ends: the line ``Turn: <turn id>`` (``turn_trailer``), which only the
store writes, for ``transaction(turn_id=…)`` (design §5)."""


def turn_trailer(turn_id: str) -> str:
    """The last line of the message of a revision a turn records (design §5): ``Turn: <id>``."""
    return f"{TURN_TRAILER} {turn_id}"


def trailer_turn(message: str) -> str | None:
    """The turn a revision's message names in its trailer (its last line, ``turn_trailer``), or
    None. A ``Turn:`` line elsewhere in a message is the caller's text, not the trailer."""
    last = message.rstrip("\n").rsplit("\n", 1)[-1]
    return last.removeprefix(f"{TURN_TRAILER} ") if last.startswith(f"{TURN_TRAILER} ") else None


def check_commit_text(message: str | None, author: str, committer: str | None) -> None:
    """Refuse commit text git and Postgres cannot both hold (design §14): a NUL or a lone surrogate
    anywhere, a line break in an identity; and a message whose last line is a ``Turn:`` trailer,
    which would claim the revision for that turn: a turn whose commit finds a revision with its
    trailer after its base takes it as its own, already recorded, and discards its changes
    (design §5 recovery); an identity longer than MAX_IDENTITY_CHARS. Raises InvalidInput naming
    the field."""
    for field, value, single_line in (
        ("message", message, False),
        ("author", author, True),
        ("committer", committer, True),
    ):
        if value is None:
            continue
        if not isinstance(value, str):
            raise InvalidInput(f"{field} must be text, not {type(value).__name__}")
        if "\x00" in value:
            raise InvalidInput(f"the {field} contains a NUL character; remove it")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: bytes that were not UTF-8 (argv, a file name)
            raise InvalidInput(
                f"the {field} {value!r} is not valid Unicode text (character {exc.start + 1} is "
                "half of a surrogate pair, e.g. from bytes that were not UTF-8); pass UTF-8 text"
            ) from None
        if single_line and ("\n" in value or "\r" in value):
            raise InvalidInput(f"the {field} {value!r} spans several lines; use one line")
        if single_line and len(value) > MAX_IDENTITY_CHARS:
            raise InvalidInput(
                f"the {field} is {len(value):,} characters long; an identity is at most "
                f"{MAX_IDENTITY_CHARS:,} ('Name <email>')"
            )
    if message is not None and message.rstrip("\n").rsplit("\n", 1)[-1].startswith(TURN_TRAILER):
        raise InvalidInput(
            "the message ends in a 'Turn:' line, the trailer kb writes itself on a turn's revision "
            "(it names the turn that recorded it); end the message with other text"
        )


def stated_message(message: str | None) -> str | None:
    """The caller's commit message, or None when it holds nothing but whitespace (design §3): git
    refuses such a message as empty, and a revision whose message is blank says nothing in
    ``kb log``; the writer's own default (a summary of the change, an import's or a revert's line)
    is written instead, as when no message was given. Anything but text is returned as is for
    ``check_commit_text`` to refuse."""
    if isinstance(message, str) and not message.strip():
        return None
    return message


def summarize(changes: list[PathChange]) -> str:
    """Deterministic commit message for a change set, e.g. ``docs: add 2 files, remove 1`` (design §3)."""
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


MAX_HISTORY_LIMIT = 2**31 - 1
MAX_IDENTITY_CHARS = 1024
"""The longest author or committer a revision records (design §3): every commit, history row and
log line carries it, so a caller's 60,000-character name would weigh on all of them."""
"""The largest history limit: a Postgres ``integer`` (a larger one failed inside Postgres)."""


class KnowledgeStore:
    """The store of one workspace: repository at ``{storage_root}/knowledge_store/{id}`` + Postgres."""

    def __init__(self, settings: Settings, database_url: str, workspace_id: int) -> None:
        self.settings = settings
        self.database_url = database_url
        self.workspace_id = check_workspace_id(workspace_id)
        self.path: Path = settings.knowledge_store / str(workspace_id)
        self._repository: Repository | None = None
        self._opening = threading.Lock()  # threads share a store (design §4): one Repository object
        self._contended = float("-inf")
        """When this store last saw other writers in its group commit (``time.monotonic()``)."""

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def repository(self) -> Repository:
        """The workspace's git repository; raises WorkspaceNotFound when it has none yet."""
        repository = self._repository
        if repository is not None:
            return repository
        with self._opening:
            if self._repository is not None:
                return self._repository
            try:
                repository = self._repository = Repository.open(self.path)
            except FileNotFoundError:
                self.refuse_if_homed_elsewhere()
                if (self.path / ".git").exists():
                    raise WorkspaceNotFound(
                        f"workspace {self.workspace_id}'s git repository at {self.path} is incomplete (being "
                        "created or deleted right now, or damaged); retry, and if it stays so restore that "
                        "folder from a backup"
                    ) from None
                root = self.settings.storage_root
                if not root.exists() and self._recorded():  # a mistyped KB_STORAGE_ROOT: an import would not help
                    raise WorkspaceNotFound(
                        f"workspace {self.workspace_id} has no repository here: the storage root {root} does "
                        "not exist, and the repositories live under it. Check KB_STORAGE_ROOT"
                    ) from None
                raise WorkspaceNotFound(
                    f"workspace {self.workspace_id} does not exist; create it with "
                    f"`kb import PATH --workspace {self.workspace_id}`"
                ) from None
        return repository

    def refuse_if_homed_elsewhere(self) -> None:
        """Raise WrongNode when the workspace is homed on a node with another storage (design §15):
        its repository is there, and creating, opening or deleting one here would split it. The
        store asks only when the repository is missing here; deletion asks always. Does nothing
        when Postgres cannot be asked."""
        try:
            home = nodes.workspace_home(self.database_url, self.workspace_id)
        except KbError:  # Postgres cannot be asked: the caller's own error says what is missing
            return
        if home is None or home.node is None or nodes.same_storage(home, self.settings):
            return
        raise WrongNode(
            f"workspace {self.workspace_id} is homed on node {home.node!r} (its repository is there, "
            f"not under this node's storage root {self.settings.storage_root}); nothing was done here. "
            f"Use a kb server (any node's forwards to {home.node!r}"
            f"{', at ' + home.url if home.url else ''}) or run the command on {home.node!r}",
            node=home.node,
        )

    def _recorded(self) -> bool:
        """Whether Postgres records the workspace (False when it cannot be asked)."""
        try:
            return nodes.workspace_home(self.database_url, self.workspace_id) is not None
        except KbError:
            return False

    def close(self) -> None:
        """Close the repository if open (idempotent); the next use reopens it."""
        if self._repository is not None:
            self._repository.close()
            self._repository = None

    def require_exists(self) -> None:
        """Raise WorkspaceNotFound (saying how to create it) unless the workspace's git repository
        exists; opens it for later use (design §2.1)."""
        self.repository  # noqa: B018  (opening it raises WorkspaceNotFound)

    def exists(self) -> bool:
        """True when the workspace has a repository."""
        return (self.path / ".git").is_dir()

    def create(self) -> bool:
        """Create the repository and the workspace row if missing; True when newly created. A new
        repository gets a random identity (git config ``kb.repositoryid``) that the row records
        (``kb.store.repository_guard``, design §3).

        Raises HistoryDiverged — and creates nothing — when Postgres records revisions for the
        workspace but its repository is missing (an empty repository would then be projected as
        the workspace, deleting every document row): restore the repository, or delete the
        workspace to start over."""
        with database.transaction(self.database_url) as conn:
            inserted = conn.execute(
                queries["ensure_workspace"], {"workspace_id": self.workspace_id, **nodes.node_params(self.settings)}
            ).fetchone()
            row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        existed = self.exists()
        if not existed:
            self.refuse_if_homed_elsewhere()
        if not existed and row["head_revision"] is not None:
            raise HistoryDiverged(
                f"workspace {self.workspace_id}: Postgres records {row['revision_count']} revisions (head "
                f"{row['head_revision']}) but its repository {self.path} is missing; nothing was created. "
                f"Restore that folder from a backup (then retry), or delete the workspace to start over "
                f"(`kb workspace delete {self.workspace_id}`, which also deletes its document rows)."
            )
        self._repository = Repository.create(self.path)
        if not existed:
            identity = self._repository.identity() or repository_guard.new_identity()
            self._repository.set_identity(identity)
            with database.transaction(self.database_url) as conn:
                conn.execute(
                    queries["record_repository_identity"],
                    {"workspace_id": self.workspace_id, "repository_id": identity},
                )
        return inserted is not None or not existed

    # -- reads (no lock) -----------------------------------------------------------------
    def head(self) -> str | None:
        """Hex id of the newest revision, or None for an empty workspace. Raises WorkspaceNotFound
        when the repository this store opened was deleted since (by another process: a long-lived
        KnowledgeBase would otherwise read it as empty) or is incomplete; one re-created meanwhile is
        opened anew."""
        head = self.repository.head()
        if head is None and not (self.path / ".git" / "HEAD").is_file():
            # deleted, or replaced by an incomplete one, since it was opened: open it anew, which
            # raises WorkspaceNotFound unless it was re-created meanwhile (the old object is left
            # to the collector, not closed: another thread may be reading through it)
            self._repository = None
            return self.repository.head()
        return head

    def read(self, path: str | StorePath, revision: str | None = None) -> bytes:
        """Bytes of a document at HEAD (or ``revision``); raises RevisionNotFound, IsAFolder (a folder
        is there) or DocumentNotFound (saying "did you mean …?" for a path differing in case)."""
        revision = self.repository.resolve(revision) if revision else self.head()
        target = repo_path_of(path, allow_keep=True)
        try:
            return self.repository.read(revision, target)
        except DocumentNotFound:  # named as the caller names documents (virtual, with its slash)
            error = not_a_document(
                self.repository, self.repository.tree_id(revision), target, revision, self.workspace_id
            )
            if isinstance(error, DocumentNotFound) and revision == self.repository.head():
                with database.transaction(self.database_url) as conn:
                    moved = moved_away_to(conn, self.workspace_id, target)
                if moved is not None:  # a recorded move took it away: say where (design §3)
                    error = DocumentNotFound(
                        f"no document at '/{target}' now: it was moved to '/{moved}' "
                        f"(`kb log '/{moved}' --workspace {self.workspace_id}` shows the move)"
                    )
            raise error from None

    def read_as_of(self, revision: str, path: str | StorePath) -> bytes:
        """Bytes of a document at ``revision`` (design §3, citations §8)."""
        return self.read(path, revision)

    def ls(self, path: str | StorePath = "/documents", revision: str | None = None) -> list[Entry]:
        """The entries of a folder at HEAD (or ``revision``): folders first, then documents, by
        name (``.keep`` hidden); a document path lists itself (as ``Turn.ls``, in committed form).
        Raises InvalidPath, RevisionNotFound, DocumentNotFound (nothing there)."""
        target = path if isinstance(path, StorePath) else StorePath.parse(path, allow_root=True)
        revision = self.repository.resolve(revision) if revision else self.head()
        return list_tree(self.repository, self.repository.tree_id(revision), target, revision, self.workspace_id)

    def list_paths(self, revision: str | None = None) -> dict[str, str]:
        """``{virtual path: content id}`` of every document at HEAD (or ``revision``)."""
        tree = self.repository.tree_id(self.repository.resolve(revision) if revision else self.head())
        return {"/" + p: blob for p, blob in self.repository.walk(tree, "documents")}

    def moved_away(self, paths: list[str]) -> dict[str, str]:
        """``{virtual path: virtual path its document has now}`` for each of ``paths`` (virtual,
        ``/documents/…``) whose document recorded moves took elsewhere, where it still is; paths
        nothing moved away are left out (design §3: identity follows a move)."""
        if not paths:
            return {}
        with database.transaction(self.database_url) as conn:
            found = moved_away(conn, self.workspace_id, [p.removeprefix("/") for p in paths])
        return {"/" + old: "/" + new for old, new in found.items()}

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

    def revision(self, revision: str) -> Revision:
        """One revision as Postgres recorded it, with every path it changed (``list_changes``):
        id, seq, parent, author, committer, message, commit time (the revision page, design §17).
        ``revision`` is a full id or anything ``git rev-parse`` takes. Raises RevisionNotFound for
        one that does not resolve or that this workspace's history never recorded."""
        resolved = self.repository.resolve(revision)
        with database.transaction(self.database_url) as conn:
            row = conn.execute(
                queries["revision_row"], {"workspace_id": self.workspace_id, "revision_id": resolved}
            ).fetchone()
        if row is None:
            raise RevisionNotFound(
                f"revision {revision} is not recorded in workspace {self.workspace_id}'s history; "
                f"`kb log -w {self.workspace_id}` lists its revisions"
            )
        return Revision(**row, changes=tuple(self.list_changes(resolved)))

    def moved_to(self, path: str | StorePath, since_revision: str) -> str | None:
        """The virtual path the document at ``path`` in ``since_revision`` was moved to by the
        revisions recorded since (following chains of moves), or None when none moved it (design
        §3). Used to carry a writer's edit to where its document went. Raises InvalidPath."""
        repo_path = repo_path_of(path, allow_keep=True)
        with database.transaction(self.database_url) as conn:
            found = history_moved_to(conn, self.workspace_id, repo_path, since_revision)
        return None if found is None else "/" + found

    def path_in_revision(self, path: str | StorePath, revision: str) -> str | None:
        """The virtual path the document now at ``path`` had in ``revision``, following the moves
        recorded since back (design §3): ``path`` itself when none moved it; None when
        ``revision`` is not recorded. Raises InvalidPath."""
        repo_path = repo_path_of(path, allow_keep=True)
        with database.transaction(self.database_url) as conn:
            found = history_path_in_revision(conn, self.workspace_id, repo_path, revision)
        return None if found is None else "/" + found

    def history(self, path: str | StorePath | None = None, limit: int = 50) -> list[Revision]:
        """Revisions newest first, from Postgres (design §3); for one path, following recorded moves.

        ``limit``: a whole number from 1 to MAX_HISTORY_LIMIT. Raises InvalidInput for any other
        limit, WorkspaceNotFound for a workspace without a repository, InvalidPath.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY_LIMIT:
            raise InvalidInput(f"limit must be a whole number from 1 to {MAX_HISTORY_LIMIT}, not {limit!r}")
        self.require_exists()
        repo_path = None if path is None else repo_path_of(path, allow_keep=True)
        with database.transaction(self.database_url) as conn:
            return read_history(conn, self.workspace_id, repo_path, limit)

    # -- writes --------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(
        self,
        message: str | None,
        author: str,
        committer: str | None = None,
        idempotency_key: str | None = None,
        *,
        turn_id: str | None = None,
    ) -> Iterator[Draft]:
        """Yield a Draft; on clean exit record exactly one revision (``draft.revision``), or None
        if the net change is empty. An exception records nothing (design §3).

        ``turn_id``: the turn recording it (``kb.turns.turn``), named by the trailer
        ``Turn: <turn id>`` appended to ``message`` (design §5); a ``message`` may not end in such
        a line itself (InvalidInput), so no other write can pass for a turn's.

        ``idempotency_key`` (design §3, ``kb.store.write_keys``): when a revision was already
        recorded with this key, nothing is recorded and ``draft.revision`` is that revision, so a
        retry after any failure applies the change at most once; None generates a key
        (``draft.idempotency_key``). When Postgres or the connection fails after the write was
        submitted, the writer settles its own write before answering: a write that landed returns
        normally with its revision, one that did not raises DatabaseUnavailable / StorageError /
        LockUnavailable saying nothing was recorded, and when Postgres cannot be asked,
        CommitOutcomeUnknown names the key and the call that settles it.

        Raises InvalidInput (NUL in the message, a NUL or line break in author/committer, a bad
        key) before anything is written, WorkspaceNotFound, LockTimeout, LockUnavailable,
        DatabaseUnavailable, CommitOutcomeUnknown, PathExists.
        """
        check_commit_text(message, author, committer)
        message = stated_message(message)
        if turn_id is not None:
            message = f"{(message or '').rstrip(chr(10))}\n\n{turn_trailer(turn_id)}"
        key = write_keys.new_key() if idempotency_key is None else write_keys.check_key(idempotency_key)
        repo = self.repository
        # a caller's key is fenced from before the draft is read until the write has answered
        # (design §3): a retry of it in another process waits, then answers what this one did
        with self.key_fence(idempotency_key):
            draft = Draft(repo, repo.tree_id(repo.head()))
            draft.idempotency_key = key
            yield draft
            try:
                draft.revision = self.commit_draft(draft, message, author, committer or author)
            except (psycopg.Error, OSError, DatabaseUnavailable, LockUnavailable) as exc:
                draft.revision = self._settle_outcome(draft, exc)

    @contextlib.contextmanager
    def key_fence(self, idempotency_key: str | None) -> Iterator[None]:
        """Hold the write-key fence of ``idempotency_key`` for the block (design §3,
        ``kb.git.key_fence``): another write or settle of the same key, in any process of this
        node, waits until the block ends. None: nothing to fence (a generated key is never
        retried). Re-entrant in a thread. Raises InvalidInput (a bad key), LockTimeout after
        ``KB_LOCK_TIMEOUT`` seconds when a write of the key stays in flight, StorageError when
        the fence's lock file cannot be opened; a workspace without a repository is not fenced
        (its write raises WorkspaceNotFound itself), nor a key whose lock file is missing on a
        file system that will not make it (read-only: no writer holds it, so a settle answers)."""
        if idempotency_key is None:
            yield
            return
        key = write_keys.check_key(idempotency_key)
        fence = contextlib.ExitStack()
        try:
            fence.enter_context(key_fence(self.path / ".git", key, self.settings.lock_timeout))
        except KeyFenceTimeout as exc:
            raise LockTimeout(
                self.workspace_id,
                exc.waited,
                "file lock",
                lock="write-key",
                holder="a write with the same idempotency key is still in flight on this node. Ask again "
                "(the same call, or write_outcome with the key), or raise KB_LOCK_TIMEOUT",
            ) from None
        except FileNotFoundError:
            pass  # no repository: the write or settle raises WorkspaceNotFound
        except OSError as exc:
            raise StorageError(f"workspace {self.workspace_id}: the write-key fence cannot be taken: {exc}") from exc
        with fence:
            yield

    def _settle_outcome(self, draft: Draft, failure: BaseException) -> Revision | None:
        """After ``failure`` (Postgres, the connection or the file system) in a commit: the truth
        about the write (design §3). Returns its Revision when it landed (a group-commit leader
        recorded it, or git has it and Postgres now records it); raises DatabaseUnavailable /
        StorageError / LockUnavailable ("nothing was recorded") when it did not, and
        CommitOutcomeUnknown when Postgres cannot be asked (a few tries over about a second)."""
        if not draft.submitted:  # nothing reached Postgres or git
            raise write_failure(self.workspace_id, failure) from failure
        reason = (str(failure).strip().splitlines() or [type(failure).__name__])[0]
        for attempt in range(SETTLE_ATTEMPTS):
            try:
                revision = self.write_outcome(draft.idempotency_key)
                break
            except (WorkspaceNotFound, HistoryDiverged, WrongNode):
                raise
            except (KbError, psycopg.Error, OSError) as exc:
                if attempt + 1 == SETTLE_ATTEMPTS:
                    raise CommitOutcomeUnknown(self.workspace_id, draft.idempotency_key, reason, draft.pending) from exc
                time.sleep(SETTLE_PAUSE * (attempt + 1))
        if revision is None:
            raise write_failure(self.workspace_id, failure) from failure
        self._refresh_worktree(
            revision.id,
            _worktree_changes([PathChange(c.path[1:], c.change, c.content_id) for c in revision.changes]),
            draft,
        )
        return revision

    def write_outcome(self, idempotency_key: str) -> Revision | None:
        """Settle a write by its idempotency key (design §3): the Revision (virtual paths) recorded
        with ``idempotency_key``, or None when none was, and none will be unless its writer is still
        running. Under the write lock: first records any revision git has and Postgres lacks (a
        writer that died after its ref moved), then withdraws any queued intent of that key that
        no holder recorded, then looks the key up.

        Raises InvalidInput (a bad key), WorkspaceNotFound, HistoryDiverged, LockTimeout,
        LockUnavailable, DatabaseUnavailable.
        """
        key = write_keys.check_key(idempotency_key)
        repo = self.repository
        # moving_ok: settling reports, it writes no change (a revision git has is recorded, and the
        # move's flip then sees a head it did not copy and stops: design §15). The key's fence
        # first: a write of it still in flight on this node answers before it is settled.
        with (
            self.key_fence(key),
            locked_transaction(self.database_url, self.workspace_id, self.settings, moving_ok=True) as (conn, _),
        ):
            self._catch_up(conn, self._workspace_row(conn))
            write_keys.withdraw_intents(conn, self.workspace_id, key)
            revision_id = write_keys.recorded(conn, self.workspace_id, [key]).get(key)
            recorded = (
                None
                if revision_id is None
                else group_commit.recorded_revision(conn, repo, self.workspace_id, revision_id)
            )
        return None if recorded is None else _virtual(recorded)

    @contextlib.contextmanager
    def _ref_fenced(self, outcome: str) -> Iterator[None]:
        """Hold the ref-update fence (``kb.git.ref_fence``, design §3) for the block, waiting at
        most ``KB_LOCK_TIMEOUT``: a writer whose lock ended, stopped inside it (SIGSTOP, a
        debugger), would otherwise keep this one — holding the write lock, so every writer of the
        workspace — waiting for as long as it stays stopped. ``outcome``: what the caller's call
        did when the wait runs out, and what to do. Raises LockTimeout then (naming the
        ref-update lock), WorkspaceNotFound (no repository), StorageError; the block's own errors
        pass through."""
        with contextlib.ExitStack() as fenced:
            try:
                fenced.enter_context(ref_fence(self.repository.path / ".git", self.settings.lock_timeout))
            except RefFenceTimeout as exc:
                raise LockTimeout(
                    self.workspace_id,
                    exc.waited,
                    "file lock",
                    lock="ref-update",
                    holder="a writer is stopped between its lock check and its ref update on this node. "
                    f"{outcome}, or raise KB_LOCK_TIMEOUT",
                ) from None
            except FileNotFoundError:
                raise WorkspaceNotFound(f"workspace {self.workspace_id} has no repository here") from None
            except OSError as exc:
                raise StorageError(
                    f"workspace {self.workspace_id}: the ref-update fence cannot be taken: {exc}"
                ) from exc
            yield

    def _stage(self, draft: Draft) -> dict[str, str | None]:
        """Write the draft's new bytes as blobs (idempotent, unlocked); ``{repo path: blob or None}``."""
        repo, staged, pending = self.repository, {}, []
        contents: list[bytes] = []
        for path, value in draft.changes().items():
            if value is None or isinstance(value, BlobRef):
                staged[path] = None if value is None else value.id
            else:
                pending.append(path)
                contents.append(value)
        for path, blob in zip(pending, repo.add_blobs(contents)):
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
        if not draft.merge_requests():
            return staged, {}
        from kb.git.merge import merge_staged  # only a draft with write_merged paths merges (design §13)

        repo = self.repository
        return staged, merge_staged(repo, draft.merge_requests(), staged, repo.tree_id(repo.head()))

    def _record_ahead(self, conn: Connection, prepared: tuple) -> None:
        """``locked_pipeline``'s ``before_lock`` of ``_commit_alone``: insert the path changes of the
        revision ``_prebuild`` made (``prepared``: what ``_staged_and_prebuilt`` returned), if any,
        ahead of the lock (``kb.store.history.record_changes_ahead``)."""
        prebuilt = prepared[2]
        if prebuilt is not None and prebuilt.built is not None:
            record_changes_ahead(conn, self.workspace_id, prebuilt.built.revision)

    def _staged_and_prebuilt(
        self, draft: Draft, conn: Connection | None = None, words: tuple | None = None
    ) -> tuple[dict[str, str | None], dict[str, MergedBlob], _Shape | None]:
        """Unlocked: ``_stage_merged`` and the ``_prebuild`` of what it staged — with ``conn`` (idle,
        outside any transaction) and ``words`` (message, author, committer, key), the revision
        itself on the head Postgres records now."""
        staged, premerged = self._stage_merged(draft)
        ahead = None
        if conn is not None and words is not None and _prebuildable(draft, staged):
            with conn.transaction():
                row = self._fetch_workspace(conn).fetchone()
            ahead = None if row is None else (row, words)
        return staged, premerged, self._prebuild(draft, staged, ahead)

    def _merge_with_head(
        self, draft: Draft, staged: dict[str, str | None], head_tree: bytes | None, premerged: dict[str, MergedBlob]
    ) -> dict[str, str | None]:
        """Under the lock: three-way merge the draft's ``write_merged`` paths with the current head
        (design §5); returns the staged blobs with merged ones substituted and fills ``draft.merges``."""
        if not draft.merge_requests():
            return staged
        from kb.git.merge import merge_staged

        merged = merge_staged(self.repository, draft.merge_requests(), staged, head_tree, premerged)
        draft.merges = {"/" + p: m.outcome for p, m in merged.items() if m.outcome is not None}
        return {**staged, **{p: m.blob for p, m in merged.items()}}

    def commit_draft(self, draft: Draft, message: str | None, author: str, committer: str) -> Revision | None:
        """Record ``draft`` on top of the *current* head as one revision (see the module docstring).

        A groupable draft (``kb.store.group_commit``: plain writes, removes and moves) of fewer than
        PREBUILD_PATHS paths is queued and recorded by whichever writer holds the lock next,
        together with the others waiting; any other draft is recorded by its own writer. Returns the Revision (virtual paths), or None
        when the net change is empty. Raises PathExists, ArtifactReadOnly, LockTimeout,
        CommitOutcomeUnknown, WorkspaceNotFound (design §3, §4).
        """
        if draft.is_empty():
            return None
        # git's form of each identity, recorded alike in the commit and in Postgres
        author, committer = git_identity(author), git_identity(committer)
        if draft.idempotency_key is None:
            draft.idempotency_key = write_keys.new_key()
        fault_point("draft_ready")
        # a big draft (a folder rename) is recorded by its own writer, with what it built before the
        # lock (``_prebuild``): a group's holder in another process would build it all under its lock
        if group_commit.groupable(draft) and len(draft.changes()) < PREBUILD_PATHS:
            revision = self._commit_grouped(draft, message, author, committer)
        else:
            try:
                revision = self._commit_alone(draft, message, author, committer)
            except psycopg.errors.UniqueViolation as exc:
                if exc.diag.constraint_name != "path_changes_pkey":
                    raise
                # the rows it inserted ahead of the lock are another transaction's too: the same
                # commit (same key, head, second — a request sent twice at once) recorded or caught
                # up meanwhile. Rolled back; again without them, the lock's checks find it landed.
                revision = self._commit_alone(draft, message, author, committer, ahead=False)
        self._pack_if_behind(revision)
        return revision

    def _pack_if_behind(self, revision: Revision | None) -> None:
        """The backstop of ``defer_packing`` (design §2.1): on a revision whose number is a multiple
        of PACK_BACKSTOP_EVERY the writer estimates the loose objects (git's ``gc --auto`` sample)
        and, past PACK_BACKSTOP_LOOSE (a few hundred) — the deferred packing jobs did not run, no
        worker or a busy one — packs them itself, outside the write lock (``kb.git.maintenance``:
        only the loose objects and, beyond a few, the small packs; safe beside writers and
        readers; skipped while another packer holds the repository's pack lock). A failure to pack
        is logged, never the write's outcome. ``KB_PACK_EVERY_REVISIONS=0``: none (the maintenance cron packs)."""
        packing_off = self.settings.pack_every_revisions <= 0  # the deferred jobs' pace; 0 turns both off
        if revision is None or packing_off or revision.seq % PACK_BACKSTOP_EVERY:
            return
        path = self.repository.path
        try:
            if estimated_loose_objects(path, PACK_BACKSTOP_SAMPLE) >= PACK_BACKSTOP_LOOSE:
                started = time.perf_counter()
                packed = pack_workspace(path, backstop=True)
                if packed is not None:
                    log.debug(
                        "workspace %s: the writer packed %d loose objects in %.3f s",
                        self.workspace_id,
                        packed,
                        time.perf_counter() - started,
                    )
        except Exception as exc:
            # concurrent `git repack` removed, a damaged loose object): the revision has landed,
            # so it is logged for maintenance and `kb fsck`, never the write's outcome
            log.warning(
                "workspace %s: packing loose objects failed (%s: %s); maintenance retries, `kb fsck --workspace %s` checks",
                self.workspace_id,
                type(exc).__name__,
                exc,
                self.workspace_id,
            )

    def _commit_alone(
        self, draft: Draft, message: str | None, author: str, committer: str, ahead: bool = True
    ) -> Revision | None:
        """Record ``draft`` by itself under the lock (merges, titles, artifact hooks). ``ahead``: a
        big draft's revision and path changes may be made before the lock (``_prebuild``)."""
        repo, owed = self.repository, _OwedRefresh()
        try:
            words = (message, author, committer, draft.idempotency_key)
            with locked_pipeline(
                self.database_url,
                self.workspace_id,
                self.settings,
                lambda conn: self._staged_and_prebuilt(draft, conn if ahead else None, words),
                lambda conn, _: self._fetch_workspace(conn),
                before_lock=self._record_ahead,
            ) as (conn, (staged, premerged, prebuilt), row):
                early = None if prebuilt is None else prebuilt.built  # its path changes went in ahead
                workspace = self._workspace_row(conn, row.fetchone())
                repo.clear_stale_locks()
                if self._catch_up(conn, workspace):
                    workspace = self._workspace_row(conn)
                key = draft.idempotency_key
                if (landed := write_keys.recorded(conn, self.workspace_id, [key]).get(key)) is not None:
                    if early is not None:
                        forget_changes(conn, self.workspace_id, early.revision.id)
                    return _virtual(group_commit.recorded_revision(conn, repo, self.workspace_id, landed))
                head = workspace["head_revision"]  # what Postgres records, not a fresh read: see _advance
                built = self._build(
                    conn,
                    draft,
                    staged,
                    premerged,
                    head,
                    repo.tree_id(head),
                    workspace["revision_count"] + 1,
                    message,
                    author,
                    committer,
                    key=key,
                    prebuilt=prebuilt,
                )
                used = early is not None and built is early
                if early is not None and not used:  # before recording: a revision rebuilt the same has them too
                    forget_changes(conn, self.workspace_id, early.revision.id)
                if built is None:
                    return None
                fault_point("objects_written")
                with conn.pipeline():  # one round trip for the revision's rows and jobs
                    record_revisions(
                        conn,
                        self.workspace_id,
                        [(built.revision, built.commit.commit_time)],
                        frozenset([built.revision.id]) if used else frozenset(),
                    )
                    write_keys.record(conn, self.workspace_id, [(key, built.revision.id)])
                    record_titles(conn, self.workspace_id, built.revision.seq, draft.titles())
                    defer_convergence(conn, self.workspace_id)
                    defer_packing(conn, self.workspace_id, [built.revision.seq], self.settings.pack_every_revisions)
                owed.take(repo, built.effective)  # fsck waits for this refresh (design §2.1)
                draft.pending = built.revision.id
                draft.submitted = True  # from here on the revision may land (git first, design §3)
                self._advance(conn, head, built.revision.id)
        finally:
            self._settle(owed, draft)
        return built.result()

    def _commit_grouped(self, draft: Draft, message: str | None, author: str, committer: str) -> Revision | None:
        """Queue ``draft``; when other drafts are queued, wait for the lock's holder and take the
        outcome it recorded for this one; otherwise (or if it did not) queue for the lock and, unless
        a holder recorded it meanwhile, record every queued draft as consecutive revisions
        (``kb.store.group_commit``). Raises LockTimeout after ``lock_timeout`` seconds in all."""
        owed = _OwedRefresh()  # the refresh this writer owes once it moves the branch (design §2.1)
        try:
            return self._commit_queued(draft, message, author, committer, owed)
        finally:
            self._settle(owed, draft)

    def _settle(self, owed: _OwedRefresh, draft: Draft) -> None:
        """After a commit that took ``owed`` (the branch may have moved), whatever Postgres said:
        refresh the working tree for every path it changed — it follows HEAD, recorded or not —
        then release the hold ``kb fsck`` waits for."""
        if owed.hold is None:
            return
        try:
            fault_point("refresh_owed")
            self._refresh_worktree(self.repository.head() or "", owed.changes, draft)
        finally:
            owed.release()

    def _commit_queued(
        self, draft: Draft, message: str | None, author: str, committer: str, owed: _OwedRefresh
    ) -> Revision | None:
        """``_commit_grouped`` itself; ``owed`` takes the refresh hold when this writer leads a
        group that moves the branch, settled by the caller."""
        repo, ws, intent_id = self.repository, self.workspace_id, None
        outcome, own = None, None
        journal: list[int] = []
        deadline = time.monotonic() + self.settings.lock_timeout
        waits = self.settings.lock_backend != "redis"  # the Redis lock is not a Postgres lock to wait on
        try:
            with database.pooled_connection(self.database_url) as conn:  # its session owns the intent
                staged = self._stage_merged(draft)[0]
                draft.submitted = True  # once queued, a holder may record it
                intent_id, ahead = group_commit.enqueue(
                    conn, ws, draft, staged, message, author, committer, draft.idempotency_key
                )
                if ahead:
                    self._contended = time.monotonic()
                    if waits:  # a holder is at work: wait for it, it may record this draft
                        outcome = group_commit.await_outcome(conn, ws, intent_id, self.settings.lock_timeout)
                if outcome is None:  # queue for the lock (FIFO: progress for everyone) and lead
                    with locked_pipeline(
                        self.database_url,
                        ws,
                        self.settings,
                        connection=conn,
                        timeout=max(0.001, deadline - time.monotonic()),
                        with_lock=lambda c, _: (self._fetch_workspace(c), group_commit.claim(c, ws, intent_id)),
                    ) as (conn, _, (row, claimed)):
                        rows = claimed.fetchall()
                        mine = next((r for r in rows if r["id"] == intent_id), None)
                        if mine is not None and mine["outcome"] is not None:  # recorded while it queued
                            group_commit.drop(conn, intent_id)
                            outcome = mine["outcome"]
                        else:
                            own, journal = self._record_group(
                                conn, draft, staged, intent_id, row, rows, (message, author, committer), owed
                            )
        except LockTimeout:
            if intent_id is None:
                raise
            outcome = self._withdraw(intent_id, draft.idempotency_key)
            if outcome is None:
                raise
        except BaseException as exc:
            withdrawn = intent_id is not None and self._withdraw_quietly(intent_id)
            # Withdrawn means no holder's *committed* transaction recorded it — not that it did not
            # land: a holder whose Postgres transaction failed after its ref moved (its claim rolled
            # back, so the intent was withdrawable) left the revision in git, with this intent in its
            # journal until a settle's catch-up records the revision with this key and clears the
            # journal. So "nothing landed" needs all three: withdrawn, not in the journal, and (read
            # after it) the key not recorded; otherwise the write is settled by its key (design §3).
            if (
                withdrawn
                and draft.pending is None
                and intent_id not in group_commit.read_journal(repo)
                and not self._key_recorded_quietly(draft.idempotency_key)
            ):
                draft.submitted = False  # nothing reached git that anyone could record
            if withdrawn or intent_id is None or not isinstance(exc, KbError) or isinstance(exc, _SETTLED_BY_KEY):
                raise  # (the errors settled by key: the caller asks Postgres, design §3)
            # not withdrawn: a holder claimed the intent when this writer's group failed (its ref
            # update refused: git's ref lock held) and recorded it — the answer is that outcome
            outcome = self._recorded_outcome(intent_id, draft.idempotency_key, exc)
        group_commit.clear_journal(repo, journal)  # only once Postgres has committed (design §3)
        if outcome is not None:
            revision = group_commit.result_of(outcome)  # raises the error a holder recorded for it
            if revision is not None:
                self._refresh_worktree(
                    revision.id,
                    _worktree_changes([PathChange(c.path[1:], c.change, c.content_id) for c in revision.changes]),
                    draft,
                )
            return revision
        if isinstance(own, KbError):
            raise own
        if isinstance(own, Revision):  # recorded earlier: by a holder that died, or with the same key
            return _virtual(own)
        if own is None:
            return None
        return own.result()

    def _record_group(
        self,
        conn: Connection,
        draft: Draft,
        staged: dict[str, str | None],
        intent_id: int,
        row,
        rows: list[dict],
        text: tuple[str | None, str, str],
        owed: _OwedRefresh,
    ) -> tuple[Revision | _Built | KbError | None, list[int]]:
        """Under the lock: record the waiting intents (``rows``, oldest first; the caller's own is
        ``intent_id``, whose draft is ``draft`` and ``text`` its message, author and committer) as consecutive revisions in this transaction and one
        ref update; settle the others' outcomes. Returns the caller's own result (``_Built``, a
        recovered Revision, None for a net-empty change, or the KbError refusing it) and the intent
        ids whose journal files to remove once Postgres has committed. Before the ref moves,
        ``owed`` takes the refresh hold for every path the group's revisions changed: this writer
        refreshes them all (its followers' own refreshes would be owed to no one fsck waits for)."""
        repo, ws = self.repository, self.workspace_id
        workspace = self._workspace_row(conn, row.fetchone())
        repo.clear_stale_locks()
        if self._catch_up(conn, workspace):
            workspace = self._workspace_row(conn)
        pending = [r for r in rows if r["outcome"] is None]
        if not any(r["id"] == intent_id for r in pending):  # its row vanished (server restart): record it too
            pending.append({"id": intent_id, "payload": None, "outcome": None, "artifact_paths": None})
        journal = group_commit.read_journal(repo)
        results: dict[int, Revision | _Built | KbError | None] = {}
        key_of = {intent_id: draft.idempotency_key}
        by_key: dict[str, Revision] = {}  # design §3: a key recorded earlier or in this group
        # the head Postgres records once caught up, not a fresh read of git's: a writer that lost
        # the lock may have moved the branch since, and its revisions are not recorded (see _advance)
        head0 = head = workspace["head_revision"]
        head_tree, seq, built = repo.tree_id(head), workspace["revision_count"], []
        batch, rounds = pending, 0
        while batch:
            key_of.update({r["id"]: (r["payload"] or {}).get("key") for r in batch if r["id"] != intent_id})
            known = write_keys.recorded(
                conn, ws, [k for k in (key_of.get(r["id"]) for r in batch) if k is not None and k not in by_key]
            )
            for key, revision_id in known.items():
                by_key[key] = group_commit.recorded_revision(conn, repo, ws, revision_id)
            for r in batch:
                if by_key.get(key_of.get(r["id"])) is not None:  # a retry of a recorded write
                    results[r["id"]] = by_key[key_of[r["id"]]]
                    continue
                landed = journal.get(r["id"])  # a holder that died after the ref moved recorded it (design §3)
                recorded = None if landed is None else group_commit.recorded_revision(conn, repo, ws, landed)
                if recorded is not None:
                    results[r["id"]] = recorded
                    continue
                if r["id"] == intent_id:
                    intent = group_commit.Intent(
                        intent_id, staged, draft.moves(), None, "", "", frozenset(r["artifact_paths"] or ())
                    )
                    each, words = draft, text
                else:
                    intent = group_commit.intent_of(r)
                    each, words = intent.draft(repo, head_tree), (intent.message, intent.author, intent.committer)
                try:
                    result = self._build(
                        conn,
                        each,
                        intent.staged,
                        {},
                        head,
                        head_tree,
                        seq + 1,
                        *words,
                        intent=intent if r["artifact_paths"] is not None else None,
                        key=key_of.get(r["id"]),
                    )
                except KbError as exc:  # this draft alone is refused; the group goes on
                    results[r["id"]] = exc
                    continue
                results[r["id"]] = result
                if result is not None:
                    built.append((r["id"], result))
                    if key_of.get(r["id"]) is not None:
                        by_key[key_of[r["id"]]] = result.revision
                    head, head_tree, seq = result.revision.id, result.commit.tree, seq + 1
            rounds += 1
            if len(results) > 1 or any(r["id"] != intent_id for r in batch):
                self._contended = time.monotonic()
            if (
                rounds > group_commit.MORE_ROUNDS
                or len(results) >= group_commit.MAX_GROUP
                or time.monotonic() - self._contended > group_commit.CONTENDED_SECONDS
            ):
                break
            # other writers are active: those who queued while this group was built join it
            batch = [
                r
                for r in group_commit.claim(conn, ws, intent_id).fetchall()
                if r["outcome"] is None and r["id"] not in results
            ]
        others = {i: b.revision.id for i, b in built if i != intent_id}
        if built:
            fault_point("objects_written")
            group_commit.write_journal(repo, others)
        outcomes = {
            i: group_commit.outcome_of(res.revision if isinstance(res, _Built) else res)
            for i, res in results.items()
            if i != intent_id
        }
        with conn.pipeline():  # one round trip: every revision's rows, the jobs, the outcomes
            record_revisions(conn, ws, [(b.revision, b.commit.commit_time) for _, b in built])
            write_keys.record(conn, ws, [(key_of[i], b.revision.id) for i, b in built if key_of.get(i) is not None])
            if built:
                defer_convergence(conn, ws)
                defer_packing(conn, ws, [b.revision.seq for _, b in built], self.settings.pack_every_revisions)
            group_commit.settle(conn, outcomes)
            group_commit.drop(conn, intent_id)
            group_commit.forget_dead(conn, ws, intent_id)
        own = results.get(intent_id)
        if built:
            changed: dict[str, str | None] = {}
            for _, b in built:
                changed.update(b.effective)
            owed.take(repo, changed)
            draft.pending = own.revision.id if isinstance(own, _Built) else None
            try:
                self._advance(conn, head0, head)
            except KbError:  # WriteLockLost, or git's ref lock held: the ref did not move
                group_commit.clear_journal(repo, others)  # those revisions never reached the branch
                raise
        return own, [*others, *(i for i in journal if i not in others)]

    def _build(
        self,
        conn: Connection,
        draft: Draft,
        staged: dict[str, str | None],
        premerged: dict[str, MergedBlob],
        head: str | None,
        head_tree: bytes | None,
        seq: int,
        message: str | None,
        author: str,
        committer: str,
        intent: group_commit.Intent | None = None,
        key: str | None = None,
        prebuilt: _Shape | None = None,
    ) -> _Built | None:
        """Under the lock: the revision ``draft`` makes on top of ``head`` — merges, the
        create-by-title race, the tree and collision checks, the artifact rule (``intent``'s
        claimed ARTIFACT paths, else a query), the commit object (carrying the idempotency ``key``, design §3) and the draft's hooks. None when
        the net change is empty. Raises PathExists, ArtifactReadOnly (nothing recorded).
        ``prebuilt``: the ``_prebuild`` of these very ``staged`` blobs, used when built on
        ``head_tree`` (else everything is checked and built here)."""
        repo = self.repository
        staged = self._merge_with_head(draft, staged, head_tree, premerged)
        staged = follow_moved_edits(repo, draft, staged, head_tree)  # an edit of a moved source (design §3)
        staged = rename_taken(repo, draft, staged, head_tree)  # create-by-title race (design §2.2)
        shape = (
            prebuilt
            if prebuilt is not None and prebuilt.staged is staged and prebuilt.head_tree == head_tree
            else self._shape(head_tree, staged, draft.moves())
        )
        effective = shape.effective
        if not effective:
            return None
        if intent is not None:
            group_commit.refuse_artifacts(intent, effective)
        words = (message, author, committer, key)
        built = (
            shape.built
            if shape.built is not None and (shape.head, shape.seq, shape.words) == (head, seq, words)
            else self._commit_for(shape, draft, head, seq, *words)
        )
        if intent is None:
            artifact_rows.guard(conn, self.workspace_id, effective, draft.artifact_access, built.revision.id)
        for hook in draft.on_record:  # e.g. the artifact layer's generation check (design §11)
            hook(conn, head_tree, built.revision.id)
        return built

    def _commit_for(
        self,
        shape: _Shape,
        draft: Draft,
        head: str | None,
        seq: int,
        message: str | None,
        author: str,
        committer: str,
        key: str | None,
    ) -> _Built:
        """The commit object and Revision of ``shape`` (``draft``'s moves applied to its changes)
        as revision ``seq`` on top of ``head``; the tree is built unless ``shape`` has it."""
        repo, effective, changes = self.repository, shape.effective, dict(shape.changes)
        moves = draft.moves()
        sources = set(moves.values())
        for new in moves:
            # a document moved away and another of the same bytes (an empty note, a template)
            # moved in: the path's content is unchanged, yet both moves went through it — without
            # a row here they would be recorded as a removal and an addition, and a revert of an
            # earlier move could then restore a second copy of the first document (design §3)
            if new not in changes and new in sources:
                changes[new] = PathChange(new, "modified", draft.content_id(new))
        # Kinds before any move is applied, so the order of moves never matters (a swap
        # p <-> q records two moves whichever is seen first).
        kinds = {path: change.change for path, change in changes.items()}
        for new, origin in moves.items():
            if new not in changes or kinds.get(origin) not in ("removed", "modified"):
                continue
            target, source = changes[new], changes[origin]
            changes[new] = PathChange(new, "moved", target.content_id, old_path=origin, new_path=target.new_path)
            if source.change == "moved":  # the source is itself a move's destination
                changes[origin] = PathChange(origin, "moved", source.content_id, old_path=source.old_path, new_path=new)
            else:
                changes[origin] = PathChange(
                    origin,
                    "moved_away" if kinds[origin] == "removed" else "modified",
                    source.content_id,
                    new_path=new,
                )
        ordered = tuple(sorted(changes.values(), key=lambda c: c.path))
        text = stated_message(message) or summarize(list(ordered))
        commit = repo.make_commit(
            shape.tree if shape.tree is not None else repo.build_tree(shape.head_tree, list(effective.items())),
            head,
            text,
            author,
            committer,
            None if key is None else {write_keys.COMMIT_HEADER: key.encode()},
        )
        revision = Revision(commit.id.decode(), seq, head, author, committer, text, None, ordered)
        return _Built(commit, revision, effective)

    def _shape(
        self, head_tree: bytes | None, staged: dict[str, str | None], moves: dict[str, str] | None = None
    ) -> _Shape:
        """What ``staged`` changes on ``head_tree`` (the paths whose blob differs, as PathChanges
        before moves), after the tree and collision checks (PathExists); the tree is not built.
        ``moves`` (``Draft.moves``): DocumentNotFound when a move's source is not on ``head_tree``
        any more — another revision moved or removed it since the draft saw it, and recording the
        draft's adds alone would leave a second copy, with no history, at the destination."""
        repo = self.repository
        effective: dict[str, str | None] = {}
        changes: dict[str, PathChange] = {}
        at_head = repo.lookup_many(head_tree, staged)
        gone = [
            (new, old) for new, old in (moves or {}).items() if old in at_head and (at_head[old] or ("",))[0] != "file"
        ]
        if gone:
            new, old = min(gone)
            raise DocumentNotFound(
                f"cannot move /{old} to /{new}{f' (and {len(gone) - 1} more)' if len(gone) > 1 else ''}: "
                "another revision moved or removed it meanwhile; nothing was recorded"
            )
        for path, blob in staged.items():
            old = at_head[path][1] if at_head[path] and at_head[path][0] == "file" else None
            if old == blob:
                continue
            effective[path] = blob
            kind = "added" if old is None else ("removed" if blob is None else "modified")
            changes[path] = PathChange(path, kind, blob)
        if effective:
            self._check_tree(head_tree, effective, at_head)
            check_case_collisions(repo, head_tree, effective, at_head)
        return _Shape(head_tree, staged, effective, changes, None)

    def _prebuild(
        self, draft: Draft, staged: dict[str, str | None], ahead: tuple[dict, tuple] | None = None
    ) -> _Shape | None:
        """Before the write lock, for a draft of at least PREBUILD_PATHS paths (a folder rename):
        its ``_shape`` and tree on the head git has now, which ``_build`` uses under the lock when
        the head is still that one — the checks and the tree are pure functions of the head tree
        and the staged blobs, so the lock is held only to record (design §4, §14). ``ahead``: the
        workspace row read just now and the commit's ``(message, author, committer, key)``: then
        on the head Postgres records, and with the commit and Revision it would be as the next
        revision (whose path changes the caller inserts before it takes the lock). None for a
        small draft, one with merges or titles (settled against the head under the lock), or when
        a check fails (``_build`` raises it under the lock, against the head then)."""
        if not _prebuildable(draft, staged):
            return None
        repo = self.repository
        try:
            head = repo.head() if ahead is None else ahead[0]["head_revision"]
            head_tree = repo.tree_id(head)
            shape = self._shape(head_tree, staged, draft.moves())
        except KbError:
            return None
        if not shape.effective:
            return shape
        shape = replace(shape, tree=repo.build_tree(head_tree, list(shape.effective.items())))
        if ahead is None:
            return shape
        row, words = ahead
        seq = row["revision_count"] + 1
        built = self._commit_for(shape, draft, head, seq, *words)
        return replace(shape, head=head, seq=seq, words=words, built=built)

    def _advance(self, conn: Connection, head: str | None, new: str) -> None:
        """Move the branch ref from ``head`` (the head Postgres records, caught up under the lock)
        to ``new`` (compare-and-swap, fsynced) under the lock.

        The lock is a Postgres session's: when that session ends (``pg_terminate_backend``, a
        server restart) the lock is gone while this process goes on, and another writer may take
        it. So first one round trip on ``conn`` checks that the session — and with it the lock — is
        still there (psycopg.Error when not: nothing moved; the caller settles by key). The check
        and the compare-and-swap run inside the ref-update fence (``kb.git.ref_fence``), which
        every catch-up under the lock passes through first: a session that ends between the two
        lets this ref update finish before the next holder reads git's head (design §3). So a
        failed compare-and-swap means a process moved the branch without the lock (a git command
        run by hand in the repository): WriteLockLost, which the caller settles by key. The fence
        is waited for at most ``KB_LOCK_TIMEOUT``: a writer whose lock ended, stopped inside it (a
        SIGSTOP, a debugger), kept this one waiting — with the write lock, so every writer of the
        workspace — for as long as it stayed stopped; LockTimeout then, nothing moved."""
        with self._ref_fenced("Nothing was recorded by this write; retry"):
            conn.execute(queries["write_lock_session_alive"]).fetchone()
            moved = self.repository.advance(head, new)
        if not moved:
            raise WriteLockLost(
                f"workspace {self.workspace_id}: the branch moved while this writer held the write lock: "
                "a process moved it without the lock (a git command run by hand in the workspace's "
                "repository); kb records such revisions as they are"
            )
        fault_point("ref_advanced")
        fault_point("before_pg_commit")

    def _refresh_worktree(self, revision_id: str, changed: dict[str, str | None], draft: Draft) -> None:
        """After the commit, outside the write lock: bring the working tree to HEAD for the paths
        the revision changed (``Repository.refresh_to_head``). The working tree is a convenience:
        a failure is logged and left to ``kb fsck``, never raised."""
        repo = self.repository
        try:
            refused = repo.refresh_to_head(
                changed,
                {
                    p: v
                    for p, v in draft.changes().items()
                    if isinstance(v, bytes) and p in changed and p not in draft.merge_requests()
                },
                moves=draft.moves(),
            )
            if refused:
                log.warning(
                    "workspace %s: %d paths of %s not checked out (%s…); `kb fsck --workspace %s` lists them",
                    self.workspace_id,
                    len(refused),
                    revision_id,
                    refused[0][:80],
                    self.workspace_id,
                )
        except (OSError, KbError) as exc:
            log.warning(
                "workspace %s: working tree not refreshed after %s (%s); `kb fsck --workspace %s` repairs it",
                self.workspace_id,
                revision_id,
                exc,
                self.workspace_id,
            )

    def _withdraw(self, intent_id: int, key: str) -> dict | None:
        """After LockTimeout: withdraw the queued intent (returns None: the caller re-raises),
        unless a holder recorded it meanwhile (its outcome is returned) or claimed it and died
        (raises CommitOutcomeUnknown with the revision that may have landed)."""
        with database.pooled_transaction(self.database_url) as conn:
            withdrawn = group_commit.withdraw(conn, intent_id)
            outcome = None if withdrawn else group_commit.take(conn, intent_id)
        if outcome is not None:
            return outcome
        landed = group_commit.read_journal(self.repository).get(intent_id)
        if landed is not None:
            group_commit.clear_journal(self.repository, [intent_id])
            raise CommitOutcomeUnknown(self.workspace_id, key, "the writer recording it with others died", landed)
        return None

    def _recorded_outcome(self, intent_id: int, key: str, failure: KbError) -> dict:
        """The outcome a holder recorded for this writer's intent after this writer's own attempt
        failed with ``failure`` (the intent could not be withdrawn). Raises CommitOutcomeUnknown
        when it cannot be read, ``failure`` when the intent holds none (design §3)."""
        try:
            with database.pooled_transaction(self.database_url) as conn:
                outcome = group_commit.take(conn, intent_id)
        except (KbError, psycopg.Error, OSError) as exc:
            raise CommitOutcomeUnknown(self.workspace_id, key, str(failure).splitlines()[0], None) from exc
        if outcome is None:
            raise failure
        return outcome

    def _key_recorded_quietly(self, key: str | None) -> bool:
        """Whether Postgres records a revision with ``key`` (one look-up, no lock); True when it
        cannot be asked — unknown, so the caller settles the write instead of answering "nothing"."""
        if key is None:
            return True
        try:
            with database.pooled_transaction(self.database_url) as conn:
                return bool(write_keys.recorded(conn, self.workspace_id, [key]))
        except (KbError, psycopg.Error, OSError):
            return True

    def _withdraw_quietly(self, intent_id: int) -> bool:
        """Best effort, on the way out of a failed commit: withdraw the queued intent so that no
        later holder records it. True when it was withdrawn unrecorded (no holder recorded it)."""
        try:
            with database.pooled_transaction(self.database_url) as conn:
                return group_commit.withdraw(conn, intent_id)
        except (KbError, psycopg.Error, OSError):
            log.warning(
                "workspace %s: could not withdraw queued write %s; its outcome is settled next",
                self.workspace_id,
                intent_id,
            )
            return False

    def _check_tree(
        self, head_tree: bytes | None, effective: dict[str, str | None], at_head: dict[str, tuple[str, str] | None]
    ) -> None:
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
            if (
                at_head.get(path)
                and at_head[path][0] == "folder"
                and any(effective.get(p, b) is not None for p, b in repo.walk(head_tree, path))
            ):
                raise PathExists(f"cannot write /{path}: it became a folder holding documents meanwhile")

    def _fetch_workspace(self, conn: Connection):
        """Execute the read of the workspace row (in the lock's round trip); returns the cursor."""
        return conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id})

    def _workspace_row(self, conn: Connection, row: dict | None = None) -> dict:
        """The ``kb.workspaces`` row (``row`` when already read under the lock), created if missing.
        Raises WorkspaceNotFound when the workspace was deleted while this writer waited."""
        if row is not None:
            return row
        row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        if row is None and not self.exists():  # deleted while this writer waited for the lock
            raise WorkspaceNotFound(f"workspace {self.workspace_id} was deleted; nothing was recorded")
        if row is None:
            conn.execute(
                queries["ensure_workspace"], {"workspace_id": self.workspace_id, **nodes.node_params(self.settings)}
            )
            row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        return row

    def _catch_up(self, conn: Connection, workspace: dict) -> list[Revision]:
        """Under the write lock: record revisions git has and Postgres lacks, defer their jobs, and
        refresh the working tree for the paths they touched (a crashed writer may have left it).

        When there is something to record it first takes the chunk lock (``kb.db.locks``): recording
        updates the workspace row, and the artifact rows it completes — or the rest of the
        transaction — may then lock document rows, which a projection may hold while it waits for
        the workspace row.

        Raises WrongNode first when the workspace is homed on a node with another storage (a
        copy left here by a move is not the workspace's repository any more, design §15)."""
        if workspace.get("home_node") not in (None, self.settings.node):
            self.refuse_if_homed_elsewhere()
        with self._ref_fenced("Nothing was recorded by this call; retry"):
            pass  # a holder whose lock ended may be moving the branch: let it finish first
        repository_guard.check(conn, self.database_url, self.repository, workspace)  # design §3
        if self.repository.head() != workspace["head_revision"]:
            chunk_lock(conn, self.workspace_id)
        missing = record_missing(conn, self.repository, workspace)
        if missing:
            artifact_rows.recover(conn, self.workspace_id, (r.message for r in missing))
            defer_convergence(conn, self.workspace_id)
            try:  # the working tree is a convenience: never let it stop Postgres catching up
                self.repository.refresh_worktree(_worktree_changes([c for r in missing for c in r.changes]).items())
            except OSError as exc:
                log.warning(
                    "workspace %s: working tree not refreshed while catching up (%s); `kb fsck --workspace %s` repairs it",
                    self.workspace_id,
                    exc,
                    self.workspace_id,
                )
        return [
            Revision(
                r.id,
                r.seq,
                r.parent_id,
                r.author,
                r.committer,
                r.message,
                r.committed_at,
                tuple(c.virtual() for c in r.changes),
            )
            for r in missing
        ]

    def check_repository(self, conn: Connection | None = None) -> None:
        """Check that the workspace's repository is its own and holds every revision Postgres
        recorded (``kb.store.repository_guard``, design §3); a repository created before
        identities existed adopts one. Nothing when Postgres has no row for it. ``conn``: a
        connection to read the row on (readers pass theirs), else one of its own. Raises
        HistoryDiverged (the workspace is marked), WorkspaceNotFound."""
        repo = self.repository
        with contextlib.nullcontext(conn) if conn is not None else database.transaction(self.database_url) as conn:
            row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
            if row is not None:
                repository_guard.check(conn, self.database_url, repo, row)

    def catch_up(self, conn: Connection) -> list[Revision]:
        """Under the write lock (``conn`` from ``kb.db.locks.locked_transaction``): record the
        revisions git has and Postgres lacks, as :meth:`reconcile` does (design §3), before a
        caller writes rows that must follow git's head (artifacts, ``kb fsck``). Returns them,
        oldest first. Raises WorkspaceNotFound when the workspace was deleted meanwhile."""
        return self._catch_up(conn, self._workspace_row(conn))

    def reconcile(self) -> list[Revision]:
        """Record every revision git has and Postgres lacks, with history rows and deferred
        projection/index jobs (design §3; the periodic sweep and ``kb fsck`` call this).

        Cheap when nothing is missing (one row read, no lock). Returns the revisions recorded,
        oldest first (virtual paths). Raises WorkspaceNotFound, HistoryDiverged, LockTimeout.
        """
        repo = self.repository
        with database.transaction(self.database_url) as conn:
            row = conn.execute(queries["get_workspace"], {"workspace_id": self.workspace_id}).fetchone()
        if row is not None and row["head_revision"] == repo.head():
            return []
        with locked_transaction(self.database_url, self.workspace_id, self.settings) as (conn, _):
            return self.catch_up(conn)


SETTLE_ATTEMPTS = 4
"""How many times a writer whose commit failed asks Postgres for its write's outcome."""
SETTLE_PAUSE = 0.15
"""Seconds before the second try of settling (growing by as much each try)."""


def _virtual(revision: Revision) -> Revision:
    """``revision`` (repo paths) as callers see it (virtual paths)."""
    return Revision(
        revision.id,
        revision.seq,
        revision.parent_id,
        revision.author,
        revision.committer,
        revision.message,
        revision.committed_at,
        tuple(c.virtual() for c in revision.changes),
    )


class _OwedRefresh:
    """The working-tree refresh a writer owes once its ref update may have moved the branch: the
    hold ``kb fsck`` waits for (``Repository.refresh_pending``) and the paths to refresh."""

    def __init__(self) -> None:
        self.hold: PendingRefresh | None = None
        self.changes: dict[str, str | None] = {}

    def take(self, repo: Repository, changes: dict[str, str | None]) -> None:
        """Under the write lock, before the ref moves: take the hold for ``changes``."""
        self.hold = repo.refresh_pending()
        self.changes = changes

    def release(self) -> None:
        """Drop the hold (idempotent)."""
        if self.hold is not None:
            self.hold.release()
            self.hold = None


@dataclass(frozen=True)
class _Shape:
    """What ``staged`` (``{repo path: blob or None}``) changes on ``head_tree``: ``effective`` (the
    paths whose blob differs), their PathChanges before moves, the new tree once built, and maybe
    the revision itself (``built``)."""

    head_tree: bytes | None
    staged: dict[str, str | None]
    effective: dict[str, str | None]
    changes: dict[str, PathChange]
    tree: bytes | None
    head: str | None = None
    seq: int | None = None
    words: tuple | None = None
    built: _Built | None = None
    """With ``head``, ``seq`` and ``words`` (message, author, committer, key): the revision made
    before the lock (``KnowledgeStore._prebuild``), used when those are still what they were."""


@dataclass(frozen=True)
class _Built:
    """A revision built under the lock, not yet recorded: the commit object, the Revision (repo
    paths) and ``effective`` ``{repo path: blob id or None}`` (what it changes)."""

    commit: Commit
    revision: Revision
    effective: dict[str, str | None]

    def result(self) -> Revision:
        """The Revision as callers see it (virtual paths)."""
        r = self.revision
        return Revision(
            r.id, r.seq, r.parent_id, r.author, r.committer, r.message, None, tuple(c.virtual() for c in r.changes)
        )


def write_failure(workspace_id: int, exc: BaseException) -> KbError:
    """The KbError for a Postgres or file-system failure of a commit known to have recorded nothing
    (design §3, §14; ``KnowledgeStore._settle_outcome`` made sure): WorkspaceNotFound when the workspace was
    deleted meanwhile (``database.deleted_workspace``), else StorageError / LockUnavailable /
    DatabaseUnavailable saying nothing was recorded."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    reason = reason.removeprefix(f"workspace {workspace_id}: ")  # the message names it once
    if isinstance(exc, WriteLockLost):
        return WriteLockLost(
            f"{reason}; settled by its idempotency key, this write did not land: nothing was recorded. Retry."
        )
    if isinstance(exc, LockUnavailable):
        return LockUnavailable(
            f"workspace {workspace_id}: {reason}; nothing was recorded. Retry when Postgres is back."
        )
    if (missing := database.deleted_workspace(exc)) is not None:
        return missing
    if isinstance(exc, OSError):
        return StorageError(
            f"workspace {workspace_id}: the file system refused the write ({reason}); "
            "nothing was recorded. Free space or fix permissions, then retry."
        )
    return DatabaseUnavailable(
        f"workspace {workspace_id}: Postgres failed during the write ({reason}); "
        "nothing was recorded. Retry when the server is back."
    )
