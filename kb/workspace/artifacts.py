"""Artifacts (design §11): generated deliverables saved as documents, with durable blobs
and optimistic revisions. ``kb.workspace.artifacts(workspace)`` hands out an :class:`Artifacts` object.

An artifact is an ARTIFACT document at ``/documents/Artifacts/<title>.md`` (path law, collisions
``name (2).md``) — searchable, readable and citable like any document — plus sidecar rows in
Postgres (format, generation counter, attached files: role, size, sha256) and the attached files'
bytes in a content-addressed blob store under the storage root (``kb.workspace.blobstore``).

Order of a save or revise: blobs are written and fsynced (unlocked); then one store revision is
recorded, and in its transaction, under the workspace write lock, the generation is checked and
bumped, the blobs' presence re-checked (a concurrent purge cannot strand a row), and the rows
written (``kb.store.artifact_rows``). Indexing happens later in the index job, so saving never waits for
the embedder. The commit carries the manifest as a trailer so a crash between the git ref update
and the Postgres commit is completed by the store's catch-up: an artifact is whole or absent.

Delete removes the markdown in one revision, drops the rows and records purge entries for blobs
nothing references; the purge then runs under the write lock. A purge that fails is logged and
left as an entry (``kb.artifact_blob_purges``) that the periodic sweep retries.
"""

from __future__ import annotations

import builtins
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from kb.db import database
from kb.db.locks import chunk_lock, locked_transaction
from kb.db.sql import queries
from kb.errors import ArtifactNotFound, InvalidInput, PathExists, StaleGeneration
from kb.paths import StorePath, name_key, safe_filename, unique_name
from kb.store.artifact_rows import (
    ACCESS_ARTIFACT,
    ArtifactFile,
    Manifest,
    announce_deleted,
    delete_rows,
    write_manifest,
)
from kb.store.history import Revision
from kb.store.knowledge_store import KnowledgeStore
from kb.workspace.blobstore import BlobStore, sha256_of

log = logging.getLogger(__name__)

FOLDER = "/documents/Artifacts"
_FORMAT = re.compile(r"^[a-z0-9][a-z0-9.+_-]{0,63}$")
_NAME_RETRIES = 8


@dataclass(frozen=True)
class Artifact:
    """One artifact: ``id`` (its document id), virtual ``path``, ``title``, ``format``,
    ``generation`` (revise with this), ``revision`` (the git revision that recorded this
    generation; None when it recorded no markdown change), ``files`` (role, size, sha256)."""

    id: int
    workspace_id: int
    path: str
    title: str
    format: str
    generation: int
    revision: str | None
    files: tuple[ArtifactFile, ...] = ()
    updated_at: datetime | None = None


class _NameTaken(Exception):
    """The chosen file name was taken by a concurrent revision; the save retries with a new one."""


def _markdown_bytes(markdown: str | bytes) -> bytes:
    if isinstance(markdown, str):
        return markdown.encode("utf-8")
    if isinstance(markdown, (bytes, bytearray, memoryview)):
        return bytes(markdown)
    raise InvalidInput(f"artifact markdown must be str or bytes, not {type(markdown).__name__}")


def _check_files(files: Mapping[str, bytes] | None) -> dict[str, bytes]:
    if files is None:
        return {}
    if not isinstance(files, Mapping):
        raise InvalidInput("artifact files must be a mapping {role: bytes}")
    checked = {}
    for role, data in files.items():
        if not isinstance(role, str) or not role.strip() or len(role.encode()) > 255:
            raise InvalidInput(f"artifact file role {role!r}: give a non-empty name of at most 255 bytes")
        if any(ord(c) < 32 for c in role):
            raise InvalidInput(f"artifact file role {role!r} contains control characters; use a plain name")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput(f"artifact file {role!r} must be bytes, not {type(data).__name__}")
        checked[role] = bytes(data)
    return checked


def _check_format(fmt: str) -> str:
    if not isinstance(fmt, str) or not _FORMAT.match(fmt):
        raise InvalidInput(f"artifact format {fmt!r}: use a short lowercase name such as markdown, html, csv")
    return fmt


def artifact_blobs_path(storage_root: Path, workspace_id: int) -> Path:
    """The folder holding a workspace's artifact files (``{storage_root}/artifact_blobs/{id}``)."""
    return storage_root / "artifact_blobs" / str(workspace_id)


class Artifacts:
    """The artifacts of one workspace (design §11). Errors: ArtifactNotFound, StaleGeneration,
    InvalidInput, BlobStoreError, plus the store's (LockTimeout, WorkspaceNotFound, …)."""

    def __init__(self, store: KnowledgeStore, default_author: Callable[[], str]) -> None:
        self.store = store
        self.workspace_id = store.workspace_id
        self.blobs = BlobStore(artifact_blobs_path(store.settings.storage_root, store.workspace_id))
        self._default_author = default_author

    # -- reads -------------------------------------------------------------------------
    def _artifact(self, row: dict, files: list[dict], revision: str | None = None) -> Artifact:
        return Artifact(
            row["id"],
            self.workspace_id,
            row["path"],
            row["title"],
            row["format"] or "markdown",
            row["generation"] or 1,
            revision if revision is not None else row.get("revision_id"),
            tuple(ArtifactFile(f["role"], f["size"], f["sha256"]) for f in files),
            row.get("updated_at"),
        )

    def list(self) -> list[Artifact]:
        """Every artifact of the workspace, by path (a sidecar-less ARTIFACT row shows generation 1)."""
        with database.connect(self.store.database_url) as conn:
            rows = conn.execute(queries["list_artifacts"], {"workspace_id": self.workspace_id}).fetchall()
            files = conn.execute(queries["artifact_files"], {"document_ids": [r["id"] for r in rows]}).fetchall()
        by_doc: dict[int, list[dict]] = {}
        for f in files:
            by_doc.setdefault(f["document_id"], []).append(f)
        return [self._artifact(r, by_doc.get(r["id"], [])) for r in rows]

    def get(self, artifact_id: int) -> Artifact:
        """One artifact's metadata; a sidecar-less ARTIFACT row gets its sidecar (generation 1)
        here, on first use. Raises ArtifactNotFound."""
        with database.transaction(self.store.database_url) as conn:
            row = conn.execute(
                queries["get_artifact"], {"workspace_id": self.workspace_id, "document_id": artifact_id}
            ).fetchone()
            if row is None or row["document_type"] != "ARTIFACT":
                raise ArtifactNotFound(
                    f"workspace {self.workspace_id} has no artifact {artifact_id}; "
                    f"list them with `kb artifact list --workspace {self.workspace_id}`"
                )
            if row["generation"] is None:
                conn.execute(
                    queries["upsert_artifact"],
                    {
                        "document_id": artifact_id,
                        "workspace_id": self.workspace_id,
                        "format": "markdown",
                        "generation": 1,
                    },
                )
            files = conn.execute(queries["artifact_files"], {"document_ids": [artifact_id]}).fetchall()
        return self._artifact(row, files)

    def read_markdown(self, artifact_id: int) -> bytes:
        """The artifact's markdown at HEAD. Raises ArtifactNotFound."""
        return self.store.read(self.get(artifact_id).path)

    def read_file(self, artifact_id: int, role: str) -> bytes:
        """The bytes of one attached file. Raises ArtifactNotFound (no such artifact or role),
        BlobStoreError (the blob is missing from disk: run ``kb fsck``)."""
        artifact = self.get(artifact_id)
        for file in artifact.files:
            if file.role == role:
                return self.blobs.read(file.sha256)
        roles = ", ".join(f.role for f in artifact.files) or "none"
        raise ArtifactNotFound(f"artifact {artifact_id} has no file {role!r} (files: {roles})")

    # -- writes ------------------------------------------------------------------------
    def _store_blobs(self, files: dict[str, bytes]) -> tuple[ArtifactFile, ...]:
        """Write every attached file durably before anything is recorded."""
        return tuple(ArtifactFile(role, len(data), self.blobs.put(data)) for role, data in sorted(files.items()))

    def _ensure_blobs(self, files: dict[str, bytes]) -> None:
        """Under the write lock: re-create any blob a concurrent purge removed meanwhile."""
        for data in files.values():
            if not self.blobs.has(sha256_of(data), len(data)):
                self.blobs.put(data)

    def _message(self, verb: str, manifest: Manifest, message: str | None) -> str:
        head = message.rstrip("\n") if message else f'artifact: {verb} "{manifest.title}"'
        return f"{head}\n\n{manifest.trailer()}"

    def save(
        self,
        title: str,
        markdown: str | bytes,
        files: Mapping[str, bytes] | None = None,
        format: str = "markdown",
        author: str | None = None,
        message: str | None = None,
    ) -> Artifact:
        """Save a new artifact as one revision (design §11): markdown at
        ``/documents/Artifacts/<safe_filename(title)>`` (`` (2)`` on a collision), ``files``
        (``{role: bytes}``) in the blob store, sidecar rows at generation 1. Returns the Artifact.

        Never waits for indexing. Raises InvalidInput (title, format, roles, bytes), BlobStoreError,
        LockTimeout, WorkspaceNotFound.
        """
        if not isinstance(title, str) or not title.strip():
            raise InvalidInput("an artifact needs a non-empty title")
        if "\x00" in title:
            raise InvalidInput("the artifact title contains a NUL character; remove it")
        title = " ".join(title.split())  # one line: it is the document title and the commit subject
        data, fmt, attached = _markdown_bytes(markdown), _check_format(format), _check_files(files)
        author = author or self._default_author()
        stored = self._store_blobs(attached)
        repo, name = self.store.repository, safe_filename(title)
        for _ in range(_NAME_RETRIES):
            head_tree = repo.tree_id(repo.head())
            taken = [n for n, _kind in repo.list_folder(head_tree, FOLDER[1:])]
            path = StorePath.parse(f"{FOLDER}/{unique_name(name, taken)}")
            manifest = Manifest("save", path.virtual, title, fmt, 1, stored)
            created: dict[str, int] = {}

            def record(conn, tree, _revision, path=path, manifest=manifest, created=created) -> None:
                taken_now = {name_key(n) for n, _kind in repo.list_folder(tree, FOLDER[1:])}
                if name_key(path.name) in taken_now:
                    raise _NameTaken(path.virtual)
                self._ensure_blobs(attached)
                created["id"] = write_manifest(conn, self.workspace_id, manifest)

            try:
                with self.store.transaction(self._message("save", manifest, message), author) as draft:
                    draft.artifact_access = ACCESS_ARTIFACT
                    draft.on_record.append(record)
                    draft.write(path, data)
            except _NameTaken:
                continue  # a concurrent revision took the name: choose again at the new HEAD
            return Artifact(
                created["id"], self.workspace_id, path.virtual, manifest.title, fmt, 1, draft.revision.id, stored
            )
        raise PathExists(f"could not find a free name for artifact {title!r} in {FOLDER}; retry")

    def _locked_row(self, conn, artifact_id: int, expected_generation: int | None, verb: str = "revise") -> dict:
        row = conn.execute(
            queries["artifact_for_update"], {"workspace_id": self.workspace_id, "document_id": artifact_id}
        ).fetchone()
        if row is None or row["document_type"] != "ARTIFACT":
            raise ArtifactNotFound(f"workspace {self.workspace_id} has no artifact {artifact_id} (deleted meanwhile?)")
        current = row["generation"] or 1
        if expected_generation is not None and expected_generation != current:
            raise StaleGeneration(artifact_id, expected_generation, current, self.workspace_id, verb)
        return row

    def revise(
        self,
        artifact_id: int,
        expected_generation: int,
        markdown: str | bytes | None = None,
        files: Mapping[str, bytes] | None = None,
        author: str | None = None,
        message: str | None = None,
    ) -> Artifact:
        """Record a new generation of an artifact (design §11): ``markdown`` replaces the document
        (None keeps it), ``files`` replaces the whole set of attached files (None keeps them).

        The generation check-and-bump happens under the workspace write lock in the revision's
        transaction, so of concurrent revisions naming the same generation exactly one wins.
        A markdown change is a new git revision (history, ``kb restore`` work as for any document);
        a files-only revision bumps the generation without a git revision (``revision`` is None).
        Raises StaleGeneration (naming the current generation), ArtifactNotFound, InvalidInput.
        """
        if isinstance(expected_generation, bool) or not isinstance(expected_generation, int):
            raise InvalidInput(f"expected_generation must be an integer, got {expected_generation!r}")
        if markdown is None and files is None:
            raise InvalidInput("nothing to revise: give markdown, files, or both")
        data = None if markdown is None else _markdown_bytes(markdown)
        attached = None if files is None else _check_files(files)
        author = author or self._default_author()
        current = self.get(artifact_id)  # raises ArtifactNotFound; gives the path and current files
        if expected_generation != current.generation:
            raise StaleGeneration(artifact_id, expected_generation, current.generation, self.workspace_id)
        stored = current.files if attached is None else self._store_blobs(attached)
        kept = {f.role: f for f in current.files}
        result: dict = {}

        def record(conn, _tree, _revision) -> None:
            row = self._locked_row(conn, artifact_id, expected_generation)
            if attached is not None:
                self._ensure_blobs(attached)
            else:  # keep the files as they are now (under the lock), not as first read
                rows = conn.execute(queries["artifact_files"], {"document_ids": [artifact_id]}).fetchall()
                kept.clear()
                kept.update({f["role"]: ArtifactFile(f["role"], f["size"], f["sha256"]) for f in rows})
            files_now = tuple(kept.values()) if attached is None else stored
            manifest = Manifest(
                "revise", row["path"], row["title"], row["format"] or "markdown", expected_generation + 1, files_now
            )
            write_manifest(conn, self.workspace_id, manifest, document_id=artifact_id)
            result["manifest"] = manifest

        planned = Manifest("revise", current.path, current.title, current.format, expected_generation + 1, stored)
        revision: Revision | None = None
        if data is not None:
            with self.store.transaction(self._message("revise", planned, message), author) as draft:
                draft.artifact_access = ACCESS_ARTIFACT
                draft.on_record.append(record)
                draft.write(current.path, data)
            revision = draft.revision
        if revision is None:  # no markdown change: the rows alone, under the same lock
            self._locked_rows_only(record)
        if attached is not None:
            self.purge()  # blobs only the previous generation used
        manifest = result["manifest"]
        return Artifact(
            artifact_id,
            self.workspace_id,
            manifest.path,
            manifest.title,
            manifest.format,
            manifest.generation,
            revision.id if revision else None,
            manifest.files,
        )

    def _locked_rows_only(self, record: Callable) -> None:
        """Run ``record(conn, head_tree)`` under the write lock after catching Postgres up with git."""
        store = self.store
        with locked_transaction(store.database_url, self.workspace_id, store.settings) as (conn, _):
            store.catch_up(conn)
            record(conn, None, None)

    def delete(
        self,
        artifact_id: int,
        expected_generation: int | None = None,
        author: str | None = None,
        message: str | None = None,
    ) -> Revision | None:
        """Delete an artifact (design §11): its markdown is removed in one revision (history keeps the
        old text), its rows go, and blobs nothing else references are purged from disk. A purge that
        fails is logged and retried by the sweep; no row ever points at a missing blob.

        ``expected_generation`` (optional) guards against deleting a revision you have not seen.
        Returns the revision (None when the file was already gone from git). Raises
        ArtifactNotFound, StaleGeneration.
        """
        author = author or self._default_author()
        current = self.get(artifact_id)
        if expected_generation is not None and expected_generation != current.generation:
            raise StaleGeneration(artifact_id, expected_generation, current.generation, self.workspace_id, "delete")
        manifest = Manifest("delete", current.path, current.title, current.format, current.generation, current.files)

        def record(conn, _tree, revision_id) -> None:
            # Lock order (kb.locks): the chunk lock before the artifact's row, whose delete
            # cascades to its chunks and their statistics (as a projection's or an index run's).
            chunk_lock(conn, self.workspace_id)
            self._locked_row(conn, artifact_id, expected_generation, "delete")
            delete_rows(conn, self.workspace_id, artifact_id)
            announce_deleted(conn, self.workspace_id, artifact_id, current.path, revision_id)

        revision = None
        repo = self.store.repository
        if repo.lookup(repo.tree_id(repo.head()), current.path[1:]) is not None:
            with self.store.transaction(self._message("delete", manifest, message), author) as draft:
                draft.artifact_access = ACCESS_ARTIFACT
                draft.on_record.append(record)
                draft.remove(current.path)
            revision = draft.revision
        if revision is None:
            self._locked_rows_only(record)
        self.purge()
        return revision

    def purge(self) -> builtins.list[str]:
        """Remove blobs with a purge entry that no artifact references, under the write lock (so a
        concurrent save re-creates rather than loses a blob it needs). Returns the sha256s removed;
        a failure is logged, counted on its entry and left for the sweep to retry."""
        store = self.store
        with locked_transaction(store.database_url, self.workspace_id, store.settings) as (conn, _):
            store.catch_up(conn)
            return self._purge_pending(conn)

    def _purge_pending(self, conn) -> builtins.list[str]:
        removed = []
        for entry in conn.execute(queries["pending_blob_purges"], {"workspace_id": self.workspace_id}).fetchall():
            params = {"workspace_id": self.workspace_id, "sha256": entry["sha256"]}
            if not conn.execute(queries["blob_referenced"], params).fetchone()["referenced"]:
                try:
                    self.blobs.remove(entry["sha256"])
                except OSError as exc:
                    log.warning(
                        "workspace %s: artifact blob %s not purged (%s); the sweep retries",
                        self.workspace_id,
                        entry["sha256"],
                        exc,
                    )
                    conn.execute(queries["fail_blob_purge"], {**params, "error": str(exc)[:500]})
                    continue
                removed.append(entry["sha256"])
            conn.execute(queries["finish_blob_purge"], params)
        return removed

    def check(self, temp_file_age: float = 3600.0) -> ArtifactCheck:
        """``kb fsck`` for artifacts, under the write lock: every file row's blob must exist and
        hash to its address (problems are reported, never "repaired" by guessing); pending purges
        run; orphan blobs (on disk, referenced by no row — e.g. a save killed before it recorded
        its revision) are removed, and so are temp files of interrupted writes older than
        ``temp_file_age`` seconds. Returns an :class:`ArtifactCheck`."""
        store, result = self.store, ArtifactCheck()
        with locked_transaction(store.database_url, self.workspace_id, store.settings) as (conn, _):
            store.catch_up(conn)
            result.purged = self._purge_pending(conn)
            rows = conn.execute(queries["workspace_artifact_files"], {"workspace_id": self.workspace_id}).fetchall()
            referenced = set()
            for row in rows:
                referenced.add(row["sha256"])
                problem = self.blobs.verify(row["sha256"])
                if problem is not None:
                    result.problems.append(
                        f"{row['path']} (artifact {row['document_id']}) file "
                        f"{row['role']!r} blob {row['sha256']}: {problem}"
                    )
            cutoff = time.time() - temp_file_age
            orphans = [(self.blobs.path(sha), False) for sha in self.blobs.addresses() if sha not in referenced]
            orphans += [(temp, True) for temp in self.blobs.temp_files()]
            for path, is_temp in orphans:
                try:
                    if is_temp and path.stat().st_mtime >= cutoff:
                        continue  # a save may still be writing it
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    result.problems.append(f"unreferenced artifact blob {path} cannot be removed: {exc}")
                    continue
                result.orphans_removed.append(path.name)
        return result


@dataclass
class ArtifactCheck:
    """What ``Artifacts.check`` found: ``problems`` (missing or corrupt blobs: fsck fails),
    ``orphans_removed`` (blobs/temp files no row referenced), ``purged`` (pending purges done)."""

    problems: list[str] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)
    purged: list[str] = field(default_factory=list)
