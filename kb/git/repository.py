"""Git plumbing for one workspace repository (design §2.1), on dulwich.

The porcelain (``kb.store``) speaks in intent verbs; this module owns objects, trees and refs:
opening/initialising the repo with kb's config, reading blobs and trees at a revision, building a
commit from a tree plus a change set without touching the working tree, the compare-and-swap of
the branch ref; refreshing the persistent working tree and index after a commit is
``kb.git.worktree_refresh`` (a mixin of ``Repository``).

All paths handed to dulwich are absolute; the process never changes its working directory.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import hashlib
import io
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import weakref
import zlib
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dulwich.config import ConfigFile
from dulwich.diff_tree import tree_changes
from dulwich.errors import ChecksumMismatch, NotGitRepository, NotTreeError, ObjectFormatException
from dulwich.object_store import PACK_MODE, DiskObjectStore, tree_lookup_path
from dulwich.objects import (
    ZERO_SHA,
    Blob,
    Commit,
    RawObjectID,
    ShaFile,
    Tree,
    _decompress,
    object_header,
    valid_hexsha,
)
from dulwich.pack import DELTA_TYPES, PackFileDisappeared, UnpackedObject, full_unpacked_object, write_pack_data
from dulwich.reflog import format_reflog_line
from dulwich.repo import Repo

from kb.errors import (
    DocumentNotFound,
    KbError,
    MalformedRevision,
    RevisionNotFound,
    StorageError,
    WorkspaceNotFound,
    kb_command,
)
from kb.faults import fault_point
from kb.git import loose_zlib
from kb.git.blob_batch import MissingObject, read_blobs
from kb.git.gitindex import IndexFile
from kb.git.lock_files import create_lock_file
from kb.git.tree_layout import DIR_MODE_PREFIXES, LayoutCache, apply_changes, derive
from kb.git.worktree_refresh import FILE_MODE, WorktreeRefresh
from kb.paths import name_key

BRANCH = b"refs/heads/main"
OBJECT_CACHE_SIZE = 8192
FOLDER_CACHE_SIZE = 64
"""(tree, folder path) pairs whose folder tree ``Repository.lookup`` remembers."""
STALE_LOCK_SECONDS = 30.0
"""Age after which a git lock file found under the workspace write lock is a killed writer's."""
REF_LOCK_WAIT_SECONDS = 1.0
"""How long a ref update waits for git's lock file on the branch ref before it gives up (design
§2.1): git's own commands wait for each other the same way (``core.filesRefLockTimeout``, 100 ms
by default), and ``git gc``'s ``pack-refs`` holds the lock for a moment while it prunes the loose
ref; a git command that holds it longer, or a killed writer's leftover, still fails the write."""
BULK_READ_MIN = 48
"""Blobs from which ``Repository.blobs`` reads through one ``git cat-file --batch`` rather than one
dulwich lookup each (starting git costs about as much as this many lookups)."""
DERIVE_MIN_BYTES = 4096
"""Loose objects from this size (compressed) are looked at as revisions of a cached big tree."""
DERIVE_HEAD_BYTES = 512
"""Bytes inflated to find a loose tree's first entry (a name is at most 255 bytes here)."""
LOOSE_LIMIT = 256
"""Batches smaller than this are written as loose objects, larger ones as one pack."""
LOOSE_COMPRESSION = 1
"""zlib level of loose objects when the repository's config sets neither ``core.looseCompression``
nor ``core.compression``: git's own default (best speed), where dulwich would use zlib's 6."""


@dataclass(frozen=True)
class TreeChange:
    """One path's difference between two trees: kind is 'added' | 'modified' | 'removed'."""

    kind: str
    path: str
    old_id: str | None
    new_id: str | None


def format_identity(who: str) -> bytes:
    """``Name <email>`` bytes for a commit, in the form ``git fsck --strict`` accepts (design §3).

    ``who`` is ``Name <email>`` (the email is what the last ``<…>`` at its end holds) or a bare
    name, which gets an empty email (``Name <>``). As git's own ident code does, the name loses
    ``<``, ``>`` and control characters and its whitespace runs become one space; the email loses
    those and all whitespace. An empty name becomes the email's local part, else ``kb``. So
    ``A <a> <b>`` is ``A a <b>``, never a second ``<…>`` that git reads as the date."""
    name, email = who, ""
    stripped = who.rstrip()
    if stripped.endswith(">") and "<" in stripped:
        name, _, email = stripped[:-1].rpartition("<")
    name = " ".join(_IDENT_CRUD.sub(" ", name).split())
    email = "".join(_IDENT_CRUD.sub("", email).split())
    name = name or " ".join(_IDENT_CRUD.sub(" ", email.partition("@")[0]).split()) or "kb"
    return f"{name} <{email}>".encode()


_IDENT_CRUD = re.compile(r"[<>\x00-\x1f\x7f]")
"""Characters an identity's name or email cannot hold in a commit (git's ident drops them too)."""


PACK_CLOSE_ATTEMPTS = 8
"""Re-scans of the pack folder while a vanished pack cannot be closed yet (another thread reads it)."""


def _retry_reads_across_packing(store) -> None:
    """Make ``store``'s reads survive concurrent packing (``kb.git.maintenance``, ``git repack``):

    - a read that misses the packs, then finds the loose copy already deleted because a pack holding
      it just landed, looks once more (the packs are re-scanned on a miss) — git's own
      ``reprepare_packed_git``;
    - the re-scan drops packs that vanished from disk by closing their mapping, which raises
      BufferError while another thread of this process still holds a view into it (mid-read). The
      pack is out of the cache by then; its mapping closes when the last view goes. The re-scan
      goes on past it, and returns every pack it opened (the caller looks for the object there)."""
    read = store.get_raw
    rescan = store._update_pack_cache

    def get_raw(name):
        try:
            return read(name)
        except KeyError:
            return read(name)

    def update_pack_cache():
        before = set(store._pack_cache)
        for _ in range(PACK_CLOSE_ATTEMPTS):
            try:
                rescan()
                break
            except BufferError:  # a vanished pack another thread still reads: popped, closed later
                continue
        return [pack for name, pack in list(store._pack_cache.items()) if name not in before]

    store.get_raw = get_raw
    store._update_pack_cache = update_pack_cache


_LAYOUT_SEEN, _KEYS_SEEN = "_layout_seen", "_keys_seen"
_READ_ERRORS = (ChecksumMismatch, ObjectFormatException, zlib.error, OSError)
"""What dulwich or the OS raise for an object that exists but cannot be read (corrupt, I/O error)."""


def _changed_names(old: Tree, new: Tree) -> set[bytes]:
    """Names whose entry differs between two versions of a folder (added, removed or changed):
    one set operation over the entry dicts, in C, instead of Python work per entry."""
    return {name for name, _ in old._entries.items() ^ new._entries.items()}


def _patched_keys(base: dict, tree: Tree, names) -> dict:
    """A folder's key map (``Repository.folder_keys``) for ``tree``, from ``base`` (the map of
    another version of the folder) by re-keying only ``names`` (bytes), the entries that differ."""
    keys = dict(base)
    for raw_name in names:
        name = raw_name.decode()
        key = name_key(name)
        entries = [e for e in keys.get(key, ()) if e[0] != name]
        if raw_name in tree:
            entries.append((name, "folder" if stat.S_ISDIR(tree[raw_name][0]) else "file"))
        if entries:
            keys[key] = tuple(entries)
        else:
            keys.pop(key, None)
    return keys


def _loose_compression_as_git(repo: Repo) -> None:
    """Compress loose objects at git's default level unless the config names one (a big folder's
    tree is rewritten as a loose object on every revision that touches it)."""
    config = repo.get_config()
    for key in (b"looseCompression", b"compression"):
        try:
            config.get((b"core",), key)
            return
        except KeyError:
            continue
    repo.object_store.loose_compression_level = LOOSE_COMPRESSION


_open_repositories: weakref.WeakSet[Repository] = weakref.WeakSet()


@atexit.register
def close_open_repositories() -> None:
    """Close every repository still open (at interpreter exit, while imports still work), so a
    script that never closed its KnowledgeBase ends without dulwich's ``__del__`` noise."""
    for repository in list(_open_repositories):
        repository.close()


OBJECT_WRITE_ATTEMPTS = 5
"""Tries to store one loose object while another process may remove its emptied ``objects/xx/``
folder (``git prune-packed``) between the folder's creation and the object's write."""


SMALL_PACK_OBJECTS = 4096
"""Packs below this many objects are the small ones ``Repository.combine_small_packs`` combines."""
PACK_SIDE_FILES = (".keep", ".rev", ".bitmap", ".mtimes", ".promisor")


def _plain_pack(pack) -> bool:
    """Whether ``pack`` has only its ``.pack`` and ``.idx`` (no ``PACK_SIDE_FILES``)."""
    return not any(os.path.exists(pack._basename + suffix) for suffix in PACK_SIDE_FILES)


PENDING_PACK_MARK = b"kb: objects of a write whose revision may not be recorded yet\n"
"""The content of the ``.keep`` file kb puts beside a pack it writes (see keep_pending_pack)."""
PENDING_PACK_SECONDS = 3600.0
"""How long a pending pack stays kept: far longer than any write takes to move its ref."""


def _pending_mark_time(pack) -> float | None:
    """The mtime of ``pack``'s ``.keep`` when it is kb's pending mark (PENDING_PACK_MARK) and the
    pack has no other side file; None otherwise (a plain pack, git's ``.keep``, a ``.bitmap``)."""
    keep = pack._basename + ".keep"
    try:
        with open(keep, "rb") as mark:
            if mark.read(len(PENDING_PACK_MARK) + 1) != PENDING_PACK_MARK:
                return None
            mtime = os.fstat(mark.fileno()).st_mtime
    except OSError:
        return None
    others = (suffix for suffix in PACK_SIDE_FILES if suffix != ".keep")
    return None if any(os.path.exists(pack._basename + suffix) for suffix in others) else mtime


def loose_object_ids(objects_dir: str | os.PathLike) -> list[bytes]:
    """The hex ids of the loose objects under ``objects_dir`` (a repository's ``.git/objects``; as
    dulwich's ``_iter_loose_objects``), past the ``objects/xx/`` folders a concurrent ``git
    prune-packed`` empties and removes meanwhile; empty when ``objects_dir`` does not exist."""
    try:
        folders = os.listdir(objects_dir)
    except FileNotFoundError:
        return []
    ids = []
    for base in folders:
        if len(base) != 2:
            continue
        try:
            names = os.listdir(os.path.join(objects_dir, base))
        except (FileNotFoundError, NotADirectoryError):
            continue
        ids += [sha for sha in (os.fsencode(base + rest) for rest in names) if valid_hexsha(sha)]
    return ids


def _clear_multi_pack_index(pack_dir: Path) -> None:
    """Remove git's multi-pack-index of the packs in ``pack_dir`` (``git multi-pack-index write``,
    ``git maintenance``'s incremental repack) with its ``.bitmap`` and ``.rev``, as ``git repack``
    does before it removes a pack the index names: left naming a removed pack, it fails every
    ``git fsck``. git and dulwich read the packs without one."""
    for path in [
        pack_dir / "multi-pack-index",
        *pack_dir.glob("multi-pack-index-*.bitmap"),
        *pack_dir.glob("multi-pack-index-*.rev"),
    ]:
        path.unlink(missing_ok=True)
    shutil.rmtree(pack_dir / "multi-pack-index.d", ignore_errors=True)  # newer git's incremental chain


def _pack_size(pack) -> int:
    """The objects in ``pack``; 0 for one gone meanwhile (a concurrent ``git repack -a -d``)."""
    try:
        return len(pack)
    except (PackFileDisappeared, FileNotFoundError):
        return 0


def _pack_basename(pack_dir: Path, digests) -> Path:
    """The basename dulwich gives a pack of the objects ``digests`` (binary ids): ``pack-`` and the
    SHA-1 of their sorted ids, known before the pack is written."""
    return pack_dir / ("pack-" + hashlib.sha1(b"".join(sorted(digests))).hexdigest())


def keep_pending_pack(basename: Path) -> bool:
    """Mark the pack ``{basename}.pack`` kept (``{basename}.keep``, as git's receive-pack does)
    until its objects are reachable: a concurrent ``git repack -a -d`` (or ``git gc``) drops
    packed objects no ref reaches yet, which lost every blob of an import whose ref had not moved
    (design §14). Maintenance removes the mark after PENDING_PACK_SECONDS
    (:meth:`Repository.release_pending_packs`). A ``.keep`` already there (git's, or another
    write's of the same objects) is left as it is. Returns whether this call made the mark.
    A mark this call began but could not write in full (a full disk) is removed: left empty or
    half written it is no mark of kb's, which release_pending_packs never removes, but a
    ``.keep`` as git's, kept for ever. Raises OSError."""
    keep = basename.with_name(basename.name + ".keep")
    try:
        mark = keep.open("xb")
    except FileExistsError:
        return False
    try:
        with mark:
            mark.write(PENDING_PACK_MARK)
    except BaseException:
        keep.unlink(missing_ok=True)  # this call's own file (it made it: no one else could)
        raise
    return True


def _mark_pending_since(basename: Path, since: float) -> Path | None:
    """Mark the pack ``{basename}.pack`` pending (:func:`keep_pending_pack`), the mark dated
    ``since`` (its release comes PENDING_PACK_SECONDS after that); a pending mark already there
    (the same objects, packed before) is dated ``since`` if that is later. Returns the mark this
    call made, or None. Raises OSError."""
    mark = basename.with_name(basename.name + ".keep")
    if keep_pending_pack(basename):
        try:
            os.utime(mark, (since, since))
        except BaseException:
            mark.unlink(missing_ok=True)
            raise
        return mark
    with contextlib.suppress(OSError):
        if mark.read_bytes() == PENDING_PACK_MARK and mark.stat().st_mtime < since:
            os.utime(mark, (since, since))
    return None


class Repository(WorktreeRefresh):
    """One workspace's non-bare git repository at ``path`` (created on ``Repository.create``)."""

    def __init__(self, repo: Repo) -> None:
        self._repo = repo
        _open_repositories.add(self)
        self.path = Path(repo.path)
        # Objects are immutable: path lookups and the tree builder share a bounded cache of
        # parsed objects, and trees the builder creates enter it directly, so the next turn's
        # lookups never re-read (and re-parse) a large folder's tree from disk.
        self._objects: collections.OrderedDict[bytes, object] = collections.OrderedDict()
        # Threads share a Repository (design §4): every cache below is read and updated under
        # this lock, held only around the dict operations, never across a disk read.
        self._cache_lock = threading.RLock()
        self._index = IndexFile(self.path / ".git" / "index")
        self._layouts = LayoutCache()  # trees' entry layouts, so a new tree is spliced, not re-serialized
        # {(base tree id, tree id): names that differ} for the trees _derived_tree read
        self._deltas: collections.OrderedDict[tuple[bytes, bytes], frozenset[bytes]] = collections.OrderedDict()
        self._ref_path = os.path.join(self.path, ".git", BRANCH.decode())
        self._compressor: loose_zlib.SegmentedCompressor | None = None  # big trees' loose bytes
        _retry_reads_across_packing(repo.object_store)
        _loose_compression_as_git(repo)

    def _tree_object(self, sha: bytes):
        """The parsed object ``sha`` (LRU-cached, at most OBJECT_CACHE_SIZE entries)."""
        with self._cache_lock:
            cached = self._objects.get(sha)
            if cached is not None:
                self._objects.move_to_end(sha)
                return cached
        obj = self._read_object(sha)
        self._remember(obj)
        return obj

    def _read_object(self, sha: bytes):
        """``object_store[sha]``, parsing a loose object once (dulwich parses it, re-serializes it and
        parses it again: ~10 ms for a 4,612-entry tree) and checking its id as dulwich does.
        Raises KeyError (absent), StorageError (a corrupt or unreadable object, design §14)."""
        store = self._repo.object_store
        try:
            obj = None
            if isinstance(store, DiskObjectStore):
                obj = self._read_loose(store, sha) if len(sha) == 40 else store._get_loose_object(sha)
            if obj is None:  # packed (or packed away meanwhile): dulwich's own path
                return store[sha]
            digest = hashlib.sha1(object_header(obj.type_num, obj.raw_length()))
            for chunk in obj.as_raw_chunks():
                digest.update(chunk)
            if digest.hexdigest().encode() != sha:
                raise ChecksumMismatch(sha, digest.hexdigest().encode())
            return obj
        except KeyError:
            raise
        except _READ_ERRORS as exc:
            raise self._damaged(sha, exc) from None

    def _read_loose(self, store: DiskObjectStore, sha: bytes):
        """The loose object ``sha`` (hex) parsed from one read of its file, as dulwich's
        ``_get_loose_object`` parses it, or a big tree derived from a cached one
        (``_derived_tree``); None when it is not loose. Raises what dulwich raises."""
        try:
            with open(store._get_shafile_path(sha), "rb") as handle:
                compressed = handle.read()
        except FileNotFoundError:
            return None
        tree = self._derived_tree(store, sha, compressed) if self._layouts.has_bases() else None
        if tree is not None:
            return tree
        return ShaFile.from_file(
            io.BytesIO(compressed), sha, object_format=store.object_format, max_size=store.loose_object_size_limit
        )

    def _derived_tree(self, store: DiskObjectStore, sha: bytes, compressed: bytes) -> Tree | None:
        """The loose tree ``sha`` (its file's bytes: ``compressed``) read as a revision of a big
        tree whose layout is cached (one whose first entry it shares: another process's version
        of a big folder this process wrote or read), by parsing only the entries that differ
        (``kb.git.tree_layout.derive``); its layout and changed names are cached too. None when it
        is not such a tree (the caller reads it as dulwich does). The caller checks the text
        against ``sha``. Raises zlib.error."""
        if len(compressed) < DERIVE_MIN_BYTES or not ShaFile._is_legacy_object(compressed):
            return None
        head = zlib.decompressobj().decompress(compressed, DERIVE_HEAD_BYTES)
        header_end = head.find(b"\0")
        if not head.startswith(b"tree ") or header_end < 0:
            return None
        space = head.find(b" ", header_end)
        nul = head.find(b"\0", space) if space >= 0 else -1
        if nul < 0:
            return None
        name = head[space + 1 : nul]
        found = self._layouts.base_for(name + b"/" if head.startswith(DIR_MODE_PREFIXES, header_end + 1) else name)
        limit = store.loose_object_size_limit
        with self._cache_lock:
            base = None if found is None else self._objects.get(found[0])
        if not isinstance(base, Tree):
            return None
        text = None if self._compressor is None else self._compressor.decompress(compressed, limit)
        if text is None or hashlib.sha1(text).hexdigest().encode() != sha:  # not (only) our segments
            text = _decompress(compressed, max_size=limit)
        raw = text[header_end + 1 :]
        if text[5:header_end] != b"%d" % len(raw):
            return None
        derived = derive(base, found[1], raw, sha)
        if derived is None:
            return None
        tree, layout, changed = derived
        self._layouts.put(sha, layout)
        with self._cache_lock:
            self._deltas[(found[0], sha)] = changed
            if len(self._deltas) > FOLDER_CACHE_SIZE:
                self._deltas.popitem(last=False)
        return tree

    def _changed_names(self, old: Tree, new: Tree) -> frozenset[bytes] | set[bytes]:
        """Names whose entry differs between two versions of a folder: known when ``new`` was
        derived from ``old`` (``_derived_tree``), else ``_changed_names`` of their entry dicts."""
        with self._cache_lock:
            known = self._deltas.get((old.id, new.id))
        return known if known is not None else _changed_names(old, new)

    def _referenced(self, sha: bytes):
        """The parsed object ``sha`` that a commit or tree of this repository refers to (a tree
        walk's lookup function): absent, it is damage, not "no such path" — raises StorageError, or
        WorkspaceNotFound when the repository was deleted while it was read (design §14)."""
        try:
            return self._tree_object(sha)
        except KeyError:
            raise self._missing(sha) from None

    def _missing(self, sha: bytes) -> KbError:
        """The error for object ``sha`` absent though referred to (see ``_referenced``)."""
        if not (self.path / ".git").is_dir():
            return WorkspaceNotFound(
                f"the repository at {self.path} was deleted while it was being read; "
                "if the workspace was re-created, retry"
            )
        return StorageError(
            f"object {sha.decode(errors='replace')} is missing from {self.path} though a revision refers to it; "
            "the repository is damaged (`git gc --prune=now` or `git prune` beside a writer removes what a "
            f"write has stored but not yet made reachable): run {kb_command('fsck', self.path)}, then restore the "
            "workspace from a backup or its remote"
        )

    def _damaged(self, sha: bytes, exc: BaseException) -> StorageError:
        """The StorageError for object ``sha`` that cannot be read (``exc``: dulwich's or the OS's)."""
        reason = (str(exc).strip().splitlines() or [""])[0][:160] or type(exc).__name__
        return StorageError(
            f"object {sha.decode(errors='replace')} in {self.path} cannot be read ({type(exc).__name__}: {reason}); "
            f"the repository is damaged or the disk failed: run {kb_command('fsck', self.path)}, then restore "
            "the workspace from a backup or its remote"
        )

    def _remember(self, obj) -> None:
        with self._cache_lock:
            self._objects[obj.id] = obj
            if len(self._objects) > OBJECT_CACHE_SIZE:
                self._objects.popitem(last=False)

    def close(self) -> None:
        """Close dulwich's pack files and object store (idempotent). (design §13) left to the garbage
        collector at interpreter exit they print ``Exception ignored in … __del__`` noise."""
        _open_repositories.discard(self)
        self._objects.clear()
        self._layouts.clear()
        self._deltas.clear()
        self._compressor = None
        self._repo.close()

    def __enter__(self) -> Repository:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @classmethod
    def open(cls, path: Path) -> Repository:
        """Open an existing repository; raises FileNotFoundError if there is none, including a
        ``.git`` folder that is not a complete repository (one being created or deleted by
        another process right now, or left damaged: dulwich's NotGitRepository)."""
        if not (Path(path) / ".git").is_dir():
            raise FileNotFoundError(path)
        try:
            return cls(Repo(str(path)))
        except NotGitRepository:
            raise FileNotFoundError(path) from None

    @classmethod
    def create(cls, path: Path) -> Repository:
        """Initialise a repository with kb's config (design §2.1) or open the existing one.

        The ``.git`` folder is built beside ``path`` under a temporary name and renamed into place
        complete, config included: another process (a worker's sweep, a second creator) sees no
        repository or a whole one, never a ``.git`` without its config, and a creator killed midway
        leaves only the temporary folder, which the next create replaces (fault point
        ``repository_init``, ``kb.faults``). Two creators at once: the second's rename fails and it
        opens the first's."""
        path = Path(path)
        if (path / ".git").is_dir():
            return cls.open(path)
        path.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.init-", dir=path.parent))
        try:
            repo = Repo.init(str(staging))
            try:
                repo.refs.set_symbolic_ref(b"HEAD", BRANCH)
                config = repo.get_config()
                config.set((b"core",), b"autocrlf", b"false")
                config.set((b"core",), b"filemode", b"false")
                config.set((b"core",), b"hooksPath", b"/dev/null")
                config.write_to_path()
            finally:
                repo.close()
            fault_point("repository_init")
            try:
                os.rename(staging / ".git", path / ".git")
            except OSError:
                if not (path / ".git").is_dir():  # not a creator that won the race: a real failure
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return cls.open(path)

    # -- identity (design §3) -------------------------------------------------------------
    def identity(self) -> str | None:
        """The repository's identity (``kb.repositoryid`` in its git config, read afresh: the
        folder may have been replaced since it was opened), or None when it has none yet."""
        try:
            config = ConfigFile.from_path(os.path.join(self._repo.controldir(), "config"))
            value = config.get((b"kb",), b"repositoryid")
        except (KeyError, FileNotFoundError):
            return None
        return value.decode("ascii", errors="replace").strip() or None

    def set_identity(self, identity: str) -> None:
        """Write ``identity`` as the repository's ``kb.repositoryid`` (git config)."""
        path = os.path.join(self._repo.controldir(), "config")
        config = ConfigFile.from_path(path)
        config.set((b"kb",), b"repositoryid", identity.encode("ascii"))
        config.write_to_path(path)

    # -- reads -----------------------------------------------------------------------------
    def head(self) -> str | None:
        """Hex id of the branch head, or None for an unborn repository. Raises StorageError when
        the ref holds anything but a 40-digit hex id (a damaged repository, design §14)."""
        try:  # the loose ref, read directly (dulwich would resolve symrefs and packed refs first)
            with open(self._ref_path, "rb") as f:
                loose = f.read().strip()
        except (FileNotFoundError, NotADirectoryError):
            loose = b""
        if len(loose) != 40:
            try:
                loose = self._repo.refs[BRANCH]
            except (KeyError, NotTreeError):
                return None
        if len(loose) != 40 or loose.strip(b"0123456789abcdef"):
            raise StorageError(
                f"the branch ref {BRANCH.decode()} of {self.path} holds {loose[:60].decode(errors='replace')!r}, "
                "not a revision id; the repository is damaged: `git fsck` in it shows what else is, then "
                "restore the workspace from a backup or its remote"
            )
        return loose.decode()

    def resolve(self, revision: str) -> str:
        """The full id of ``revision``, which may be a unique prefix of at least 4 hex digits (as
        git accepts). Raises RevisionNotFound for an unknown or ambiguous prefix, MalformedRevision
        (a RevisionNotFound and an InvalidInput) for text that is no revision id at all."""
        text = revision.strip().lower() if isinstance(revision, str) else ""
        if len(text) == 40 and not text.strip("0123456789abcdef"):
            return text
        if len(text) < 4 or len(text) > 40 or any(c not in "0123456789abcdef" for c in text):
            raise MalformedRevision(
                f"{revision!r} is not a revision id; use the id {kb_command('log', self.path)} prints "
                "(or 4+ of its first hex digits)"
            )
        found = {sha.decode() for sha in self._repo.object_store.iter_prefix(text.encode())}
        commits = [sha for sha in found if isinstance(self._repo.object_store[sha.encode()], Commit)]
        if len(commits) > 1:
            raise RevisionNotFound(
                f"revision {revision!r} is ambiguous ({len(commits)} revisions start with it); "
                f"use more digits of the id {kb_command('log', self.path)} prints"
            )
        if not commits:
            raise RevisionNotFound(
                f"no revision {revision!r} in this workspace; {kb_command('log', self.path)} lists its revisions"
            )
        return commits[0]

    def commit(self, revision: str) -> Commit:
        """The commit object of ``revision`` (full id or unique prefix); raises RevisionNotFound."""
        revision = self.resolve(revision)
        try:
            obj = self._tree_object(revision.encode())  # parsed objects are cached (immutable)
        except (KeyError, ValueError, AssertionError):
            try:
                damaged = revision == self.head()  # the branch points at it: damage, not an unknown id
            except KbError:
                damaged = False
            if damaged:
                raise self._missing(revision.encode()) from None
            raise RevisionNotFound(f"revision {revision!r} is not in this workspace's history") from None
        if not isinstance(obj, Commit):
            raise RevisionNotFound(f"{revision!r} is not a revision (commit) id")
        return obj

    def tree_id(self, revision: str | None) -> bytes | None:
        """Tree id of a revision (None → None, the empty tree of an unborn repo)."""
        return None if revision is None else self.commit(revision).tree

    def lookup(self, tree_id: bytes | None, path: str) -> str | None:
        """Blob id at ``path`` in ``tree_id``, or None when absent (or a folder). The folder is
        resolved once per (tree, folder) and remembered, so many lookups in one big folder (a
        draft moving it, a turn reading it) cost one dict probe each."""
        if tree_id is None:
            return None
        parent, _, name = path.rpartition("/")
        folder = self._folder_tree(tree_id, parent)
        entry = None if folder is None else folder._entries.get(name.encode())
        return None if entry is None or stat.S_ISDIR(entry[0]) else entry[1].decode()

    def _folder_tree(self, tree_id: bytes, folder: str) -> Tree | None:
        """The tree object of ``folder`` (a repo path, "" for the root) in ``tree_id``, or None when
        it is not a folder there; (tree, folder) pairs are cached (trees are immutable)."""
        cache = self.__dict__.setdefault("_folder_trees", collections.OrderedDict())
        key = (tree_id, folder)
        with self._cache_lock:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
        try:
            mode, sha = (
                tree_lookup_path(self._referenced, tree_id, folder.encode()) if folder else (stat.S_IFDIR, tree_id)
            )
            found = self._referenced(sha) if stat.S_ISDIR(mode) else None
        except (KeyError, NotTreeError):
            found = None
        if found is not None and not isinstance(found, Tree):
            found = None
        with self._cache_lock:
            cache[key] = found
            if len(cache) > FOLDER_CACHE_SIZE:
                cache.popitem(last=False)
        return found

    def lookup_many(self, tree_id: bytes | None, paths: Iterable[str]) -> dict[str, tuple[str, str] | None]:
        """``{path: ("file" | "folder", sha hex) or None when absent}`` for many paths of one tree,
        resolving each parent folder once: O(paths), where one ``lookup`` per path would walk the
        tree from the root each time (a folder rename looks up thousands of paths)."""
        folders: dict[str, Tree | None] = {}
        result: dict[str, tuple[str, str] | None] = {}
        for path in paths:
            parent, _, name = path.rpartition("/")
            if parent not in folders:
                folder = None
                if tree_id is not None:
                    try:
                        mode, sha = (
                            tree_lookup_path(self._referenced, tree_id, parent.encode())
                            if parent
                            else (stat.S_IFDIR, tree_id)
                        )
                        folder = self._referenced(sha) if stat.S_ISDIR(mode) else None
                    except (KeyError, NotTreeError):
                        folder = None
                folders[parent] = folder
            folder = folders[parent]
            key = name.encode()
            if folder is None or key not in folder:
                result[path] = None
            else:
                mode, sha = folder[key]
                result[path] = ("folder" if stat.S_ISDIR(mode) else "file", sha.decode())
        return result

    def is_folder(self, tree_id: bytes | None, path: str) -> bool:
        """True when ``path`` names a folder (subtree) in ``tree_id``."""
        if tree_id is None:
            return False
        try:
            mode, _ = tree_lookup_path(self._referenced, tree_id, path.encode())
        except (KeyError, NotTreeError):
            return False
        return stat.S_ISDIR(mode)

    def list_folder(self, tree_id: bytes | None, folder: str) -> list[tuple[str, str]]:
        """``(name, "file" | "folder")`` of the direct children of ``folder`` (a repo path such as
        ``documents/a``) in ``tree_id``; empty when the folder does not exist."""
        if tree_id is None:
            return []
        try:
            mode, sha = tree_lookup_path(self._referenced, tree_id, folder.encode())
        except (KeyError, NotTreeError):
            return []
        if not stat.S_ISDIR(mode):
            return []
        return list(self._folder_entries(sha))

    def _folder_entries(self, sha: bytes) -> tuple[tuple[str, str], ...]:
        """``(name, kind)`` of one tree's entries, cached per tree id (trees are immutable): the
        draft, the turn and the commit's collision check list the same big folder once."""
        cache = self.__dict__.setdefault("_entries_cache", collections.OrderedDict())
        entries = cache.get(sha)
        if entries is None:
            entries = tuple(
                (entry.path.decode(), "folder" if stat.S_ISDIR(entry.mode) else "file")
                for entry in self._referenced(sha).iteritems()
            )
            with self._cache_lock:
                cache[sha] = entries
                if len(cache) > 64:
                    cache.popitem(last=False)
        return entries

    def blob(self, blob_id: str) -> bytes:
        """The bytes of a blob a tree, a history row or a citation handle refers to; raises
        StorageError when it is missing (damage, design §14: ``_missing``)."""
        try:
            return self._read_object(blob_id.encode()).as_raw_string()
        except KeyError:
            raise self._missing(blob_id.encode()) from None

    def blobs(self, blob_ids: Sequence[str]) -> Generator[tuple[str, bytes], None, None]:
        """``(blob id, bytes)`` for each of ``blob_ids``, in order: a whole-tree scan's reads in bulk
        (``kb.git.blob_batch``: one git process reads packed and loose objects alike), or one lookup
        each for fewer than BULK_READ_MIN. Raises StorageError (a blob a tree refers to is missing,
        or cannot be read), WorkspaceNotFound (the repository was deleted meanwhile),
        ConfigurationError (no git executable)."""
        if len(blob_ids) < BULK_READ_MIN:
            for blob_id in blob_ids:
                yield blob_id, self._referenced(blob_id.encode()).as_raw_string()
            return
        try:
            yield from read_blobs(self.path, blob_ids)
        except MissingObject as exc:
            raise self._missing(str(exc.args[0]).encode()) from None

    def read(self, revision: str | None, path: str) -> bytes:
        """Bytes of ``path`` at ``revision``; raises DocumentNotFound (no document there),
        StorageError (the revision lists it but its blob is missing: damage, design §14)."""
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
                mode, tree_id = tree_lookup_path(self._referenced, tree_id, prefix.rstrip("/").encode())
            except (KeyError, NotTreeError):
                return
            if not stat.S_ISDIR(mode):
                return
            base = prefix.rstrip("/") + "/"
        else:
            base = ""
        yield from self._walk_tree(tree_id, base)

    def _walk_tree(self, tree_id: bytes, base: str) -> Iterator[tuple[str, str]]:
        """Files under one tree in tree order, read through ``_referenced`` (cached; a damaged or
        missing tree raises StorageError)."""
        for entry in self._referenced(tree_id).iteritems():
            path = base + entry.path.decode()
            if stat.S_ISDIR(entry.mode):
                yield from self._walk_tree(entry.sha, path + "/")
            else:
                yield path, entry.sha.decode()

    def diff(self, old_tree: bytes | None, new_tree: bytes | None) -> list[TreeChange]:
        """Path-level changes from one tree to another (no rename detection: moves are recorded)."""
        changes = []
        try:
            found = list(tree_changes(self._repo.object_store, old_tree, new_tree))
        except _READ_ERRORS as exc:
            raise self._damaged((new_tree or old_tree or b"?"), exc) from None
        for change in found:
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
                    changes.append(TreeChange("modified", new.path.decode(), old.sha.decode(), new.sha.decode()))
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
        self._add_objects([blob])
        return blob.id.decode()

    def add_blobs(self, blobs: Iterable[bytes]) -> list[str]:
        """Store many blobs (loose, or one pack for a large batch); returns their ids in order."""
        objects = [Blob.from_string(data) for data in blobs]
        self._add_objects(objects)
        return [obj.id.decode() for obj in objects]

    def _add_objects(self, objects: Sequence) -> None:
        """Store objects: loose when few (a pack per small commit would pile up thousands of
        packs and slow every lookup), one pack for a large batch (an import). Each object once: a
        batch may repeat one (two documents of the same text), and dulwich names a pack by its ids
        repeats included, so the pack would appear under another name than the one marked pending
        beforehand (and hold the repeat twice, which ``git verify-pack`` calls bad)."""
        objects = list({obj.id: obj for obj in objects}.values())
        if len(objects) < LOOSE_LIMIT:
            for obj in objects:
                self._add_loose(obj)
            return
        # Marked kept before it appears, dated now (dulwich names a pack by the SHA-1 of its
        # objects' sorted ids): maintenance, which holds no write lock, never sees it plain, so
        # never folds it into an unmarked pack while no ref reaches its objects (design §14).
        # The temporary pack is this call's own file, removed on any failure (another process's,
        # being written beside it, is never touched).
        try:
            self._write_pack([full_unpacked_object(obj) for obj in objects], pending_since=time.time())
        except BufferError as exc:
            # Interrupted mid-pack (Ctrl-C): report the interrupt, not the BufferError ("cannot
            # close exported pointers exist") of closing a file a mapping still used.
            if isinstance(exc.__context__, KeyboardInterrupt):
                raise exc.__context__ from None
            raise

    def release_pending_packs(self, older_than: float = PENDING_PACK_SECONDS) -> int:
        """Remove kb's ``.keep`` marks older than ``older_than`` seconds (see
        :func:`keep_pending_pack`): by then the write that made the pack has landed (its objects
        are reachable) or died (they are garbage). Returns how many were removed."""
        removed = 0
        now = time.time()
        for keep in Path(self._repo.object_store.pack_dir).glob("pack-*.keep"):
            try:
                if keep.read_bytes() == PENDING_PACK_MARK and now - keep.stat().st_mtime >= older_than:
                    keep.unlink()
                    removed += 1
            except OSError:
                continue  # removed meanwhile, or not ours to read
        return removed

    def _add_loose(self, obj) -> None:
        """Store ``obj`` as a loose object the way git itself does: written to a ``tmp_obj_*`` file
        of this writer's own and linked into place. dulwich's own way (a ``<object>.lock`` file
        renamed into place) showed up in a concurrent ``git fsck`` (``kb fsck`` beside live
        writers) as ``bad sha1 file: …lock``; git skips ``tmp_obj_*``. Two writers storing the
        same object at once never wait for each other (the bytes are the same). A concurrent
        ``git repack -d`` / ``prune-packed`` may remove the emptied ``objects/xx/`` folder between
        its creation and the write (FileNotFoundError): it is made again on the next try, as git
        retries. Raises OSError after OBJECT_WRITE_ATTEMPTS tries."""
        path = self._repo.object_store._get_shafile_path(obj.id)
        try:  # already there: refresh its mtime (as git and dulwich do), so no prune takes it now
            os.utime(path, None)
            return
        except OSError:
            pass  # absent (or another user's): write it below
        for attempt in range(1, OBJECT_WRITE_ATTEMPTS + 1):
            try:
                try:  # not makedirs(exist_ok=True): it raises FileExistsError when the folder it
                    os.mkdir(os.path.dirname(path))  # found vanishes before it checks it is one
                except FileExistsError:
                    pass
                self._add_loose_beside(obj)
                return
            except FileNotFoundError:
                if attempt == OBJECT_WRITE_ATTEMPTS:
                    raise

    def _loose_bytes(self, obj) -> bytes:
        """The loose-object file of ``obj``: a big tree's from segments compressed once and
        remembered (``kb.git.loose_zlib``), anything else as dulwich compresses it."""
        level = self._repo.object_store.loose_compression_level
        if isinstance(obj, Tree) and obj.raw_length() >= loose_zlib.MIN_BYTES:
            compressor = self._compressor
            if compressor is None or compressor.level != level:
                compressor = self._compressor = loose_zlib.shared(level)  # one per process, bounded
            return compressor.compress(obj._header(), obj.as_raw_string())
        return obj.as_legacy_object(compression_level=level)

    def _add_loose_beside(self, obj) -> None:
        """Write ``obj`` to a temporary ``tmp_obj_*`` file in its ``objects/xx/`` folder (which must
        exist) and link it into place; an object already there (another writer's copy) is kept.
        Raises OSError (FileNotFoundError when the folder vanished meanwhile)."""
        store = self._repo.object_store
        path = store._get_shafile_path(obj.id)
        data = self._loose_bytes(obj)
        fd, temporary = tempfile.mkstemp(prefix="tmp_obj_", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                if store.fsync_object_files:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.chmod(temporary, 0o444)
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass  # the other writer's copy landed first: the same bytes
        finally:
            with contextlib.suppress(OSError):
                os.unlink(temporary)

    def build_tree(self, base_tree: bytes | None, changes: Sequence[tuple[str, str | None]]) -> bytes:
        """New tree id = ``base_tree`` with ``(path, blob_id or None to delete)`` applied.

        Only the trees on changed paths are rewritten (cost grows with the change, not the
        workspace). A blob may replace a subtree and vice versa (the store checks beforehand that
        no document ends up under a document); trees left empty are dropped, as git has no empty
        trees. New objects are added in one batch.
        """
        nested: dict = {}
        # deletions first: a folder emptied to make room for a document (or the reverse) then
        # meets the addition, which wins
        for path, sha in sorted(changes, key=lambda change: change[1] is not None):
            *folders, name = path.encode().split(b"/")
            node = nested
            for folder in folders:
                child = node.get(folder)
                if not isinstance(child, dict):
                    child = node[folder] = {}
                node = child
            node[name] = None if sha is None else sha.encode()
        new_objects: list[Tree] = []
        root = self._apply(base_tree, nested, new_objects, "")
        if root is None:
            root = Tree()
            new_objects.append(root)
        self._add_objects(new_objects)
        for tree in new_objects:
            self._remember(tree)
        return root.id

    def _apply(self, tree_id: bytes | None, nested: dict, new_objects: list, path: str) -> Tree | None:
        """Apply ``nested`` ({name: blob sha | None | {sub-changes}}) to the tree at folder ``path``
        ("" for the root); None if empty. Only the changed entries are spliced into the base's
        layout (``kb.git.tree_layout``)."""
        base = None if tree_id is None else self._referenced(tree_id)
        changes: dict[bytes, tuple[int, bytes] | None] = {}
        for name, change in nested.items():
            if isinstance(change, dict):
                existing = base[name] if base is not None and name in base else None
                sub_base = existing[1] if existing and stat.S_ISDIR(existing[0]) else None
                subtree = self._apply(
                    sub_base, change, new_objects, f"{path}/{name.decode(errors='surrogateescape')}".lstrip("/")
                )
                changes[name] = None if subtree is None else (stat.S_IFDIR, subtree.id)
            else:
                changes[name] = None if change is None else (FILE_MODE, change)
        layout = None if base is None else self._layout_of(base, path)
        built = None if base is not None and layout is None else apply_changes(base, layout, changes)
        if built is None:  # a base tree not in git order: let dulwich rebuild (and sort) it whole
            tree = base.copy()
            for name, change in changes.items():
                if change is None:
                    if name in tree:
                        del tree[name]
                else:
                    tree.add(name, *change)
        else:
            tree, layout = built
            if len(tree):
                self._layouts.put(tree.id, layout)
                self._seen(_LAYOUT_SEEN, path, tree.id)
        if not len(tree):
            return None
        new_objects.append(tree)
        self._derive_keys(tree_id, tree, nested, path)
        return tree

    def _seen(self, kind: str, folder: str, sha: bytes | None = None) -> bytes | None:
        """The tree id last laid out / keyed at ``folder`` by this process (``kind``), after
        recording ``sha`` as such when given. Another process's revision of a big folder is then
        derived from it by its changed entries (``_changed_names``) instead of from scratch."""
        seen = self.__dict__.setdefault(kind, collections.OrderedDict())
        with self._cache_lock:
            if sha is not None:
                seen[folder] = sha
                seen.move_to_end(folder)
                if len(seen) > FOLDER_CACHE_SIZE:
                    seen.popitem(last=False)
            return seen.get(folder)

    def _layout_of(self, tree: Tree, folder: str):
        """The layout of ``tree`` (at ``folder``): cached, else derived from the layout of the tree
        last laid out there (a revision another process made), else parsed from its text."""
        layout = self._layouts.peek(tree.id)
        previous = self._seen(_LAYOUT_SEEN, folder) if layout is None else None
        old_layout = self._layouts.peek(previous) if previous is not None else None
        if old_layout is not None:
            old = self._referenced(previous)
            built = apply_changes(old, old_layout, {n: tree._entries.get(n) for n in self._changed_names(old, tree)})
            if built is not None and built[0].id == tree.id:  # the same text: the derivation holds
                layout = built[1]
                self._layouts.put(tree.id, layout)
        if layout is None:
            layout = self._layouts.get(tree)
        if layout is not None:
            self._seen(_LAYOUT_SEEN, folder, tree.id)
        return layout

    # -- collision keys per folder (design §2.2), O(changed entries) per revision ---------------
    def folder_keys(self, tree_id: bytes | None, folder: str) -> dict[str, tuple[tuple[str, str], ...]]:
        """``{name_key: ((name, "file" | "folder"), …)}`` of the children of ``folder`` in
        ``tree_id`` (empty when it is not a folder there). Read-only: do not mutate. Cached per
        folder tree id, and derived for the trees ``build_tree`` makes from their base's entry by
        patching only the changed names, so a big folder is keyed once, not once per write."""
        if tree_id is None:
            return {}
        try:
            mode, sha = tree_lookup_path(self._referenced, tree_id, folder.encode())
        except (KeyError, NotTreeError):
            return {}
        if not stat.S_ISDIR(mode):
            return {}
        cache = self.__dict__.setdefault("_keys_cache", collections.OrderedDict())
        keys = cache.get(sha)
        if keys is None:
            tree = self._referenced(sha)
            previous = self._seen(_KEYS_SEEN, folder)
            base = None if previous is None else cache.get(previous)
            if base is not None:  # another revision of this folder: patch it
                keys = _patched_keys(base, tree, self._changed_names(self._referenced(previous), tree))
            else:
                grouped: dict[str, list[tuple[str, str]]] = {}
                for raw_name, (entry_mode, _) in tree._entries.items():
                    name = raw_name.decode()
                    grouped.setdefault(name_key(name), []).append(
                        (name, "folder" if stat.S_ISDIR(entry_mode) else "file")
                    )
                keys = {k: tuple(v) for k, v in grouped.items()}
            self._cache_keys(sha, keys)
        else:
            with self._cache_lock:
                if sha in cache:
                    cache.move_to_end(sha)
        self._seen(_KEYS_SEEN, folder, sha)
        return keys

    def _cache_keys(self, sha: bytes, keys: dict) -> None:
        cache = self.__dict__.setdefault("_keys_cache", collections.OrderedDict())
        with self._cache_lock:
            cache[sha] = keys
            if len(cache) > 32:
                cache.popitem(last=False)

    def _derive_keys(self, base_id: bytes | None, tree: Tree, nested: dict, folder: str) -> None:
        """Key map of ``tree`` from its base's cached one plus the names ``nested`` changed."""
        cache = self.__dict__.get("_keys_cache")
        base = cache.get(base_id) if cache is not None and base_id is not None else None
        if base is None:
            return
        self._cache_keys(tree.id, _patched_keys(base, tree, nested))
        self._seen(_KEYS_SEEN, folder, tree.id)

    def make_commit(
        self,
        tree_id: bytes,
        parent: str | None,
        message: str,
        author: str,
        committer: str,
        headers: dict[bytes, bytes] | None = None,
    ) -> Commit:
        """Write a commit object (hooks never run; design §2.1) and return it (ref not moved).
        ``headers``: extra commit headers (git keeps them; e.g. the write's idempotency key,
        design §3)."""
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
        for name, value in (headers or {}).items():
            commit._extra.append((name, value))
        self._add_objects([commit])
        return commit

    def advance(self, old: str | None, new: str) -> bool:
        """Compare-and-swap the branch ref from ``old`` to ``new``; False if it moved meanwhile.

        Raises KbError when git's ref lock file stays held for ``REF_LOCK_WAIT_SECONDS`` (a git
        command run by hand, or a killed writer's leftover younger than STALE_LOCK_SECONDS).
        """
        ref = self._ref_path
        lock = ref + ".lock"
        fd, held = self._lock_ref(lock)
        try:
            try:
                moved = self.head() == old
                if moved:
                    os.write(fd, new.encode() + b"\n")
                    os.fsync(fd)  # durable before Postgres commits the revision (design §3)
            finally:
                os.close(fd)  # once: a second close could end another thread's file given its number
            if not moved:
                os.unlink(lock)
                return False
            os.replace(lock, ref)
            fault_point("ref_renamed")
        except BaseException:
            # Only the lock file this call made: once renamed into place, the lock is free, and
            # a git command waiting for it (or a writer of kb's) may hold a lock file of its own
            # there already, which removing would let two ref updates run at once.
            with contextlib.suppress(OSError):
                if os.path.samestat(os.stat(lock), held):
                    os.unlink(lock)
            raise
        self._log_ref(old, new)
        return True

    def _lock_ref(self, lock: str) -> tuple[int, os.stat_result]:
        """Create git's lock file ``lock`` on the branch ref (git's protocol: exclusively, then
        check, write, fsync, rename over the ref) and return its descriptor and its stat (which
        tells it from another process's lock file of that name later). A lock another
        process holds is waited for up to ``REF_LOCK_WAIT_SECONDS`` (``create_lock_file``), as
        git's commands wait for each other.

        Raises KbError (nothing written) when it is still held then."""
        try:
            fd = create_lock_file(lock, REF_LOCK_WAIT_SECONDS)
        except FileExistsError:
            raise KbError(
                f"the branch ref of {self.path} is locked ({BRANCH.decode()}.lock exists, still after "
                f"{REF_LOCK_WAIT_SECONDS:g}s): a git command is running there, or a killed writer left it "
                f"(removed automatically after {STALE_LOCK_SECONDS:g}s, or now by {kb_command('fsck', self.path)}). "
                "Nothing was "
                "recorded; retry."
            ) from None
        return fd, os.fstat(fd)

    def _log_ref(self, old: str | None, new: str) -> None:
        """Append the ref update to the branch's reflog, as git does (no fsync, as git)."""
        log = self.path / ".git" / "logs" / BRANCH.decode()
        line = format_reflog_line(
            old.encode() if old else ZERO_SHA, new.encode(), b"kb <>", int(time.time()), 0, b"kb: commit"
        )
        try:
            with open(log, "ab") as f:
                f.write(line + b"\n")
        except FileNotFoundError:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as f:
                f.write(line + b"\n")

    def clear_stale_locks(self, min_age: float = STALE_LOCK_SECONDS) -> list[str]:
        """Remove git lock files (``index.lock``, ``refs/heads/main.lock`` …) older than ``min_age``
        seconds: leftovers of a killed writer.

        Call only while holding the workspace write lock and, for ``index.lock``, once owed
        working-tree refreshes are settled (``refreshes_settled``: a refresh runs after its commit
        released the write lock), so no kb writer owns one; the age guard
        spares a lock a person's own git command (``git status``) holds for a moment. ``kb fsck``
        passes 0. Returns the removed paths relative to the repository.
        """
        git_dir = self.path / ".git"
        removed = []
        now = time.time()
        ref_locks = [
            Path(top) / name for top, _, names in os.walk(git_dir / "refs") for name in names if name.endswith(".lock")
        ]
        for lock in [git_dir / n for n in ("index.lock", "HEAD.lock", "packed-refs.lock")] + sorted(ref_locks):
            try:
                if now - lock.stat().st_mtime < min_age:
                    continue
                lock.unlink()
            except FileNotFoundError:
                continue
            removed.append(str(lock.relative_to(self.path)))
        return removed

    def invalid_reflog_entries(self) -> list[str]:
        """Reflog lines (``.git/logs/…``) that do not parse or name a missing commit, as messages
        like git fsck's. Call under the write lock: writers append to the reflogs."""
        problems = []
        logs = self.path / ".git" / "logs"
        store = self._repo.object_store
        for log_file in sorted(p for p in logs.rglob("*") if p.is_file()) if logs.is_dir() else []:
            name = log_file.relative_to(logs).as_posix()
            for number, line in enumerate(log_file.read_bytes().splitlines(), start=1):
                fields = line.split(b" ", 2)
                shas = fields[:2] if len(fields) == 3 else []
                if len(shas) != 2 or any(len(sha) != 40 for sha in shas):
                    problems.append(f"error: {name}: reflog line {number} does not parse")
                    continue
                for sha in shas:
                    if sha != b"0" * 40 and sha not in store and not self._readable(sha):
                        problems.append(f"error: {name}: invalid reflog entry {sha.decode(errors='replace')}")
        return problems

    def _readable(self, sha: bytes) -> bool:
        """True when object ``sha`` can be read (re-checking the packs, for a concurrent packing)."""
        try:
            self._repo.object_store.get_raw(sha)
        except KeyError:
            return False
        return True

    def remove_temporary_packs(self, min_age: float) -> list[str]:
        """Delete temporary packs a killed import left (``objects/tmp_pack_*``, and ``.pack`` files
        without their ``.idx``) whose last write is older than ``min_age`` seconds, so a pack being
        written right now is spared. Returns the removed paths relative to the repository."""
        store = self._repo.object_store
        objects = Path(store.path)
        candidates = list(objects.glob("tmp_pack_*")) + [
            p for p in (objects / "pack").glob("*.pack") if not p.with_suffix(".idx").exists()
        ]
        store.prune(grace_period=int(min_age))
        now = time.time()
        for path in candidates:  # dulwich's own tmp*.pack (mkstemp in objects/pack) is not pruned
            with contextlib.suppress(OSError):
                if path.exists() and now - path.stat().st_mtime > min_age:
                    path.unlink()
        return sorted(str(p.relative_to(self.path)) for p in candidates if not p.exists())

    def pack_loose_objects(self, max_packs: int | None = 32, small_packs: int | None = None) -> tuple[int, int]:
        """Maintenance (design §14): put the loose objects into one pack (cost O(loose objects))
        and, once more than ``max_packs`` packs pile up, consolidate kb's packs into one
        (:meth:`consolidate_packs`, cost O(their objects)); otherwise, once more than
        ``small_packs`` of kb's packs hold fewer than SMALL_PACK_OBJECTS objects, combine just those
        (:meth:`combine_small_packs`; ``None``: never). The new pack is kept pending
        (:func:`keep_pending_pack`): a loose object may belong to a write whose ref has not moved
        yet, which ``git repack -a -d`` leaves alone while it is loose but drops from a plain pack.
        Safe beside concurrent writers and readers: objects are only added to a pack before their
        loose copy or old pack is removed, and readers re-scan the packs on a miss. Returns
        ``(objects packed, packs after)``. Raises OSError."""
        store = self._repo.object_store
        loose = [obj for obj in map(store._get_loose_object, loose_object_ids(store.path)) if obj is not None]
        self._write_pack([full_unpacked_object(obj) for obj in loose], pending_since=time.time())
        for obj in loose:  # packed: the loose copies may go (as dulwich's pack_loose_objects)
            with contextlib.suppress(FileNotFoundError):  # a concurrent git prune-packed took it first
                store.delete_loose_object(obj.id)
        packed = len(loose)
        if max_packs is not None and len(store.packs) > max_packs:
            packed += self.consolidate_packs()
        elif small_packs is not None:
            self.combine_small_packs(small_packs)
        return packed, len(store.packs)

    def _write_pack(self, records: list[UnpackedObject], pending_since: float | None = None):
        """Write ``records`` (whole objects, no deltas) as one new pack and its index; returns the
        Pack (None for no records). dulwich's ``add_objects`` writes the pack, then reads it all back
        to index it; the offsets and checksums ``write_pack_data`` returns are that index: half the
        cost of the backstop's packing (design §14). The pack is complete (renamed into place, its
        ``.idx`` written) before the caller removes the loose copies or old packs. ``pending_since``
        (a time): the pack is marked pending (:func:`keep_pending_pack`) before it appears, the
        mark dated then, so its release comes PENDING_PACK_SECONDS after that. Raises OSError."""
        if not records:
            return None
        store = self._repo.object_store
        marked: Path | None = None
        if pending_since is not None:
            expected = _pack_basename(Path(store.pack_dir), {record.sha() for record in records})
            marked = _mark_pending_since(expected, pending_since)
        try:
            pack = self._pack_file(records)
        except BaseException:
            # The mark is the pack's, not this call's: another write of the same objects (an
            # import run twice at once) found it there, made none, and may have put its pack in
            # place meanwhile, its revision not recorded yet. It stays while such a pack is there
            # (released PENDING_PACK_SECONDS on, as any).
            if marked is not None and not os.path.exists(f"{expected}.idx"):
                marked.unlink(missing_ok=True)
            raise
        if pending_since is not None and Path(pack._basename) != expected:  # named otherwise (never so far)
            _mark_pending_since(Path(pack._basename), pending_since)
            if marked is not None:
                marked.unlink(missing_ok=True)
        return pack

    def _pack_file(self, records: list[UnpackedObject]):
        """Write ``records`` to a temporary pack, then let dulwich index it and move it into place
        (``_complete_pack``, which first compares it with every pack it lists, reading their
        indexes); returns the Pack. The temporary file is removed on any failure, also once moved
        into place when its index could not be written (dulwich moves the pack first, as git
        does: a full disk left a pack without index). Raises OSError, PackFileDisappeared."""
        store = self._repo.object_store
        fd, path = tempfile.mkstemp(dir=store.pack_dir, prefix="tmp_pack_", suffix=".pack")
        handle = os.fdopen(fd, "w+b")
        own = os.fstat(fd)
        placed: str | None = None
        try:
            os.chmod(path, PACK_MODE)
            entries, _ = write_pack_data(
                handle.write,
                iter(records),
                store.object_format,
                num_records=len(records),
                compression_level=store.pack_compression_level,
            )
            index: list[tuple[RawObjectID, int, int | None]] = [
                (RawObjectID(k), at, crc) for k, (at, crc) in entries.items()
            ]
            placed = str(_pack_basename(Path(store.pack_dir), entries)) + ".pack"  # where it goes
            # dulwich's _complete_pack looks among the packs it has cached for one of the same name:
            # forget those gone meanwhile (a concurrent ``git repack``), which it cannot name
            # (PackFileDisappeared) or would return in place of the new pack
            for attempt in range(1, PACK_CLOSE_ATTEMPTS + 1):
                store._update_pack_cache()
                try:
                    pack = store._complete_pack(handle, path, index, set())
                    break
                except PackFileDisappeared:  # one went between the re-scan and the look: again
                    if attempt == PACK_CLOSE_ATTEMPTS:  # (the new pack is not in place yet)
                        raise
                    handle = open(path, "r+b")  # closed by _complete_pack
            return pack
        except BaseException:
            handle.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            if placed is not None:  # moved into place, its index never written: this call's file still
                with contextlib.suppress(OSError):
                    if not os.path.exists(placed[: -len(".pack")] + ".idx") and os.path.samestat(os.stat(placed), own):
                        os.unlink(placed)
            raise

    def _own_packs(self) -> list[tuple[Any, float | None]]:
        """kb's packs as ``(pack, pending mark's mtime or None)``: the plain ones and those kept by
        kb's pending mark alone; packs with git's ``.keep`` or any other side file are left out."""
        store = self._repo.object_store
        store._update_pack_cache()
        own: list[tuple[Any, float | None]] = []
        for pack in store.packs:
            if _plain_pack(pack):
                own.append((pack, None))
            elif (since := _pending_mark_time(pack)) is not None:
                own.append((pack, since))
        return own

    def combine_small_packs(self, more_than: int) -> int:
        """When more than ``more_than`` of kb's packs (:meth:`_own_packs`) hold fewer than
        SMALL_PACK_OBJECTS objects each, write their objects into one new pack, then remove them
        (cost O(their objects), not O(all objects) as a full consolidation). Packs with git's
        ``.keep``, ``.rev``, ``.bitmap``, ``.mtimes`` or ``.promisor`` are left as they are.
        Returns the objects combined (0: none). Raises OSError."""
        small = [(pack, since) for pack, since in self._own_packs() if _pack_size(pack) < SMALL_PACK_OBJECTS]
        if len(small) <= more_than:
            return 0
        return self._combine_packs(small)

    def consolidate_packs(self) -> int:
        """Write the objects of every pack of kb's (:meth:`_own_packs`) into one new pack, then
        remove them (cost O(their objects)). Packs with a side file other than kb's pending mark
        are left as they are (a ``.keep`` of git's, a ``.bitmap``). Returns the objects combined
        (0: fewer than two such packs). Raises OSError."""
        own = self._own_packs()
        return self._combine_packs(own) if len(own) > 1 else 0

    def _combine_packs(self, packs: list[tuple[Any, float | None]]) -> int:
        """Write the objects of ``packs`` (``(pack, pending mark's mtime or None)``) into one new
        pack, then remove them; the objects combined. Where any of them is pending (a write's pack,
        whose objects no ref may reach yet), the new pack is kept pending from the newest of their
        marks' times (:meth:`_write_pack`): dulwich's ``repack`` folded such a pack into an
        unmarked one, where ``git repack -a -d`` and ``git gc`` could drop its objects.
        A pack gone before it is read (a plain one a concurrent ``git repack -a -d`` replaced) is
        left out; one gone before its removal is skipped there."""
        store = self._repo.object_store
        objects: dict[bytes, UnpackedObject] = {}
        read: list[tuple[Any, float | None]] = []
        for pack, since in packs:
            try:
                entries = list(pack.data.iter_unpacked())
                if any(entry.pack_type_num in DELTA_TYPES for entry in entries):  # not kb's: resolve deltas
                    entries = [full_unpacked_object(obj) for obj in pack.iterobjects()]
            except (PackFileDisappeared, FileNotFoundError):
                continue  # its objects are in git's new pack (or were garbage, dropped)
            read.append((pack, since))
            for entry in entries:  # the objects' bytes as stored, not parsed into objects and back
                objects[entry.sha()] = UnpackedObject(
                    entry.obj_type_num, decomp_chunks=entry.decomp_chunks, sha=entry.sha()
                )
        marks = [since for _, since in read if since is not None]
        combined = self._write_pack(list(objects.values()), pending_since=max(marks) if marks else None)
        if combined is None:
            return 0
        if any(pack._basename != combined._basename for pack, _ in read):
            _clear_multi_pack_index(Path(store.pack_dir))
        for pack, since in read:  # the new pack is complete (its .idx written): the old ones may go
            if pack._basename != combined._basename:  # not the name(): an index git removed cannot give it
                with contextlib.suppress(FileNotFoundError):  # git's repack removed it meanwhile
                    store._remove_pack(pack)
                if since is not None:  # its pending mark with it, once the pack is gone
                    Path(pack._basename + ".keep").unlink(missing_ok=True)
        return len(objects)
