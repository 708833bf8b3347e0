"""Lazily materialized git worktrees for turns (design §5), and the janitor that prunes them.

A turn's worktree lives at ``{storage_root}/knowledge_store/.worktrees/{workspace_id}/{name}`` and
is a real git worktree of the workspace repository: its ``.git`` file points at the admin folder
``{repo}/.git/worktrees/{name}`` (``HEAD`` = the detached base revision, ``commondir``, ``gitdir``),
exactly as ``git worktree add --detach --no-checkout`` would write them, so ``git worktree list``
shows it and ``git fsck`` agrees.

Nothing is checked out up front (a checkout is O(workspace)). A file appears on disk on first touch;
the admin ``HEAD`` records the base revision and the turn's *manifest* (``kb-turn.json`` in the
admin folder) the touched paths and recorded moves. A touched path, or any file present on disk, is
authoritative on disk (present → its bytes, absent → deleted); any other path is the base tree's.
Ordering keeps a crash safe: created/modified bytes only need to reach the disk (the commit scans
the small set of files on disk), while a deletion or move is named in the manifest before its file
is unlinked, so only those operations write the manifest. In lazy mode the worktree has
no index (git's index would have to list the whole base tree); :meth:`LazyWorktree.materialize_all`
checks out everything and writes an index equal to the base tree, after which ``git status`` in the
worktree shows exactly the turn's changes.

An open turn holds an exclusive ``flock`` on ``kb-turn.lock`` in the admin folder; a crashed process
releases it with its file descriptors. The janitor removes only worktrees whose lock it can take
and whose newest file is older than ``worktree_ttl``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from dulwich.index import Index, IndexEntry, index_entry_from_stat
from dulwich.objects import ObjectID

from kb.errors import InvalidTurn, StorageError, TurnBusy, UnsafeWorktreeEntry, WorkspaceNotFound
from kb.git.process_locks import path_lock
from kb.git.repository import FILE_MODE, Repository
from kb.paths import check_path_length

MANIFEST = "kb-turn.json"
LOCK = "kb-turn.lock"
FOLDER_ATTEMPTS = 5
"""Tries to create a worktree's folders while another process removes their emptied parent."""
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@+=:-")


def root_turn_id(turn_id: object) -> str:
    """The turn a (sub-agent) turn id belongs to: ``root::task:7`` → ``root`` (design §5).

    The one derivation used on both the write and the commit side. Raises InvalidTurn when the root
    id is empty, longer than 200 characters, starts with ``.``, or uses characters other than
    ASCII letters, digits and ``. _ @ + = : -``.
    """
    if not isinstance(turn_id, str):
        raise InvalidTurn(f"a turn id is a string, got {type(turn_id).__name__}")
    root = turn_id.split("::", 1)[0]
    if not root or len(root) > 200 or root.startswith(".") or not set(root) <= _NAME_CHARS or root.endswith(".lock"):
        raise InvalidTurn(
            f"turn id {turn_id!r}: the root id {root!r} must be 1-200 characters of ASCII letters "
            "(a-z, A-Z), digits and . _ @ + = : -, not starting with '.' nor ending in '.lock' (git's lock files); "
            "sub-agents append '::<anything>'"
        )
    return root


def worktrees_root(knowledge_store: Path, workspace_id: int) -> Path:
    """``{knowledge_store}/.worktrees/{workspace_id}`` (design §2.1)."""
    return Path(knowledge_store) / ".worktrees" / str(workspace_id)


def make_folders(folder: Path, within: Path | None = None) -> None:
    """``mkdir -p folder``, made again when another process removes an emptied parent between the
    parent's creation and the child's (a turn's cleanup, the janitor): FileNotFoundError, or
    FileExistsError from ``exist_ok`` when the folder it found vanished before it checked it.
    ``within``: a folder above ``folder`` that is never made, only the folders below it — a
    repository's ``.git``, which is gone when another process deleted the workspace (a ``.git``
    made again there was no repository, and kept the workspace id from being created again).
    Raises OSError, FileNotFoundError when ``within`` is missing."""
    for attempt in range(1, FOLDER_ATTEMPTS + 1):
        try:
            if within is None:
                folder.mkdir(parents=True, exist_ok=True)
            else:
                here = within
                for part in folder.relative_to(within).parts:
                    here = here / part
                    here.mkdir(exist_ok=True)
            return
        except (FileNotFoundError, FileExistsError):
            if attempt == FOLDER_ATTEMPTS or (within is not None and not within.is_dir()):
                raise


def folders_lock(repository: Repository):
    """The process-wide lock under which this process creates turn worktrees and removes the
    folders they share (``.git/worktrees``, ``.worktrees/{ws}``), so that no thread's cleanup
    removes a shared folder another thread is creating its worktree in (design §5)."""
    return path_lock(repository.path / ".git" / "worktrees")


def _is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


@dataclass
class LazyWorktree:
    """One turn's worktree: the admin files, the manifest, the lock and safe file I/O.

    ``base`` is the base revision (None for an unborn workspace), ``touched`` the repo paths whose
    truth is on disk, ``moves`` ``{new repo path: origin repo path}``, ``full`` True once
    :meth:`materialize_all` ran.
    """

    repository: Repository
    path: Path
    name: str
    base: str | None = None
    touched: set[str] = field(default_factory=set)
    moves: dict[str, str] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)  # {repo path: title} of documents created by title
    full: bool = False
    _lock_fd: int | None = None

    @property
    def git_dir(self) -> Path:
        """The workspace repository's ``.git``, which holds the admin folder (never made here)."""
        return self.repository.path / ".git"

    def repository_identity(self) -> tuple[int, int]:
        """``(st_dev, st_ino)`` of the repository's ``.git``: which repository this is — a
        workspace deleted and created again with the same id has another. Raises
        FileNotFoundError when it is gone."""
        st = os.stat(self.git_dir)
        return st.st_dev, st.st_ino

    @property
    def admin(self) -> Path:
        """The worktree's admin folder inside the workspace repository."""
        return self.repository.path / ".git" / "worktrees" / self.name

    @property
    def manifest_path(self) -> Path:
        return self.admin / MANIFEST

    def exists(self) -> bool:
        """True when a worktree (perhaps left by a crashed process) is on disk."""
        return (self.path / ".git").is_file() and (self.admin / "HEAD").is_file()

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self, head: str | None) -> bool:
        """Lock the worktree, adopting an existing one (recovery) or creating it at ``head``.

        Returns True when an existing worktree was adopted. Raises TurnBusy when another process
        (or another Turn object of this process) holds it open, WorkspaceNotFound when the
        repository is gone (the workspace deleted by another process), StorageError when its
        folders cannot be created.
        """
        with folders_lock(self.repository):
            try:
                make_folders(self.admin, within=self.git_dir)
                self._lock()
            except OSError as exc:
                if not self.git_dir.is_dir():  # deleted meanwhile: nothing made in its place
                    raise WorkspaceNotFound(
                        f"turn {self.name!r}: its workspace was deleted (the repository at "
                        f"{self.repository.path} is gone); nothing was written. `kb workspaces` lists "
                        "the workspaces there are"
                    ) from None
                raise StorageError(
                    f"cannot create the worktree of turn {self.name!r} at {self.admin}: "
                    f"{exc.strerror or exc}; free space or fix permissions"
                ) from None
            return self._open_locked(head)

    def _open_locked(self, head: str | None) -> bool:
        """``open`` once the lock is held."""
        if not self.exists():
            self._clear_leftovers()
        if self.exists():
            recorded = (self.admin / "HEAD").read_text().strip()
            self.base = None if recorded.startswith("ref:") else recorded
            self.touched, self.moves, self.full = set(), {}, False
            if self.manifest_path.is_file():
                data = json.loads(self.manifest_path.read_text())
                self.full = data.get("full", False)
                self.touched, self.moves = set(data["touched"]), dict(data["moves"])
                self.titles = dict(data.get("titles", {}))
            return True
        self.base, self.touched, self.moves, self.full, self.titles = head, set(), {}, False, {}
        try:
            make_folders(self.path)
            (self.admin / "commondir").write_text("../..\n")
            (self.admin / "gitdir").write_text(str(self.path / ".git") + "\n")
            (self.path / ".git").write_text(f"gitdir: {self.admin}\n")
            (self.admin / "HEAD").write_text((head or "ref: refs/heads/main") + "\n")  # last: marks it complete
        except OSError as exc:
            self.release()
            raise StorageError(
                f"cannot create the worktree of turn {self.name!r} at {self.path}: "
                f"{exc.strerror or exc}; free space or fix permissions"
            ) from None
        return False

    def _clear_leftovers(self) -> None:
        """Delete what a worktree that is not complete left (a process killed while creating or
        destroying it): none of it is a turn's work, and files left there must never be committed
        as one (design §14). Keeps the lock file this process holds."""
        shutil.rmtree(self.path, ignore_errors=True)
        for entry in list(self.admin.iterdir()) if self.admin.is_dir() else []:
            if entry.name == LOCK:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def leftover(self) -> bool:
        """True when anything of this worktree is on disk (complete, or half created/deleted)."""
        return self.path.exists() or self.admin.exists()

    def _lock(self) -> None:
        while True:
            fd = os.open(self.admin / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise TurnBusy(
                    f"turn {self.name!r} is open in another process (worktree {self.path}); "
                    "commit or abort it there, or retry once that process ends"
                ) from None
            try:  # the janitor may have removed the file between our open and our lock
                same = os.stat(self.admin / LOCK).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock_fd = fd
                return
            os.close(fd)
            make_folders(self.admin, within=self.git_dir)

    def release(self) -> None:
        """Drop the lock, leaving the worktree on disk (for recovery or the janitor)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def destroy(self) -> None:
        """Delete the worktree folder and its admin folder, then drop the lock. The admin ``HEAD``
        goes first, so a process killed half-way leaves a worktree that is visibly incomplete
        (cleaned by the next open, commit or abort), never one that looks like a turn to recover."""
        (self.admin / "HEAD").unlink(missing_ok=True)
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.admin, ignore_errors=True)
        self.release()
        with folders_lock(self.repository):  # never while another thread creates a worktree here
            for folder in (self.path.parent, self.repository.path / ".git" / "worktrees"):
                try:
                    folder.rmdir()
                except OSError:
                    pass

    def save(self) -> None:
        """Write the manifest atomically."""
        data = {
            "version": 1,
            "turn": self.name,
            "base": self.base,
            "full": self.full,
            "touched": sorted(self.touched),
            "moves": self.moves,
            "titles": self.titles,
        }
        tmp = self.admin / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.manifest_path)

    # -- safe file I/O (repo paths like ``documents/a/b.md``) --------------------------------
    def _checked(self, repo_path: str) -> Path:
        """The disk path of ``repo_path``; raises UnsafeWorktreeEntry when any existing component
        is a symlink or not the expected kind (folders for parents), InvalidPath when the path is
        longer than the path law allows (it cannot exist on disk; design §2.3)."""
        check_path_length(repo_path, "/" + repo_path)
        current = self.path
        parts = repo_path.split("/")
        for i, part in enumerate(parts):
            current = current / part
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                return self.path.joinpath(*parts)
            last = i == len(parts) - 1
            if stat.S_ISLNK(st.st_mode) or (not last and not stat.S_ISDIR(st.st_mode)):
                raise UnsafeWorktreeEntry(
                    f"/{'/'.join(parts[: i + 1])} in turn {self.name!r} is "
                    f"{'a symlink' if stat.S_ISLNK(st.st_mode) else 'not a folder'}; kb refuses "
                    f"symlinks and special files. Remove it from {self.path} or abort the turn"
                )
        return current

    def read_disk(self, repo_path: str) -> bytes | None:
        """Bytes of a touched path on disk, None when it is absent (deleted by the turn)."""
        target = self._checked(repo_path)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeWorktreeEntry(f"/{repo_path} is a symlink; kb refuses symlinks") from None
            if exc.errno == errno.EISDIR:
                return None
            raise StorageError(f"cannot read /{repo_path} in turn {self.name!r}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as handle:
            if not _is_regular(os.fstat(handle.fileno())):
                raise UnsafeWorktreeEntry(f"/{repo_path} is not a regular file; kb refuses special files")
            return handle.read()

    def write_disk(self, repo_path: str, data: bytes) -> None:
        """Write ``data`` at ``repo_path`` (parents created), atomically, never through a symlink."""
        target = self._checked(repo_path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            self._checked(repo_path)  # a parent created concurrently must still be a real folder
            tmp = target.parent / f".kbtmp-{os.getpid()}-{time.monotonic_ns()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, target)
        except OSError as exc:
            raise StorageError(
                f"cannot write /{repo_path} in turn {self.name!r}: {exc.strerror or exc}; "
                "free space or fix permissions, then retry"
            ) from None

    def unlink_disk(self, repo_path: str) -> None:
        """Remove the file at ``repo_path`` if present, and folders it leaves empty."""
        target = self._checked(repo_path)
        try:
            target.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StorageError(
                f"cannot delete /{repo_path} in turn {self.name!r}: {exc.strerror or exc}; fix permissions, then retry"
            ) from None
        parent = target.parent
        while parent != self.path and parent.is_dir():
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def scan_disk(self) -> list[str]:
        """Repo paths of every file on disk under ``documents/``; raises UnsafeWorktreeEntry for a
        symlink or special file anywhere in the worktree (the turn is kept)."""
        found: list[str] = []
        root = self.path / "documents"

        def unreadable(exc: OSError) -> None:
            if isinstance(exc, FileNotFoundError):
                return  # no documents/ folder (nothing written), or one removed while walking
            raise StorageError(
                f"cannot read {exc.filename} in turn {self.name!r}: {exc.strerror or exc}; "
                "fix its permissions or remove it, then commit again, or abort the turn"
            )

        for folder, dirs, files in os.walk(root, onerror=unreadable):
            for name in dirs + files:
                full = os.path.join(folder, name)
                rel = os.path.relpath(full, self.path).replace(os.sep, "/")
                # checked before the entry is touched: a path past the path law may also be past
                # the operating system's limit, where every call on it fails (design §2.3)
                check_path_length(
                    rel,
                    f"/{rel} (on disk in turn {self.name!r}: move it to a shorter path "
                    "or remove it, then commit again, or abort the turn)",
                )
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue  # removed while walking
                except OSError as exc:
                    unreadable(exc)
                if stat.S_ISLNK(st.st_mode):
                    raise UnsafeWorktreeEntry(
                        f"/{rel} in turn {self.name!r} is a symlink; kb refuses symlinks. Remove it "
                        f"from {self.path} and commit again, or abort the turn"
                    )
                if name in files and not _is_regular(st):
                    raise UnsafeWorktreeEntry(f"/{rel} in turn {self.name!r} is not a regular file")
                if name in files and not name.startswith(".kbtmp-"):
                    found.append(rel)
        return found

    # -- full checkout ----------------------------------------------------------------------
    def materialize_all(self) -> int:
        """Check out every base file the turn has not touched and write an index equal to the base
        tree (so ``git status`` shows the turn's changes). Returns the number of files written."""
        repo = self.repository
        tree = repo.tree_id(self.base)
        index = Index(str(self.admin / "index"), read=False)
        written = 0
        files = list(repo.walk(tree))
        for path, blob_id in files:
            if path in self.touched:
                sha = ObjectID(blob_id.encode())
                index[path.encode()] = IndexEntry((0, 0), (0, 0), 0, 0, FILE_MODE, 0, 0, 0, sha)
        checkout = [(path, blob_id) for path, blob_id in files if path not in self.touched]
        # the blobs in one bulk read (kb.git.blob_batch), not one lookup each
        with contextlib.closing(repo.blobs([blob_id for _, blob_id in checkout])) as blobs:
            for (path, blob_id), (_, data) in zip(checkout, blobs):
                target = self._checked(path)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                index[path.encode()] = index_entry_from_stat(os.lstat(target), ObjectID(blob_id.encode()), FILE_MODE)
                written += 1
        index.write()
        self.full = True
        self.save()
        return written

    def newest_mtime(self) -> float:
        """Newest modification time of any file in the worktree and its admin folder."""
        newest = 0.0
        for root in (self.path, self.admin):
            for folder, dirs, files in os.walk(root):
                for name in [*files, *dirs, "."]:
                    try:
                        newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
                    except FileNotFoundError:
                        pass
        return newest


@dataclass(frozen=True)
class JanitorReport:
    """What one janitor pass did: worktree paths removed, and those kept because they are open."""

    removed: list[str]
    kept_open: list[str]
    kept_fresh: int


def sweep_worktrees(repository_for, knowledge_store: Path, ttl: float, now: float | None = None) -> JanitorReport:
    """Remove abandoned turn worktrees (design §5): those whose lock no process holds and whose newest
    file is older than ``ttl`` seconds. ``repository_for(workspace_id)`` returns the Repository (or
    None when the workspace has no repository). Never touches a worktree an open turn holds.
    """
    now = time.time() if now is None else now
    removed, kept_open, kept_fresh = [], [], 0
    base = Path(knowledge_store) / ".worktrees"
    if not base.is_dir():
        return JanitorReport([], [], 0)
    for ws_dir in sorted(base.iterdir()):
        if not ws_dir.name.isdigit():
            continue
        repository = repository_for(int(ws_dir.name))
        for path in sorted(ws_dir.iterdir()):
            if repository is None:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
                continue
            worktree = LazyWorktree(repository, path, path.name)
            if not worktree.admin.is_dir():  # admin folders are made first: this is an orphan
                shutil.rmtree(path, ignore_errors=True)
                removed.append(str(path))
                continue
            try:
                worktree._lock()
            except TurnBusy:
                kept_open.append(str(path))
                continue
            if now - worktree.newest_mtime() >= ttl:
                worktree.destroy()
                removed.append(str(path))
            else:
                worktree.release()
                kept_fresh += 1
    return JanitorReport(removed, kept_open, kept_fresh)
