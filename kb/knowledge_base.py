"""``KnowledgeBase``: the one facade the CLI, the jobs and library users call (design §18).

Open it from settings (``KnowledgeBase.open()``): it resolves the database (embedded by default)
and applies the schema. It owns the lifecycle (``open``, ``migrate``, ``close``) and hands out what
works on one workspace — ``workspace(id)`` (reads and writes), ``turn``, ``conversation``,
``artifacts``, ``remote`` — and the knowledge-base-wide services (index, worker, legacy migration).
Its per-workspace methods (``read``, ``transaction``, ``history`` …) are the documented API,
kept as one-line forwards to ``workspace(id)``; the logic lives in the modules they call.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kb.citations.envelope import Envelope, document_lines
from kb.db import database
from kb.db.migrations import MigrationReport, apply_migrations, schema_is_current
from kb.db.nodes import Node, WorkspaceHome, forget_node, list_nodes, same_storage
from kb.db.nodes import register as register_node
from kb.db.publication import PublicationStatus, ensure_publication
from kb.db.sql import queries
from kb.errors import DatabaseUnavailable, DimensionMismatch
from kb.paths import StorePath, check_storage_root
from kb.settings import Settings
from kb.store.authors import default_author
from kb.store.draft import Draft
from kb.store.history import PathChange, Revision
from kb.store.homes import adopt_homeless, home_of
from kb.store.knowledge_store import KnowledgeStore, check_commit_text, check_workspace_id
from kb.store.projection import ProjectionResult
from kb.store.stores import Stores
from kb.store.titles import recorded_title

if TYPE_CHECKING:
    from kb.citations.conversation import Conversation
    from kb.db.database import Connection
    from kb.db.tokens import TokenStore
    from kb.git.repository import Repository
    from kb.git.worktree import JanitorReport

    # Imported where used: numpy, the chunker's tokenizer and the model stay unloaded for
    # commands that need none of them (design §13).
    from kb.index.chunking import LazyChunker
    from kb.index.embedding import Embedder
    from kb.index.freshness import IndexFreshness
    from kb.index.indexer import IndexReport
    from kb.index.models import ModelSet
    from kb.jobs.worker import WorkerReport
    from kb.legacy.drift import DriftReport
    from kb.legacy.seed import SeedReport
    from kb.legacy.span_fill import SpanFill
    from kb.store.importer import ImportProgress, ImportReport
    from kb.store.listing import Entry
    from kb.turns.open_turns import Admission, OpenTurns
    from kb.turns.turn import CommitResult, Turn
    from kb.workspace.artifacts import Artifacts
    from kb.workspace.blame import Blame
    from kb.workspace.fsck import FsckReport
    from kb.workspace.handle import Workspace
    from kb.workspace.lifecycle import DeletedWorkspace, WorkspaceSummary
    from kb.workspace.moves import MoveReport
    from kb.workspace.remotes import Remote
    from kb.workspace.repository_copy import ReceivedCopy


__all__ = ["KnowledgeBase", "default_author"]


class KnowledgeBase:
    """kb's public surface over one database and one storage root."""

    def __init__(self, settings: Settings, database_url: str) -> None:
        """Raises ConfigurationError when the storage root is too deep for the path law (design §2.3)."""
        check_storage_root(settings.knowledge_store)
        self.stores = Stores(settings, database_url)
        self._embedder: Embedder | None = None
        self._embedder_installed = False  # use_embedder() by a caller: workspaces without a model use it
        self._models: ModelSet | None = None
        self._open_turns: OpenTurns | None = None  # made by the first turn (one-shot commands open none)
        self._open_turns_made = threading.Lock()
        self._embedder_made = threading.Lock()
        self._models_made = threading.Lock()

    @property
    def settings(self) -> Settings:
        """The settings this KnowledgeBase was opened with."""
        return self.stores.settings

    @property
    def database_url(self) -> str:
        """The URL of kb's database (the embedded server's unless ``KB_DATABASE_URL``)."""
        return self.stores.database_url

    @classmethod
    def open(
        cls,
        settings: Settings | None = None,
        *,
        migrate: bool = True,
        reuse_connection: bool = False,
        create: bool = True,
    ) -> KnowledgeBase:
        """Open kb from settings (environment ``KB_*`` when None), applying pending migrations.

        ``reuse_connection`` (a one-shot command, design §13): the connection that found the
        schema current is kept (``database.park``) for the first connection the caller opens
        within ``database.PARKED_SECONDS``, instead of being closed. ``create=False`` (a command
        that only reads): raise KnowledgeBaseNotFound rather than create and start a new embedded
        database in a storage root that holds none (design §2.1, §13).
        Raises DatabaseUnavailable, DatabaseNotReady (no pgvector), MigrationError, KnowledgeBaseNotFound.
        """
        settings = settings or Settings()
        kb = cls(settings, database.resolve_database_url(settings, create=create))
        if migrate:
            kb._ensure_schema(reuse_connection)
        return kb

    def _ensure_schema(self, reuse_connection: bool = False) -> None:
        """Migrate only when something is to do: a current schema costs one connection and two
        reads (``schema_is_current``), not the migration lock and pgvector probe (design §13).
        Whatever the quick read cannot vouch for goes to ``migrate()``, which reports errors.
        ``reuse_connection``: park the connection for the caller's next one (see ``open``)."""
        try:
            conn = database.connect(self.database_url)
        except DatabaseUnavailable:
            if self.settings.database_url:
                raise
            # The embedded server's quick check vouched for a server or database that is gone
            # (dropped, or its postmaster replaced): make the full check once, then connect.
            self.stores.database_url = database.recheck_embedded(self.settings)
            conn = database.connect(self.database_url)
        if reuse_connection:
            current = database.check_then_park(conn, self.database_url, schema_is_current)
        else:
            with conn:
                current = schema_is_current(conn)
        if not current:
            self.migrate()

    def close(self) -> None:
        """Close what this KnowledgeBase opened: its workspaces' git repositories and the turns
        it holds open (their worktrees stay for a later commit or the janitor). Idempotent; the
        object stays usable (a later call reopens what it needs). ``with KnowledgeBase.open() as
        kb:`` calls it on exit (design §13)."""
        if self._open_turns is not None:
            self._open_turns.close_all()
        self.stores.close()

    def close_idle_turns(self, idle_seconds: float) -> int:
        """Release the turns this KnowledgeBase holds open that no ``turn()`` call asked for in the
        last ``idle_seconds`` (``kb serve`` every few minutes, ``KB_TURN_IDLE_SECONDS``): nothing is
        committed or deleted — a later ``turn()`` of the same id takes its worktree up again, and
        the janitor removes one idle past ``KB_WORKTREE_TTL`` (design §5). Returns how many."""
        return 0 if self._open_turns is None else self._open_turns.close_idle(idle_seconds)

    def open_turns(self) -> list[tuple[int, str]]:
        """``(workspace id, root turn id)`` of the turns this KnowledgeBase holds open (design §5):
        made by ``turn()`` and not yet committed, aborted or released."""
        return [] if self._open_turns is None else self._open_turns.open_keys()

    def admit_turns(self, admission: Admission) -> None:
        """Have ``admission(key, open_keys)`` decide, for each turn of this KnowledgeBase about to
        become open — a new one, or one reused after its commit or idle release — whether it may,
        under the lock that makes it open: it raises (a KbError, which the turn's call raises;
        nothing is opened) or returns. ``key`` and ``open_keys`` are ``(workspace id, root turn
        id)`` as ``open_turns()`` gives them. A commit or abort is never refused. ``kb serve``
        bounds each token's open turns with it (design §16)."""
        with self._open_turns_made:
            if self._open_turns is None:
                from kb.turns.open_turns import OpenTurns

                self._open_turns = OpenTurns()
            self._open_turns.admission = admission

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def migrate(self) -> MigrationReport:
        """Apply the schema and pending migrations, Procrastinate's included (design §12)."""
        with database.connect(self.database_url) as conn:
            database.require_pgvector(conn, self.database_url)
            conn.commit()
            return apply_migrations(conn)

    # -- workspaces and the store (design §2, §3) ------------------------------------------
    def store(self, workspace_id: int) -> KnowledgeStore:
        """The store of one workspace (raises InvalidWorkspace for a non-positive id)."""
        return self.stores.store(workspace_id)

    def workspace(self, workspace_id: int) -> Workspace:
        """One workspace's reads and writes (``kb.workspace.handle.Workspace``): head, read, ls,
        list_paths, list_changes, history, transaction, move, revert, restore, import_folder,
        reconcile, fsck, artifacts, remote (design §3). Raises InvalidWorkspace for a bad id."""
        from kb.workspace.handle import Workspace

        return Workspace(self.store(workspace_id))

    def create_workspace(self, workspace_id: int) -> bool:
        """Create a workspace (repo + row); True when it did not exist."""
        return self.store(workspace_id).create()

    def workspaces(self) -> list[dict]:
        """All workspace rows."""
        with database.transaction(self.database_url) as conn:
            return conn.execute(queries["list_workspaces"]).fetchall()

    @contextlib.contextmanager
    def transaction(
        self,
        workspace_id: int,
        message: str | None = None,
        author: str | None = None,
        committer: str | None = None,
        idempotency_key: str | None = None,
    ) -> Iterator[Draft]:
        """``with kb.transaction(1, "msg", "alice") as tx: tx.write(...)`` → ``tx.revision``.

        Operations apply in call order; one revision per clean exit, None when net-empty, nothing
        on exception (design §3). ``idempotency_key``: a retry with the key of a write that landed
        records nothing and gets that write's revision (design §3); a failure of Postgres is
        settled before the call answers (``KnowledgeStore.transaction``). Raises as that method.
        """
        with self.workspace(workspace_id).transaction(message, author, committer, idempotency_key) as draft:
            yield draft

    def write_outcome(self, workspace_id: int, idempotency_key: str) -> Revision | None:
        """The revision a write with ``idempotency_key`` recorded, or None when it recorded none
        (design §3): the call that settles CommitOutcomeUnknown. Raises InvalidInput,
        WorkspaceNotFound, HistoryDiverged, LockTimeout, DatabaseUnavailable."""
        return self.store(workspace_id).write_outcome(idempotency_key)

    def head(self, workspace_id: int) -> str | None:
        """Newest revision id of a workspace (None when empty)."""
        return self.workspace(workspace_id).head()

    def read(self, workspace_id: int, path: str, revision: str | None = None) -> bytes:
        """Bytes of a document at HEAD or ``revision`` (design §3)."""
        return self.workspace(workspace_id).read(path, revision)

    def read_as_of(self, workspace_id: int, revision: str, path: str) -> bytes:
        """Bytes of a document at ``revision`` (design §3, §8)."""
        return self.store(workspace_id).read_as_of(revision, path)

    def ls(self, workspace_id: int, path: str = "/documents", revision: str | None = None) -> list[Entry]:
        """A folder's entries at HEAD or ``revision`` (``kb ls``): ``Entry(name, path, kind)`` with
        ``kind`` "folder" or "file", folders first, by name; a document path lists itself. The
        committed counterpart of ``Turn.ls`` (the MCP ``ls`` tool). Raises InvalidPath,
        RevisionNotFound, DocumentNotFound (nothing there; "did you mean …?" for another case)."""
        return self.workspace(workspace_id).ls(path, revision)

    def list_paths(self, workspace_id: int, revision: str | None = None) -> dict[str, str]:
        """``{virtual path: content id}`` at HEAD or ``revision``."""
        return self.workspace(workspace_id).list_paths(revision)

    def list_changes(self, workspace_id: int, revision: str) -> list[PathChange]:
        """Changes a revision made, recorded moves included."""
        return self.workspace(workspace_id).list_changes(revision)

    def history(self, workspace_id: int, path: str | None = None, limit: int = 50) -> list[Revision]:
        """Revisions newest first, from Postgres; for a path, following its moves (design §3)."""
        return self.workspace(workspace_id).history(path, limit)

    def revision(self, workspace_id: int, revision: str) -> Revision:
        """One recorded revision (author, committer, message, time) with every path it changed,
        moves as moves (design §3, §17). Raises RevisionNotFound, InvalidWorkspace."""
        return self.workspace(workspace_id).revision(revision)

    def blame(self, workspace_id: int, path: str) -> Blame:
        """Each line of a document at HEAD with the revision that last changed it, from the
        recorded history (``kb.workspace.blame``, design §17). Raises InvalidPath,
        DocumentNotFound, IsAFolder, WorkspaceNotFound."""
        return self.workspace(workspace_id).blame(path)

    def import_folder(
        self,
        source: Path | str,
        workspace_id: int,
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
        ``transaction`` (design §3); ``progress(phase, done, total)`` hears the import at work
        (``kb.store.importer.ImportProgress``); ``dry_run``: record nothing, the report says what
        the import would do (``kb import --dry-run``)."""
        return self.workspace(workspace_id).import_folder(
            source,
            prefix=prefix,
            prune=prune,
            message=message,
            author=author,
            idempotency_key=idempotency_key,
            progress=progress,
            dry_run=dry_run,
        )

    # -- derived index (design §6, §7) -----------------------------------------------------
    @property
    def embedder(self) -> Embedder:
        """The active embedder (loaded on first use); checks the database's vector dimension."""
        embedder = self._embedder
        if embedder is None:
            from kb.index.embedding import LazyEmbedder

            with self._embedder_made:  # one embedder for every thread (docs/python-api.md "Threads")
                if self._embedder is None:
                    self.use_embedder(LazyEmbedder(self.settings))  # the model loads on first embed()
                    self._embedder_installed = False
                embedder = self._embedder
        return embedder

    @property
    def models(self) -> ModelSet:
        """The embedders of the models workspaces record (kb.index.models), one per model."""
        if self._models is None:
            from kb.index.models import ModelSet

            with self._models_made:
                if self._models is None:
                    self._models = ModelSet(self.settings)
        return self._models

    def share_embedders(self, other: KnowledgeBase) -> None:
        """Use ``other``'s default embedder and per-workspace models (``kb serve``: one load of
        each model for all its threads' KnowledgeBase objects)."""
        self._embedder = other.embedder
        self._embedder_installed = other._embedder_installed
        self._models = other.models

    def embedder_for(self, workspace_id: int, conn: Connection | None = None) -> Embedder:
        """The embedder of the model ``workspace_id`` records (``kb.workspaces.embedder``), or the
        default (``embedder``) when it records none (or has no row) or the same model (design §7).
        Loads nothing. Raises ConfigurationError (the recorded model's package is missing)."""
        from psycopg.pq import TransactionStatus

        from kb.index import models

        if conn is None:
            with database.pooled_connection(self.database_url) as own, own.transaction():
                name, _ = models.recorded(own, workspace_id)
        elif conn.autocommit:
            name, _ = models.recorded(conn, workspace_id)
        elif conn.info.transaction_status == TransactionStatus.IDLE:  # one round trip, not BEGIN … COMMIT
            conn.autocommit = True
            try:
                name, _ = models.recorded(conn, workspace_id)
            finally:
                if not conn.closed:
                    conn.autocommit = False
        else:
            with conn.transaction():
                name, _ = models.recorded(conn, workspace_id)
        default = self.embedder
        if name is None:
            return default
        embedder = self.models.embedder(name)
        return default if embedder.model == default.model else embedder

    def _index_embedder(self, workspace_id: int, repo: Repository) -> Embedder:
        """The embedder an index run uses, resolved under the workspace's index lock: the recorded
        model's; at a workspace's first run (no model recorded, no chunks yet) the default's
        name — with ``KB_EMBEDDING_MODEL=auto`` the model auto picks by the documents' languages
        — is recorded first. A caller's own embedder (use_embedder) is never recorded."""
        from kb.index import models

        with database.connect(self.database_url, autocommit=True) as conn:
            name, _ = models.recorded(conn, workspace_id)
            if name is None and not self._embedder_installed:
                vectors = conn.execute(queries["workspace_vector_models"], {"workspace_id": workspace_id}).fetchall()
                if not vectors:  # never indexed: choose now, so a later default never mixes models
                    configured: str | None = self.settings.embedding_model.strip()
                    if configured == "auto":
                        languages = models.workspace_languages(conn, repo, workspace_id)
                        # no document yet: nothing to pick by, so the choice waits for one
                        configured = models.auto_choice(languages) if languages else None
                    if configured is not None:
                        models.pin(conn, workspace_id, configured)
            return self.embedder_for(workspace_id, conn)

    @functools.cached_property
    def chunker(self) -> LazyChunker:
        """The chunker (chunk size in model tokens, design §7)."""
        from kb.index.chunking import LazyChunker

        return LazyChunker(self.settings.chunk_size)  # chonkie and the tokenizer load on first cut

    def project(self, workspace_id: int, *, force: bool = False) -> ProjectionResult:
        """Converge documents/folders rows to HEAD in one transaction, sending ``kb_events`` on
        commit (design §6); what the ``kb.project_changes`` job runs. Raises WorkspaceNotFound."""
        return self.stores.project(workspace_id, force=force)

    def rebuild_projection(self, workspace_id: int) -> ProjectionResult:
        """Re-derive documents/folders rows from HEAD even if HEAD is already projected
        (``kb rebuild-projection``, design §1, §6): missing folder rows come back, drifted rows are
        repaired, and no row whose file exists is deleted, so ids stay stable for replicas."""
        return self.project(workspace_id, force=True)

    def publication_status(self) -> PublicationStatus:
        """Create ``kb_publication`` if missing and allowed; say whether subscribers can stream it
        and what to change if not (design §6)."""
        with database.transaction(self.database_url) as conn:
            return ensure_publication(conn)

    def index(self, workspace_id: int, progress: Callable[[int, int, IndexReport], None] | None = None) -> IndexReport:
        """Project and index a workspace up to HEAD in this process (what the index job runs)."""
        self.store(workspace_id).require_exists()
        from kb.index.indexer import Indexer

        indexer = Indexer(
            self.settings, self.database_url, self.embedder, self.chunker, progress, embedder_for=self._index_embedder
        )
        return indexer.converge(workspace_id)

    def run_worker(self, until_idle: bool = False, concurrency: int = 1, display=None) -> WorkerReport:
        """Run the Procrastinate worker for kb's queues (``kb worker``); with ``until_idle`` return
        once no job is due or runnable (design §7). ``display``: a
        ``kb.jobs.worker.ProgressDisplay`` for per-job progress. Returns a ``kb.jobs.worker.WorkerReport``."""
        from kb.jobs.worker import run_worker

        return run_worker(self, until_idle=until_idle, concurrency=concurrency, display=display)

    # -- reads for people and agents (design §8) -------------------------------------------
    def search(self, workspace_id: int, query: str, k: int = 5) -> list[Envelope]:
        """Hybrid search → excerpt envelopes with true line numbers (design §8).

        Raises InvalidInput for an empty, over-long or NUL-bearing query or k outside 1..100,
        HistoryDiverged when the workspace's repository is not its own or is behind Postgres.
        """
        from kb.index.embedding import model_cache
        from kb.index.languages import cache_in
        from kb.search.hybrid import check_query
        from kb.search.hybrid import search as hybrid_search

        check_query(query, k)
        cache_in(model_cache(self.settings))  # the query's language model, unpacked once (design §7)
        store = self.store(workspace_id)
        repo = store.repository
        with database.pooled_connection(self.database_url) as conn:
            store.check_repository(conn)  # never answer from a repository behind Postgres (design §3)
            embedder = self.embedder_for(workspace_id, conn)  # the workspace's own model (design §7)
            found = hybrid_search(conn, repo, embedder, workspace_id, query, k)
        if not found and not store.exists():
            # deleted (by another process) since this object opened it: its rows are gone, so the
            # search found nothing, but that is no answer for a workspace that is not there
            self.stores.forget(workspace_id)
            self.store(workspace_id).require_exists()  # unless re-created meanwhile
        return found

    def index_freshness(self, workspace_id: int) -> IndexFreshness:
        """How far the workspace's index lags its head (``kb search`` warns with its ``hint()``;
        design §7, §8). Zeros for a workspace that does not exist; raises
        InvalidWorkspace for a bad id."""
        from kb.index.freshness import index_freshness

        return index_freshness(self.database_url, check_workspace_id(workspace_id))

    def read_document(self, workspace_id: int, path: str, revision: str | None = None) -> Envelope:
        """The full-view envelope of one document at HEAD or ``revision`` (design §8); ``.window(offset,
        limit)`` cuts it. Raises InvalidPath, RevisionNotFound, IsAFolder, DocumentNotFound,
        HistoryDiverged (design §3)."""
        store = self.store(workspace_id)
        target = StorePath.parse(path)
        revision = store.repository.resolve(revision) if revision else store.head()
        data = store.read(target, revision)
        with database.connect(self.database_url) as conn:
            store.check_repository(conn)  # never answer from a repository behind Postgres (design §3)
            row = conn.execute(
                queries["document_by_path"], {"workspace_id": workspace_id, "path": target.virtual}
            ).fetchone()
            title = row["title"] if row else recorded_title(conn, workspace_id, target.virtual)
        title = title or target.name.removesuffix(".md")
        lines = list(enumerate(document_lines(data), start=1))
        return Envelope(target.virtual, title, revision, "full", lines)

    def document_record(self, workspace_id: int, path: str) -> dict | None:
        """The projected row of the document at ``path`` (design §6): ``{id, path, title,
        document_type, metadata, content_id, status, indexed_revision}``, or None when the
        projection has no row for it (not projected yet, or no such document). Raises InvalidPath,
        InvalidWorkspace."""
        target = StorePath.parse(path)
        with database.connect(self.database_url) as conn:
            return conn.execute(
                queries["document_by_path"], {"workspace_id": check_workspace_id(workspace_id), "path": target.virtual}
            ).fetchone()

    def conversation(self, workspace_id: int, chat_id: str) -> Conversation:
        """The chat ``chat_id``'s door to search, read and cite (design §8): a
        :class:`kb.citations.conversation.Conversation` (search, read, normalize, resolve, handles, forget).
        Raises InvalidChat, InvalidWorkspace, WorkspaceNotFound."""
        from kb.citations.conversation import Conversation

        store = self.store(workspace_id)
        return Conversation(
            store,
            chat_id,
            search=lambda query, k: self.search(workspace_id, query, k),
            read_document=lambda path, revision: self.read_document(workspace_id, path, revision),
        )

    def expire_citations(self) -> int:
        """Delete chats unused for ``KB_CITATION_TTL`` seconds with their handles (what the
        periodic ``kb.expire_citations`` task runs, design §8); returns how many chats."""
        from kb.citations import registry as citation_registry

        with database.transaction(self.database_url) as conn:
            return citation_registry.expire(conn, self.settings.citation_ttl)

    def status(self, workspace_id: int | None = None) -> dict:
        """Head, index stamp, job counts, chunk and document counts (``kb status``, ``kb.status``).
        Raises InvalidWorkspace for a bad id, WorkspaceNotFound for one that does not exist."""
        from kb.status import status

        store = None if workspace_id is None else self.store(workspace_id)
        return status(self.settings, self.database_url, store)

    def operator_view(self) -> dict:
        """What an operator watches (``kb.status.operator_view``, design §17): ``queues`` (per
        queue: waiting, running, failed, scheduled, oldest_waiting_seconds) and
        ``failed_documents`` (workspace_id, path, status, index_attempts, index_error)."""
        from kb.status import operator_view

        return operator_view(self.database_url)

    def retry_documents(self, workspace_id: int, paths: list[str] | None = None) -> list[str]:
        """Index a workspace's failed and quarantined documents (all, or ``paths``) again now:
        they become pending with no attempts counted, and an index job is deferred (design §7,
        §17). Returns the paths requeued (empty: none was failed). Raises InvalidWorkspace,
        WorkspaceNotFound."""
        from kb.jobs.sweep import retry_documents

        self.store(workspace_id).require_exists()
        return retry_documents(self.stores, check_workspace_id(workspace_id), paths)

    # -- store maintenance and undo (design §2.1, §3) ------------------------------
    def revert(
        self,
        workspace_id: int,
        revision: str,
        author: str | None = None,
        committer: str | None = None,
        message: str | None = None,
        idempotency_key: str | None = None,
    ) -> Revision | None:
        """Record a forward revision undoing ``revision`` (design §3); None when nothing to undo.
        ``idempotency_key`` as in ``transaction``."""
        return self.workspace(workspace_id).revert(revision, author, committer, message, idempotency_key)

    def restore(
        self,
        workspace_id: int,
        path: str,
        revision: str,
        author: str | None = None,
        committer: str | None = None,
        message: str | None = None,
        idempotency_key: str | None = None,
    ) -> Revision | None:
        """Bring one document back as it was at ``revision``, as a new revision (design §3).
        ``idempotency_key`` as in ``transaction``."""
        return self.workspace(workspace_id).restore(path, revision, author, committer, message, idempotency_key)

    def reconcile(self, workspace_id: int) -> list[Revision]:
        """Record revisions git has and Postgres lacks, deferring their jobs (design §3; the sweep)."""
        return self.workspace(workspace_id).reconcile()

    def fsck(self, workspace_id: int) -> FsckReport:
        """git's consistency check, stale-lock and working-tree repair, reconcile (``kb fsck``)."""
        return self.workspace(workspace_id).fsck()

    # -- the derived index's operations (design §7) ---------------------------------
    def use_embedder(self, embedder: Embedder) -> Embedder:
        """Make ``embedder`` the active one after checking it against the database.

        Raises DimensionMismatch naming both dimensions when ``kb.chunks.embedding`` is declared
        with another dimension than the model makes (the startup check of design §7).
        """
        with database.connect(self.database_url) as conn:
            dim = conn.execute(queries["chunk_vector_dimension"]).fetchone()["dim"]
        if dim is not None and dim != embedder.dim:
            raise DimensionMismatch(
                f"the database stores {dim}-d vectors (kb.chunks.embedding) but the embedding "
                f"model {embedder.model!r} makes {embedder.dim}-d vectors; choose a {dim}-d "
                "model (KB_EMBEDDING_MODEL) or migrate the column"
            )
        self._embedder = embedder
        self._embedder_installed = True
        self.models.add(embedder.model, embedder)  # a workspace recording its model uses it too
        return embedder

    def reindex(
        self, workspace_id: int, progress: Callable[[int, int, IndexReport], None] | None = None
    ) -> IndexReport:
        """Rebuild a workspace's index from git HEAD in this process, resuming an interrupted
        rebuild (what the ``kb.reindex`` job runs, design §7)."""
        self.store(workspace_id).require_exists()
        from kb.index.indexer import Indexer

        indexer = Indexer(
            self.settings, self.database_url, self.embedder, self.chunker, progress, embedder_for=self._index_embedder
        )
        return indexer.reindex(workspace_id)

    def set_model(self, workspace_id: int, name: str) -> int | None:
        """Switch ``workspace_id`` to embedding model ``name`` (``kb workspace set-model``, design
        §7): ``minilm``, ``use-m3``, ``e5-small``, ``hashing``, ``openai:<model>``, a model
        directory, or ``auto`` (the model auto picks for the workspace's documents now). Records
        the target and queues ``kb.switch_model``; search answers from the old vectors until the
        worker has re-embedded the workspace. Returns the job id, None when the workspace already
        uses the model (or a waiting job covers it). Any node may record a named model (Postgres
        only; the job runs on the home node's queue); ``auto`` reads the documents, so it runs on the
        home node. Raises ConfigurationError for an unknown model or one whose package is missing,
        WorkspaceNotFound."""
        from kb.index import models
        from kb.jobs import tasks as jobs

        if name.strip() == "auto":  # reads documents: the home node's repository (elsewhere: WrongNode)
            store = self.store(workspace_id)
            store.require_exists()
            with database.connect(self.database_url, autocommit=True) as conn:
                name = models.auto_choice(models.workspace_languages(conn, store.repository, workspace_id))
        return jobs.defer_model_switch(self.stores, workspace_id, models.normalize(name, self.settings))

    def switch_model(self, workspace_id: int, progress=None, between_passes=None):
        """Run the model switch ``set_model`` queued, in this process (what ``kb.switch_model``
        runs): re-embed through the cache, then swap every vector in one transaction. Returns a
        ``kb.index.model_switch.SwitchReport`` (action ``unchanged`` when no switch is pending).
        Raises WorkspaceNotFound, LockTimeout (an index run held the lock; retry)."""
        from kb.index import model_switch, models

        self.store(workspace_id).require_exists()
        with database.connect(self.database_url, autocommit=True) as conn:
            current, target = models.recorded(conn, workspace_id)
        if target is None:
            embedder = self.embedder_for(workspace_id)
            return model_switch.SwitchReport(workspace_id, current or "", embedder.model, action="unchanged")
        embedder = self.models.embedder(target)
        if embedder.model == self.embedder.model:
            embedder = self.embedder
        return model_switch.switch(
            self.settings,
            self.database_url,
            workspace_id,
            target,
            embedder,
            self.chunker,
            progress,
            between_passes,
        )

    def defer_reindex(self, workspace_id: int) -> int | None:
        """Queue ``kb.reindex`` for a worker; returns the job id (None: one is already waiting)."""
        from kb.jobs import tasks as jobs

        return jobs.defer_reindex(self.stores, workspace_id)

    def sweep(self):
        """Defer projection/index jobs for every workspace lagging git HEAD (design §7)."""
        from kb.jobs.sweep import sweep

        return sweep(self.stores, lambda: self.embedder)

    # -- nodes (design §15; kb.db.nodes, kb.store.homes) --------------------------------
    def nodes(self) -> list[Node]:
        """Every registered node (``kb nodes``): name, storage root, URL, heartbeat age in seconds,
        workspaces homed on it; ``Node.is_up(settings.node_stale_seconds)`` says up or down."""
        return list_nodes(self.database_url)

    def forget_node(self, name: str) -> None:
        """Remove a renamed or retired node's row (``kb nodes forget``, design §15). Raises NodeInUse
        while workspaces are homed on it or it is up, InvalidInput when no node has that name."""
        forget_node(self.database_url, name, self.settings.node_stale_seconds)

    def register_node(self, url: str | None = None) -> Node:
        """Register this process's node (``KB_NODE``, its storage root, ``url`` for ``kb serve``)
        and adopt the workspaces without a home node whose repository is here (design §15).
        Raises ConfigurationError when the name belongs to another storage."""
        node = register_node(self.database_url, self.settings, url)
        adopt_homeless(self.settings, self.database_url)
        return node

    def workspace_home(self, workspace_id: int) -> WorkspaceHome | None:
        """The workspace's home node with its URL and heartbeat age (adopting a workspace without
        one whose repository is here); None when the workspace does not exist."""
        return home_of(self.settings, self.database_url, check_workspace_id(workspace_id))

    def is_home(self, home: WorkspaceHome) -> bool:
        """True when this process may use the home's repository directly: it is this node, or a
        node sharing this node's storage (a shared file system, design §15)."""
        return same_storage(home, self.settings)

    # -- artifacts (design §11) ---------------------------------------------------
    def artifacts(self, workspace_id: int) -> Artifacts:
        """The artifacts of a workspace: ``save``, ``revise``, ``get``, ``list``, ``read_file``,
        ``delete`` (``kb.workspace.artifacts.Artifacts``). Raises InvalidWorkspace."""
        return self.workspace(workspace_id).artifacts()

    # -- git remotes (design §13) ----------------------------------------------------
    def remote(self, workspace_id: int) -> Remote:
        """The workspace's push-only git remote: ``add``, ``status``, ``remove``, ``push``,
        ``defer_push`` (``kb.workspace.remotes.Remote``). Raises InvalidWorkspace."""
        return self.workspace(workspace_id).remote()

    # -- API tokens of kb serve and MCP over HTTP (design §16) ------------------------
    def tokens(self) -> TokenStore:
        """The API tokens (``kb.db.tokens.TokenStore``): ``create``, ``list``, ``revoke``,
        ``verify``, ``any_live``. Only their SHA-256 is stored; ``create`` returns the secret once."""
        from kb.db.tokens import TokenStore

        return TokenStore(self.database_url)

    # -- listing and deleting workspaces (design §2.1, §6; kb.workspaces) -----------
    def list_workspaces(self) -> list[WorkspaceSummary]:
        """Every workspace: id, documents, git head, index state (``kb workspaces``)."""
        from kb.workspace.lifecycle import list_workspaces

        return list_workspaces(self.stores)

    def delete_workspace(self, workspace_id: int, *, force: bool = False) -> DeletedWorkspace:
        """Delete a workspace with its repository, rows, chunks, jobs and worktrees, announced on
        ``kb_events``; refused while a turn or job uses it unless ``force`` (see ``kb.workspaces``).
        Raises InvalidWorkspace, WorkspaceNotFound, WorkspaceBusy, LockTimeout."""
        from kb.workspace.lifecycle import delete_workspace

        try:
            return delete_workspace(self.stores, workspace_id, force=force)
        finally:
            self.stores.forget(workspace_id)
            if self._open_turns is not None:
                self._open_turns.forget_workspace(workspace_id)

    # -- moving a workspace between nodes (design §15; kb.workspace.moves) ------------
    def move_workspace(
        self, workspace_id: int, to: str, *, progress: Callable[[str], None] | None = None, force: bool = False
    ) -> MoveReport:
        """Move the workspace's home to node ``to``: read-only window (writers get WorkspaceMoving),
        the target pulls and verifies the copy, the home flips in Postgres, the old copy is renamed
        aside. ``progress`` gets one line per step; ``force`` moves even with open turn worktrees.
        Running it again after a failure or a kill resumes. Returns a MoveReport. Raises
        WorkspaceNotFound, InvalidInput (unknown node), WorkspaceBusy, MoveFailed, LockTimeout."""
        from kb.workspace import moves

        try:
            return moves.move(self.stores, workspace_id, to, progress=progress, force=force)
        finally:
            self.stores.forget(workspace_id)

    def abort_move(self, workspace_id: int) -> dict | None:
        """Cancel the workspace's move: its window closes at once (writes go on at its home) and the
        target renames its copy aside. Returns the move's window row, or None when none was open.
        A flipped move is not undone. Raises InvalidWorkspace, WorkspaceNotFound, LockTimeout."""
        from kb.workspace import moves

        return moves.abort(self.stores, workspace_id)

    def export_workspace(self, workspace_id: int, move_id: str, *, force: bool = False) -> Path:
        """The home node's side of a move: the archive file of the workspace for ``move_id`` (the
        caller streams, then removes it). Raises MoveFailed, WorkspaceBusy (open turns)."""
        from kb.workspace import moves

        return moves.export(self.stores, workspace_id, move_id, force=force)

    def receive_workspace(
        self, workspace_id: int, move_id: str, source_url: str, *, force: bool = False, token: str | None = None
    ) -> ReceivedCopy:
        """The target node's side of a move: pull the copy from ``source_url`` (sending ``token``,
        the bearer token the home node checks, design §16), verify it and put it in place (not
        authoritative until the flip). Raises MoveFailed."""
        from kb.workspace import moves

        try:
            return moves.receive(self.stores, workspace_id, move_id, source_url, force=force, token=token)
        finally:
            self.stores.forget(workspace_id)

    def retire_workspace_copy(self, workspace_id: int, move_id: str, *, aborted: bool = False) -> list[str]:
        """The old home's side after a flip (or the target's after an abort, ``aborted``): rename
        this node's copy of the workspace aside. Refused (MoveFailed) while this node is its home.
        Returns the paths renamed."""
        from kb.workspace import moves

        try:
            return (moves.discard if aborted else moves.retire)(self.stores, workspace_id, move_id)
        finally:
            self.stores.forget(workspace_id)

    # -- turns (design §5) ----------------------------------------------------------
    def turn(self, workspace_id: int, turn_id: str, author: str | None = None, committer: str | None = None) -> Turn:
        """The turn ``turn_id`` of a workspace: a private, lazily created worktree with the file
        operations (ls, read, write, edit, glob, grep, mkdir, move, remove, rmdir, create) and
        ``commit()``. ``author`` = whom the turn acts for (default: the OS user), ``committer`` =
        who records it (default: kb itself, ``kb.turns.turn.KB_COMMITTER``; design §5).

        Sub-agent ids (``root::task:7``) return the root's open Turn object. Nothing touches the
        disk until the first file operation. Raises InvalidTurn, InvalidWorkspace, WorkspaceNotFound,
        and InvalidInput for an author or committer no revision can record (a NUL, a line break):
        the turn keeps the author it opened with, so one taken here made every commit of the turn
        refuse it while nothing the caller sent later could change it (design §5).
        """
        author = author or default_author()
        check_commit_text(None, author, committer)
        store = self.store(workspace_id)
        store.require_exists()
        with self._open_turns_made:
            if self._open_turns is None:
                from kb.turns.open_turns import OpenTurns

                self._open_turns = OpenTurns()
        return self._open_turns.turn(store, turn_id, author, committer)

    def sweep_worktrees(self, ttl: float | None = None) -> JanitorReport:
        """Remove abandoned turn worktrees older than ``ttl`` seconds (default
        ``settings.worktree_ttl``); never an open turn's (design §5). What the janitor job runs."""
        from kb.git.worktree import sweep_worktrees

        def repository_for(workspace_id: int):
            store = self.store(workspace_id)
            return store.repository if store.exists() else None

        return sweep_worktrees(
            repository_for,
            self.settings.knowledge_store,
            self.settings.worktree_ttl if ttl is None else ttl,
        )

    def edit_document(
        self,
        workspace_id: int,
        path: str,
        editor: Callable[[Path], None],
        author: str | None = None,
        message: str | None = None,
        committer: str | None = None,
        idempotency_key: str | None = None,
    ) -> CommitResult | None:
        """Edit one document as a person would (``kb edit``): materialize it in a fresh turn, call
        ``editor(file_path)`` (which edits the file in place), and commit when the bytes changed.
        ``idempotency_key``: the commit's key (design §3), so an interrupted save is settled with
        ``write_outcome(workspace_id, key)``.

        ``committer`` defaults to kb itself (design §5). A missing document starts empty (saving
        creates it); a document changed meanwhile by someone else is three-way merged (design §5). Returns the CommitResult, or None when
        nothing changed (the turn is discarded). Raises ArtifactReadOnly for ARTIFACT documents
        (design §11), InvalidPath, WorkspaceNotFound, and whatever ``editor`` raises (turn discarded).
        """
        from kb.turns.editor_save import edit_document

        return edit_document(
            self.database_url,
            workspace_id,
            lambda turn_id: self.turn(workspace_id, turn_id, author, committer),
            path,
            editor,
            message,
            idempotency_key,
        )

    # -- seeding from legacy rows, span fill, drift check (design §9, §10) ----------
    def seed(
        self,
        dsn: str,
        legacy_workspace: int,
        workspace_id: int,
        *,
        yes: bool = False,
        flip: bool = False,
        force: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> SeedReport:
        """Seed ``workspace_id`` from legacy workspace ``legacy_workspace`` of the legacy database
        at ``dsn`` (``kb seed``, design §10). Dry run unless ``yes``: plans paths and reports
        documents, skipped rows, collisions and bytes. With ``yes``: one seed revision, byte parity
        check, identity and (same model) chunk adoption without embedding; ``flip`` then makes kb
        the authority. Raises LegacySourceError, SeedRefused (flipped without ``force``; ``flip``
        without parity), LockTimeout.
        """
        from kb.legacy.seed import Seeder

        check_workspace_id(workspace_id)
        active = self.embedder_for(workspace_id).model if self.store(workspace_id).exists() else self.embedder.model
        report = Seeder(self.stores, dsn, legacy_workspace, workspace_id, progress).run(
            yes=yes, flip=flip, force=force, active_model=active
        )
        if yes and report.models_match and report.legacy_model:
            # the adopted vectors are the legacy model's: the workspace keeps it until switched,
            # whatever the default becomes (design §7, §10)
            from kb.index import models

            with database.connect(self.database_url, autocommit=True) as conn:
                models.pin(conn, workspace_id, report.legacy_model)
        return report

    def set_authority(self, workspace_id: int, *, flipped: bool) -> bool:
        """``--flip`` / ``--unflip`` of a seeded workspace (design §10); True when it changed.
        Raises SeedRefused when the workspace was never seeded or (flip) parity did not pass."""
        from kb.legacy.seed import set_authority

        return set_authority(self.stores, check_workspace_id(workspace_id), flipped=flipped)

    def span_fill(self) -> SpanFill:
        """The span fill (design §9): ``status()``, ``pause()``, ``resume()``, ``run()``."""
        from kb.legacy.span_fill import SpanFill

        return SpanFill(self.stores)

    def drift_check(self, workspace_id: int | None = None) -> list[DriftReport]:
        """Compare git HEAD with document and chunk rows of flipped workspaces (or one workspace)
        and repair the Postgres side, capped per run (design §10 after the flip)."""
        from kb.legacy.drift import drift_check

        return drift_check(self.stores, workspace_id)
