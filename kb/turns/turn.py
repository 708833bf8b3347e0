"""Turns (design §5): the agent file-operations API over a private, lazily materialized worktree.

``kb.turn(workspace, turn_id, author)`` hands out a :class:`Turn`. Nothing touches the disk until
the first file operation; then the turn's worktree (``kb.git.worktree.LazyWorktree``) is created at the
current head. Every operation takes a caller path under ``/documents`` (parsed by ``StorePath``,
design §2.3) and returns a structured result. Reads see the turn's own writes; ``ls``/``glob``/``grep``
answer from the base revision's tree plus the turn's own changes, so nothing costs O(workspace)
except what by nature reads everything (``grep``/``glob`` over the whole tree, ``materialize_all``).

``commit()`` diffs the touched paths against the base and records them as one revision on top of
the **current** head through the store (``KnowledgeStore.transaction``, under the write lock):
parallel turns' work on other files is never reverted; a file both changed is three-way merged
(``kb.git.merge``): non-overlapping edits both survive (``merged``), overlapping hunks go to the later
commit (``overwrote`` and ``lost_hunks``). Author = whom the turn acts for; committer = the agent
(``KB_COMMITTER`` by default).
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import shlex
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dulwich.errors import NotTreeError

from kb.citations.envelope import document_lines
from kb.errors import (
    AuthorConflict,
    DocumentGone,
    DocumentNotFound,
    EditMismatch,
    FolderNotEmpty,
    IdempotencyKeyReused,
    InvalidPattern,
    IsAFolder,
    PathExists,
    WorkspaceNotFound,
)
from kb.git.merge import LostHunk
from kb.git.worktree import LazyWorktree, root_turn_id, worktrees_root
from kb.lines import check_offset, check_window_arguments
from kb.paths import StorePath, blob_id, check_new_segment, check_path_length, describe_name, name_key
from kb.store.draft import document_bytes
from kb.store.history import PathChange
from kb.store.knowledge_store import KnowledgeStore, check_commit_text, stated_message, summarize, trailer_turn
from kb.store.listing import KEEP, Entry, folder_entries
from kb.store.titles import TitledDocument, choose_name, folder_and_name, name_taken_since
from kb.turns.line_pattern import LinePattern

KB_COMMITTER = "kb"
"""The committer a turn records when the caller names none: kb itself (design §5, seed contract C4)."""

GREP_SECONDS = 10.0
"""Matching time one ``Turn.grep`` call may spend (seconds, all its documents together) before it
stops with InvalidPattern: a pattern whose backtracking explodes would otherwise hold the thread
that runs it, in ``kb serve`` a thread every tenant shares (design §5, §16)."""


@dataclass(frozen=True)
class ReadResult:
    """Lines of a document as ``(true 1-based line number, text)``; ``total_lines`` of the whole file."""

    path: str
    lines: list[tuple[int, str]]
    total_lines: int

    @property
    def text(self) -> str:
        """The returned lines joined with ``\\n``."""
        return "\n".join(line for _, line in self.lines)


@dataclass(frozen=True)
class WriteResult:
    """``created`` is False when an existing document was replaced; ``size`` in bytes."""

    path: str
    created: bool
    size: int


@dataclass(frozen=True)
class EditResult:
    """How many occurrences of ``old`` were replaced."""

    path: str
    replacements: int


@dataclass(frozen=True)
class GrepMatch:
    """One matching line: virtual path, true 1-based line number, the line's text."""

    path: str
    line_number: int
    line: str


@dataclass(frozen=True)
class CommitResult:
    """The revision a turn recorded and its changes (virtual paths). ``moved`` holds ``(old, new)``.

    For paths another revision also changed since the turn's base (design §5): ``merged`` lists those
    three-way merged cleanly (both sides' edits at HEAD); ``overwrote`` those where the turn won
    over the other revision's change (overlapping hunks, or a document one side removed), with
    ``lost_hunks[path]`` naming the hunks that lost when the document was merged. The lost lines
    stay in history: they are the document at the revision's parent. :meth:`outcome` says it per
    path.
    """

    revision: str
    added: list[str]
    modified: list[str]
    removed: list[str]
    moved: list[tuple[str, str]]
    overwrote: list[str]
    merged: list[str] = field(default_factory=list)
    lost_hunks: dict[str, list[LostHunk]] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)
    """``{final virtual path: title}`` of the documents created by title (:meth:`Turn.create`)."""
    followed: list[tuple[str, str]] = field(default_factory=list)
    """``(path in the turn, path at HEAD)`` of edited documents another revision moved since the
    turn's base: the edit followed the move and was merged there."""

    def outcome(self, path: str) -> str:
        """``"merged"``, ``"overwrote"`` or ``"plain"`` for a virtual path of this commit."""
        return "merged" if path in self.merged else ("overwrote" if path in self.overwrote else "plain")


def _under(prefix: str, path: str) -> bool:
    return path.startswith(prefix + "/")


def _glob_segments(pattern: str) -> tuple[str, ...]:
    body = pattern.strip()
    if body.startswith("/"):
        if body != "/documents" and not body.startswith("/documents/"):
            raise InvalidPattern(f"glob {pattern!r}: patterns are relative to /documents or start with /documents/")
        body = body[len("/documents") :]
    parts = tuple(p for p in body.split("/") if p)
    if not parts or any(p in (".", "..") for p in parts):
        raise InvalidPattern(f"glob {pattern!r}: give a pattern like '**/*.md' or '/documents/Notes/*.md'")
    return parts


def _glob_match(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    @functools.cache
    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(parts)
        if pattern[i] == "**":
            return match(i + 1, j) or (j < len(parts) and match(i, j + 1))
        return j < len(parts) and fnmatch.fnmatchcase(parts[j], pattern[i]) and match(i + 1, j + 1)

    return match(0, 0)


class Turn:
    """One turn's private view of a workspace (design §5). Thread-safe; sub-agents share it.

    Errors: InvalidPath (path law), DocumentNotFound, PathExists, IsAFolder, FolderNotEmpty,
    EditMismatch, InvalidPattern, UnsafeWorktreeEntry (symlinks/special files), TurnBusy (open in
    another process), plus the store's errors from :meth:`commit`.
    """

    def __init__(
        self,
        store: KnowledgeStore,
        turn_id: str,
        author: str,
        on_close: Callable[[Turn], None] | None = None,
        on_open: Callable[[Turn, bool], None] | None = None,
        committer: str | None = None,
    ) -> None:
        self.turn_id = root_turn_id(turn_id)
        self.store = store
        self.author = author
        self._made_for = author  # the author again once a revision is recorded (``acting_for``)
        self._author_named = False  # a writing request named ``author`` for the next revision
        self.committer = committer or KB_COMMITTER
        self.path: Path = worktrees_root(store.settings.knowledge_store, store.workspace_id) / self.turn_id
        self._worktree: LazyWorktree | None = None
        self._mutex = threading.RLock()
        self._on_close = on_close
        self._on_open = on_open
        self._titles: dict[str, TitledDocument] = {}
        self._repository_identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the worktree's .git

    # -- worktree lifecycle ---------------------------------------------------------------
    @property
    def started(self) -> bool:
        """True once a file operation created (or adopted) this turn's worktree."""
        return self._worktree is not None

    @property
    def base(self) -> str | None:
        """The revision the turn's worktree was created at (None before the first operation)."""
        return self._worktree.base if self._worktree else None

    @contextlib.contextmanager
    def _operation(self) -> Iterator[None]:
        """Hold the turn's lock for one operation, first checking that the repository its
        worktree was opened on is still there (``_check_repository``)."""
        with self._mutex:
            self._check_repository()
            yield

    def _check_repository(self) -> None:
        """Raise WorkspaceNotFound, dropping the worktree, when the workspace's ``.git`` is gone
        or is another one than the worktree was opened on: another process deleted the workspace
        (and maybe created one with the same id). The turn went on writing into a worktree of a
        repository that was gone — answered 200 — and its commit recorded those writes into the
        new workspace that reuses the id (design §5, §16). One ``stat`` per operation."""
        if self._worktree is None:
            return
        try:
            same = self._worktree.repository_identity() == self._repository_identity
        except FileNotFoundError:
            same = False
        if not same:
            self._titles = {}
            self._finish(destroy=False)  # released: the worktree's folder is the janitor's
            raise WorkspaceNotFound(
                f"turn {self.turn_id!r}: workspace {self.store.workspace_id} was deleted while the turn was "
                "open; its changes went with it and nothing of them is recorded. Start the turn again"
            )

    def _wt(self, ending: bool = False) -> LazyWorktree:
        """The turn's worktree, opened (and flocked) at the first operation, or again after a
        commit, abort or idle release. ``on_open`` is told first, so that a turn reused after its
        commit is the open turn of its id again and a bound on open turns (``kb serve``'s per
        token, design §16) can refuse it before any lock is taken; ``ending``: for a commit or an
        abort, which a bound never refuses. Raises what ``on_open`` and opening raise."""
        if self._worktree is None:
            if self._on_open:
                self._on_open(self, ending)
            repo = self.store.repository
            worktree = LazyWorktree(repo, self.path, self.turn_id)
            try:
                worktree.open(repo.head())
            except BaseException:
                if self._on_close:  # not open after all: it counts against no bound
                    self._on_close(self)
                raise
            self._repository_identity = worktree.repository_identity()  # a workspace re-created has another
            self._worktree = worktree
            self._base_tree = repo.tree_id(worktree.base)
            for rp, title in worktree.titles.items():  # a crashed turn's documents keep their titles
                self._titles.setdefault(rp, TitledDocument(title, "/" + rp))
        return self._worktree

    @contextlib.contextmanager
    def acting_for(self, author: str | None) -> Iterator[Turn]:
        """Hold the turn for one writing request acting for ``author`` (None: whoever the turn
        acts for, by default the author it was made with), naming it the author of the turn's next
        revision if no writing request has named one since the turn was made or last committed or
        aborted (design §5). A read opens a turn as well, names nobody, and so cannot decide the
        author: the turn a ``kb serve`` client listed first kept the token as author and ignored
        the ``?author=`` of its first write. Holds the turn's own lock for the request, so two
        first writes cannot both name one (other turns are not held up); a request that fails
        names nobody. Raises InvalidInput for an author no revision can record (a line break, a
        NUL), AuthorConflict when an earlier writing request named another."""
        if author is not None:
            check_commit_text(None, author, None)
        with self._mutex:
            if self._author_named:
                if author is not None and author != self.author:
                    raise AuthorConflict(
                        f"turn {self.turn_id!r} acts for {self.author!r}, named by its first write since it began "
                        f"or last committed; this request names {author!r}. Commit or abort the turn first, "
                        "or write as that author in another turn"
                    )
                yield self
                return
            self.author, self._author_named = author or self._made_for, True
            try:
                yield self
            except BaseException:
                self.author, self._author_named = self._made_for, False  # it wrote nothing: it named nobody
                raise

    def _finish(self, destroy: bool, keep_author: bool = False) -> None:
        if not keep_author:  # recorded or dropped: the next writing request names the author again
            self.author, self._author_named = self._made_for, False
        if destroy:
            self._titles = {}
        if self._worktree is not None:
            self._worktree.destroy() if destroy else self._worktree.release()
            self._worktree = None
        if self._on_close:
            self._on_close(self)

    def abort(self) -> None:
        """Discard the turn: delete its worktree (also one a crashed process left behind)."""
        with self._mutex:
            if self._worktree is None and self._leftover():
                self._wt(ending=True)
            self._finish(destroy=True)

    def close(self) -> None:
        """Release the turn without committing or deleting; its worktree stays for a later
        ``commit()`` of the same turn id or for the janitor."""
        with self._mutex:
            self._finish(destroy=False, keep_author=True)  # its changes are still to be recorded

    def materialize_all(self) -> Path:
        """Check out every document into the worktree (for an external tool) and return the worktree
        folder; ``git status`` there then shows the turn's changes. O(workspace)."""
        with self._operation():
            worktree = self._wt()
            if not worktree.full:
                worktree.materialize_all()
            return self.path

    # -- the view: base tree + the turn's own changes -------------------------------------
    def _authoritative_on_disk(self, rp: str) -> bool:
        worktree = self._wt()
        if worktree.full or rp in worktree.touched:
            return True
        try:  # a file put there behind the API's back (a tool, a crash before the manifest)
            worktree._checked(rp).lstat()
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def _base_blob(self, rp: str) -> str | None:
        try:
            return self.store.repository.lookup(self._base_tree, rp)
        except NotTreeError:  # a path below a document (``a.md/x.md``)
            return None

    def _base_is_folder(self, rp: str) -> bool:
        try:
            return self.store.repository.is_folder(self._base_tree, rp)
        except NotTreeError:
            return False

    def _current(self, rp: str) -> bytes | None:
        """Bytes of the file at ``rp`` in the turn's view, None when there is none."""
        if self._authoritative_on_disk(rp):
            return self._worktree.read_disk(rp)
        blob = self._base_blob(rp)
        return None if blob is None else self.store.repository.blob(blob)

    def _exists(self, rp: str) -> bool:
        if self._authoritative_on_disk(rp):
            target = self._worktree._checked(rp)
            try:
                return stat.S_ISREG(target.lstat().st_mode)
            except FileNotFoundError:
                return False
        return self._base_blob(rp) is not None

    def _file_sources(self, folder: str) -> dict[str, str | None]:
        """``{repo path: base blob id, or None when the file on disk is authoritative}`` for every
        file (``.keep`` included) under ``folder`` in the turn's view."""
        worktree = self._wt()
        disk = worktree.scan_disk()
        if worktree.full:
            return {p: None for p in disk if folder == "documents" or _under(folder, p)}
        try:
            base = list(self.store.repository.walk(self._base_tree, folder))
        except NotTreeError:
            base = []
        local = set(worktree.touched) | set(disk)
        found: dict[str, str | None] = {p: blob for p, blob in base if p not in local}
        found.update((p, None) for p in local if _under(folder, p) and self._exists(p))
        return found

    def _files(self, folder: str) -> list[str]:
        """Repo paths of every file (``.keep`` included) under ``folder`` in the turn's view."""
        return sorted(self._file_sources(folder))

    def _is_folder(self, rp: str) -> bool:
        worktree = self._wt()
        if not worktree.full and not any(_under(rp, p) for p in worktree.touched):
            return self._base_is_folder(rp)
        return bool(self._files(rp))

    def _touch(self, rp: str) -> None:
        """Materialize ``rp`` from the base (bytes to disk first, then the manifest)."""
        worktree = self._wt()
        if worktree.full or rp in worktree.touched:
            return
        blob = self._base_blob(rp)
        if blob is None:
            return
        worktree.write_disk(rp, self.store.repository.blob(blob))
        worktree.touched.add(rp)  # on disk now: a crash leaves it found by the commit's scan

    def _put(self, rp: str, data: bytes) -> None:
        worktree = self._wt()
        worktree.write_disk(rp, data)
        worktree.touched.add(rp)

    def _drop(self, rp: str) -> None:
        worktree = self._wt()
        self._titles.pop(rp, None)
        worktree.titles.pop(rp, None)
        worktree.touched.add(rp)
        worktree.moves.pop(rp, None)
        worktree.save()
        worktree.unlink_disk(rp)

    def _require_file(self, path: str, rp: str) -> None:
        if self._is_folder(rp):
            raise IsAFolder(
                f"{path} is a folder, not a document; the turn's ls({path!r}) lists what it holds",
                cli=f"{path} is a folder, not a document; `kb ls {shlex.quote(path)} --workspace "
                f"{self.store.workspace_id}` lists what it holds",
            )

    def _check_parents(self, sp: StorePath) -> None:
        parent = sp.parent
        while parent is not None and parent.parts:
            if self._exists(parent.repo_path):
                raise PathExists(f"cannot create {sp.virtual}: {parent.virtual} is a document, not a folder")
            parent = parent.parent

    # -- file operations ------------------------------------------------------------------
    def ls(self, path: str = "/documents") -> list[Entry]:
        """Children of a folder (``.keep`` hidden), folders first then files, by name; a document
        path returns its own entry. Raises DocumentNotFound when nothing is there."""
        with self._operation():
            sp = StorePath.parse(path, allow_root=True)
            rp = sp.repo_path
            if sp.parts and self._exists(rp):
                return [Entry(sp.name, sp.virtual, "file")]
            worktree = self._wt()
            children: dict[str, str] = {}
            if worktree.full:
                for p in self._files(rp):
                    rest = p[len(rp) + 1 :].split("/")
                    children[rest[0]] = "folder" if len(rest) > 1 else "file"
            else:
                for name, kind in list_folder(self.store.repository, self._base_tree, rp):
                    children[name] = kind
                for p in worktree.touched:
                    if _under(rp, p):
                        name = p[len(rp) + 1 :].split("/")[0]
                        child = f"{rp}/{name}"
                        if child == p:
                            if self._exists(p):
                                children[name] = "file"
                            elif children.get(name) == "file":
                                del children[name]
                        elif self._is_folder(child):
                            children[name] = "folder"
                        else:
                            children.pop(name, None)
            if not children and sp.parts and not self._is_folder(rp):
                raise DocumentNotFound(f"no folder or document at {sp.virtual}")
            return folder_entries(sp, children.items())

    def read(self, path: str, offset: int = 0, limit: int | None = None) -> ReadResult:
        """Lines ``offset+1 … offset+limit`` of a document with their true line numbers (design §5, §8).

        ``offset`` = lines skipped (≥ 0), ``limit`` = most lines returned (None: to the end).
        Raises DocumentNotFound, IsAFolder, InvalidPath, InvalidInput for an offset/limit that is
        not a whole number ≥ 0, OffsetOutOfRange (a subclass) for an offset past the last line
        (``offset`` = the line count: no lines).
        """
        check_window_arguments(offset, limit)
        with self._operation():
            sp = StorePath.parse(path)
            self._require_file(sp.virtual, sp.repo_path)
            self._touch(sp.repo_path)
            data = self._current(sp.repo_path)
            if data is None:
                raise DocumentNotFound(f"no document at {sp.virtual} in this turn")
            lines = document_lines(data) if data else []
            check_offset(sp.virtual, offset, len(lines))
            end = len(lines) if limit is None else offset + limit
            return ReadResult(sp.virtual, [(n + 1, lines[n]) for n in range(offset, min(end, len(lines)))], len(lines))

    def read_bytes(self, path: str) -> bytes:
        """The exact bytes of a document in this turn; raises DocumentNotFound, IsAFolder."""
        with self._operation():
            sp = StorePath.parse(path)
            self._require_file(sp.virtual, sp.repo_path)
            self._touch(sp.repo_path)
            data = self._current(sp.repo_path)
            if data is None:
                raise DocumentNotFound(f"no document at {sp.virtual} in this turn")
            return data

    def write(self, path: str, text: str | bytes) -> WriteResult:
        """Create or replace a document (parent folders are implied). Raises IsAFolder when ``path``
        is a folder, PathExists when a parent is a document, InvalidPath."""
        with self._operation():
            sp = StorePath.parse(path)
            data = document_bytes(text, sp.virtual)
            self._require_file(sp.virtual, sp.repo_path)
            self._check_parents(sp)
            created = not self._exists(sp.repo_path)
            if created:
                self._check_new(sp)
            self._put(sp.repo_path, data)
            return WriteResult(sp.virtual, created, len(data))

    def edit(self, path: str, old: str, new: str, replace_all: bool = False) -> EditResult:
        """Replace the exact text ``old`` with ``new``. Raises EditMismatch when ``old`` is empty,
        absent, or occurs more than once without ``replace_all=True``; DocumentNotFound."""
        with self._operation():
            sp = StorePath.parse(path)
            if not old:
                raise EditMismatch(f"edit {sp.virtual}: old text is empty; give the exact text to replace")
            data = self.read_bytes(sp.virtual)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise EditMismatch(f"edit {sp.virtual}: the document is not UTF-8 text; use write") from None
            count = text.count(old)
            if count == 0:
                raise EditMismatch(f"edit {sp.virtual}: old text not found; read the document and copy it exactly")
            if count > 1 and not replace_all:
                raise EditMismatch(
                    f"edit {sp.virtual}: old text occurs {count} times; include more surrounding text "
                    "to make it unique, or pass replace_all=True"
                )
            self._put(sp.repo_path, document_bytes(text.replace(old, new), sp.virtual))
            return EditResult(sp.virtual, count)

    def create(self, folder: str, title: str, body: str | bytes = b"") -> TitledDocument:
        """Create a document in ``folder`` named from ``title`` by the path law (design §2.2, §5):
        ``safe_filename(title)`` with the first free `` (n)`` suffix among the folder's entries in
        this turn's view; chosen again at commit, under the write lock, if a commit that landed
        meanwhile took the name. The title is recorded as typed (``documents.title``). Returns a
        TitledDocument whose ``path`` is final after :meth:`commit`. Raises InvalidPath,
        PathExists (``folder`` is a document), TypeError (title not str).
        """
        with self._operation():
            sp = StorePath.parse(folder, allow_root=True)
            if sp.parts and self._exists(sp.repo_path):
                raise PathExists(f"cannot create in {sp.virtual}: it is a document, not a folder")
            taken = {e.name for e in self.ls(sp.virtual)} if not sp.parts or self._is_folder(sp.repo_path) else set()
            target = sp.child(choose_name(title, taken))
            self.write(target.virtual, body)
            document = TitledDocument(title, target.virtual)
            self._titles[target.repo_path] = document
            self._worktree.titles[target.repo_path] = title
            self._worktree.save()  # the title survives a crash (recovery commits it)
            return document

    def glob(self, pattern: str) -> list[str]:
        """Virtual paths of documents matching ``pattern`` (relative to /documents, or starting
        with /documents/; ``*``/``?``/``[...]`` within a name, ``**`` any folders). Sorted."""
        with self._operation():
            segments = _glob_segments(pattern)
            result = []
            for p in self._files("documents"):
                parts = tuple(p.split("/")[1:])
                if parts[-1] != KEEP and _glob_match(segments, parts):
                    result.append("/" + p)
            return result

    def grep(self, pattern: str, path: str | None = None, *, ignore_case: bool = False) -> list[GrepMatch]:
        """Lines matching the regular expression ``pattern`` (Python ``re``'s syntax, matched per
        line) in every document under ``path`` (a folder or one document; default all).

        Matching is bounded (design §5, §16; ``kb.turns.line_pattern``): at most ``GREP_SECONDS``
        of it per call, since a pattern whose backtracking explodes would hold a ``kb serve``
        thread, and the interpreter lock, for hours. Raises InvalidPattern when the pattern does
        not compile or passes that bound (nothing is changed), DocumentNotFound."""
        with self._operation():
            matcher = LinePattern(pattern, ignore_case=ignore_case, seconds=GREP_SECONDS)
            sp = StorePath.parse(path or "/documents", allow_root=True)
            rp = sp.repo_path
            if sp.parts and self._exists(rp):
                sources: dict[str, str | None] = {rp: None}
            else:
                sources = self._file_sources(rp)
                if not sources and sp.parts and not self._is_folder(rp):
                    raise DocumentNotFound(f"no folder or document at {sp.virtual}")
            paths = sorted(p for p in sources if not p.endswith("/" + KEEP))
            # the base's blobs in one bulk read (kb.git.blob_batch), the turn's own files from disk
            # (streamed in path order: a big workspace is never held in memory whole)
            blobs = self.store.repository.blobs([b for p in paths if (b := sources[p]) is not None])
            matches = []
            with contextlib.closing(blobs) as base:  # an error below ends the git process at once
                for p in paths:
                    data = next(base)[1] if sources[p] is not None else self._current(p)
                    if not data:
                        continue
                    text = data.decode("utf-8", errors="replace")
                    matches += [GrepMatch("/" + p, n, line) for n, line in matcher.lines("/" + p, text)]
            return matches

    def mkdir(self, path: str) -> bool:
        """Create a folder (writes ``.keep``, design §1); True when it was created, False when it
        already existed. Raises PathExists when a document has that path."""
        with self._operation():
            sp = StorePath.parse(path)
            if self._exists(sp.repo_path):
                raise PathExists(f"cannot create folder {sp.virtual}: a document has that path")
            if self._is_folder(sp.repo_path):
                return False
            self._check_parents(sp)
            self._check_new(sp)
            self._put(f"{sp.repo_path}/{KEEP}", b"")
            return True

    def move(self, src: str, dst: str, overwrite: bool = False) -> list[tuple[str, str]]:
        """Move a document or a whole folder; returns the ``(old, new)`` virtual paths moved.

        Raises DocumentNotFound (no ``src``), PathExists (``dst`` taken and not ``overwrite``, a
        folder at ``dst``, or a folder moved into itself)."""
        with self._operation():
            s, d = StorePath.parse(src), StorePath.parse(dst)
            srp, drp = s.repo_path, d.repo_path
            if srp == drp:
                return []
            if self._exists(srp):
                pairs = [(srp, drp)]
            elif self._is_folder(srp):
                if _under(srp, drp):
                    raise PathExists(f"cannot move folder {s.virtual} into itself")
                if not overwrite and self._is_folder(drp) and name_key(srp) != name_key(drp):
                    raise PathExists(
                        f"cannot move folder {s.virtual} to {d.virtual}: a folder exists there; name the "
                        f"new path (e.g. {d.virtual}/{s.parts[-1]}) or merge into it with overwrite=True"
                    )
                pairs = [(p, drp + p[len(srp) :]) for p in self._files(srp)]
            else:
                raise DocumentNotFound(f"cannot move {s.virtual}: no such document or folder")
            self._check_parents(d)
            if not self._exists(drp):
                self._check_new(d, renaming=s)
            for old, new in pairs:
                check_path_length(new, "/" + new)
                if self._is_folder(new):
                    raise PathExists(f"cannot move /{old} to /{new}: a folder is there")
                if self._exists(new) and not overwrite:
                    raise PathExists(f"cannot move /{old} to /{new}: a document exists there (pass overwrite=True)")
            worktree = self._wt()
            for old, new in pairs:
                data = self._current(old)
                same_file = name_key(old) == name_key(new)
                if same_file:
                    # a rename by letter case or normalization only: on a case-insensitive file
                    # system both names are one file, so remove the old name before writing the new
                    worktree.unlink_disk(old)
                worktree.write_disk(new, data)
                worktree.touched.update((old, new))
                origin = worktree.moves.pop(old, old)
                worktree.moves.pop(new, None)
                if origin != new:
                    worktree.moves[new] = origin
                if old in self._titles:  # a document created by title keeps its title
                    self._titles[new] = self._titles.pop(old)
                    self._titles[new].path = "/" + new
                    worktree.titles[new] = worktree.titles.pop(old, self._titles[new].title)
                worktree.save()
                if not same_file:
                    worktree.unlink_disk(old)
            return [("/" + old, "/" + new) for old, new in pairs if not old.endswith("/" + KEEP)]

    def remove(self, path: str, missing_ok: bool = False) -> str | None:
        """Delete a document; returns its virtual path, or None when it was absent and
        ``missing_ok`` (as ``rm -f``). Raises DocumentNotFound (absent, strict), IsAFolder."""
        with self._operation():
            sp = StorePath.parse(path)
            self._require_file(sp.virtual, sp.repo_path)
            if not self._exists(sp.repo_path):
                if missing_ok:
                    return None
                raise DocumentNotFound(f"cannot remove {sp.virtual}: no such document")
            self._drop(sp.repo_path)
            return sp.virtual

    def rmdir(self, path: str, recursive: bool = False) -> list[str]:
        """Delete a folder; with ``recursive`` also every document in it. Returns the removed
        documents' virtual paths. Raises DocumentNotFound, FolderNotEmpty."""
        with self._operation():
            sp = StorePath.parse(path)
            if self._exists(sp.repo_path):
                raise DocumentNotFound(f"{sp.virtual} is a document, not a folder; use remove")
            files = self._files(sp.repo_path)
            if not files:
                raise DocumentNotFound(f"cannot remove folder {sp.virtual}: no such folder")
            documents = [p for p in files if not p.endswith("/" + KEEP)]
            if documents and not recursive:
                raise FolderNotEmpty(
                    f"folder {sp.virtual} holds {len(documents)} documents; pass recursive=True to delete them"
                )
            for p in files:
                self._drop(p)
            return ["/" + p for p in documents]

    def forget_untracked(self) -> list[str]:
        """Delete files on disk that no operation of this turn wrote (an editor's swap or backup
        files, say) so the commit does not pick them up; returns their virtual paths."""
        with self._operation():
            if self._worktree is None or self._worktree.full:
                return []
            stray = [p for p in self._worktree.scan_disk() if p not in self._worktree.touched]
            for p in stray:
                self._worktree.unlink_disk(p)
            return ["/" + p for p in stray]

    # -- recovery and new-name checks (design §14) ------------------------------------------------
    def _leftover(self) -> bool:
        """True when this turn id has anything on disk: a worktree to recover, or the remains of
        one a killed process was creating or deleting (cleaned by ``_wt()``)."""
        return LazyWorktree(self.store.repository, self.path, self.turn_id).leftover()

    def _landed_revision(self) -> str | None:
        """The revision this worktree's changes were already recorded as, if any: a revision after
        the worktree's base whose ``Turn:`` trailer names this turn (a process killed after the
        ref moved, or a commit whose outcome was unknown). Only this worktree can have made one —
        the turn id is locked, and a reused turn starts a fresh worktree at the head after its
        commit. Cost: the revisions since the base."""
        repo = self.store.repository
        for revision in reversed(repo.ancestry(repo.head(), self._worktree.base)):
            if trailer_turn(repo.commit(revision).message.decode("utf-8", "replace")) == self.turn_id:
                return revision
        return None

    def _answered_by_another_write(self, revision, changes: dict[str, bytes | None]) -> bool:
        """Whether ``revision`` — what the store answered this turn's keyed commit with — is
        another write's, recorded earlier with the same key, that does not hold the turn's
        ``changes`` (design §3: a key names one write). Not when this call recorded it (this
        turn's trailer, after the worktree's base), nor when it holds the turn's bytes at every
        changed path (a retry of the same change from another turn). Answering such a key's
        revision and discarding the worktree deleted the turn's work while saying it landed."""
        repo = self.store.repository
        base = self._worktree.base if self._worktree is not None else None
        # after the base: among the revisions since it (what ``_landed_revision`` walks too)
        if trailer_turn(revision.message or "") == self.turn_id and revision.id in repo.ancestry(repo.head(), base):
            return False
        tree = repo.tree_id(revision.id)
        for rp, data in changes.items():
            try:
                held = repo.lookup(tree, rp)
            except NotTreeError:
                held = None
            if held != (None if data is None else blob_id(data)):
                return True
        return False

    def _keyed_result(self, idempotency_key: str | None) -> CommitResult | None:
        """What a commit with nothing to record answers (design §3): None, unless
        ``idempotency_key`` already landed — a retry of a commit that landed (this turn's, then
        used again; or a new turn that repeats the same write, which the head already holds) gets
        that commit's revision, as the key's first write answered. The key is settled
        (``KnowledgeStore.write_outcome``): a None here means it never lands."""
        if idempotency_key is None:
            return None
        landed = self.store.write_outcome(idempotency_key)
        return None if landed is None else self._result_of(landed.id)

    def _result_of(self, revision: str) -> CommitResult:
        """CommitResult of an already recorded revision (``overwrote`` is not known any more)."""
        changes = self.store.list_changes(revision)
        return CommitResult(
            revision,
            added=[c.path for c in changes if c.change == "added"],
            modified=[c.path for c in changes if c.change == "modified"],
            removed=[c.path for c in changes if c.change == "removed"],
            moved=[(c.old_path, c.path) for c in changes if c.change == "moved"],
            overwrote=[],
        )

    def _check_new(self, sp: StorePath, renaming: StorePath | None = None) -> None:
        """Refuse, at write time, a path the turn would create that the commit could not record:
        longer than the path law allows, a new segment that is a Windows device name or ends in a
        dot/space (InvalidPath), or one differing only in case or Unicode normalization from an
        existing sibling in the turn's view (PathExists, both names shown escaped; design §2.2).
        ``renaming``: the path a move takes ``sp`` from; it is no twin of its own new name (a
        rename by letter case only)."""
        check_path_length(sp.repo_path, sp.virtual)
        parent = StorePath(())
        for depth, name in enumerate(sp.parts, start=1):
            here = StorePath(sp.parts[:depth])
            if self._exists(here.repo_path) or self._is_folder(here.repo_path):
                parent = here
                continue
            check_new_segment(name, sp.virtual)
            if parent is not None:  # a folder that exists: its children may hold a twin
                key, folder = name_key(name), parent.repo_path
                touched = {p[len(folder) + 1 :].split("/")[0] for p in self._worktree.touched if _under(folder, p)}
                candidates = self._base_sibling_keys(folder).get(key, set()) | {
                    n for n in touched if name_key(n) == key
                }
                source = (
                    StorePath(renaming.parts[:depth]).repo_path if renaming and len(renaming.parts) >= depth else None
                )
                for other in sorted(candidates):
                    if f"{parent.repo_path}/{other}" == source:
                        continue  # the name being renamed away
                    if other != name and (
                        self._exists(f"{parent.repo_path}/{other}") or self._is_folder(f"{parent.repo_path}/{other}")
                    ):
                        raise PathExists(
                            f"cannot create {sp.virtual}: {describe_name(name)} differs only in case or "
                            f"Unicode normalization from the existing {describe_name(other)} in "
                            f"{parent.virtual}; the tree would not check out on macOS or Windows. "
                            "Use the existing name."
                        )
            parent = None  # below a new folder nothing exists yet

    def _base_sibling_keys(self, folder: str) -> _NamesByKey:
        """``{name_key: names}`` of the children of ``folder`` in the turn's base tree, cached per
        base (which never changes for a worktree): O(folder) once, then O(1) per write."""
        found = self.store.repository.folder_keys(self._base_tree, folder)
        return _NamesByKey(found)

    # -- commit ---------------------------------------------------------------------------
    def _changes(self) -> dict[str, bytes | None]:
        """``{repo path: new bytes or None (deleted)}`` for every path the turn changed vs its base."""
        worktree = self._worktree
        repo = self.store.repository
        candidates = set(worktree.touched) | set(worktree.scan_disk())
        if worktree.full:
            candidates |= {p for p, _ in repo.walk(self._base_tree, "documents")}
        changes: dict[str, bytes | None] = {}
        for rp in sorted(candidates):
            if not rp.startswith("documents/"):
                continue
            data = worktree.read_disk(rp)
            base = self._base_blob(rp)
            if data is None:
                if base is not None:
                    changes[rp] = None
            elif blob_id(data) != base:
                StorePath.from_repo_path(rp, allow_keep=True)  # a file an external tool named badly
                changes[rp] = data
        return changes

    def _free_path(self, draft, rp: str, changes: dict[str, bytes | None]) -> str:
        """Where a document this turn created by title goes in ``draft`` (at the current head):
        ``rp``, or the next free name if a commit since the turn's base took it (design §2.2)."""
        folder, name = folder_and_name(rp)
        at_base = {n for n, _ in list_folder(self.store.repository, self._base_tree, folder)}
        own = {
            folder_and_name(p)[1]
            for p, d in changes.items()
            if d is not None and p != rp and folder_and_name(p)[0] == folder
        }
        new_name = name_taken_since(name, draft.names_in(folder), at_base, own)
        return rp if new_name is None else f"{folder}/{new_name}"

    def commit(self, message: str | None = None, idempotency_key: str | None = None) -> CommitResult | None:
        """Record the turn's changes as one revision on top of the current head (design §5) and
        delete the worktree; None when nothing changed. A worktree a crashed process left for
        this turn id is committed too (recovery). After a commit the turn can be used again (a
        fresh worktree at the then-current head).

        ``idempotency_key`` (design §3): a retry of a commit that landed with this key records
        nothing and returns that commit's revision (the worktree is then discarded); None generates
        one. A failure of Postgres is settled before the call answers (``KnowledgeStore.transaction``).

        Raises UnsafeWorktreeEntry (symlink/special file: nothing recorded, worktree kept),
        InvalidPath (a badly named file), PathExists, LockTimeout, LockUnavailable,
        CommitOutcomeUnknown (the worktree is kept: retry with the same key). A commit with a key
        waits for another commit or settle of that key in flight on this node, in any process (the
        write-key fence, ``KnowledgeStore.key_fence``), so a retry with nothing to record answers
        the revision the first one lands as — never None followed by the key landing (design §3).
        """
        with self.store.key_fence(idempotency_key):
            return self._commit(message, idempotency_key)

    def _commit(self, message: str | None, idempotency_key: str | None) -> CommitResult | None:
        """``commit`` under its key's lock (see there)."""
        with self._operation():
            if self._worktree is None:
                if not self._leftover():
                    self._finish(destroy=False)
                    return self._keyed_result(idempotency_key)
                self._wt(ending=True)
            worktree = self._worktree
            changes = self._changes()
            if not changes:
                self._finish(destroy=True)
                return self._keyed_result(idempotency_key)
            landed = self._landed_revision()
            if landed is not None:  # recovery: this worktree's revision is already recorded
                result = self._result_of(landed)
                self._finish(destroy=True)
                return result
            moves = {
                new: origin
                for new, origin in worktree.moves.items()
                if changes.get(new) is not None and origin in changes and changes[origin] is None
            }
            planned = [
                PathChange(
                    p,
                    "moved"
                    if p in moves
                    else ("removed" if d is None else ("modified" if self._base_blob(p) else "added")),
                )
                for p, d in changes.items()
                if not (d is None and p in moves.values())
            ]
            text = stated_message(message) or summarize(planned)
            gone: list[str] = []
            followed: list[tuple[str, str]] = []
            with self.store.transaction(
                text, self.author, self.committer, idempotency_key, turn_id=self.turn_id
            ) as draft:
                recorded_moves = set()
                for new, origin in moves.items():
                    if draft.exists(origin):
                        draft.move(origin, new, overwrite=True)
                        recorded_moves.add(new)
                for rp, data in changes.items():
                    if data is not None and rp in self._titles:  # created by title: named again if taken
                        draft.write_titled(
                            self._free_path(draft, rp, changes), data, self._titles[rp].title, self._titles[rp]
                        )
                    elif data is not None:  # an edit of the base's document: merged with head (§5)
                        # a document the turn moved whose origin is gone at head stands as new
                        base_blob = (
                            None if rp in moves and rp not in recorded_moves else self._base_blob(moves.get(rp, rp))
                        )
                        target = rp
                        if base_blob is not None and rp not in moves and draft.content_id(rp) != base_blob:
                            target = self._where_now(rp, draft, gone)  # changed since the base: moved?
                            if target is None:
                                continue
                            if target != rp:
                                followed.append(("/" + rp, "/" + target))
                        draft.write_merged(target, data, base_blob, allow_keep=True)
                    elif draft.exists(rp):
                        draft.remove(rp)
                if gone:
                    raise DocumentGone(
                        f"turn {self.turn_id!r} edits {', '.join(gone)}, which another revision removed since the "
                        "turn began; nothing was recorded and the turn is kept. Keep the text under a new path "
                        "(move it in the turn) or drop the edit (remove it in the turn), then commit again",
                        gone,
                    )
            revision = draft.revision
            if revision is None:
                self._finish(destroy=True)
                return None
            if idempotency_key is not None and self._answered_by_another_write(revision, changes):
                raise IdempotencyKeyReused(
                    f"turn {self.turn_id!r}: its idempotency key was already used by another write, recorded as "
                    f"revision {revision.id}, which does not hold this turn's changes; nothing of the turn was "
                    "recorded and the turn is kept. Commit it with a new key (a retry of the same change with "
                    "the same key answers that revision)",
                    revision.id,
                )
            repo = self.store.repository
            parent_tree = repo.tree_id(revision.parent_id)
            overwrote, lost_hunks = [], {}
            for path, outcome in draft.merges.items():
                if not outcome.clean:
                    overwrote.append(path)
                    lost_hunks[path] = list(outcome.lost)
            followed_from = {old for old, _ in followed}
            for rp, data in changes.items():
                if "/" + rp in draft.merges or "/" + rp in followed_from:
                    continue  # a followed edit was merged where its document went: no overwrite
                at_parent = repo.lookup(parent_tree, rp)
                ours = None if data is None else blob_id(data)
                if at_parent != self._base_blob(rp) and ours != at_parent:
                    overwrote.append("/" + rp)
            result = CommitResult(
                revision.id,
                added=[c.path for c in revision.changes if c.change == "added"],
                modified=[c.path for c in revision.changes if c.change == "modified"],
                removed=[c.path for c in revision.changes if c.change == "removed"],
                moved=[(c.old_path, c.path) for c in revision.changes if c.change == "moved"],
                overwrote=sorted(overwrote),
                merged=sorted(p for p, outcome in draft.merges.items() if outcome.clean),
                lost_hunks=lost_hunks,
                titles={document.path: document.title for document in self._titles.values()},
                followed=followed,
            )
            self._finish(destroy=True)
            return result

    def _where_now(self, rp: str, draft, gone: list[str]) -> str | None:
        """Where the base's document at ``rp``, changed at the draft's head since the turn's base,
        is now: the path a recorded move took it to (the edit follows it, design §5) — even when a
        new document now occupies ``rp`` —, else ``rp`` itself when a document is still there (the
        edit merges with it), or None after adding ``/rp`` to ``gone`` (removed, or moved and then
        removed: the edit must not bring it back, nor land on a stranger)."""
        base = self._worktree.base if self._worktree is not None else None
        moved = self.store.moved_to("/" + rp, base) if base else None
        if moved is not None:
            if draft.exists(moved):
                return moved[1:]
        elif draft.exists(rp):
            return rp
        gone.append("/" + rp)
        return None


class _NamesByKey:
    """``.get(key, default)`` → set of names, over ``Repository.folder_keys`` (no copy)."""

    def __init__(self, keys: dict) -> None:
        self._keys = keys

    def get(self, key: str, default=None):
        entries = self._keys.get(key)
        return default if entries is None else {name for name, _ in entries}


def list_folder(repository, tree_id: bytes | None, folder: str) -> list[tuple[str, str]]:
    """``(name, "file"|"folder")`` of the direct children of ``folder`` in a tree (one tree read)."""
    return repository.list_folder(tree_id, folder)
