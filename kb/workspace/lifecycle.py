"""Listing and deleting workspaces (design §2.1, §6): ``kb workspaces``, ``kb workspace delete``.

A workspace owns its repository (``{knowledge_store}/{id}``), its turn worktrees
(``{knowledge_store}/.worktrees/{id}``), its artifact files (``{storage_root}/artifact_blobs/{id}``),
its Postgres rows and its Procrastinate jobs. Deleting it:

1. refuses while a turn of the workspace has a worktree (open in some process, or left by a
   crashed one for recovery) or a job of it is running, unless ``force``;
2. under the workspace write lock (design §4) and then its projection and chunk locks (the lock
   order of ``kb.db.locks``: a running projection or index run finishes first), in one Postgres
   transaction: announces every document
   and folder row as deleted on ``kb_events`` (then ``workspace_deleted``), deletes the jobs and the
   ``kb.workspaces`` row — every table referencing it does so ``ON DELETE CASCADE``, so whatever a
   feature adds (citation registry, seed mapping, artifacts, remotes) goes with it — and renames
   the repository aside before the transaction commits, so no writer can commit to it afterwards;
3. after the commit, drops the workspace's partial HNSW indexes on ``kb.chunks``
   (``kb.index.vector_index``) and removes the renamed repository and the worktrees from disk.

A crash after the commit leaves a ``.deleted-{id}-*`` folder (and maybe indexes) that running
``delete`` of the same id again removes.
"""

from __future__ import annotations

import dataclasses
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kb.db import database
from kb.db.locks import chunk_lock, locked_transaction
from kb.db.nodes import storage_id
from kb.db.sql import queries
from kb.errors import KbError, WorkspaceBusy, WorkspaceNotFound
from kb.store.knowledge_store import check_workspace_id
from kb.store.projection import PROJECTION_LOCK_NAMESPACE, notify_events

if TYPE_CHECKING:
    from kb.settings import Settings
    from kb.store.stores import Stores


@dataclass(frozen=True)
class WorkspaceSummary:
    """One workspace for ``kb workspaces``: ``head`` is git's HEAD (None when empty or without a
    readable repository), ``index_state`` one of ``indexed``, ``behind`` (the index stamp lags the
    head by ``revisions_behind`` revisions, documents are pending, or git's HEAD is a revision made
    outside kb that is not recorded yet), ``problems`` (failed, quarantined or unindexable
    documents), ``empty``, ``no repository``, ``damaged`` (the repository cannot be read:
    ``problem`` says why), ``elsewhere`` (homed on ``home_node``, whose storage this process does
    not see: ``head`` and the counts are Postgres', the index state is that node's to tell, design
    §15). ``revisions_unprojected``: recorded revisions the projection has not
    reached; their documents have no rows yet, so ``documents`` and ``documents_pending`` do not
    count them."""

    id: int
    documents: int
    head: str | None
    index_state: str
    revisions_behind: int
    documents_pending: int
    documents_failed: int
    revisions_unprojected: int = 0
    documents_quarantined: int = 0
    documents_unindexable: int = 0
    head_unrecorded: bool = False
    problem: str = ""
    jobs_running: int = 0
    """Projection and index jobs of the workspace a worker is running now."""
    home_node: str | None = None
    """The node whose storage holds the repository (None before nodes existed)."""

    def describe_lag(self) -> str:
        """What the workspace waits for or what is wrong, in words (plurals right), with the
        command that does it (or that a worker is running its job): ``2 revisions waiting to be
        projected, then indexed`` before the projection ran, else ``1 revision and 3 documents
        waiting to be indexed``; for ``problems`` the documents that failed and any lag besides;
        for ``damaged`` the reason; for ``elsewhere`` ``homed on node b``. Empty when ``indexed``,
        ``empty`` or ``no repository``. A
        revision made with git outside kb needs ``kb sweep`` to be recorded (the worker's periodic
        sweep does it too)."""
        if self.index_state == "damaged":
            return self.problem
        if self.index_state == "elsewhere":
            return f"homed on node {self.home_node}"
        if self.index_state in ("indexed", "empty", "no repository"):
            return ""
        parts = []
        if self.index_state == "problems":
            counts = [
                f"{_count(n, 'document')} {word}"
                for n, word in (
                    (self.documents_failed, "failed"),
                    (self.documents_quarantined, "quarantined"),
                    (self.documents_unindexable, "unindexable"),
                )
                if n
            ]
            parts.append(f"{', '.join(counts)} (`kb status --workspace {self.id}` lists them)")
        if self.head_unrecorded:
            parts.append(
                "git's HEAD is a revision made outside kb: `kb sweep` records it, then "
                "`kb worker --until-idle` indexes it"
            )
        elif (
            self.revisions_unprojected
            or self.index_state == "behind"
            or self.revisions_behind
            or self.documents_pending
        ):
            if self.revisions_unprojected:
                waiting = f"{_count(self.revisions_unprojected, 'revision')} waiting to be projected, then indexed"
            else:
                counts = [
                    _count(n, word)
                    for n, word in ((self.revisions_behind, "revision"), (self.documents_pending, "document"))
                    if n
                ]
                waiting = f"{' and '.join(counts) or 'the newest revision'} waiting to be indexed"
            runs = "a worker is running its job now" if self.jobs_running else "`kb worker --until-idle` does it"
            parts.append(f"{waiting} ({runs})")
        return "; ".join(parts)


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class DeletedWorkspace:
    """What :func:`delete_workspace` removed: row and job counts, the paths deleted from disk, and
    the partial vector indexes dropped."""

    id: int
    documents: int
    folders: int
    jobs: int
    removed_paths: list[str]
    vector_indexes: list[str]


def _index_state(row: dict, head: str | None) -> str:
    """``row``: a ``workspace_summaries`` row; ``head``: git's HEAD (None: empty repository)."""
    if head is None:
        return "empty"
    if row["documents_failed"] or row["documents_quarantined"] or row["documents_unindexable"]:
        return "problems"
    if row["revisions_behind"] or row["revisions_unprojected"] or row["documents_pending"] or row["stamp"] != head:
        return "behind"
    return "indexed"


def list_workspaces(stores: Stores) -> list[WorkspaceSummary]:
    """Every workspace with a row, by id (design §2.1). ``stores`` are the workspaces' stores. A
    workspace whose repository cannot be read is listed as ``damaged`` with the reason; the
    others are listed all the same."""
    with database.transaction(stores.database_url) as conn:
        rows = conn.execute(
            queries["workspace_summaries"], {"alive_seconds": stores.settings.worker_alive_seconds}
        ).fetchall()
    summaries, heads = [], {}
    for row in rows:
        store = stores.store(row["id"])
        counts = dict(
            revisions_behind=row["revisions_behind"],
            documents_pending=row["documents_pending"],
            documents_failed=row["documents_failed"],
            revisions_unprojected=row["revisions_unprojected"],
            documents_quarantined=row["documents_quarantined"],
            documents_unindexable=row["documents_unindexable"],
            jobs_running=row["jobs_running"],
            home_node=row["home_node"],
        )
        if _homed_elsewhere(row, stores.settings):
            summaries.append(WorkspaceSummary(row["id"], row["documents"], row["head"], "elsewhere", **counts))
            continue
        if not store.exists():
            summaries.append(WorkspaceSummary(row["id"], row["documents"], None, "no repository", **counts))
            continue
        try:
            head = store.head()
        except KbError as exc:  # one unreadable repository must not hide the others
            summaries.append(
                WorkspaceSummary(row["id"], row["documents"], None, "damaged", **counts, problem=str(exc))
            )  # it says what to do
            continue
        if head is not None and head != row["head"]:
            heads[row["id"]] = head
        summaries.append(WorkspaceSummary(row["id"], row["documents"], head, _index_state(row, head), **counts))
    if heads:  # git moved past Postgres' head: recorded since the query above, or made outside kb?
        with database.connect(stores.database_url) as conn:
            recorded = {
                r["workspace_id"]
                for r in conn.execute(
                    queries["recorded_heads"], {"workspace_ids": list(heads), "heads": list(heads.values())}
                )
            }
        summaries = [
            dataclasses.replace(s, head_unrecorded=True) if s.id in heads and s.id not in recorded else s
            for s in summaries
        ]
    return summaries


def _homed_elsewhere(row: dict, settings: Settings) -> bool:
    """True when the workspace's home node is another node whose storage this process does not see
    (``kb.db.nodes.same_storage``): its repository is there, not missing."""
    if row["home_node"] is None or row["home_node"] == settings.node:
        return False
    return row["home_storage_id"] is None or row["home_storage_id"] != storage_id(settings.storage_root)


def _turn_worktrees(stores: Stores, workspace_id: int) -> list[str]:
    from kb.git.worktree import worktrees_root

    root = worktrees_root(stores.settings.knowledge_store, workspace_id)
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def _leftovers(knowledge_store: Path, workspace_id: int) -> list[Path]:
    return sorted(knowledge_store.glob(f".deleted-{workspace_id}-*"))


def delete_workspace(stores: Stores, workspace_id: int, *, force: bool = False) -> DeletedWorkspace:
    """Delete a workspace and everything it owns (see the module docstring; design §2.1, §6).

    Returns a DeletedWorkspace. Raises InvalidWorkspace (bad id), WorkspaceNotFound (no row, no
    repository, nothing left over), WorkspaceBusy (a turn worktree exists or a job of it is running,
    and not ``force``), WrongNode (homed on a node with another storage: delete it there), LockTimeout.
    """
    from kb.git.worktree import worktrees_root
    from kb.workspace.artifacts import artifact_blobs_path

    check_workspace_id(workspace_id)
    store = stores.store(workspace_id)
    knowledge_store = stores.settings.knowledge_store
    turns = _turn_worktrees(stores, workspace_id)
    with database.transaction(stores.database_url) as conn:
        row = conn.execute(queries["get_workspace"], {"workspace_id": workspace_id}).fetchone()
        running = conn.execute(queries["workspace_running_jobs"], {"workspace_id": workspace_id}).fetchall()
    if row is not None:  # its repository on another node would be left behind (design §15)
        store.refuse_if_homed_elsewhere()
    leftovers = _leftovers(knowledge_store, workspace_id)
    if row is None and not store.exists() and not turns and not leftovers:
        raise WorkspaceNotFound(f"workspace {workspace_id} does not exist; `kb workspaces` lists them")
    if not force and (turns or running):
        what = ([f"{len(turns)} turn worktree(s) ({', '.join(turns[:5])})"] if turns else []) + (
            [f"{len(running)} running job(s)"] if running else []
        )
        busy = (
            f"workspace {workspace_id} is in use: {' and '.join(what)}; commit or abort the turns and "
            "let the jobs finish, or pass"
        )
        raise WorkspaceBusy(f"{busy} force=True to delete it anyway", cli=f"{busy} --force to delete it anyway")
    tombstone = knowledge_store / f".deleted-{workspace_id}-{uuid.uuid4().hex}"
    moved = False
    with locked_transaction(stores.database_url, workspace_id, stores.settings) as (conn, _):
        # Lock order (kb.locks): write lock, projection lock, chunk lock, then the rows. Deleting the
        # workspace row cascades to its document rows, chunks and statistics: without the two
        # locks a running projection (holding document rows, waiting for the workspace row) or
        # index run deadlocked with it. A projection that waited for its lock then finds no
        # workspace row (WorkspaceNotFound), an index run no document.
        conn.execute(queries["lock_projection"], {"namespace": PROJECTION_LOCK_NAMESPACE, "workspace_id": workspace_id})
        chunk_lock(conn, workspace_id)
        owned = conn.execute(queries["workspace_row_ids"], {"workspace_id": workspace_id}).fetchall()
        events = [
            {
                "event": f"{r['kind']}_deleted",
                "workspace_id": workspace_id,
                "revision": None,
                "id": r["id"],
                "path": r["path"],
            }
            for r in owned
        ]
        events.append(
            {
                "event": "workspace_deleted",
                "workspace_id": workspace_id,
                "revision": None,
                "id": workspace_id,
                "path": None,
            }
        )
        notify_events(conn, events)
        jobs = conn.execute(queries["delete_workspace_jobs"], {"workspace_id": workspace_id}).fetchall()
        conn.execute(queries["delete_workspace"], {"workspace_id": workspace_id})
        for statistics in (
            "delete_workspace_lexeme_stats",
            "delete_workspace_text_stats",
            "delete_workspace_document_lexeme_stats",
            "delete_workspace_document_text_stats",
        ):
            conn.execute(queries[statistics], {"workspace_id": workspace_id})  # no FK: kept by a trigger
        if store.path.exists():
            store.path.rename(tombstone)  # under the lock: no writer commits to it after this
            moved = True
    dropped = _drop_vector_indexes(stores.database_url, workspace_id)
    removed = []
    artifact_files = artifact_blobs_path(stores.settings.storage_root, workspace_id)
    worktrees = worktrees_root(knowledge_store, workspace_id)
    for path in [*([tombstone] if moved else []), worktrees, artifact_files, *leftovers]:
        if path.exists():
            shutil.rmtree(_set_aside(path, knowledge_store, workspace_id) if path == worktrees else path)
            removed.append(str(store.path if path == tombstone else path))
    return DeletedWorkspace(
        workspace_id,
        sum(r["kind"] == "document" for r in owned),
        sum(r["kind"] == "folder" for r in owned),
        len(jobs),
        removed,
        dropped,
    )


def _set_aside(folder: Path, knowledge_store: Path, workspace_id: int) -> Path:
    """Rename ``folder`` (the workspace's turn worktrees) to a ``.deleted-{id}-*`` tombstone and
    return it, for ``rmtree`` to remove there: a turn still open in another process (``kb serve``)
    writes its worktree by path, and a file it made in a folder ``rmtree`` was emptying failed the
    delete (ENOTEMPTY) after Postgres had deleted the workspace. Its late writes now make a new
    folder for the janitor; a crash leaves the tombstone to the next delete (design §2.1)."""
    tombstone = knowledge_store / f".deleted-{workspace_id}-{uuid.uuid4().hex}"
    folder.rename(tombstone)
    return tombstone


def _drop_vector_indexes(database_url: str, workspace_id: int) -> list[str]:
    """Drop the workspace's partial HNSW indexes on ``kb.chunks`` (``kb.index.vector_index``); their
    ``kb.vector_indexes`` rows went with the cascade. ``DROP INDEX CONCURRENTLY`` needs autocommit
    and never blocks other workspaces' writers. Returns the names dropped."""
    from psycopg import sql

    from kb.index.vector_index import forget_cached, index_name

    prefix = index_name(workspace_id, "").rsplit("_", 1)[0] + "_"
    with database.connect(database_url, autocommit=True) as conn:
        names = [r["name"] for r in conn.execute(queries["workspace_vector_index_names"], {"prefix": prefix})]
        for name in names:
            conn.execute(sql.SQL(queries["drop_vector_index"]).format(name=sql.Identifier("kb", name)))
    forget_cached(workspace_id)
    return names
