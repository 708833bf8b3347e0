"""``kb import``: a folder of markdown becomes one revision (design §2.2).

Every ``*.md`` under the folder (recursively) becomes ``documents/[PREFIX/]<relative path>`` with
each segment passed through the path law; folder and file names that collide case- or
NFC-insensitively get `` (2)``, `` (3)`` …, and each keeps the name an earlier import gave it
(``kb.store.import_names``: design §3, identity).
Hidden files and folders (``.obsidian/``, ``.trash/``) are skipped, and so are other files; the
report names each skipped entry with the reason, and each imported document the index will not
take (``kb.store.indexable``: not UTF-8, NUL bytes, too large), which is stored all the same.
Unchanged content records nothing; ``prune`` also removes documents under the prefix that the
folder no longer has, but for the ARTIFACT documents an application saved there (design §11). A file whose document kb moved since an earlier import (``kb mv``) updates
that document where it is now, not a second copy at the old path (design §3: identity follows a
move), unless the folder holds a file of its own at the new path.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kb.db import database
from kb.errors import ImportSourceError, InvalidInput, InvalidPath, KbError, PathExists
from kb.paths import blob_id, check_path_length, name_key, safe_folder_segment
from kb.store import artifact_rows
from kb.store.draft import BlobRef, Draft
from kb.store.history import Revision
from kb.store.import_names import Content, plan_paths
from kb.store.indexable import unindexable_reason
from kb.store.knowledge_store import KnowledgeStore, stated_message

HIDDEN = "hidden (its name starts with '.')"
SYMLINK = "symbolic link (never followed: it could pull in files from outside the folder)"
NOT_MARKDOWN = "not markdown (only files named *.md, in any case, are imported)"
NOT_UTF8_NAME = "its name is not valid UTF-8"
NOT_A_FILE = "not a regular file"

SCANNING, READING, RECORDING = "scanning", "reading", "recording"
"""The phases an import reports to its ``progress`` callback, in this order."""
ImportProgress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: ``SCANNING`` with the markdown files found so far (``total``
0 until the scan ends, then ``done``), ``READING`` file ``done`` of ``total``, ``RECORDING`` once,
as the revision is written (``done`` = ``total`` = the files read)."""


@dataclass(frozen=True)
class Skipped:
    """An entry of the source folder ``kb import`` did not import: ``path`` relative to the folder
    (a folder ends in ``/``; a name that is not UTF-8 shows its bytes escaped), and why."""

    path: str
    reason: str

    @property
    def hidden(self) -> bool:
        """True when skipped for being hidden."""
        return self.reason == HIDDEN


@dataclass
class ImportReport:
    """Outcome of one import: the revision (None when nothing changed) and counts.

    ``skipped`` names every entry not imported and why (``skipped_other``/``skipped_hidden`` count
    them); ``unindexable`` maps each imported document the index will not take (stored in git all
    the same, search never finds it) to the reason. ``renamed``: source path → the document's path
    where the path law changed a name; ``folder``: the folder imported into (``/documents/…``, the
    prefix as the path law made it: ``--prefix a:b`` imports into ``/documents/a_b``), and
    ``folder_renamed`` True when that differs from the prefix given.
    """

    workspace_id: int
    created_workspace: bool
    revision: Revision | None
    documents_found: int = 0
    skipped_other: int = 0
    skipped_hidden: int = 0
    added: int = 0
    modified: int = 0
    removed: int = 0
    moved: int = 0
    unchanged: int = 0
    renamed: dict[str, str] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)
    unindexable: dict[str, str] = field(default_factory=dict)
    folder: str = "/documents"
    folder_renamed: bool = False
    dry_run: bool = False
    """True for a preview (``dry_run``): the counts say what an import would record, nothing was."""
    moves: dict[str, str] = field(default_factory=dict)
    """A preview's moves: ``{old virtual path: new}`` for the files ``prune`` finds renamed."""
    removals: list[str] = field(default_factory=list)
    """A preview's removals: the virtual paths ``prune`` would remove."""
    additions: list[str] = field(default_factory=list)
    """A preview's additions: the virtual paths the import would add (sorted)."""
    modifications: list[str] = field(default_factory=list)
    """A preview's modifications: the virtual paths whose documents the import would change (sorted)."""
    kept_artifacts: dict[str, int] = field(default_factory=dict)
    """``{virtual path: document id}`` of the ARTIFACT documents under the prefix that the folder
    lacks: ``prune`` leaves them (an application saved them; only the artifact layer removes one,
    design §11)."""
    followed: dict[str, str] = field(default_factory=dict)
    """``{virtual path the folder's file maps to: the document's path now}`` for the files whose
    document kb moved since (``kb mv``): the file updates the document where it lives now instead
    of adding a copy at its old path (design §3: identity follows a move)."""


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a byte name that is not UTF-8 (os.walk's surrogate escapes)
        return False
    return True


def _shown(parts: tuple[str, ...]) -> str:
    """A relative path for a message (bytes of a non-UTF-8 name escaped, never an encoding error)."""
    return os.fsencode("/".join(parts)).decode("utf-8", "backslashreplace")


def scan(source: Path, progress: ImportProgress | None = None) -> tuple[list[tuple[str, ...]], list[Skipped]]:
    """Relative paths (as segment tuples, sorted) of the markdown files under ``source``, and the
    entries skipped with the reason (sorted by path). ``progress`` hears ``SCANNING`` after each
    folder.

    Skipped: hidden files and folders (a hidden folder once, not its contents), non-markdown
    files, symbolic links (never followed: a link could pull in files from outside the folder),
    and files or folders whose names are not valid UTF-8. Raises the OSError of a folder or file
    the system will not read (``import_folder`` explains it).
    """
    found: list[tuple[str, ...]] = []
    skipped: list[Skipped] = []

    def unlistable(exc: OSError) -> None:
        raise exc  # a folder that cannot be listed is never skipped in silence

    for root, dirs, files in os.walk(source, onerror=unlistable):
        rel_root = Path(root).relative_to(source).parts
        kept = []
        for d in sorted(dirs):
            shown = _shown((*rel_root, d)) + "/"
            if d.startswith("."):
                skipped.append(Skipped(shown, HIDDEN))
            elif (Path(root) / d).is_symlink():
                skipped.append(Skipped(shown, SYMLINK))
            elif not _utf8(d):
                skipped.append(Skipped(shown, NOT_UTF8_NAME))
            else:
                kept.append(d)
        dirs[:] = kept
        for name in files:
            path = Path(root) / name
            reason = None
            if name.startswith("."):
                reason = HIDDEN
            elif path.is_symlink():
                reason = SYMLINK
            elif not name.lower().endswith(".md"):
                reason = NOT_MARKDOWN
            elif not _utf8(name):
                reason = NOT_UTF8_NAME
            elif not path.is_file():
                reason = NOT_A_FILE
            if reason is None:
                found.append((*rel_root, name))
            else:
                skipped.append(Skipped(_shown((*rel_root, name)), reason))
        if progress is not None:
            progress(SCANNING, len(found), 0)
    if progress is not None:
        progress(SCANNING, len(found), len(found))
    return sorted(found), sorted(skipped, key=lambda entry: entry.path)


def _unreadable(source: Path, exc: OSError) -> KbError:
    """The error for a file or folder of ``source`` the operating system would not read: nothing
    is imported (the import is one revision or none)."""
    name = exc.filename or source
    try:
        shown = "/".join(Path(name).relative_to(source).parts) or str(source)
    except ValueError:
        shown = str(name)
    if exc.errno == errno.ENAMETOOLONG:
        return InvalidPath(
            shown,
            f"its path on disk is longer than the operating system allows "
            f"({len(os.fsencode(name))} bytes); use shorter folder or file names. "
            "Nothing was imported",
        )
    return ImportSourceError(
        f"cannot read {shown} in {source}: {exc.strerror or exc}; fix its permissions "
        "or move it out of the folder, then import again. Nothing was imported"
    )


def import_prefix(prefix: str | None) -> tuple[str, ...]:
    """Folder segments under ``documents/`` for ``--prefix``: ``Notes/2026``, ``/Notes`` and
    ``/documents/Notes`` all name ``documents/Notes...``; each segment passes through the path
    law (design §2.2). Raises InvalidInput for ``.``/``..`` segments rather than guessing."""
    return tuple(safe_folder_segment(p) for p in _prefix_segments(prefix))


def _prefix_segments(prefix: str | None) -> list[str]:
    """``import_prefix``'s segments as given, before the path law (``.``/``..`` refused)."""
    text = (prefix or "").strip().strip("/")
    if text == "documents":
        text = ""
    elif text.startswith("documents/"):
        text = text[len("documents/") :]
    parts = [p for p in text.split("/") if p.strip()]
    if any(p.strip() in (".", "..") for p in parts):
        raise InvalidInput(
            f"prefix={prefix!r} contains '.' or '..'; name a folder under /documents",
            cli=f"--prefix {prefix!r} contains '.' or '..'; name a folder under /documents",
        )
    return parts


def _renames(
    content: Content, planned: dict[tuple[str, ...], str], existing: dict[str, str], pruned: list[str]
) -> dict[str, str]:
    """``{new virtual path: pruned virtual path}`` for the documents ``--prune`` would remove whose
    exact bytes the folder holds at a path the workspace lacks: a file renamed (or moved) in the
    folder. Recorded as moves, their history and document id follow them (design §3) instead of
    ending at a removal beside an unrelated addition. Bytes met at several paths pair in path
    order. Only the new paths are read here (to hash them); nothing when nothing is pruned."""
    if not pruned:
        return {}
    by_content: dict[str, list[str]] = {}
    for virtual in sorted(pruned):
        by_content.setdefault(existing[virtual], []).append(virtual)
    moves: dict[str, str] = {}
    for parts, repo_path in sorted(planned.items(), key=lambda item: item[1]):
        virtual = "/" + repo_path
        if virtual in existing:
            continue
        candidates = by_content.get(content(parts))
        if candidates:
            moves[virtual] = candidates.pop(0)
    return moves


def import_folder(
    store: KnowledgeStore,
    source: Path,
    *,
    prefix: str | None = None,
    prune: bool = False,
    message: str | None = None,
    author: str = "kb-import",
    idempotency_key: str | None = None,
    progress: ImportProgress | None = None,
    dry_run: bool = False,
) -> ImportReport:
    """Import ``source`` into the store's workspace as one revision (created if needed).

    ``dry_run``: record nothing and create no workspace; the report says what the import would
    do (its counts, ``moves`` and ``removals``; ``revision`` None), so a ``prune``, which removes
    documents, can be looked at first.

    ``idempotency_key``: the write's key (design §3): an interrupted import is settled with
    ``KnowledgeStore.write_outcome(key)``, and a retry with the key records it at most once.
    ``progress``: told what the import is doing (``ImportProgress``), so a caller can show a
    long import at work; it may be called once per file.
    Raises ImportSourceError when ``source`` is not a readable directory; HistoryDiverged when
    Postgres records revisions for the workspace but its repository is missing; LockTimeout etc.
    from the commit. Nothing is written on error.
    """
    source = Path(source).expanduser()
    if not source.exists():
        raise ImportSourceError(f"{source} does not exist; pass a folder of markdown files")
    if not source.is_dir():
        raise ImportSourceError(f"{source} is not a folder; pass a folder of markdown files")
    source = source.resolve()
    prefix_parts = import_prefix(prefix)
    try:
        relative, skipped = scan(source, progress)
    except OSError as exc:
        raise _unreadable(source, exc) from None
    created = not store.exists()
    existing = store.list_paths() if not created and store.head() else {}
    content = _hashes(source)
    planned = plan_paths(relative, prefix_parts, existing, content)  # names kept import after import
    for repo_path in planned.values():  # the whole import is refused before anything is created
        check_path_length(repo_path, "/" + repo_path)
    if created and not dry_run:
        store.create()
    hidden = sum(1 for entry in skipped if entry.hidden)
    root = "/" + "/".join(("documents", *prefix_parts))
    report = ImportReport(
        store.workspace_id, created, None, len(relative), len(skipped) - hidden, hidden, skipped=skipped, folder=root
    )
    report.folder_renamed = tuple(_prefix_segments(prefix)) != prefix_parts
    text = stated_message(message) or f"import {len(relative)} documents from {source.name}"
    followed = _followed_moves(store, planned, existing)
    report.followed = followed
    pruned: list[str] = []
    if prune:
        wanted = {"/" + p for p in planned.values()} | set(followed.values())
        pruned = [
            virtual
            for virtual in existing
            if (virtual == root or virtual.startswith(root + "/"))
            and virtual not in wanted
            and not virtual.endswith("/.keep")
        ]
        if pruned:  # an application's artifacts were never the folder's: prune leaves them (§11)
            with database.transaction(store.database_url) as conn:
                report.kept_artifacts = artifact_rows.artifacts_at(conn, store.workspace_id, pruned)
            pruned = [virtual for virtual in pruned if virtual not in report.kept_artifacts]
    moves = _renames(content, {parts: p for parts, p in planned.items() if "/" + p not in followed}, existing, pruned)
    if dry_run:
        return _preview(store, report, source, planned, existing, pruned, moves, prefix_parts, prune)
    with store.transaction(text, author, idempotency_key=idempotency_key) as draft:
        _stage(draft, report, source, planned, pruned, moves, prefix_parts, prune, store, progress)
        if progress is not None:  # the commit runs as the block ends: the longest step of a large import
            progress(RECORDING, len(planned), len(planned))
    report.revision = draft.revision
    if draft.revision is not None:
        for change in draft.revision.changes:
            if change.change == "added":
                report.added += 1
            elif change.change == "modified":
                report.modified += 1
            elif change.change == "removed":
                report.removed += 1
    report.unchanged = len(relative) - report.added - report.modified - report.moved
    return report


def _hashes(source: Path) -> Content:
    """``content(parts)``: the blob id of the file ``parts`` under ``source``, read once. Raises
    ImportSourceError when it cannot be read."""
    known: dict[tuple[str, ...], str] = {}

    def content(parts: tuple[str, ...]) -> str:
        if parts not in known:
            try:
                known[parts] = blob_id(source.joinpath(*parts).read_bytes())
            except OSError as exc:
                raise _unreadable(source, exc) from None
        return known[parts]

    return content


def _followed_moves(
    store: KnowledgeStore, planned: dict[tuple[str, ...], str], existing: dict[str, str]
) -> dict[str, str]:
    """``{virtual path: the document's path now}`` for the planned paths the workspace lacks
    because kb moved their document away since (a ``kb mv`` after an earlier import), where it
    still is and the folder holds no file of its own there: importing the folder again updates
    that document instead of adding a second copy at the old path (design §3). "Its own" is by
    the path law's names (design §2.2): a folder file ``c.md`` is the one at ``C.md``, unless
    ``C.md`` is where kb moved that very file (a case-only ``kb mv``)."""
    if not existing:
        return {}
    wanted = {"/" + p for p in planned.values()}
    claimed: dict[str, set[str]] = {}  # each name key → the folder's files there
    for virtual in wanted:
        claimed.setdefault(_path_key(virtual), set()).add(virtual)
    followed: dict[str, str] = {}
    taken: set[str] = set()  # followed.values() as a set: a folder kb moved may hold thousands
    for old, now in sorted(store.moved_away(sorted(v for v in wanted if v not in existing)).items()):
        if now in existing and claimed.get(_path_key(now), set()) <= {old} and now not in taken:
            followed[old] = now
            taken.add(now)
    return followed


def _path_key(virtual: str) -> str:
    """``virtual`` with each segment by its ``name_key``: two paths that differ only in case or
    Unicode normalization share it, as the path law makes them one name (design §2.2)."""
    return "/".join(name_key(segment) for segment in virtual.split("/"))


def _read_document(
    source: Path,
    parts: tuple[str, ...],
    repo_path: str,
    prefix_parts: tuple[str, ...],
    report: ImportReport,
    max_index_bytes: int,
) -> bytes:
    """The bytes of the planned file ``parts`` under ``source`` (to be the document at
    ``repo_path``), telling ``report`` when the index will not take them (``unindexable``) or the
    path law renamed the file (``renamed``). Raises ImportSourceError when it cannot be read."""
    try:
        data = source.joinpath(*parts).read_bytes()
    except OSError as exc:
        raise _unreadable(source, exc) from None
    reason = unindexable_reason(data, max_index_bytes)
    if reason is not None:
        report.unindexable["/" + repo_path] = reason
    if "/".join(parts) != repo_path.split("/", 1 + len(prefix_parts))[-1]:
        report.renamed["/".join(parts)] = "/" + repo_path
    return data


def _stage(
    draft: Draft,
    report: ImportReport,
    source: Path,
    planned: dict[tuple[str, ...], str],
    pruned: list[str],
    moves: dict[str, str],
    prefix_parts: tuple[str, ...],
    prune: bool,
    store: KnowledgeStore,
    progress: ImportProgress | None,
) -> None:
    """Put the import in ``draft``: ``moves``, then ``pruned`` less the moves' sources removed,
    then every planned file written; ``report`` hears the moves, renamed names and unindexable
    files. The real import and its dry run (``_preview``) stage alike, so a preview refuses what
    the import would (a name differing only in case, a document where a folder is, design §2.2).
    Raises PathExists, ImportSourceError, InvalidPath."""
    # pruned first: a document renamed in the folder only by case (Foo.md → foo.md) then takes
    # the name its old self leaves, which the draft refuses while the old name stands (§2.2);
    # one renamed with its bytes unchanged is moved, so its history and id follow it (§3)
    for new_path, old_path in moves.items():
        draft.move(old_path, new_path)
    for virtual in pruned:
        if virtual not in moves.values():
            draft.remove(virtual)
    for read, (parts, repo_path) in enumerate(planned.items(), 1):
        if "/" + repo_path in moves:  # moved there with these very bytes
            report.moved += 1
            if progress is not None:
                progress(READING, read, len(planned))
            continue
        data = _read_document(source, parts, repo_path, prefix_parts, report, store.settings.max_index_bytes)
        now = report.followed.get("/" + repo_path)
        if now is not None:  # kb moved its document since: update it there (design §3)
            if "/" + repo_path in report.unindexable:
                report.unindexable[now] = report.unindexable.pop("/" + repo_path)
            repo_path = now.removeprefix("/")
        try:
            draft.write(repo_path, data)
        except PathExists as exc:
            if prune:
                raise
            raise PathExists(
                f"{exc}; when the folder renamed it, `kb import --prune` takes the new name and "
                "removes the old one (a file whose bytes are unchanged is recorded as moved)"
            ) from None
        if progress is not None:
            progress(READING, read, len(planned))


def _preview(
    store: KnowledgeStore,
    report: ImportReport,
    source: Path,
    planned: dict[tuple[str, ...], str],
    existing: dict[str, str],
    pruned: list[str],
    moves: dict[str, str],
    prefix_parts: tuple[str, ...],
    prune: bool,
) -> ImportReport:
    """``report`` filled with what an import of ``planned`` would record over ``existing``
    (``{virtual path: blob id}`` at HEAD), staged as the import stages it (``_stage``) in a draft
    that is never committed: the same refusals (PathExists; ArtifactReadOnly for an ARTIFACT
    document it would change, design §11), the same counts. Records nothing."""
    report.dry_run = True
    report.moves = {old: new for new, old in moves.items()}
    report.removals = sorted(virtual for virtual in pruned if virtual not in moves.values())
    head = store.head() if not report.created_workspace else None
    repository = store.repository if head else None
    draft = Draft(repository, repository.tree_id(head)) if repository is not None else None
    if draft is None:  # a first import: every file is added, nothing to collide with
        for parts, repo_path in planned.items():
            _read_document(source, parts, repo_path, prefix_parts, report, store.settings.max_index_bytes)
        report.added = len(planned)
        report.additions = sorted("/" + repo_path for repo_path in planned.values())
        return report
    _stage(draft, report, source, planned, pruned, moves, prefix_parts, prune, store, None)
    effective: dict[str, str | None] = {}
    for repo_path, value in draft.changes().items():
        before = existing.get("/" + repo_path)
        after = None if value is None else value.id if isinstance(value, BlobRef) else blob_id(value)
        if after != before:
            effective[repo_path] = after
            if "/" + repo_path in moves or "/" + repo_path in moves.values():  # counted as moved
                continue
            if after is None:
                report.removed += 1
            elif before is None:
                report.added += 1
                report.additions.append("/" + repo_path)
            else:
                report.modified += 1
                report.modifications.append("/" + repo_path)
    with database.transaction(store.database_url) as conn:  # as the commit would refuse them
        artifact_rows.guard(conn, store.workspace_id, effective, artifact_rows.ACCESS_REFUSE)
    report.additions.sort()
    report.modifications.sort()
    report.unchanged = len(planned) - report.added - report.modified - report.moved
    return report
