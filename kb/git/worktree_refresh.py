"""Refreshing the persistent working tree and index of a workspace repository (design §2.1).

(Turns' private worktrees are ``kb.git.worktree``; this is the repository's own checkout.)

After a commit the working tree and git index are brought to HEAD for the changed paths only,
outside the workspace write lock and serialized by an flock of their own (design §14): files are
written under a temporary name and renamed into place, a folder whose every file moves is renamed
with one ``rename(2)``, folders left empty are removed once each. ``Repository`` inherits these
methods; they use its object reads (``lookup_many``, ``blob``) and its index file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from dulwich.index import index_entry_from_stat

from kb.errors import ConfigurationError
from kb.git.gitindex import IndexFile, UnsupportedIndex, order_problem
from kb.git.process_locks import path_lock
from kb.paths import blob_id

log = logging.getLogger(__name__)

FILE_MODE = 0o100644
"""Git's mode of a regular, non-executable file (the only kind kb writes)."""
WORKTREE_LOCK = "kb-worktree.lock"
"""The flock serializing working-tree refreshes (``WorktreeRefresh.worktree_lock``)."""
REFRESH_LOCK = "kb-refresh.lock"
"""The flock writers hold shared while a refresh is owed (``WorktreeRefresh.refresh_pending``)."""
OWED_FOLDER = "kb-refresh-owed"
"""Under ``.git``: one file per owed refresh, flocked by its writer (``WorktreeRefresh.lost_refreshes``)."""
SET_ASIDE_FOLDER = "kb-set-aside"
"""Under ``.git``: copies of working-tree files a repair would have overwritten or removed whose
content no revision holds (hand edits), one folder per repair (``WorktreeRefresh.set_aside_unrecorded``)."""
_NEW_MARKER = ".new-"
"""Prefix of a marker not yet flocked and renamed into place (never judged; removed when old)."""
_NEW_MARKER_AGE = 60.0
"""Seconds after which a ``.new-`` marker is a killed writer's, removed by ``lost_refreshes``."""


class PendingRefresh:
    """A writer's hold while its working-tree refresh is owed: a shared flock on
    ``.git/kb-refresh.lock`` (what ``kb fsck`` waits for) and its own marker file under
    ``.git/kb-refresh-owed/``, flocked, which outlives a killed writer (``lost_refreshes``)."""

    def __init__(self, fd: int, marker_fd: int, marker: str) -> None:
        self._fd: int | None = fd
        self._marker_fd: int | None = marker_fd
        self._marker = marker

    def release(self) -> None:
        """Drop the hold (idempotent): the marker is removed before its flock ends, so a marker
        whose flock can be taken is always a writer's that died owing its refresh."""
        if self._marker_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._marker)
            os.close(self._marker_fd)
            self._marker_fd = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class WorktreeRefresh:
    """Working-tree and index refresh for ``kb.git.repository.Repository`` (a mixin: it reads the
    repository's ``path``, ``_index``, objects and HEAD through the Repository's own methods)."""

    @contextlib.contextmanager
    def worktree_lock(self) -> Iterator[None]:
        """Hold ``.git/kb-worktree.lock`` (an flock, released when the holder dies) for the block:
        working-tree refreshes run outside the workspace write lock (design §14), so they serialize
        here, as do ``kb fsck``'s check and repair of the working tree.

        Re-entrant per *thread*: the depth lives in a ``threading.local``, and the threads of this
        process first take the process-wide lock of the lock file (``kb.git.process_locks``), so a
        thread never mistakes another thread's hold for its own (design §4; two threads in the
        index at once duplicated its entries, and a depth shared between threads let a thread
        wait on an flock it held itself)."""
        state = self.__dict__.get("_worktree_thread") or self.__dict__.setdefault("_worktree_thread", threading.local())
        if getattr(state, "depth", 0):
            state.depth += 1
            try:
                yield
            finally:
                state.depth -= 1
            return
        lock_file = self.path / ".git" / WORKTREE_LOCK
        with path_lock(lock_file):
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                state.depth = 1
                try:
                    yield
                finally:
                    state.depth = 0
            finally:
                os.close(fd)

    def refresh_pending(self) -> PendingRefresh:
        """Mark a working-tree refresh as owed (a shared flock on ``.git/kb-refresh.lock``): taken
        by a writer *under the write lock, before the branch moves*, released once it has
        refreshed the working tree for that revision (``PendingRefresh.release``). ``kb fsck``
        waits for every owed refresh (``refreshes_settled``) before it compares the working tree
        with HEAD, so a commit whose refresh is still on its way is never reported as damage.
        A killed writer's hold ends with it (its refresh is then real damage, which fsck repairs).
        A killed writer's hold ends with it, but its marker file stays: ``lost_refreshes`` finds
        it and ``kb fsck`` or the periodic sweep repairs the working tree.
        Raises OSError when the lock or marker file cannot be made."""
        fd = os.open(self.path / ".git" / REFRESH_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            folder = self.path / ".git" / OWED_FOLDER
            folder.mkdir(exist_ok=True)
            name = f"{os.getpid()}-{threading.get_ident()}-{os.urandom(6).hex()}"
            # flocked under a name nobody judges, then renamed into place: a checker never sees a
            # marker its writer has not locked yet
            new = os.path.join(folder, _NEW_MARKER + name)
            marker_fd = os.open(new, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except BaseException:
            os.close(fd)
            raise
        try:
            fcntl.flock(marker_fd, fcntl.LOCK_EX)
            marker = os.path.join(folder, name)
            os.rename(new, marker)
        except BaseException:
            os.close(marker_fd)
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(new)
            raise
        return PendingRefresh(fd, marker_fd, marker)

    def lost_refreshes(self) -> list[str]:
        """The marker files of refreshes owed by writers that died before refreshing (killed
        between moving the branch and refreshing the working tree): their flock is free. Empty
        when none (one listing of a folder that is empty but in that moment). ``.new-`` markers
        older than a minute (a writer killed while making one) are removed. Never raises for a
        marker that vanishes meanwhile."""
        folder = self.path / ".git" / OWED_FOLDER
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        lost = []
        for name in names:
            path = os.path.join(folder, name)
            if name.startswith(_NEW_MARKER):
                with contextlib.suppress(OSError):
                    if time.time() - os.lstat(path).st_mtime > _NEW_MARKER_AGE:
                        os.unlink(path)
                continue
            try:
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # its writer refreshed and removed it meanwhile
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its writer is alive, refreshing
            finally:
                os.close(fd)
            lost.append(path)
        return sorted(lost)

    def set_aside_unrecorded(self, paths: Iterable[str]) -> tuple[str | None, list[str]]:
        """Before a repair brings ``paths`` (repo paths) to HEAD: copy each working-tree file among
        them whose content is no object of the repository (a hand edit, a file added by hand:
        content no revision holds, which the repair would destroy) to
        ``.git/kb-set-aside/<UTC time>/<path>``. A file whose blob the repository has (kb's own
        content, from a refresh that was lost) is left to the repair: git keeps it. Nothing is
        deleted (design §2.1, §14). Call under ``worktree_lock``. Returns ``(the folder of the
        copies, the repo paths copied)``, ``(None, [])`` when none was; raises OSError when a copy
        cannot be written (the caller then repairs nothing)."""
        root = str(self.path)
        kept: list[str] = []
        folder = None
        for path in paths:
            source = os.path.join(root, path)
            try:
                if not stat.S_ISREG(os.lstat(source).st_mode):
                    continue
                with open(source, "rb") as handle:
                    data = handle.read()
            except OSError:
                continue  # gone, or unreadable: nothing the repair could take from it
            if blob_id(data).encode() in self._repo.object_store:
                continue
            if folder is None:
                stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
                folder = os.path.join(root, ".git", SET_ASIDE_FOLDER, f"{stamp}-{os.getpid()}")
            target = os.path.join(folder, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as copy:
                copy.write(data)
            kept.append(path)
        return folder, kept

    def repair_lost_refreshes(self, stale_paths: Callable[[], list[str]]) -> list[str] | None:
        """When ``lost_refreshes`` finds any: holding ``worktree_lock``, bring every path
        ``stale_paths()`` lists (where the working tree or index differs from HEAD: ``git
        status``) to HEAD — refreshes follow HEAD, so this commutes with live writers' — then
        remove those markers. Returns the repo paths repaired, or None when no refresh was lost.
        Raises OSError when the index cannot be written (the markers stay for the next try)."""
        lost = self.lost_refreshes()
        if not lost:
            return None
        with self.worktree_lock():
            head_tree = self.tree_id(self.head())
            paths = stale_paths()
            folder, kept = self.set_aside_unrecorded(paths)  # a hand edit among them is copied first
            if kept:
                log.warning(
                    "repairing a lost working-tree refresh of %s: %d changed files no revision holds were "
                    "copied to %s first",
                    self.path,
                    len(kept),
                    folder,
                )
            refused = set(self.refresh_worktree([(p, self.lookup(head_tree, p)) for p in paths]))
            for marker in lost:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(marker)
        return [p for p in paths if p not in refused]

    @contextlib.contextmanager
    def refreshes_settled(self) -> Iterator[None]:
        """Under the workspace write lock (so no new refresh becomes owed): wait until every owed
        refresh is done (``refresh_pending``), then hold ``worktree_lock`` for the block: the
        working tree and index then show HEAD unless something damaged them."""
        fd = os.open(self.path / ".git" / REFRESH_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with self.worktree_lock():
                yield
        finally:
            os.close(fd)

    def index_problem(self) -> str | None:
        """What is wrong with ``.git/index``: duplicate or unordered entries (``order_problem``; git
        itself checks the order only in ``git fsck``), or what git's own read refuses (a bad
        checksum, a truncated file: its message from ``git ls-files --stage``); None when sound.
        A ``.git/index`` that is no regular file (a folder, say) is a problem too ("not a file").
        Call under ``worktree_lock``. Raises ConfigurationError when no git CLI is installed,
        OSError when the index cannot be read."""
        index = self.path / ".git" / "index"
        if index.is_symlink() or (index.exists() and not index.is_file()):
            kind = "a folder" if index.is_dir() and not index.is_symlink() else "a symlink or special file"
            return f".git/index is not a file but {kind}"
        problem = order_problem(index)
        if problem is not None:
            return problem
        if not (self.path / ".git" / "index").exists():
            return None
        executable = shutil.which("git")
        if executable is None:
            raise ConfigurationError("checking the git index needs the `git` executable on PATH; install git")
        checked = subprocess.run(
            [executable, "--no-optional-locks", "-C", str(self.path), "ls-files", "--stage", "-z"],
            capture_output=True,
            timeout=3600,
            env={"LC_ALL": "C", "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"},
        )
        if checked.returncode == 0:
            return None
        return (checked.stderr.decode(errors="replace").strip().splitlines() or ["git cannot read the index"])[0]

    def rebuild_index(self) -> None:
        """Replace ``.git/index`` with one built from HEAD and the files on disk (``kb fsck``'s
        repair of an index git cannot read, or of one that is not a file), holding
        ``worktree_lock``. Raises OSError."""
        with self.worktree_lock():
            index = self.path / ".git" / "index"
            if index.is_dir() and not index.is_symlink():
                shutil.rmtree(index)
            else:
                index.unlink(missing_ok=True)
            self.reset_worktree()

    def refresh_to_head(
        self,
        staged: Mapping[str, str | None],
        data: Mapping[str, bytes] | None = None,
        moves: Mapping[str, str] | None = None,
    ) -> list[str]:
        """After a commit, outside the write lock: make the working tree and index equal the
        *current* HEAD for the paths of ``staged`` (``{repo path: blob id the commit wrote, or
        None}``). Holding ``worktree_lock`` and reading HEAD under it makes refreshes of racing
        commits commute: whichever runs last writes what HEAD holds, never an older version.
        ``data``: bytes at hand for some paths, used only where they are the very blob HEAD holds
        there (checked by hashing them: a group-commit holder refreshes its followers' paths too,
        and where a later draft of its group rewrote a path the holder's own bytes are not HEAD's);
        ``moves`` as for :meth:`refresh_worktree`. Returns the paths the file system refused.
        Raises OSError when the index cannot be written."""
        with self.worktree_lock():
            found = self.lookup_many(self.tree_id(self.head()), staged)
            changes = [(p, f[1] if f is not None and f[0] == "file" else None) for p, f in found.items()]
            at_hand = {}
            if data:
                for path, blob in changes:
                    if blob is not None and path in data and blob_id(data[path]) == blob:
                        at_hand[path] = data[path]
            return self.refresh_worktree(changes, at_hand, moves=moves)

    def refresh_worktree(
        self,
        changes: Iterable[tuple[str, str | None]],
        data: Mapping[str, bytes] | None = None,
        moves: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Make the working tree and index equal HEAD for the changed paths (design §2.1), holding
        ``worktree_lock``.

        ``changes``: ``(repo path, blob id or None to delete)``; ``data``: bytes already at hand
        for some of those paths (saves re-reading blobs). Files are written to a temporary name
        and renamed into place; folders left empty are removed, each one once (O(changed paths),
        never O(changed × folder size)). ``moves`` (``{new path: old path}``, the change's recorded
        moves) lets a moved document's file be renamed on disk instead of rewritten from its blob,
        when the index shows the old file holds exactly that blob. Call under the write lock.

        Returns the repo paths the file system refused (a path too long for it, say): those keep
        their old index entry, so ``git status`` and ``kb fsck`` show them; the rest is refreshed.
        Raises OSError only when the index itself cannot be written.
        """
        with self.worktree_lock():
            return self._refresh_worktree(changes, data, moves)

    def _refresh_worktree(self, changes, data, moves) -> list[str]:
        changes = sorted(changes, key=lambda change: change[1] is not None)  # deletions first
        try:
            self._index.load()
            index = self._index
        except UnsupportedIndex:
            index = None
        fallback = self._repo.open_index() if index is None else None
        # Plain strings and os calls: per file this is a rename or a write, one lstat and one index
        # update (pathlib's per-call parsing cost more than the system calls at 4,612 files).
        root = str(self.path)
        join, lstat, replace = os.path.join, os.lstat, os.replace
        failed: list[str] = []
        emptied: set[str] = set()
        writes = []
        deleted = {path for path, blob_id in changes if blob_id is None}
        renames: dict[str, str] = {}  # new path -> old path whose file is renamed into place
        kept: set[str] = set()  # the old paths of those renames (a set: O(1) per moved file)
        if index is not None and moves:
            for path, blob_id in changes:
                old = moves.get(path)
                if blob_id is not None and old in deleted and old not in kept:
                    try:
                        st = lstat(join(root, old))
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode) and index.describes(old.encode(), st, blob_id):
                        renames[path] = old
                        kept.add(old)
        in_moved_folders = self._move_folders(index, renames) if renames else set()
        for path, blob_id in changes:
            if blob_id is not None:
                writes.append((path, blob_id))
                continue
            target = join(root, path)
            try:
                if path not in kept:
                    os.unlink(target)
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                pass
            except OSError as exc:
                if exc.errno != errno.ENAMETOOLONG:  # too long to exist on disk: nothing to delete
                    failed.append(path)
                    continue
            if index is not None:
                index.update(path.encode(), None, None)
            elif path.encode() in fallback:
                del fallback[path.encode()]
            emptied.add(os.path.dirname(target))
        made: set[str] = set()
        for path, blob_id in writes:
            if path in in_moved_folders:
                continue
            target = join(root, path)
            try:
                parent = os.path.dirname(target)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                if path in renames:
                    source = join(root, renames[path])
                else:
                    name = os.path.basename(target)
                    source = join(parent, f".{name}.kbtmp" if len(name.encode()) <= 248 else f".kbtmp-{os.getpid()}")
                    with open(source, "wb") as handle:
                        handle.write(data[path] if data is not None and path in data else self.blob(blob_id))
                try:
                    replace(source, target)
                except IsADirectoryError:  # a folder became a document: its files are deleted above
                    shutil.rmtree(target)
                    replace(source, target)
                st = lstat(target)
            except OSError:
                failed.append(path)
                continue
            if index is not None:
                index.update(path.encode(), st, blob_id)
            else:
                fallback[path.encode()] = index_entry_from_stat(st, blob_id.encode(), FILE_MODE)
        for folder in sorted(emptied, key=lambda f: f.count(os.sep), reverse=True):
            while folder != root and folder.startswith(root + os.sep):
                try:
                    os.rmdir(folder)
                except FileNotFoundError:  # renamed away whole: its parent may be empty now
                    pass
                except OSError:  # not empty (or too long): its ancestors are not empty either
                    break
                folder = os.path.dirname(folder)
        if index is not None:
            index.write()
        else:
            fallback.write()
        return failed

    def _move_folders(self, index: IndexFile, renames: dict[str, str]) -> set[str]:
        """Rename on disk, in one call each, the folders whose every file (and subfolder, the same
        way) moves under the same name to a folder that does not exist yet — a folder rename:
        O(1) file-system work instead of one rename per file. The files keep their inodes, so
        their index entries only change path. ``renames``: ``{new path: old path}`` of files the
        index shows unchanged on disk (a path whose entry cannot move is dropped from it).
        Returns the new paths done this way; the others are renamed one by one."""
        groups: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for new, old in renames.items():
            old_folder, _, old_name = old.rpartition("/")
            new_folder, _, new_name = new.rpartition("/")
            if old_name == new_name and old_folder and new_folder:
                groups.setdefault((old_folder, new_folder), []).append((new, old))
        root = str(self.path)
        whole: dict[tuple[str, str], bool] = {}

        def movable(pair: tuple[str, str]) -> bool:  # the folder holds only what moves with it
            if pair not in whole:
                old_folder, new_folder = pair
                names = {old.rpartition("/")[2] for _, old in groups[pair]}
                try:
                    entries = list(os.scandir(os.path.join(root, old_folder)))
                    whole[pair] = (
                        not os.path.lexists(os.path.join(root, new_folder))
                        and all(
                            entry.name in names
                            if not entry.is_dir(follow_symlinks=False)
                            else (f"{old_folder}/{entry.name}", f"{new_folder}/{entry.name}") in groups
                            and movable((f"{old_folder}/{entry.name}", f"{new_folder}/{entry.name}"))
                            for entry in entries
                        )
                        and len(entries) >= len(names)
                    )
                except OSError:
                    whole[pair] = False
            return whole[pair]

        done: set[str] = set()
        for pair in sorted(groups, key=lambda p: p[0].count("/")):  # outermost first
            old_folder, new_folder = pair
            parent = (old_folder.rpartition("/")[0], new_folder.rpartition("/")[0])
            if parent in groups and movable(parent) or not movable(pair):
                continue  # moved with its parent, or file by file
            try:
                os.makedirs(os.path.join(root, new_folder.rpartition("/")[0]), exist_ok=True)
                os.rename(os.path.join(root, old_folder), os.path.join(root, new_folder))
            except OSError:  # the files are then renamed one by one
                whole[pair] = False
                continue
            moved = [
                moved
                for sub_pair, files in groups.items()
                for moved in files
                if sub_pair == pair or sub_pair[0].startswith(old_folder + "/") and whole.get(sub_pair)
            ]
            entries = index.move_many([(old.encode(), new.encode()) for new, old in moved])
            for new, _ in moved:
                if new.encode() in entries:
                    done.add(new)
                else:  # no usable entry: the file (already in place) is rewritten from its blob
                    del renames[new]
        return done

    def reset_worktree(self) -> None:
        """Rebuild the whole working tree and index from HEAD (``kb fsck`` repair), holding
        ``worktree_lock`` (HEAD is read under it, as ``refresh_to_head`` does)."""
        with self.worktree_lock():
            tree = self.tree_id(self.head())
            wanted = dict(self.walk(tree))
            index = self._repo.open_index()
            present = {p.decode() for p in index}
            for root, dirs, files in os.walk(self.path):
                dirs[:] = [d for d in dirs if not (root == str(self.path) and d == ".git")]
                for name in files:
                    rel = os.path.relpath(os.path.join(root, name), self.path)
                    present.add(rel)
            changes = [(p, None) for p in present if p not in wanted]
            changes += list(wanted.items())
            self.refresh_worktree(changes)
