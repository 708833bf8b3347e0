"""Projection of git into ``documents`` and ``folders`` rows (design §6), converging to HEAD.

``project(conn, repo, workspace)`` runs inside the caller's transaction under the workspace's
projection lock and, once it has something to change, its chunk lock (the lock order shared with
index runs is written in ``kb.db.locks``). It is idempotent and order-free:

1. It replays the moves the store recorded (``kb.path_changes``) since the last projected
   revision, revision by revision, so a moved document keeps its row id; a folder whose files all
   moved (a folder rename) keeps its folder row id, and so do its descendants.
2. It diffs the last projected revision's tree against HEAD (git skips unchanged subtrees, so a
   one-file revision costs the same at any workspace size) — or, on a first run, a rebuild or an
   unrecorded base, walks HEAD's whole ``documents/`` tree against every row — and upserts every
   document whose content changed, preserving each row's ``document_type``, ``metadata`` and
   ``title``; a file no row claims becomes a ``NOTE`` titled from its file name. Rows whose file is
   gone are deleted — except rows with no ``content_id``: those were created by a client ahead of
   their file (a *claim*, e.g. a FILE row written to git a moment later) and wait for it.
3. Folder rows: one for every folder implied by a document path or holding a ``.keep``; the rest
   are pruned (an incremental run looks only at the folders above the paths that changed).
4. Every change is announced with ``pg_notify('kb_events', json)`` in the same transaction, so
   listeners hear it exactly when the rows commit (design §5, §6).

``force=True`` (``kb rebuild-projection``) converges even when HEAD is the projected revision: it
recreates missing folder rows and repairs drifted document rows without ever deleting a row whose
file still exists, so replicated ids stay stable.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kb.db.locks import chunk_lock
from kb.db.sql import queries
from kb.errors import RevisionNotFound, WorkspaceNotFound
from kb.git.repository import Repository
from kb.paths import unique_identifier_hash
from kb.store import repository_guard
from kb.store.history import json_column

if TYPE_CHECKING:
    from kb.db.database import Connection

PROJECTION_LOCK_NAMESPACE = 7103
KEEP = ".keep"
ROOT = "/documents"
EVENTS_CHANNEL = "kb_events"
MAX_PAYLOAD_BYTES = 8000
PATH_KEYED_TYPES = ("NOTE", "ARTIFACT")
"""Document types whose ``unique_identifier_hash`` is keyed by the virtual path (design §2.4)."""
STATEMENT_ROWS = 1000
"""Most rows one ``upsert_documents`` or ``notify_events`` statement carries: a revision with tens
of thousands of paths is sent in several statements (in order, in the same transaction, so the
rows and events are those of one statement), and neither this process nor the server builds one
parameter list of them all (design §6, §7). 1,000 rows keep a statement's round trip small
beside its work (a 1,500-file import: two statements instead of one)."""


@dataclass
class ProjectionResult:
    """What one projection run changed: document and folder row ids by kind of change.

    ``revision`` is the HEAD it converged to (None for an empty repository). ``events`` are the
    payloads sent on ``kb_events``, in order.
    """

    revision: str | None
    created: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    folders_created: list[int] = field(default_factory=list)
    folders_moved: list[int] = field(default_factory=list)
    folders_deleted: list[int] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)

    def counts(self) -> dict[str, int | str | None]:
        """A JSON-able summary (what the projection job returns)."""
        return {
            "revision": self.revision,
            "created": len(self.created),
            "updated": len(self.updated),
            "moved": len(self.moved),
            "deleted": len(self.deleted),
            "folders_created": len(self.folders_created),
            "folders_moved": len(self.folders_moved),
            "folders_deleted": len(self.folders_deleted),
        }


def title_from_path(virtual_path: str) -> str:
    """Title of a document that no row claims: its file name without ``.md``."""
    name = posixpath.basename(virtual_path)
    return name[:-3] if name.lower().endswith(".md") else name


def _virtual(repo_path: str) -> str:
    return "/" + repo_path


def _parent(path: str) -> str | None:
    parent = posixpath.dirname(path)
    return None if parent in (ROOT, "/", "") else parent


def folders_of(paths: list[str]) -> set[str]:
    """Every folder (virtual path, below ``/documents``) holding one of ``paths``."""
    folders: set[str] = set()
    for path in paths:
        parent = _parent(path)
        while parent is not None and parent not in folders:
            folders.add(parent)
            parent = _parent(parent)
    return folders


def renamed_folder_candidates(old: str, new: str) -> list[tuple[str, str]]:
    """Folder pairs a file move ``old → new`` may imply, deepest first.

    ``/documents/a/b/x.md → /documents/c/b/x.md`` implies ``(/documents/a/b, /documents/c/b)`` and
    ``(/documents/a, /documents/c)``: the shared trailing segments are stripped one by one and the
    remaining parents paired. A rename inside one folder implies nothing.
    """
    o, n = old.split("/"), new.split("/")
    pairs = []
    while len(o) > 3 and len(n) > 3 and o[-1] == n[-1]:
        o.pop()
        n.pop()
        pairs.append(("/".join(o), "/".join(n)))
    return pairs


class _Projection:
    """One run of the projection inside one transaction (see the module docstring)."""

    def __init__(
        self,
        conn: Connection,
        repo: Repository,
        workspace_id: int,
        head: str,
        paths: set[str] | None = None,
    ) -> None:
        """Load the document rows at ``paths`` (all of the workspace's when None) and every folder row."""
        self.conn, self.repo, self.ws, self.head = conn, repo, workspace_id, head
        self.result = ProjectionResult(head)
        rows = (
            conn.execute(queries["document_paths"], {"workspace_id": workspace_id})
            if paths is None
            else conn.execute(queries["document_rows_at"], {"workspace_id": workspace_id, "paths": sorted(paths)})
        )
        self.rows = {r["path"]: r for r in rows}
        self.folder_rows = {
            r["path"]: r["id"] for r in conn.execute(queries["folder_paths"], {"workspace_id": workspace_id})
        }
        self.deleted_paths: dict[int, str] = {}

    # -- 1. recorded moves ----------------------------------------------------------------
    def replay_moves(self, moves: list[dict]) -> None:
        """Apply recorded moves (``recorded_moves_since`` rows), one revision at a time."""
        for _, rows in itertools.groupby(moves, key=lambda m: m["seq"]):
            group = list(rows)
            pairs = [(_virtual(m["old_path"]), _virtual(m["new_path"])) for m in group]
            self._move_documents([(o, n) for o, n in pairs if o in self.rows and o != n])
            self._move_folders(pairs, self.repo.tree_id(group[0]["revision_id"]))

    def _move_documents(self, pairs: list[tuple[str, str]]) -> None:
        """Apply one revision's document moves at once (a swap is two moves in one revision)."""
        sources = {old for old, _ in pairs}
        for _, new in pairs:
            if new in self.rows and new not in sources:  # moved onto (overwrote) another document
                self._delete_document(new)
        parked = any(new in sources for _, new in pairs)
        moving = [(old, new, self.rows.pop(old)) for old, new in pairs]
        if parked:  # free every source path first so the unique (workspace, path) never trips
            self._many(
                queries["move_document"],
                [self._move_params(old, f"//moving/{row['id']}", row) for old, _, row in moving],
            )
        self._many(
            queries["move_document"],
            [self._move_params(f"//moving/{row['id']}" if parked else old, new, row) for old, new, row in moving],
        )
        for _, new, row in moving:
            self.rows[new] = {**row, "path": new}
            self.result.moved.append(row["id"])

    def _move_params(self, old: str, new: str, row: dict) -> dict:
        uid_hash = (
            unique_identifier_hash(row["document_type"], new, self.ws)
            if row["document_type"] in PATH_KEYED_TYPES and not new.startswith("//")
            else None
        )
        return {"workspace_id": self.ws, "old_path": old, "new_path": new, "uid_hash": uid_hash}

    def _move_folders(self, pairs: list[tuple[str, str]], tree: bytes | None) -> None:
        """Keep folder row ids across a folder rename: a folder that exists before but not after
        the revision, whose files went to a folder that did not exist before, is renamed."""
        candidates = sorted({c for old, new in pairs for c in renamed_folder_candidates(old, new)})
        for old_dir, new_dir in candidates:
            if old_dir not in self.folder_rows or new_dir in self.folder_rows:
                continue
            if self.repo.is_folder(tree, old_dir[1:]) or not self.repo.is_folder(tree, new_dir[1:]):
                continue
            folder_id = self.folder_rows.pop(old_dir)
            self.conn.execute(
                queries["move_folder"],
                {
                    "workspace_id": self.ws,
                    "old_path": old_dir,
                    "new_path": new_dir,
                    "name": posixpath.basename(new_dir),
                    "parent_path": _parent(new_dir),
                },
            )
            self.folder_rows[new_dir] = folder_id
            self.result.folders_moved.append(folder_id)

    # -- 2. documents -----------------------------------------------------------------------
    def converge_documents(self, documents: dict[str, str], removed: set[str] | None = None) -> None:
        """Upsert ``documents`` ({virtual path: blob id}) whose content differs from their row;
        delete the rows of ``removed`` paths, or (a full run, ``removed=None``) of every path not
        in ``documents``. Rows without ``content_id`` (claims) are never deleted."""
        changed = [
            (path, blob)
            for path, blob in documents.items()
            if path not in self.rows or self.rows[path]["content_id"] != blob
        ]
        # a statement for up to STATEMENT_ROWS of them (design §6): a first import upserts thousands
        for start in range(0, len(changed), STATEMENT_ROWS):
            part = changed[start : start + STATEMENT_ROWS]
            upserted = {
                row["path"]: row
                for row in self.conn.execute(
                    queries["upsert_documents"],
                    {
                        "workspace_id": self.ws,
                        "revision_id": self.head,
                        "paths": json_column([path for path, _ in part]),
                        "titles": json_column([title_from_path(path) for path, _ in part]),
                        "uid_hashes": json_column([unique_identifier_hash("NOTE", path, self.ws) for path, _ in part]),
                        "content_ids": json_column([blob for _, blob in part]),
                    },
                )
            }
            for path, _ in part:  # in the files' order, as the rows were written
                if (row := upserted.get(path)) is not None:
                    (self.result.created if row["inserted"] else self.result.updated).append(row["id"])
                    self.rows[path] = row
        candidates = set(self.rows) - set(documents) if removed is None else set(self.rows) & removed
        gone = [p for p in sorted(candidates) if self.rows[p]["content_id"] is not None]
        for row in self._many(queries["delete_document"], [{"workspace_id": self.ws, "path": p} for p in gone]):
            self.rows.pop(row["path"], None)  # a claim without content waits for its file
            self.result.deleted.append(row["id"])
            self.deleted_paths[row["id"]] = row["path"]

    def _many(self, query: str, params: list[dict]) -> list[dict]:
        """Run ``query`` once per parameter set in one pipelined batch; the rows it returned."""
        if not params:
            return []
        found = []
        with self.conn.cursor() as cur:
            cur.executemany(query, params, returning=True)
            for _ in cur.results():
                found.extend(cur.fetchall())
        return found

    def _delete_document(self, path: str) -> None:
        gone = self.conn.execute(queries["delete_document"], {"workspace_id": self.ws, "path": path}).fetchone()
        self.rows.pop(path, None)
        if gone:
            self.result.deleted.append(gone["id"])
            self.deleted_paths[gone["id"]] = path

    # -- 3. folders -------------------------------------------------------------------------
    def result_folder_paths(self) -> list[str]:
        """Paths of the folder rows renamed by this run (their old paths are gone already)."""
        by_id = {i: p for p, i in self.folder_rows.items()}
        return [by_id[i] for i in self.result.folders_moved if i in by_id]

    def converge_folders(self, wanted: set[str], scope: set[str] | None = None) -> dict[int, str]:
        """Create the ``wanted`` folder rows that are missing and delete the others — all other
        rows, or (an incremental run) only those in ``scope``. Returns ``{deleted id: path}``."""
        deleted: dict[int, str] = {}
        existing = set(self.folder_rows) if scope is None else set(self.folder_rows) & scope
        for stale in sorted(existing - wanted, reverse=True):  # children first
            removed = self.conn.execute(queries["delete_folder"], {"workspace_id": self.ws, "path": stale}).fetchone()
            self.folder_rows.pop(stale)
            if removed:
                self.result.folders_deleted.append(removed["id"])
                deleted[removed["id"]] = stale
        for path in sorted(wanted - set(self.folder_rows)):  # parents first
            added = self.conn.execute(
                queries["insert_folder"],
                {"workspace_id": self.ws, "path": path, "name": posixpath.basename(path), "parent_path": _parent(path)},
            ).fetchone()
            if added:
                self.folder_rows[path] = added["id"]
                self.result.folders_created.append(added["id"])
        return deleted

    # -- titles given by writers (kb.titles) -------------------------------------------------
    def apply_titles(self, after_seq: int) -> None:
        """Copy the titles writers recorded with revisions after ``after_seq`` into the rows of
        their documents, following later recorded moves; the newest title of a document wins.
        Rows whose title changes are announced as updated (design §5, §6)."""
        params = {"workspace_id": self.ws, "after_seq": after_seq}
        titles = self.conn.execute(queries["recorded_titles_since"], params).fetchall()
        if not titles:
            return
        moves = self.conn.execute(queries["recorded_moves_since"], params).fetchall()
        latest: dict[str, str] = {}
        for recorded in titles:
            path = recorded["path"]
            for move in moves:
                if move["seq"] > recorded["seq"] and _virtual(move["old_path"]) == path:
                    path = _virtual(move["new_path"])
            latest[path] = recorded["title"]
        changed = self._many(
            queries["set_document_title"],
            [{"workspace_id": self.ws, "path": path, "title": title} for path, title in latest.items()],
        )
        self.result.updated.extend(row["id"] for row in changed if row["id"] not in self.result.created)

    # -- 4. events --------------------------------------------------------------------------
    def announce(self, folders_deleted: dict[int, str]) -> None:
        r = self.result
        by_id = {row["id"]: path for path, row in self.rows.items()}
        folder_by_id = {i: p for p, i in self.folder_rows.items()}
        created, deleted = set(r.created), set(r.deleted)
        updated = [i for i in dict.fromkeys(r.moved + r.updated) if i not in created and i not in deleted]
        events = [("document_created", i, by_id.get(i)) for i in r.created]
        events += [("document_updated", i, by_id.get(i)) for i in updated]
        events += [("document_deleted", i, self.deleted_paths.get(i)) for i in r.deleted]
        events += [("folder_created", i, folder_by_id.get(i)) for i in r.folders_created]
        events += [("folder_updated", i, folder_by_id.get(i)) for i in r.folders_moved if i in folder_by_id]
        events += [("folder_deleted", i, folders_deleted[i]) for i in r.folders_deleted]
        r.events = [
            {"event": kind, "workspace_id": self.ws, "revision": self.head, "id": row_id, "path": path}
            for kind, row_id, path in events
        ]
        notify_events(self.conn, r.events)


def notify_events(conn: Connection, events: list[dict]) -> None:
    """Send ``events`` on ``kb_events`` in ``conn``'s transaction, in their order, by a statement
    (``notify_events``) for each ``STATEMENT_ROWS`` of them (nothing when there are none)."""
    for start in range(0, len(events), STATEMENT_ROWS):
        payloads = [event_payload(e) for e in events[start : start + STATEMENT_ROWS]]
        conn.execute(queries["notify_events"], {"channel": EVENTS_CHANNEL, "payloads": json_column(payloads)})


def event_payload(event: dict) -> str:
    """The JSON text of one ``kb_events`` notification. Postgres refuses payloads of 8000 bytes or
    more, so an event whose path would not fit is sent without ``path`` (the id identifies it)."""
    text = json.dumps(event, ensure_ascii=False)
    if len(text.encode("utf-8")) >= MAX_PAYLOAD_BYTES:
        text = json.dumps({k: v for k, v in event.items() if k != "path"}, ensure_ascii=False)
    return text


def project(
    conn: Connection,
    repo: Repository,
    workspace: dict | int,
    *,
    force: bool = False,
    database_url: str | None = None,
) -> ProjectionResult:
    """Converge the workspace's rows to ``repo``'s HEAD inside ``conn``'s open transaction (design §6).

    ``workspace`` is its ``kb.workspaces`` row or id (the row is re-read under the projection lock,
    so two concurrent runs never replay the same moves). ``force`` converges even when HEAD is
    already projected (``rebuild-projection``). Returns the row ids it changed and the events it
    sent on ``kb_events``. Raises WorkspaceNotFound when the workspace has no row, HistoryDiverged
    (nothing changed; the workspace is marked when ``database_url`` is given) when ``repo`` is not
    the workspace's repository or lacks a revision Postgres recorded (``kb.store.repository_guard``:
    never converge backwards, design §3).
    """
    ws = workspace if isinstance(workspace, int) else workspace["id"]
    conn.execute(queries["lock_projection"], {"namespace": PROJECTION_LOCK_NAMESPACE, "workspace_id": ws})
    row = conn.execute(queries["get_workspace"], {"workspace_id": ws}).fetchone()
    if row is None:
        raise WorkspaceNotFound(f"workspace {ws} has no row; create it with `kb import PATH --workspace {ws}`")
    repository_guard.check(conn, database_url, repo, row)
    head = repo.head()
    projected = row["last_projected_revision"]
    if head is None or (head == projected and not force):
        return ProjectionResult(head)
    # Lock order (kb.locks): projection lock, chunk lock, then document rows, chunks and their
    # statistics (a deleted document's chunks cascade), then the workspace row.
    chunk_lock(conn, ws)
    head_tree = repo.tree_id(head)
    moves: list[dict] = []
    base_tree = None
    if projected is not None and projected != head:
        found = conn.execute(queries["revision_seq"], {"workspace_id": ws, "revision_id": projected}).fetchone()
        if found is not None:  # an unrecorded projected revision: no moves to trust, ids by path only
            moves = conn.execute(
                queries["recorded_moves_since"], {"workspace_id": ws, "after_seq": found["seq"]}
            ).fetchall()
            with contextlib.suppress(RevisionNotFound):
                base_tree = repo.tree_id(projected)
    if base_tree is not None and not force:  # incremental: only what changed since the last run
        changes = [c for c in repo.diff(base_tree, head_tree) if c.path.startswith("documents/")]
        touched = {_virtual(c.path): c.new_id for c in changes}
        moved_paths = {_virtual(m[k]) for m in moves for k in ("old_path", "new_path")}
        # A path a recorded move went through but the base-to-HEAD diff does not name (moved, then
        # removed or moved on in a later revision of this run) still gets its row converged: the
        # replayed move put a row there that HEAD may not hold.
        for path in moved_paths - set(touched):
            touched[path] = repo.lookup(head_tree, path[1:])
        run = _Projection(conn, repo, ws, head, paths=set(touched) | moved_paths)
        run.replay_moves(moves)
        run.converge_documents(
            {p: b for p, b in touched.items() if b is not None and posixpath.basename(p) != KEEP},
            removed={p for p, b in touched.items() if b is None},
        )
        scope = folders_of(list(touched)) | set(run.result_folder_paths())
        wanted = {f for f in scope if repo.is_folder(head_tree, f[1:])}
        folders_deleted = run.converge_folders(wanted, scope)
    else:  # full: the whole HEAD tree against every row (first run, rebuild, unknown base)
        run = _Projection(conn, repo, ws, head)
        run.replay_moves(moves)
        files = {_virtual(p): blob for p, blob in repo.walk(head_tree, "documents")}
        run.converge_documents({p: b for p, b in files.items() if posixpath.basename(p) != KEEP})
        folders_deleted = run.converge_folders(folders_of(list(files)))
    if projected is None:
        run.apply_titles(0)
    elif seen := conn.execute(queries["revision_seq"], {"workspace_id": ws, "revision_id": projected}).fetchone():
        run.apply_titles(seen["seq"])
    run.announce(folders_deleted)
    if run.result.moved:
        conn.execute(
            queries["moved_documents_indexed_at"], {"workspace_id": ws, "ids": run.result.moved, "revision_id": head}
        )
    conn.execute(queries["set_projected_revision"], {"workspace_id": ws, "revision_id": head})
    return run.result
