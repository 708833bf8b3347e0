"""One workspace's reads and writes, handed out by ``KnowledgeBase.workspace(id)`` (design §3):
``ws = kb.workspace(1); ws.read("/documents/a.md"); with ws.transaction("msg") as tx: ...``.

The reads go to the workspace's store; the writes name the OS user as author when the caller
names nobody; ``artifacts()``, ``remote()``, ``fsck()`` and ``import_folder()`` hand out or run the
workspace services built on the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kb.store import reverts
from kb.store.authors import default_author
from kb.store.draft import check_removable

if TYPE_CHECKING:
    from kb.store.draft import Draft
    from kb.store.history import PathChange, Revision
    from kb.store.importer import ImportProgress, ImportReport
    from kb.store.knowledge_store import KnowledgeStore
    from kb.store.listing import Entry
    from kb.workspace.artifacts import Artifacts
    from kb.workspace.blame import Blame
    from kb.workspace.fsck import FsckReport
    from kb.workspace.remotes import Remote


class Workspace:
    """The reads and writes of one workspace (design §3), over its ``KnowledgeStore``."""

    def __init__(self, store: KnowledgeStore) -> None:
        self.store = store
        self.id = store.workspace_id

    # -- reads ---------------------------------------------------------------------------
    def head(self) -> str | None:
        """Newest revision id (None when empty)."""
        return self.store.head()

    def read(self, path: str, revision: str | None = None) -> bytes:
        """Bytes of a document at HEAD or ``revision``. Raises InvalidPath, RevisionNotFound,
        IsAFolder, DocumentNotFound, WorkspaceNotFound."""
        return self.store.read(path, revision)

    def ls(self, path: str = "/documents", revision: str | None = None) -> list[Entry]:
        """A folder's entries at HEAD or ``revision``: ``Entry(name, path, kind)``, folders first,
        by name; a document path lists itself. Raises InvalidPath, RevisionNotFound,
        DocumentNotFound ("did you mean …?" for another case)."""
        return self.store.ls(path, revision)

    def list_paths(self, revision: str | None = None) -> dict[str, str]:
        """``{virtual path: content id}`` at HEAD or ``revision``."""
        return self.store.list_paths(revision)

    def list_changes(self, revision: str) -> list[PathChange]:
        """Changes a revision made, recorded moves included."""
        return self.store.list_changes(revision)

    def history(self, path: str | None = None, limit: int = 50) -> list[Revision]:
        """Revisions newest first, from Postgres; for a path, following its moves (``kb log``)."""
        return self.store.history(path, limit)

    def revision(self, revision: str) -> Revision:
        """One recorded revision with every path it changed (``KnowledgeStore.revision``).
        Raises RevisionNotFound."""
        return self.store.revision(revision)

    def blame(self, path: str) -> Blame:
        """Each line of a document at HEAD with the revision that last changed it
        (``kb.workspace.blame``, design §17). Raises InvalidPath, DocumentNotFound, IsAFolder."""
        from kb.workspace.blame import blame

        return blame(self.store, path)

    # -- writes --------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(
        self,
        message: str | None = None,
        author: str | None = None,
        committer: str | None = None,
        idempotency_key: str | None = None,
    ) -> Iterator[Draft]:
        """``with ws.transaction("msg", "alice") as tx: tx.write(...)`` → ``tx.revision``: one
        revision per clean exit, None when net-empty, nothing on exception (design §3).
        ``idempotency_key``: a retry with the key of a write that landed records nothing and gets
        that write's revision; a failure of Postgres is settled before the call answers
        (``KnowledgeStore.transaction``, design §3)."""
        with self.store.transaction(message, author or default_author(), committer, idempotency_key) as draft:
            yield draft

    def write_outcome(self, idempotency_key: str) -> Revision | None:
        """The revision a write with ``idempotency_key`` recorded, or None (design §3)."""
        return self.store.write_outcome(idempotency_key)

    def move(
        self,
        source: str,
        destination: str,
        *,
        overwrite: bool = False,
        message: str | None = None,
        author: str | None = None,
        idempotency_key: str | None = None,
    ) -> Revision | None:
        """Move a document or folder in one revision; history follows it (``kb mv``). Returns the
        revision (None: nothing moved); ``idempotency_key`` as in :meth:`transaction`. Raises
        DocumentNotFound, PathExists, InvalidPath."""
        with self.transaction(message, author, idempotency_key=idempotency_key) as draft:
            draft.move(source, destination, overwrite=overwrite)
        return draft.revision

    def remove(
        self,
        paths: list[str],
        *,
        message: str | None = None,
        author: str | None = None,
        idempotency_key: str | None = None,
    ) -> Revision | None:
        """Remove documents or folders (every document under one) in one revision (``kb rm``);
        history keeps them: ``kb log``/``kb read -r`` show them, ``kb revert`` brings them back.
        Returns the revision; ``idempotency_key`` as in :meth:`transaction`. Raises DocumentNotFound (a path with nothing there: nothing is
        removed), InvalidPath (the /documents root among them)."""
        for path in paths:
            check_removable(path, self.id)
        with self.transaction(message, author, idempotency_key=idempotency_key) as draft:
            for path in paths:
                draft.remove(path)
        return draft.revision

    def revert(
        self,
        revision: str,
        author: str | None = None,
        committer: str | None = None,
        message: str | None = None,
        idempotency_key: str | None = None,
    ) -> Revision | None:
        """Record a forward revision undoing ``revision``; None when nothing to undo (design §3).
        ``idempotency_key`` as in :meth:`transaction`."""
        return reverts.revert(self.store, revision, author or default_author(), committer, message, idempotency_key)

    def restore(
        self,
        path: str,
        revision: str,
        author: str | None = None,
        committer: str | None = None,
        message: str | None = None,
        idempotency_key: str | None = None,
    ) -> Revision | None:
        """Bring one document back as it was at ``revision``, as a new revision (design §3).
        ``idempotency_key`` as in :meth:`transaction`."""
        return reverts.restore(
            self.store, path, revision, author or default_author(), committer, message, idempotency_key
        )

    def import_folder(
        self,
        source: Path | str,
        *,
        prefix: str | None = None,
        prune: bool = False,
        message: str | None = None,
        author: str | None = None,
        idempotency_key: str | None = None,
        progress: ImportProgress | None = None,
        dry_run: bool = False,
    ) -> ImportReport:
        """Import a folder of markdown as one revision (``kb import``); ``idempotency_key`` as in
        ``transaction``; ``progress`` hears the import's phases (``kb.store.importer.ImportProgress``);
        ``dry_run``: record nothing, the report says what the import would do."""
        from kb.store.importer import import_folder

        return import_folder(
            self.store,
            Path(source),
            prefix=prefix,
            prune=prune,
            message=message,
            author=author or default_author(),
            idempotency_key=idempotency_key,
            progress=progress,
            dry_run=dry_run,
        )

    # -- maintenance and services ----------------------------------------------------------
    def reconcile(self) -> list[Revision]:
        """Record revisions git has and Postgres lacks, deferring their jobs (design §3)."""
        return self.store.reconcile()

    def fsck(self) -> FsckReport:
        """git's consistency check, stale-lock and working-tree repair, reconcile (``kb fsck``)."""
        from kb.workspace.fsck import fsck

        return fsck(self.store)

    def artifacts(self) -> Artifacts:
        """The workspace's artifacts (design §11): save, revise, get, list, read_file, delete."""
        from kb.workspace.artifacts import Artifacts

        return Artifacts(self.store, default_author)

    def remote(self) -> Remote:
        """The workspace's push-only git remote (design §13): add, status, remove, push, defer_push."""
        from kb.workspace.remotes import Remote

        return Remote(self.store)
