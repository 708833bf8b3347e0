"""The path law: safe names, collision keys, validated caller paths and identities.

* design §2.2 — :func:`safe_filename`, :func:`safe_folder_segment` turn arbitrary titles into names
  that check out on Linux, macOS and Windows; :func:`name_key`, :func:`unique_name` and
  :class:`NameRegistry` resolve collisions case- and NFC-insensitively (``x.md`` → ``x (2).md``).
* design §2.3 — :class:`StorePath` validates every caller path (under ``/documents``, no empty, ``.``,
  ``..`` or ``.git`` segments, no ``.keep``, no control characters) and raises
  :class:`~kb.errors.InvalidPath`. It validates, it never rewrites: an existing document is
  addressed by its exact (byte-exact, not re-normalized) name.
* design §2.4 — :func:`unique_identifier_hash` and :func:`blob_id` (the ``git hash-object`` id).

Pure Python, standard library only.
"""

from __future__ import annotations

import functools
import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kb.errors import InvalidPath, InvalidWorkspace

__all__ = [
    "MAX_PATH_BYTES",
    "MAX_SEGMENT_BYTES",
    "check_new_segment",
    "check_storage_root",
    "describe_name",
    "ROOT",
    "NameRegistry",
    "StorePath",
    "author_path",
    "blob_id",
    "name_key",
    "safe_filename",
    "safe_folder_segment",
    "suffixed_from",
    "unique_identifier_hash",
    "unique_name",
]

MAX_SEGMENT_BYTES = 255
MAX_PATH_BYTES = 1024
"""Longest caller path below ``/documents`` (UTF-8 bytes of ``a/b.md`` in ``/documents/a/b.md``)."""
ROOT = "documents"
_EXT = ".md"
_FORBIDDEN = frozenset('\\/:*?"<>|')
_BACKSLASH = "backslash is not a separator and not allowed in names; use '/'"
_SPACES = re.compile(" {2,}")
_SURROGATES = re.compile("[\ud800-\udfff]")
BIDI_CONTROLS = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))
"""Bidirectional embeddings, overrides and isolates (U+202A–202E, U+2066–2069): a name holding one
shows on screen other than its characters run (``report\u202egnp.exe`` reads ``reportexe.png``),
in a terminal, a review page or a diff, so no new name may hold one (design §2.1, §2.3). The marks
``\u200e``/``\u200f`` and the zero-width (non-)joiners stay: right-to-left text and Persian need them."""
_SEPARATORS = "\x1c\x1d\x1e\x1f"  # str.isspace() says yes, Unicode White_Space says no: removed
# Windows device names (design §2.2), plus the superscript-digit ports and console devices Windows
# also reserves. Compared on the ASCII-uppercased stem before the first dot, sans trailing spaces.
_DEVICES = frozenset(
    ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"]
    + [f"{p}{d}" for p in ("COM", "LPT") for d in "123456789\u00b9\u00b2\u00b3"]
)


def _clean(text: str) -> str:
    """NFC; whitespace (tab, newline, NEL, NBSP…) → space; other control chars and BIDI_CONTROLS dropped; forbidden
    chars → ``_``; NFC again (a dropped control char may have split a base from its combining
    mark); collapse spaces; strip; strip trailing dots/spaces; leading ``.`` → ``_.``."""
    out = []
    text = _SURROGATES.sub("\ufffd", text)  # undecodable bytes of an OS file name (surrogateescape)
    for ch in unicodedata.normalize("NFC", text):
        if ch.isspace() and ch not in _SEPARATORS:
            out.append(" ")
        elif ch in _FORBIDDEN:
            out.append("_")
        elif unicodedata.category(ch) != "Cc" and ch not in BIDI_CONTROLS:
            out.append(ch)
    cleaned = _SPACES.sub(" ", unicodedata.normalize("NFC", "".join(out))).strip(" ").rstrip(". ")
    return "_" + cleaned if cleaned.startswith(".") else cleaned


def _undevice(name: str) -> str:
    """Append ``_`` to the stem (text before the first dot) if it is a Windows device name."""
    stem, dot, rest = name.partition(".")
    if "".join(c.upper() if c.isascii() else c for c in stem.rstrip(" ")) in _DEVICES:
        return f"{stem}_{dot}{rest}"
    return name


def _cut(text: str, max_bytes: int) -> str:
    """Longest prefix of ``text`` within ``max_bytes`` UTF-8 bytes, minus trailing dots/spaces."""
    raw = text.encode("utf-8")
    if len(raw) > max_bytes:
        text = raw[:max_bytes].decode("utf-8", errors="ignore")  # drops a split trailing character
    return text.rstrip(". ")


def _split_ext(name: str) -> tuple[str, str]:
    """``(stem, ".md")`` if ``name`` ends in ``.md`` (any case, kept as is), else ``(name, "")``."""
    if len(name) > len(_EXT) and name[-len(_EXT) :].lower() == _EXT:
        return name[: -len(_EXT)], name[-len(_EXT) :]
    return name, ""


def safe_filename(title: str) -> str:
    """Map any title to a document file name (design §2.2). Deterministic and idempotent.

    ``title`` (str) → a non-empty NFC name ending in ``.md``, ≤ 255 UTF-8 bytes. Control chars are
    removed (whitespace ones become spaces), ``\\ / : * ? " < > |`` become ``_``, space runs become
    one space; no leading/trailing space, no trailing dot, no leading ``.`` (``.git`` →
    ``_.git.md``).

    * ``.md`` is appended unless the cleaned name already ends in ``.md``, compared
      case-insensitively and kept as written (``Report.MD`` stays ``Report.MD``;
      ``Node.js`` → ``Node.js.md``).
    * Windows device names are judged, as Windows does, on the stem before the *first* dot, so
      ``CON`` → ``CON_.md``, ``con.txt`` → ``con_.txt.md``, ``COM1.md`` → ``COM1_.md``.
    * Empty result (``""``, whitespace, only control chars, ``..``) → ``untitled.md``.
    * Too long → the stem is cut on a character boundary so the whole name fits 255 bytes.

    Raises ``TypeError`` if ``title`` is not a str.
    """
    if not isinstance(title, str):
        raise TypeError(f"title must be str, not {type(title).__name__}")
    stem, ext = _split_ext(_clean(title) or "untitled")
    name = _undevice(stem + (ext or _EXT))
    stem, ext = _split_ext(name)
    return _cut(stem, MAX_SEGMENT_BYTES - len(ext)) + ext


def names_something(title: str) -> bool:
    """Whether ``title`` keeps any character in a file name (``safe_filename``): False for one of
    only whitespace, control characters or dots (``".."``), which the path law names
    ``untitled.md`` (design §2.2). Raises ``TypeError`` if ``title`` is not a str."""
    if not isinstance(title, str):
        raise TypeError(f"title must be str, not {type(title).__name__}")
    return bool(_clean(title))


def safe_folder_segment(name: str) -> str:
    """Map any name to a folder segment (design §2.2): the rules of :func:`safe_filename` without
    the extension. ``name`` (str) → non-empty segment ≤ 255 UTF-8 bytes; empty result → ``folder``;
    ``CON`` → ``CON_``, ``..`` → ``folder``, ``.git`` → ``_.git``, ``GIT~1`` → ``GIT~1_``. Raises ``TypeError`` on
    non-str."""
    if not isinstance(name, str):
        raise TypeError(f"name must be str, not {type(name).__name__}")
    segment = _cut(_undevice(_clean(name) or "folder"), MAX_SEGMENT_BYTES)
    if git_special_name(segment):  # ``GIT~1``: the NTFS short name of .git
        segment = _cut(segment, MAX_SEGMENT_BYTES - 1) + "_"
    return segment


@functools.lru_cache(maxsize=65536)
def name_key(name: str) -> str:
    """The collision key of a name (design §2.2: "case-insensitive and NFC-insensitive").

    ``name`` (str) → ``NFC(casefold(upper(NFD(name))))``: Unicode canonical caseless matching,
    plus the upper-casing Windows (NTFS) compares with, so ``Café``/``Cafe\\u0301``/``CAFÉ`` share
    a key and so do ``ı``/``i``. Deliberately at least as coarse as macOS and Windows (``ß`` ≡
    ``ss``): a coarser key only adds ``(n)`` suffixes, never a clash on checkout.
    Idempotent, so a set of keys may be passed wherever names are expected."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", name).upper().casefold())


class NameRegistry:
    """The names taken in one folder (design §2.2 collisions), for batches: O(1) amortized per claim.

    ``NameRegistry(names)`` with ``names`` an iterable of names (or keys) already present at HEAD;
    ``claim(name) -> str`` returns ``name`` or its first free ``name (n)`` variant and records it;
    ``name in registry`` tests the collision key; ``add(name)`` records without suffixing.
    """

    __slots__ = ("_keys", "_next")

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._keys: set[str] = {name_key(n) for n in names}
        self._next: dict[str, int] = {}  # key of a base name -> next suffix number to try

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name_key(name) in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, name: str) -> None:
        """Record ``name`` as taken (no suffixing)."""
        self._keys.add(name_key(name))

    def free(self, name: str) -> str:
        """The name :meth:`claim` would return, without recording it."""
        key = name_key(name)
        if key not in self._keys:
            return name
        stem, ext = _split_ext(name)
        n = self._next.get(key, 2)
        while True:
            suffix = f" ({n})"
            candidate = _cut(stem, MAX_SEGMENT_BYTES - len((suffix + ext).encode())) + suffix + ext
            if name_key(candidate) not in self._keys:
                self._next[key] = n  # everything below n is taken; never rescanned
                return candidate
            n += 1

    def claim(self, name: str) -> str:
        """Return ``name`` if its key is free, else ``stem (n).ext`` for the smallest free n ≥ 2
        (stem shortened on a character boundary to keep ≤ 255 bytes); record the result."""
        chosen = self.free(name)
        self._keys.add(name_key(chosen))
        return chosen


_SUFFIXED = re.compile(r"(?P<stem>.*) \((?P<n>[1-9][0-9]*)\)$")


def suffixed_from(name: str) -> str | None:
    """The collision key of the name ``name`` is a collision variant of: ``Notes (3).md`` →
    ``name_key("Notes.md")``, ``Plans (2)`` → ``name_key("Plans")``; None when ``name`` carries no
    `` (n)`` suffix with n ≥ 2 (design §2.2). A stem :class:`NameRegistry` shortened to fit 255
    bytes is not traced back."""
    if ")" not in name:
        return None
    stem, ext = _split_ext(name)
    found = _SUFFIXED.fullmatch(stem)
    if found is None or int(found["n"]) < 2:
        return None
    return name_key(found["stem"] + ext)


def unique_name(name: str, taken: Iterable[str] | NameRegistry) -> str:
    """``name`` if its key is not among ``taken``'s keys, else ``stem (2).md``, ``stem (3).md`` …
    (``name (2)`` for a segment without ``.md``), stem shortened to fit 255 bytes (design §2.2).

    ``taken``: names or keys (any iterable, rebuilt into a key set: O(len(taken)) per call) or a
    :class:`NameRegistry` (queried, not modified). For many names in one folder, use
    :meth:`NameRegistry.claim` instead. Nothing is recorded; no error is raised."""
    registry = taken if isinstance(taken, NameRegistry) else NameRegistry(taken)
    return registry.free(name)


# Code points HFS+ ignores in file names (git's fsck checks .git spellings without them).
_HFS_IGNORED = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])
_GIT_NAMES = {".git", "git~1", ".gitattributes", ".gitignore", ".gitmodules"}


def git_special_name(segment: str) -> bool:
    """True when ``segment`` is, on some file system, a name git itself interprets: ``.git``
    (also as NTFS short name ``GIT~1``, with HFS-ignored code points, trailing dots/spaces or an
    NTFS stream suffix ``::$…``), ``.gitattributes``, ``.gitignore`` or ``.gitmodules`` (design §2.3,
    §14: a document must never change how git reads the repository)."""
    name = segment.translate(_HFS_IGNORED).split(":", 1)[0].rstrip(". ").casefold()
    return name in _GIT_NAMES


def _check_segment(segment: object, path: object) -> None:
    """Raise :class:`InvalidPath` (for ``path``) unless ``segment`` is a safe segment (§2.3)."""
    if not isinstance(segment, str):
        raise InvalidPath(path, "path segments must be strings")
    if segment in ("", ".", ".."):
        raise InvalidPath(path, f"empty, '.' or '..' segment {segment!r} is not allowed")
    if "/" in segment:
        raise InvalidPath(path, f"segment {segment!r} contains '/'")
    if "\\" in segment:
        raise InvalidPath(path, _BACKSLASH)
    if any(unicodedata.category(ch) == "Cc" for ch in segment):
        raise InvalidPath(path, "control characters (NUL, newline, ESC, …) are not allowed")
    try:
        size = len(segment.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPath(path, "not valid Unicode (lone surrogate)") from None
    if size > MAX_SEGMENT_BYTES:
        raise InvalidPath(path, f"segment of {size} UTF-8 bytes exceeds {MAX_SEGMENT_BYTES}")
    if git_special_name(segment):
        raise InvalidPath(
            path,
            f"segment {segment!r} is (or checks out as) a file git itself interprets "
            "(.git, .gitattributes, .gitignore, .gitmodules); choose another name",
        )


@dataclass(frozen=True, order=True)
class StorePath:
    """A validated path inside the projected root ``documents`` (design §2.3). Immutable, hashable,
    ordered by ``parts``; equality is exact (no case or NFC folding: git names are bytes).

    ``parts`` — the segments after ``documents`` (``()`` is the root itself). Construction checks
    every segment (no empty/``.``/``..``/``.git``, no ``/`` or ``\\``, no control characters, valid
    Unicode, ≤ 255 bytes) and raises :class:`InvalidPath`; the policy rules (root, ``.keep``) are
    applied by :meth:`parse`.
    """

    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.parts, tuple):
            raise InvalidPath(self.parts, "parts must be a tuple of strings")
        whole = "/".join(map(str, (ROOT, *self.parts)))  # once: per segment it was quadratic
        for segment in self.parts:
            _check_segment(segment, whole)

    @classmethod
    def parse(cls, path: object, *, allow_root: bool = False, allow_keep: bool = False) -> StorePath:
        """Parse a virtual path (``/documents/a/b.md``) or repo path (``documents/a/b.md``).

        Returns a :class:`StorePath`. One trailing ``/`` is accepted and dropped
        (``/documents/a/`` ≡ ``/documents/a``); ``//`` anywhere is an empty segment and rejected.
        Raises :class:`InvalidPath` when ``path`` is not a str, is not under ``/documents``, is the
        root without ``allow_root=True``, ends in ``.keep`` (any case) without ``allow_keep=True``,
        or breaks a segment rule (see the class docstring).
        """
        if not isinstance(path, str):
            raise InvalidPath(path, f"path must be a string, not {type(path).__name__}")
        if "\\" in path:
            raise InvalidPath(path, _BACKSLASH)
        if any(unicodedata.category(ch) == "Cc" for ch in path):
            raise InvalidPath(path, "control characters (NUL, newline, ESC, …) are not allowed")
        body = path[1:] if path.startswith("/") else path
        if body.endswith("/"):
            body = body[:-1]
        segments = body.split("/")
        if segments[0] != ROOT:
            rest = "/".join(segments[1:]) if segments[0].casefold() == ROOT else body  # /Documents/a.md
            hint = f" (did you mean '/{ROOT}/{rest}'?)" if rest and segments[0] else ""
            try:
                if hint:
                    cls(tuple(rest.split("/")))  # only a path that would parse is suggested
            except InvalidPath:
                hint = ""  # ../etc/passwd: /documents/../etc/passwd would be refused in turn
            raise InvalidPath(path, f"must be under /documents{hint}")
        try:
            result = cls(tuple(segments[1:]))
        except InvalidPath as exc:
            raise InvalidPath(path, exc.reason) from None
        if not result.parts and not allow_root:
            raise InvalidPath(path, "the /documents root is a folder, not a document; `kb ls` lists it")
        if result.name.rstrip(". ").casefold() == ".keep" and not allow_keep:
            raise InvalidPath(path, ".keep is a folder marker, not a document")
        return result

    @classmethod
    def from_repo_path(cls, repo_path: str, **options: bool) -> StorePath:
        """Parse a repo path (``documents/a/b.md``, no leading ``/``); options as :meth:`parse`."""
        if isinstance(repo_path, str) and repo_path.startswith("/"):
            raise InvalidPath(repo_path, "a repo path has no leading '/'")
        return cls.parse(repo_path, **options)

    @classmethod
    def from_parts(cls, parts: Iterable[str]) -> StorePath:
        """Build from segments after ``documents``; segment rules only (no ``.keep``/root rule)."""
        return cls(tuple(parts))

    @property
    def repo_path(self) -> str:
        """``documents/a/b.md`` (``documents`` for the root)."""
        return "/".join((ROOT, *self.parts))

    @property
    def virtual(self) -> str:
        """``/documents/a/b.md`` (``/documents`` for the root)."""
        return "/" + self.repo_path

    @property
    def name(self) -> str:
        """The last segment (``documents`` for the root)."""
        return self.parts[-1] if self.parts else ROOT

    @property
    def folder_parts(self) -> tuple[str, ...]:
        """The segments of the containing folder (``()`` for top-level entries and the root)."""
        return self.parts[:-1]

    @property
    def parent(self) -> StorePath | None:
        """The containing folder's path (the root for top-level entries); ``None`` for the root."""
        return StorePath(self.parts[:-1]) if self.parts else None

    def child(self, segment: str) -> StorePath:
        """This path joined with one more validated segment; raises :class:`InvalidPath`."""
        return StorePath((*self.parts, segment))

    def __str__(self) -> str:
        return self.virtual


def author_path(relative_parts: Sequence[str], prefix: Sequence[str] = ()) -> tuple[str, ...]:
    """Map a relative file path (e.g. ``("Licenses & payment", "Refund policy")``) to safe segments
    after ``documents`` (design §2.2): ``(*prefix, *map(safe_folder_segment, folders),
    safe_filename(last))``. ``prefix`` segments are validated as they are, never rewritten.

    Split OS paths on the separator first: a ``/`` inside a segment becomes ``_``. Collisions are
    the caller's job (a :class:`NameRegistry` per folder). Raises :class:`InvalidPath` for an empty
    ``relative_parts`` or an invalid ``prefix`` segment; ``TypeError`` for non-str segments.
    """
    if isinstance(relative_parts, str) or not relative_parts:
        raise InvalidPath(relative_parts, "expected a non-empty sequence of path segments")
    prefix = tuple(prefix)
    for segment in prefix:
        _check_segment(segment, "/".join(map(str, prefix)))
    *folders, last = relative_parts
    return (*prefix, *(safe_folder_segment(f) for f in folders), safe_filename(last))


MAX_WORKSPACE_ID = 2**31 - 1
"""The largest workspace id: ``kb.workspaces.id`` and every ``workspace_id`` column are Postgres
``integer`` (design §2.1: workspace ids are positive integers)."""


def check_workspace_id(workspace_id: object) -> int:
    """Return ``workspace_id`` if it is an int from 1 to MAX_WORKSPACE_ID (design §2.1), else raise
    InvalidWorkspace."""
    if isinstance(workspace_id, bool) or not isinstance(workspace_id, int) or not 0 < workspace_id <= MAX_WORKSPACE_ID:
        raise InvalidWorkspace(f"workspace ids are integers from 1 to {MAX_WORKSPACE_ID}, got {workspace_id!r}")
    return workspace_id


def unique_identifier_hash(document_type: str, unique_id: str, workspace_id: int) -> str:
    """``sha256(f"{document_type}:{unique_id}:{workspace_id}")`` as 64 hex chars (design §2.4); the
    legacy host's exact format. ``unique_id`` is the virtual path for NOTE/ARTIFACT, else the
    source id. Raises :class:`InvalidWorkspace` unless ``workspace_id`` is an int from 1 to
    MAX_WORKSPACE_ID (§2.1, ``check_workspace_id``)."""
    check_workspace_id(workspace_id)
    return hashlib.sha256(f"{document_type}:{unique_id}:{workspace_id}".encode()).hexdigest()


def blob_id(data: bytes) -> str:
    """The git blob SHA-1 of ``data`` as 40 hex chars — ``content_id``, equal to
    ``git hash-object`` (design §2.4). Accepts bytes-like objects; raises ``TypeError`` for str."""
    if isinstance(data, str):
        raise TypeError("blob_id takes bytes, not str (encode first)")
    raw = bytes(data)
    return hashlib.sha1(b"blob %d\0" % len(raw) + raw).hexdigest()


# -- rules for NEW names (design §2.2, §2.3, §14) -------------------------------------
# Names that exist already stay readable, movable and removable whatever they are; these rules
# apply to every name a write or move *creates*, so nothing new can fail to check out.


def describe_name(name: str) -> str:
    """``name`` quoted so look-alikes differ on screen: ASCII as is, anything else escaped
    (``'Café.md'`` → ``'Caf\\xe9.md'``, its NFD twin → ``'Cafe\\u0301.md'``)."""
    return ascii(name)


def check_new_segment(segment: str, path: object) -> None:
    """Raise InvalidPath (for ``path``) when ``segment`` may not be *created*: a Windows device
    name (``NUL``, ``lpt9.txt``, ``CON .md`` — judged like Windows on the stem before the first
    dot), a name ending in a dot or a space (Windows strips those, so two names would meet), or a
    name holding one of BIDI_CONTROLS (it would show as another name), or one holding a character
    Windows forbids in names (``: * ? " < > |``; the importer's path law turns them into ``_``)."""
    forbidden = _FORBIDDEN.intersection(segment)
    if forbidden:
        shown = " ".join(sorted(forbidden))
        raise InvalidPath(
            path,
            f"name {describe_name(segment)} holds {shown}, which Windows forbids in file names; choose another "
            f"(for example {describe_name(safe_filename(segment) if segment.lower().endswith(_EXT) else safe_folder_segment(segment))})",
        )
    bidi = BIDI_CONTROLS.intersection(segment)
    if bidi:
        marks = ", ".join(f"U+{ord(c):04X}" for c in sorted(bidi))
        raise InvalidPath(
            path,
            f"name {describe_name(segment)} holds a bidirectional control character ({marks}), which "
            "shows the name on screen other than it is; remove it",
        )
    if segment.endswith((".", " ")):
        raise InvalidPath(
            path, f"name {describe_name(segment)} ends in a dot or space, which Windows drops; choose a name without it"
        )
    stem = segment.partition(".")[0].rstrip(" ")
    if "".join(c.upper() if c.isascii() else c for c in stem) in _DEVICES:
        raise InvalidPath(
            path,
            f"name {describe_name(segment)} is a Windows device name; choose another "
            f"(for example {describe_name(safe_folder_segment(segment))})",
        )


def check_path_length(repo_path: str, path: object) -> None:
    """Raise InvalidPath (for ``path``) when ``repo_path`` (``documents/…``) is longer than
    MAX_PATH_BYTES below ``documents``: it could not be checked out everywhere (design §2.3)."""
    size = len(repo_path.encode("utf-8", "surrogatepass")) - len(ROOT) - 1
    if size > MAX_PATH_BYTES:
        raise InvalidPath(
            path,
            f"path of {size} UTF-8 bytes below /documents exceeds {MAX_PATH_BYTES}; use shorter folder or file names",
        )


OS_PATH_MAX = 4096
"""Linux ``PATH_MAX`` (bytes, including the terminating NUL)."""
_DEEPEST_SUFFIX = (
    len("/.worktrees/")
    + 20
    + 1
    + 200
    + 1
    + len(ROOT)
    + 1
    + MAX_PATH_BYTES
    + len("/.kbtmp-4194304-18446744073709551615")
)
"""Bytes a turn worktree adds below ``knowledge_store``: ``/.worktrees/{ws ≤ 20 digits}/{turn id
≤ 200}/documents/{path ≤ MAX_PATH_BYTES}`` plus the temporary name a write uses next to a file."""


def check_storage_root(knowledge_store: object) -> None:
    """Raise ConfigurationError when the deepest file kb may create below ``knowledge_store`` (a
    turn's worktree copy of a MAX_PATH_BYTES path, plus a temporary name) would exceed the OS path
    limit, so a valid path could fail on disk (design §2.3, §13). Called at start-up."""
    from kb.errors import ConfigurationError

    size = len(str(knowledge_store).encode("utf-8", "surrogateescape"))
    if size + _DEEPEST_SUFFIX >= OS_PATH_MAX:
        raise ConfigurationError(
            f"the storage root is too deep: {size} bytes to knowledge_store, and kb needs "
            f"{_DEEPEST_SUFFIX} more below it within the OS limit of {OS_PATH_MAX}; set KB_STORAGE_ROOT "
            f"to a path of at most {OS_PATH_MAX - 1 - _DEEPEST_SUFFIX - len('/knowledge_store')} bytes"
        )
