"""The change set of one store transaction (design §3): ``write``/``remove``/``move`` in call order.

A :class:`Draft` is an overlay on the tree the transaction started from. Every call sees the
result of the calls before it, so:

* move-then-write: ``move(a, b); write(a, x)`` leaves the old document at ``b`` and a new one at
  ``a``; ``move(a, b); write(b, x)`` is the moved document with new bytes;
* write-then-remove of a new file nets to nothing;
* chained moves ``a → b → c`` collapse to one recorded move ``a → c``; ``a → b → a`` to nothing;
* a move onto an existing document raises :class:`~kb.errors.PathExists` unless ``overwrite=True``;
* a document can never be written under a path that is a document (``x.md/y.md`` when ``x.md`` is a
  file) nor over a folder that still holds documents: git trees cannot hold both.

Each path in the overlay remembers its *origin*: the base path whose document it holds (itself,
another path after a move, or None for a document created in this draft). The store turns origins
into recorded moves when it commits (``kb.store``); nothing here touches git beyond reading trees.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from kb.errors import DocumentNotFound, InvalidInput, InvalidPath, PathExists, WrongThread
from kb.paths import StorePath, blob_id, check_new_segment, check_path_length, describe_name, name_key
from kb.store.titles import TitledDocument, check_title, choose_name, folder_and_name

if TYPE_CHECKING:
    # kb.git.merge (and merge3) load when a draft merges, not for a command that only reads (design §13)
    from kb.git.merge import MergeOutcome, MergeRequest
    from kb.git.repository import Repository
    from kb.store.history import Revision


@dataclass(frozen=True)
class BlobRef:
    """A document whose bytes are already a blob in the object store (unchanged or moved)."""

    id: str


def repo_path_of(path: str | StorePath, *, allow_keep: bool = False) -> str:
    """``documents/...`` for a caller path or StorePath; raises InvalidPath (design §2.3)."""
    if isinstance(path, StorePath):
        return path.repo_path
    return StorePath.parse(path, allow_keep=allow_keep).repo_path


def check_removable(path: str | StorePath, workspace_id: int | None = None) -> None:
    """Raise InvalidPath when ``path`` is the /documents root: a removal takes documents and
    folders, never the root itself (design §2.3). ``workspace_id`` names the workspace in the
    ``kb ls`` the message suggests."""
    parts = path.parts if isinstance(path, StorePath) else StorePath.parse(path, allow_root=True, allow_keep=True).parts
    if not parts:
        listing = "" if workspace_id is None else f" (`kb ls /documents --workspace {workspace_id}` lists them)"
        raise InvalidPath(
            path, f"the /documents root cannot be removed, only what it holds: name its folders or documents{listing}"
        )


def document_bytes(data: object, path: str) -> bytes:
    """The bytes of a document given as bytes-like or str (UTF-8). Raises TypeError for other
    types, InvalidInput for a str that is not valid Unicode (a lone surrogate)."""
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput(
                f"the text for {path} holds a lone surrogate (U+{ord(exc.object[exc.start]):04X} at "
                f"offset {exc.start}); pass valid Unicode, or bytes"
            ) from None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"document bytes must be bytes or str, not {type(data).__name__}")
    return bytes(data)


def virtual_of(path: str) -> str:
    """``/documents/...`` for a repo path ``documents/...``."""
    return "/" + path


def _ancestors(repo_path: str) -> list[str]:
    """Folders containing ``repo_path`` below the root, nearest last (``documents/a`` for ``documents/a/b``)."""
    parts = repo_path.split("/")
    return ["/".join(parts[:i]) for i in range(2, len(parts))]


def _owner_only(method):
    """Refuse a Draft method called from another thread than the one that made the draft
    (WrongThread): a draft is one transaction's private change set, and two threads adding to it
    at once would corrupt it silently (design §3, §4; docs/python-api.md "Threads")."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        if threading.get_ident() != self._thread:
            raise WrongThread(
                f"this transaction's draft belongs to the thread that opened it; {method.__name__}() was "
                f"called from another thread ({threading.current_thread().name}). Open a transaction "
                "in each thread (kb.transaction is safe to call from many threads at once)"
            )
        return method(self, *args, **kwargs)

    return checked


class _KeyOverlay(dict):
    """``{name_key: set of names}`` over a read-only base map (``Repository.folder_keys``): only
    keys this draft touched are copied, so a draft in a big folder costs O(its own names)."""

    def __init__(self, base: dict) -> None:
        super().__init__()
        self._base = base

    def _load(self, key: str) -> set[str] | None:
        if not dict.__contains__(self, key) and key in self._base:
            dict.__setitem__(self, key, {name for name, _ in self._base[key]})
        return dict.get(self, key)

    def get(self, key, default=None):
        found = self._load(key)
        return default if found is None else found

    def setdefault(self, key, default=None):
        found = self._load(key)
        if found is None:
            dict.__setitem__(self, key, default)
            return default
        return found


@dataclass
class Draft:
    """The change set of one transaction, applied in call order against the base tree.

    Paths are caller paths (``/documents/...`` or ``documents/...``) or StorePaths, validated by
    the path law (design §2.3, raising InvalidPath). ``revision`` is set when the transaction's
    block exits cleanly (None for a net-empty change).
    """

    _repo: Repository
    _base_tree: bytes | None
    _overlay: dict[str, bytes | BlobRef | None] = field(default_factory=dict)
    _origin: dict[str, str | None] = field(default_factory=dict)
    _dirs: set[str] = field(default_factory=set)
    _sibling_keys: dict[str, _KeyOverlay] = field(default_factory=dict)
    _merge_requests: dict[str, MergeRequest] = field(default_factory=dict)
    _titles: dict[str, TitledDocument] = field(default_factory=dict)
    revision: Revision | None = None
    pending: str | None = None
    """The revision id a commit is about to make HEAD (set by the store just before the ref moves)."""
    idempotency_key: str | None = None
    """The write's idempotency key (design §3, ``kb.store.write_keys``): set by the store's
    transaction, the caller's or a generated one."""
    submitted: bool = False
    """True once the commit may have reached Postgres or git (queued, or the lock asked for)."""
    merges: dict[str, MergeOutcome] = field(default_factory=dict)
    """After commit: ``{virtual path: MergeOutcome}`` for each :meth:`write_merged` path that
    head had changed meanwhile (three-way merged, design §5)."""

    # Artifacts (design §11): how the store treats ARTIFACT documents this draft touches
    # (``kb.store.artifact_rows``: refuse | bump | artifact), and callbacks ``hook(conn, head_tree,
    # revision_id)`` the store runs under the write lock in the revision's transaction once the
    # commit object is built, before the revision is recorded (a hook raising records nothing).
    artifact_access: str = "refuse"
    on_record: list = field(default_factory=list)
    _thread: int = field(default_factory=threading.get_ident, repr=False)
    """The thread that made the draft, the only one its public methods serve (``_owner_only``)."""

    # -- state -------------------------------------------------------------------------
    def _current(self, repo_path: str) -> bytes | BlobRef | None:
        if repo_path in self._overlay:
            return self._overlay[repo_path]
        blob_id = self._repo.lookup(self._base_tree, repo_path)
        return None if blob_id is None else BlobRef(blob_id)

    def origin_of(self, repo_path: str) -> str | None:
        """The base path whose document sits at ``repo_path`` now (None: created in this draft)."""
        if repo_path in self._origin:
            return self._origin[repo_path]
        return None if repo_path in self._overlay else repo_path

    def _files_under(self, folder: str) -> list[str]:
        prefix = folder + "/"
        found = {p for p, _ in self._repo.walk(self._base_tree, folder)}
        found |= {p for p in self._overlay if p.startswith(prefix)}
        return sorted(p for p in found if self._current(p) is not None)

    def _is_folder(self, repo_path: str) -> bool:
        """True when documents exist under ``repo_path`` as of the calls so far."""
        if repo_path not in self._dirs and not self._repo.is_folder(self._base_tree, repo_path):
            return False
        return bool(self._files_under(repo_path))

    def _siblings(self, folder: str) -> _KeyOverlay:
        """``{name_key: names}`` of the entries of ``folder`` at the base plus those this draft
        created (cached per folder; a name may since have been removed, callers check)."""
        keys = self._sibling_keys.get(folder)
        if keys is None:  # the repository's shared key map of the base folder, plus a small overlay
            keys = self._sibling_keys[folder] = _KeyOverlay(self._repo.folder_keys(self._base_tree, folder))
        return keys

    def _exists_now(self, repo_path: str) -> bool:
        return self._current(repo_path) is not None or self._is_folder(repo_path)

    def _check_collision(self, repo_path: str, virtual: str) -> None:
        """Raise PathExists when a segment of ``repo_path`` that does not exist yet differs only
        in case or Unicode normalization from an existing sibling: the tree would not check out on
        macOS/Windows (design §2.2, §14). Re-using the existing spelling is always fine."""
        parts = repo_path.split("/")
        for depth in range(2, len(parts) + 1):
            path, parent, name = "/".join(parts[:depth]), "/".join(parts[: depth - 1]), parts[depth - 1]
            if path in self._dirs or self._current(path) is not None:
                continue
            for other in self._siblings(parent).get(name_key(name), ()):
                if other != name and self._exists_now(f"{parent}/{other}"):
                    raise PathExists(
                        f"cannot place {virtual}: {describe_name(name)} differs only in case or Unicode "
                        f"normalization from the existing {describe_name(other)} in {virtual_of(parent)}, "
                        "so the tree would not check out on macOS or Windows; use the existing name"
                    )

    def _check_placeable(self, repo_path: str, virtual: str) -> None:
        """Raise PathExists when a document cannot live at ``repo_path`` (git tree conflict, or a
        case/normalization-only collision with an existing name)."""
        self._check_collision(repo_path, virtual)
        for folder in _ancestors(repo_path):
            if folder in self._dirs and folder not in self._overlay:
                continue
            if self._current(folder) is not None:
                raise PathExists(
                    f"cannot place {virtual}: {virtual_of(folder)} is a document, not a folder; move or remove it first"
                )
        if self._is_folder(repo_path):
            raise PathExists(
                f"cannot place a document at {virtual}: it is a folder holding documents; to put the "
                f"document in that folder, name it in full ({virtual.rstrip('/')}/NAME.md), or choose another name"
            )

    def _check_new(self, repo_path: str, virtual: str, *, names: bool = True) -> None:
        """Raise InvalidPath when a path this call creates breaks the rules for new paths: longer
        than MAX_PATH_BYTES, or (``names``) a segment that does not exist yet is a Windows device
        name or ends in a dot or space (design §2.2, §2.3). Existing names are never re-judged."""
        check_path_length(repo_path, virtual)
        if not names:
            return
        parts = repo_path.split("/")
        for depth in range(2, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if (
                prefix in self._dirs
                or self._current(prefix) is not None
                or self._repo.is_folder(self._base_tree, prefix)
            ):  # O(1): never list a folder
                continue
            check_new_segment(parts[depth - 1], virtual)

    def _set(self, repo_path: str, value: bytes | BlobRef | None, origin: str | None) -> None:
        self._overlay[repo_path] = value
        self._merge_requests.pop(repo_path, None)
        if value is None:
            self._origin.pop(repo_path, None)
            self._titles.pop(repo_path, None)
            return
        self._origin[repo_path] = origin
        self._dirs.discard(repo_path)
        for folder in _ancestors(repo_path):
            self._dirs.add(folder)
        parts = repo_path.split("/")
        for depth in range(2, len(parts) + 1):
            parent, name = "/".join(parts[: depth - 1]), parts[depth - 1]
            self._siblings(parent).setdefault(name_key(name), set()).add(name)

    # -- reads -------------------------------------------------------------------------
    @_owner_only
    def exists(self, path: str | StorePath) -> bool:
        """True when a document exists at ``path`` as of the calls made so far."""
        return self._current(repo_path_of(path, allow_keep=True)) is not None

    @_owner_only
    def read(self, path: str | StorePath) -> bytes:
        """Bytes at ``path`` as of the calls made so far; raises DocumentNotFound."""
        value = self._current(repo_path_of(path, allow_keep=True))
        if value is None:
            raise DocumentNotFound(f"no document at {path}")
        return value if isinstance(value, bytes) else self._repo.blob(value.id)

    @_owner_only
    def content_id(self, path: str | StorePath) -> str | None:
        """The blob id (``git hash-object``) of the document at ``path`` now, or None if absent."""
        value = self._current(repo_path_of(path, allow_keep=True))
        if value is None:
            return None
        return value.id if isinstance(value, BlobRef) else blob_id(value)

    # -- changes -----------------------------------------------------------------------
    @_owner_only
    def write(self, path: str | StorePath, data: bytes | str, *, allow_keep: bool = False) -> None:
        """Create or replace the document at ``path`` (a str is encoded as UTF-8).

        Raises InvalidPath (path law, design §2.3), PathExists when ``path`` is a folder holding
        documents or lies under a path that is a document.
        """
        repo_path = repo_path_of(path, allow_keep=allow_keep)
        virtual = virtual_of(repo_path)  # what messages show: write_titled passes a repo path
        data = document_bytes(data, virtual)
        if self._current(repo_path) is None:
            self._check_new(repo_path, virtual)
        self._check_placeable(repo_path, virtual)
        origin = self.origin_of(repo_path) if self._current(repo_path) is not None else None
        self._set(repo_path, data, origin)

    @_owner_only
    def write_blob(self, path: str | StorePath, blob: str, *, allow_keep: bool = False) -> None:
        """Like :meth:`write`, for bytes already stored as the blob ``blob`` (40 hex chars, from
        ``Repository.add_blobs``): a writer of many documents (the legacy seed, design §10) streams
        them into the object store and keeps only ids in memory. Raises as :meth:`write`."""
        repo_path = repo_path_of(path, allow_keep=allow_keep)
        self._check_placeable(repo_path, virtual_of(repo_path))
        origin = self.origin_of(repo_path) if self._current(repo_path) is not None else None
        self._set(repo_path, BlobRef(blob), origin)

    @_owner_only
    def write_merged(
        self, path: str | StorePath, data: bytes | str, base_blob: str | None, *, allow_keep: bool = False
    ) -> None:
        """Write ``data`` as the writer's edit of the document whose blob was ``base_blob`` (None:
        the writer created it). When the revision is recorded, a head that changed the document
        since is three-way merged with it (base, head, ``data``; design §5): non-overlapping edits
        both survive, overlapping hunks take ``data``. The outcome lands in :attr:`merges`.
        :meth:`write` instead means "exactly these bytes at HEAD". Raises as :meth:`write`.
        """
        from kb.git.merge import MergeRequest

        self.write(path, data, allow_keep=allow_keep)
        repo_path = repo_path_of(path, allow_keep=allow_keep)
        self._merge_requests[repo_path] = MergeRequest(base_blob, self.origin_of(repo_path) or repo_path)

    @_owner_only
    def expect_unchanged(self, path: str | StorePath, base_blob: str | None, *, allow_keep: bool = False) -> None:
        """Make the draft's write or removal at ``path`` (made before this call) conditional: when
        the revision is recorded, head must still hold ``base_blob`` there (None: no document) or
        already what the draft puts there, else nothing is recorded (PathExists). A later write,
        removal or move of ``path`` in the draft drops the condition. Used by a revert (design §3),
        which must never remove or replace work that lands while it runs."""
        from kb.git.merge import MergeRequest

        repo_path = repo_path_of(path, allow_keep=allow_keep)
        origin = self.origin_of(repo_path) if self._current(repo_path) is not None else None
        self._merge_requests[repo_path] = MergeRequest(base_blob, origin or repo_path, exact=True)

    @_owner_only
    def remove(self, path: str | StorePath, *, missing_ok: bool = False) -> None:
        """Remove the document, or every document of the folder, at ``path``.

        Raises DocumentNotFound when neither exists as of the calls so far, unless ``missing_ok``
        (then nothing happens, as ``rm -f`` / ``Path.unlink(missing_ok=True)``).
        """
        check_removable(path)
        repo_path = repo_path_of(path, allow_keep=True)
        targets = [repo_path] if self._current(repo_path) is not None else self._files_under(repo_path)
        if not targets:
            if missing_ok:
                return
            raise DocumentNotFound(f"cannot remove {path}: no such document or folder")
        for target in targets:
            self._set(target, None, None)

    @_owner_only
    def move(self, src: str | StorePath, dst: str | StorePath, *, overwrite: bool = False) -> None:
        """Move a document (or every document of a folder) from ``src`` to ``dst``; recorded as a
        move, so history follows it and projection keeps the document id (design §3, §6).

        Raises DocumentNotFound when ``src`` does not exist; PathExists when a destination document
        exists and ``overwrite`` is False, when a folder would move onto an existing folder and
        ``overwrite`` is False (with it, the folders merge and colliding documents are replaced),
        when a folder would move into itself, or when the destination conflicts with the tree
        (see :meth:`write`).
        """
        src_path, dst_path = repo_path_of(src, allow_keep=True), repo_path_of(dst, allow_keep=True)
        if src_path == dst_path:
            if not self.exists(src_path) and not self._files_under(src_path):
                raise DocumentNotFound(f"cannot move {src}: no such document or folder")
            return
        if self._current(src_path) is not None:
            pairs = [(src_path, dst_path)]
        else:
            files = self._files_under(src_path)
            if not files:
                raise DocumentNotFound(f"cannot move {src}: no such document or folder")
            if dst_path.startswith(src_path + "/"):
                raise PathExists(f"cannot move folder {src} into itself ({dst})")
            if not overwrite and self._files_under(dst_path):
                # ``dst`` names the folder's new path: an existing folder there is not silently
                # merged into (design §3)
                name = virtual_of(src_path).rsplit("/", 1)[-1]
                taken = (
                    f"cannot move folder {virtual_of(src_path)} to {virtual_of(dst_path)}: a folder exists there; "
                    f"name the new path (e.g. {virtual_of(dst_path)}/{name}) or merge into it"
                )
                raise PathExists(f"{taken} with overwrite=True", cli=f"{taken} with --overwrite")
            pairs = [(f, dst_path + f[len(src_path) :]) for f in files]
        sources = {old for old, _ in pairs}
        self._check_new(dst_path, str(dst), names=self._current(dst_path) is None)
        for _old, new in pairs:
            if new != dst_path and self._current(new) is None:
                self._check_new(new, virtual_of(new), names=False)
        for old, new in pairs:
            if new not in sources and self._current(new) is not None and not overwrite:
                taken = f"cannot move {virtual_of(old)} to {virtual_of(new)}: a document exists there"
                raise PathExists(
                    f"{taken} (pass overwrite=True to replace it)", cli=f"{taken} (pass --overwrite to replace it)"
                )
        moving = [(old, new, self._current(old), self.origin_of(old)) for old, new in pairs]
        titled = {old: self._titles[old] for old, _ in pairs if old in self._titles}
        for old, _, _, _ in moving:
            self._set(old, None, None)
        try:
            for _, new, _, _ in moving:
                self._check_placeable(new, virtual_of(new))
        except PathExists:
            for old, _, value, origin in moving:  # undo: a failed call changes nothing
                self._set(old, value, origin)
            self._titles.update(titled)
            raise
        self._titles.update(titled)
        for _, new, value, origin in moving:
            self._set(new, value, origin)
        for old, new, _, _ in moving:  # a titled document keeps its title where it went
            if old in self._titles:
                self._titles[new] = self._titles.pop(old)
                self._titles[new].path = virtual_of(new)

    # -- documents named by title (design §2.2, §5; kb.titles) ------------------------------
    def names_in(self, folder: str) -> set[str]:
        """Names of the entries of ``folder`` (repo path) that exist as of the calls so far."""
        siblings = self._siblings(folder)
        keys = set(siblings._base) | set(dict.keys(siblings))  # O(folder): every name, loaded or not
        return {n for key in keys for n in siblings.get(key, ()) if self._exists_now(f"{folder}/{n}")}

    @_owner_only
    def write_titled(
        self, path: str | StorePath, data: bytes | str, title: str, document: TitledDocument | None = None
    ) -> TitledDocument:
        """Write ``data`` at ``path`` as the document titled ``title`` (recorded in
        ``documents.title`` by the projection). If ``path`` is a name this draft chose (not the
        base's document there), it is chosen again under the write lock should a racing commit
        have taken it. Returns the TitledDocument (``document`` when given, updated in place).
        Raises as :meth:`write`."""
        repo_path = repo_path_of(path)
        check_title(title)
        self.write(repo_path, data)
        document = document or TitledDocument(title, virtual_of(repo_path))
        document.title, document.path = title, virtual_of(repo_path)
        self._titles[repo_path] = document
        return document

    @_owner_only
    def create(self, folder: str | StorePath, title: str, body: bytes | str = b"") -> TitledDocument:
        """Create a document in ``folder`` (``/documents/...``) named from ``title`` by the path
        law: ``safe_filename(title)``, suffixed `` (2)``, `` (3)`` … when a document or folder of
        that folder (case- and NFC-insensitively) has the name, as of the calls so far (design
        §2.2). The title is kept exactly as typed. Returns a TitledDocument whose ``path`` is final
        once the transaction has committed. Raises InvalidPath (folder outside /documents, or the
        resulting path too long), PathExists (``folder`` is a document), TypeError (title not str).
        """
        folder_path = StorePath.parse(str(folder), allow_root=True).repo_path
        name = choose_name(title, self.names_in(folder_path))
        return self.write_titled(f"{folder_path}/{name}", body, title)

    @_owner_only
    def retitle(self, path: str | StorePath, title: str) -> TitledDocument:
        """Give the document at ``path`` a new title: it moves to the path law's name for
        ``title`` in the same folder (a recorded move, so it keeps its id; a change of case or
        normalization only is a move of the same document) and the title is recorded as typed.
        Returns the TitledDocument (final path after commit). Raises DocumentNotFound, InvalidPath.
        """
        repo_path = repo_path_of(path)
        if self._current(repo_path) is None:
            raise DocumentNotFound(f"cannot retitle {path}: no such document")
        folder, name = folder_and_name(repo_path)
        new_name = choose_name(title, self.names_in(folder) - {name})
        new_path = f"{folder}/{new_name}"
        if new_path != repo_path:
            self.move(repo_path, new_path)
        document = self._titles.get(new_path) or TitledDocument(title, virtual_of(new_path))
        document.title = title
        self._titles[new_path] = document
        return document

    def rename_entry(self, old: str, new: str) -> None:
        """Under the write lock (``kb.store.titles.rename_taken``): the document this draft put at
        ``old`` goes to ``new`` instead (a name a racing commit took)."""
        self._overlay[new] = self._overlay.pop(old)
        if self._repo.lookup(self._base_tree, old) is not None:  # it replaced the base's document
            self._overlay[old] = None
        if old in self._origin:
            self._origin[new] = self._origin.pop(old)
        if old in self._merge_requests:
            self._merge_requests[new] = self._merge_requests.pop(old)
        document = self._titles.pop(old)
        document.path = virtual_of(new)
        self._titles[new] = document

    def titles(self) -> dict[str, str]:
        """``{repo path: title}`` of the documents named by title in this draft."""
        return {path: document.title for path, document in self._titles.items()}

    @property
    def base_tree(self) -> bytes | None:
        """The tree the transaction started from (None: an empty workspace)."""
        return self._base_tree

    def changes(self) -> Mapping[str, bytes | BlobRef | None]:
        """The net change so far, read-only: ``{repo path: new bytes, BlobRef (bytes already a
        blob: unchanged or moved), or None (removed)}`` (what the store stages, design §3)."""
        return MappingProxyType(self._overlay)

    def merge_requests(self) -> Mapping[str, MergeRequest]:
        """Read-only ``{repo path: MergeRequest}`` of the :meth:`write_merged` paths, which the
        store three-way merges with the head under the write lock (design §5)."""
        return MappingProxyType(self._merge_requests)

    @classmethod
    def from_staged(
        cls, repo: Repository, base_tree: bytes | None, staged: dict[str, str | None], moves: dict[str, str | None]
    ) -> Draft:
        """A draft of blobs already in the object store: ``staged`` ``{repo path: blob id or None}``,
        ``moves`` ``{repo path: origin}`` (a group commit records another writer's draft, design §3)."""
        draft = cls(repo, base_tree)
        draft._overlay = {p: None if b is None else BlobRef(b) for p, b in staged.items()}
        draft._origin = dict(moves)
        return draft

    def is_empty(self) -> bool:
        """True when no change has been made (the net change may still be empty)."""
        return not self._overlay

    def moves(self) -> dict[str, str]:
        """``{destination: base path}`` for documents that now live elsewhere than they started."""
        return {
            new: origin
            for new, origin in self._origin.items()
            if origin is not None and origin != new and self._overlay.get(new) is not None
        }
