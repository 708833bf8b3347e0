"""Git plumbing for one workspace repository (SPEC §2.1), on dulwich.

The porcelain (``kb.store``) speaks in intent verbs; this module owns objects, trees and refs:
opening/initialising the repo with kb's config, reading blobs and trees at a revision, building a
commit from a tree plus a change set without touching the working tree, the compare-and-swap of
the branch ref, and refreshing the persistent working tree and index after a commit.

All paths handed to dulwich are absolute; the process never changes its working directory.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from dulwich.diff_tree import tree_changes
from dulwich.file import GitFile
from dulwich.index import index_entry_from_stat
from dulwich.object_store import tree_lookup_path
from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo

from kb.errors import DocumentNotFound, RevisionNotFound
from kb.index_file import patch_index

BRANCH = b"refs/heads/main"
FILE_MODE = 0o100644


@dataclass(frozen=True)
class TreeChange:
    """One path's difference between two trees: kind is 'added' | 'modified' | 'removed'."""

    kind: str
    path: str
    old_id: str | None
    new_id: str | None


def format_identity(who: str) -> bytes:
    """``Name <email>`` bytes for a commit; a bare name gets an empty email (``Name <>``)."""
    who = " ".join(who.replace("\n", " ").split()) or "kb"
    if who.endswith(">") and "<" in who:
        return who.encode()
    return f"{who.replace('<', '').replace('>', '')} <>".encode()


class Repository:
    """One workspace's non-bare git repository at ``path`` (created on ``Repository.create``)."""

    def __init__(self, repo: Repo) -> None:
        self._repo = repo
        self.path = Path(repo.path)
        self._trees: dict[bytes, Tree] = {}
        self._entries: dict[bytes, dict[bytes, tuple[int, bytes]]] = {}

    _TREE_CACHE = 512

    def _object(self, sha: bytes):
        """An object by id; trees (immutable by id) are kept parsed in a small cache, since a
        path lookup in a folder of thousands of documents otherwise re-parses its tree (issue 6)."""
        tree = self._trees.get(sha)
        if tree is not None:
            return tree
        obj = self._repo.object_store[sha]
        if isinstance(obj, Tree):
            if len(self._trees) >= self._TREE_CACHE:
                self._trees.pop(next(iter(self._trees)))
            self._trees[sha] = obj
        return obj

    @classmethod
    def open(cls, path: Path) -> "Repository":
        """Open an existing repository; raises FileNotFoundError if there is none."""
        if not (Path(path) / ".git").is_dir():
            raise FileNotFoundError(path)
        return cls(Repo(str(path)))

    @classmethod
    def create(cls, path: Path) -> "Repository":
        """Initialise a repository with kb's config (SPEC §2.1) or open the existing one."""
        path = Path(path)
        if (path / ".git").is_dir():
            return cls.open(path)
        path.mkdir(parents=True, exist_ok=True)
        repo = Repo.init(str(path))
        repo.refs.set_symbolic_ref(b"HEAD", BRANCH)
        config = repo.get_config()
        config.set((b"core",), b"autocrlf", b"false")
        config.set((b"core",), b"filemode", b"false")
        config.set((b"core",), b"hooksPath", b"/dev/null")
        config.write_to_path()
        return cls(repo)

    # -- reads -----------------------------------------------------------------------------
    def head(self) -> str | None:
        """Hex id of the branch head, or None for an unborn repository."""
        try:
            return self._repo.refs[BRANCH].decode()
        except KeyError:
            return None

    def commit(self, revision: str) -> Commit:
        """The commit object of ``revision``; raises RevisionNotFound."""
        try:
            obj = self._repo.object_store[revision.encode()]
        except (KeyError, ValueError, AssertionError):
            raise RevisionNotFound(f"revision {revision!r} is not in this workspace's history") from None
        if not isinstance(obj, Commit):
            raise RevisionNotFound(f"{revision!r} is not a revision (commit) id")
        return obj

    def tree_id(self, revision: str | None) -> bytes | None:
        """Tree id of a revision (None → None, the empty tree of an unborn repo)."""
        return None if revision is None else self.commit(revision).tree

    def _entry(self, tree_id: bytes | None, path: str) -> tuple[int, bytes] | None:
        """``(mode, hex id)`` at ``path`` in ``tree_id``; None when absent or below a file."""
        if tree_id is None:
            return None
        mode, sha = stat.S_IFDIR, tree_id
        for part in path.encode().split(b"/"):
            if not part:
                continue
            if not stat.S_ISDIR(mode):
                return None
            found = self._tree_entries(sha).get(part)
            if found is None:
                return None
            mode, sha = found
        return mode, sha

    def lookup(self, tree_id: bytes | None, path: str) -> str | None:
        """Blob id at ``path`` in ``tree_id``, or None when absent (or a folder, or below a file)."""
        entry = self._entry(tree_id, path)
        return None if entry is None or stat.S_ISDIR(entry[0]) else entry[1].decode()

    def is_folder(self, tree_id: bytes | None, path: str) -> bool:
        """True when ``path`` names a folder (subtree) in ``tree_id``."""
        entry = self._entry(tree_id, path)
        return entry is not None and stat.S_ISDIR(entry[0])

    def blob(self, blob_id: str) -> bytes:
        """The bytes of a blob; raises DocumentNotFound for an unknown id."""
        try:
            return self._repo.object_store[blob_id.encode()].as_raw_string()
        except KeyError:
            raise DocumentNotFound(f"blob {blob_id} is missing from the object store") from None

    def read(self, revision: str | None, path: str) -> bytes:
        """Bytes of ``path`` at ``revision``; raises DocumentNotFound."""
        blob_id = self.lookup(self.tree_id(revision), path)
        if blob_id is None:
            raise DocumentNotFound(f"no document at {path!r} in revision {revision or '(empty)'}")
        return self.blob(blob_id)

    def walk(self, tree_id: bytes | None, prefix: str = "") -> Iterator[tuple[str, str]]:
        """``(path, blob_id)`` for every file in ``tree_id`` (under ``prefix``), in tree order."""
        if tree_id is None:
            return
        if prefix:
            try:
                mode, tree_id = tree_lookup_path(
                    self._object, tree_id, prefix.rstrip("/").encode()
                )
            except KeyError:
                return
            if not stat.S_ISDIR(mode):
                return
            base = prefix.rstrip("/") + "/"
        else:
            base = ""
        for entry in self._repo.object_store.iter_tree_contents(tree_id):
            yield base + entry.path.decode(), entry.sha.decode()

    def diff(self, old_tree: bytes | None, new_tree: bytes | None) -> list[TreeChange]:
        """Path-level changes from one tree to another (no rename detection: moves are recorded)."""
        changes = []
        for change in tree_changes(self._repo.object_store, old_tree, new_tree):
            old, new = change.old, change.new
            if change.type == "add":
                changes.append(TreeChange("added", new.path.decode(), None, new.sha.decode()))
            elif change.type == "delete":
                changes.append(TreeChange("removed", old.path.decode(), old.sha.decode(), None))
            else:
                if old.path != new.path:  # defensive; tree_changes without rename detection
                    changes.append(TreeChange("removed", old.path.decode(), old.sha.decode(), None))
                    changes.append(TreeChange("added", new.path.decode(), None, new.sha.decode()))
                else:
                    changes.append(
                        TreeChange("modified", new.path.decode(), old.sha.decode(), new.sha.decode())
                    )
        return changes

    def parents(self, revision: str) -> list[str]:
        """Parent revision ids of a revision."""
        return [p.decode() for p in self.commit(revision).parents]

    def ancestry(self, head: str | None, stop: str | None = None) -> list[str]:
        """First-parent revisions from ``head`` back to (excluding) ``stop``, oldest first."""
        chain = []
        current = head
        while current is not None and current != stop:
            chain.append(current)
            parents = self.parents(current)
            current = parents[0] if parents else None
        chain.reverse()
        return chain

    # -- writes ----------------------------------------------------------------------------
    def add_blob(self, data: bytes) -> str:
        """Store ``data`` as a blob; returns its id (equals ``git hash-object``)."""
        blob = Blob.from_string(data)
        self._repo.object_store.add_object(blob)
        return blob.id.decode()

    def add_blobs(self, blobs: Iterable[bytes]) -> list[str]:
        """Store many blobs in one pack-free batch; returns their ids in order."""
        objects = [Blob.from_string(data) for data in blobs]
        self._repo.object_store.add_objects([(obj, None) for obj in objects])
        return [obj.id.decode() for obj in objects]

    def build_tree(self, base_tree: bytes | None, changes: Sequence[tuple[str, str | None]]) -> bytes:
        """New tree id = ``base_tree`` with ``(path, blob_id or None to delete)`` applied.

        Only the folders on the changed paths are rebuilt; unchanged subtrees are shared, parsed
        trees come from the cache, and no new tree is re-read after writing (issue 6).
        """
        split = [(path.encode().split(b"/"), None if sha is None else sha.encode()) for path, sha in changes]
        return self._apply_tree(base_tree, split, root=True)

    def _tree_entries(self, tree_id: bytes) -> dict[bytes, tuple[int, bytes]]:
        """``{name: (mode, hex sha)}`` of a tree, cached by id (trees are immutable)."""
        entries = self._entries.get(tree_id)
        if entries is None:
            entries = {e.path: (e.mode, e.sha) for e in self._object(tree_id).iteritems()}
            if len(self._entries) >= self._TREE_CACHE:
                self._entries.pop(next(iter(self._entries)))
            self._entries[tree_id] = entries
        return entries

    def _apply_tree(self, tree_id: bytes | None, changes: list, root: bool = False) -> bytes | None:
        entries = dict(self._tree_entries(tree_id)) if tree_id is not None else {}
        nested: dict[bytes, list] = {}
        for parts, sha in changes:
            if len(parts) > 1:
                nested.setdefault(parts[0], []).append((parts[1:], sha))
            elif sha is None:
                entries.pop(parts[0], None)
            else:
                entries[parts[0]] = (FILE_MODE, sha)
        for name, subchanges in nested.items():
            mode, sha = entries.get(name, (0, None))
            new_id = self._apply_tree(sha if stat.S_ISDIR(mode) else None, subchanges)
            if new_id is None:
                entries.pop(name, None)
            else:
                entries[name] = (stat.S_IFDIR, new_id)
        if not root and not entries:
            return None
        return self._write_tree(entries)

    def _write_tree(self, entries: dict[bytes, tuple[int, bytes]]) -> bytes:
        """Serialize a tree in git's order and store it as a loose object (one zlib call, no
        re-parse); returns its hex id."""
        names = sorted(entries, key=lambda n: n + b"/" if stat.S_ISDIR(entries[n][0]) else n)
        body = b"".join(
            b"%o %s\0%s" % (entries[n][0], n, bytes.fromhex(entries[n][1].decode())) for n in names
        )
        raw = b"tree %d\0" % len(body) + body
        tree_id = hashlib.sha1(raw).hexdigest().encode()
        store = self._repo.object_store
        if not store.contains_loose(tree_id) and not store.contains_packed(tree_id):
            folder = os.path.join(store.path, tree_id[:2].decode())
            os.makedirs(folder, exist_ok=True)
            target = os.path.join(folder, tree_id[2:].decode())
            with GitFile(target, "wb", mask=0o444, fsync=store.fsync_object_files) as out:
                out.write(zlib.compress(raw, store.loose_compression_level))
        if len(self._entries) >= self._TREE_CACHE:
            self._entries.pop(next(iter(self._entries)))
        self._entries[tree_id] = entries
        return tree_id

    def make_commit(
        self, tree_id: bytes, parent: str | None, message: str, author: str, committer: str
    ) -> Commit:
        """Write a commit object (hooks never run; SPEC §2.1) and return it (ref not moved)."""
        commit = Commit()
        commit.tree = tree_id
        commit.parents = [parent.encode()] if parent else []
        commit.author = format_identity(author)
        commit.committer = format_identity(committer)
        now = int(time.time())
        commit.author_time = commit.commit_time = now
        commit.author_timezone = commit.commit_timezone = 0
        commit.encoding = b"UTF-8"
        commit.message = (message.rstrip("\n") + "\n").encode()
        self._repo.object_store.add_object(commit)
        return commit

    def advance(self, old: str | None, new: str) -> bool:
        """Compare-and-swap the branch ref from ``old`` to ``new``; False if it moved meanwhile."""
        return self._repo.refs.set_if_equals(
            BRANCH, old.encode() if old else None, new.encode(), message=b"kb: commit"
        )

    def refresh_worktree(self, changes: Iterable[tuple[str, str | None]]) -> None:
        """Make the working tree and index equal HEAD for the changed paths (SPEC §2.1)."""
        root = self.path
        entries: list[tuple[str, str | None, os.stat_result | None]] = []
        for path, blob_id in changes:
            target = root / path
            if blob_id is None:
                try:
                    target.unlink()
                except FileNotFoundError:
                    pass
                entries.append((path, None, None))
                parent = target.parent
                while parent != root and parent.is_dir() and not any(parent.iterdir()):
                    parent.rmdir()
                    parent = parent.parent
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(f".{target.name}.kbtmp")
                if len(tmp.name.encode()) > 255:
                    tmp = target.parent / f".kbtmp-{os.getpid()}"
                tmp.write_bytes(self.blob(blob_id))
                os.replace(tmp, target)
                entries.append((path, blob_id, os.lstat(target)))
        # Patch only the changed entries (issue 6: dulwich's Index re-encodes every entry, O(workspace)).
        if patch_index(self._repo.index_path(), entries, FILE_MODE):
            return
        index = self._repo.open_index()
        for path, blob_id, st in entries:
            if blob_id is None:
                if path.encode() in index:
                    del index[path.encode()]
            else:
                index[path.encode()] = index_entry_from_stat(st, blob_id.encode(), FILE_MODE)
        index.write()

    def reset_worktree(self) -> None:
        """Rebuild the whole working tree and index from HEAD (``kb fsck`` repair)."""
        head = self.head()
        tree = self.tree_id(head)
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
