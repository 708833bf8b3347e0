"""Undoing history as new forward revisions (design §3): ``revert`` of a whole revision and
``restore`` of one document.

Both record through the store's transactions (``KnowledgeStore.transaction``), so they take the
write lock and settle their outcome like every write (alone: a revert's draft is never grouped). A revert follows the
moves recorded since the revision (``kb.store.history.current_path``): a moved document is one
document, undone where it is now with the edits it got since, never restored as a copy beside
itself. ``Workspace.revert`` and ``Workspace.restore`` (``kb.workspace.handle``) call them.
"""

from __future__ import annotations

import contextlib
import posixpath
import secrets
from typing import TYPE_CHECKING

from kb.db import database
from kb.db.sql import queries
from kb.errors import DocumentGone, DocumentNotFound, PathExists, RevisionNotFound
from kb.paths import StorePath
from kb.store import artifact_rows
from kb.store.draft import Draft, repo_path_of
from kb.store.history import PathChange, Revision, current_path, json_column
from kb.store.knowledge_store import stated_message

if TYPE_CHECKING:
    from kb.store.knowledge_store import KnowledgeStore

REVERT_ATTEMPTS = 3
"""``revert``'s attempts when a document it merges back is removed while it runs (design §3)."""


def revert(
    store: KnowledgeStore,
    revision: str,
    author: str,
    committer: str | None = None,
    message: str | None = None,
    idempotency_key: str | None = None,
) -> Revision | None:
    """Record a new forward revision that puts every path ``revision`` touched back to its state
    in ``revision``'s parent (design §3). A recorded move is undone as a move when the moved
    document is still where the revision put it (found by its recorded moves, never by its
    bytes: another of one content may stand there), or — edited or moved on since by recorded
    revisions (``kb.store.history.current_path``) — from where it is now, with the edits it
    got since: it is one document, never restored as a copy beside itself nor stripped of its
    later edits. An edit of a document moved on since is undone where it is now, by the same
    merge. Returns None when there is nothing to undo.

    A path changed since by later revisions keeps that later work: a document the revision
    edited and others edited since gets the revision's edit undone by a three-way merge (base:
    the document as the revision left it; where the later edits overlap the revision's, the
    revert's lines win and theirs stay in history); one removed since stays removed; where the
    undo would remove or replace later work (a document the revision added and others changed
    or moved since, or one written later where the revision removed one) nothing is reverted —
    but an artifact's later revisions are its own generations and go with the revision that
    saved it (design §11). A revision that moved and edited a document gets both undone (the
    edit by the same merge). Work landing while the revert runs counts as later work: the
    merges are made with the head the revert records on, and a removal or restore stands only
    if the path still holds what the revert saw (``Draft.expect_unchanged``); a document
    removed meanwhile stays removed (the revert tries again on a fresh snapshot).

    Raises RevisionNotFound (unknown id, or not in this workspace's history), PathExists when a
    path to restore is now a folder holding documents, when a document the revision moved
    has moved on and its old path now holds another document (nothing is reverted: which one
    belongs there is the caller's call), or when the undo would remove or replace later work
    (above), LockTimeout.
    """
    repo = store.repository
    revision = repo.resolve(revision)
    target = repo.commit(revision)
    with database.transaction(store.database_url) as conn:
        recorded = conn.execute(
            queries["revision_exists"], {"workspace_id": store.workspace_id, "revision_id": revision}
        ).fetchone()
    if recorded is None and revision not in repo.ancestry(repo.head()):
        raise RevisionNotFound(f"revision {revision} is not in workspace {store.workspace_id}'s history")
    parent_tree = repo.tree_id(target.parents[0].decode()) if target.parents else None
    changes = store.list_changes(revision)
    first_line = target.message.decode("utf-8", errors="replace").splitlines()[0] if target.message else ""
    text = stated_message(message) or f'Revert "{first_line}"\n\nThis reverts revision {revision}.'
    for attempt in range(REVERT_ATTEMPTS):
        try:
            return _revert_once(
                store, revision, changes, parent_tree, text, author, committer, recorded is not None, idempotency_key
            )
        except DocumentGone:
            # a document it puts back was removed while it ran (nothing recorded): removed
            # since, it is left removed — the next attempt's snapshot has it so
            if attempt == REVERT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _revert_once(
    store: KnowledgeStore,
    revision: str,
    changes: list[PathChange],
    parent_tree: bytes | None,
    text: str,
    author: str,
    committer: str | None,
    recorded: bool,
    idempotency_key: str | None = None,
) -> Revision | None:
    """One attempt of ``revert`` on a fresh draft (see there); raises as ``revert``, and
    DocumentGone when a document it merges back was removed while it ran."""
    repo = store.repository
    revision_tree = repo.tree_id(revision)
    with store.transaction(text, author, committer, idempotency_key) as draft:
        draft.artifact_access = artifact_rows.ACCESS_BUMP  # design §11: revert bumps generations
        carried = _move_back(store, draft, changes, revision, recorded, parent_tree)
        # where a moved document went back from, the revision's destination is no longer its
        # document's: what stands there now came later and stays
        released = {c.path for c in changes if c.change == "moved" and c.old_path in carried}
        touched = {p for c in changes for p in (c.path, c.old_path, c.new_path) if p} - carried - released
        taken: list[tuple[str, str | None]] = []
        moved_on: dict[str, str] = {}  # of ``taken``: added by the revision, moved since -> where
        for path in sorted(touched):
            before, after = repo.lookup(parent_tree, path[1:]), repo.lookup(revision_tree, path[1:])
            now = draft.content_id(path)
            if now is None and before is None and after is not None:  # added by it, gone from there since
                if recorded and (now_at := _where_now(store, path, revision)) is not None:
                    taken.append((path, before))  # moved on since: later work, not to be removed
                    moved_on[path] = now_at
                continue
            if now == before:
                continue
            if now is None and after is not None:
                # moved on since by recorded revisions (``current_path``): the revision's edit
                # is undone where the document is now, with its later edits kept (the merge)
                moved_to = _where_now(store, path, revision) if recorded and before is not None else None
                if moved_to is not None and moved_to not in touched and draft.exists(moved_to):
                    draft.write_merged(moved_to, repo.blob(before), after, allow_keep=True)
                continue  # else removed since: a later revision's decision, left as it is
            if before is not None and after is not None:
                # as the revision left it, or edited since: undo the revision's edit only —
                # merged (base: as the revision left it) with the head the revert records on,
                # so an edit landing while the revert runs survives too (design §5)
                draft.write_merged(path, repo.blob(before), after, allow_keep=True)
            elif now == after:  # as the revision left it: put back what was there before
                if before is None:
                    draft.remove(path)
                else:
                    draft.write(path, repo.blob(before), allow_keep=True)
                # only if it is still so when the revert records: never removes or replaces
                # work landing meanwhile (PathExists, nothing recorded)
                draft.expect_unchanged(path, after, allow_keep=True)
            else:  # a document the revision added was changed since, or one was written where it removed one
                taken.append((path, before))
        if taken:  # an artifact's later revisions are its own generations (design §11): undone with it
            with database.transaction(store.database_url) as conn:
                artifacts = {
                    row["path"]
                    for row in conn.execute(
                        queries["artifact_documents_at"],
                        {"workspace_id": store.workspace_id, "paths": json_column([path for path, _ in taken])},
                    )
                }
            for path, before in [t for t in taken if t[0] in artifacts]:
                if before is None:
                    draft.remove(path)
                else:
                    draft.write(path, repo.blob(before), allow_keep=True)
            taken = [t for t in taken if t[0] not in artifacts]
        if taken:
            moved = [f"{path} (moved since to {moved_on[path]})" for path, _ in taken if path in moved_on]
            changed = [path for path, _ in taken if path not in moved_on]
            said = ([f"{', '.join(changed)} changed since it (edited or replaced)"] if changed else []) + (
                [f"{', '.join(moved)}"] if moved else []
            )
            raise PathExists(
                f"cannot revert {revision[:12]}: {'; '.join(said)}, and reverting would remove or replace "
                "that later work; nothing was reverted. Revert the later revisions first (`kb log PATH "
                f"--workspace {store.workspace_id}` lists them), or move or edit the document by hand"
            )
    return draft.revision


def _where_now(store: KnowledgeStore, path: str, revision: str) -> str | None:
    """The virtual path the document at ``path`` in ``revision`` was moved to by recorded
    revisions since (``current_path``), or None when it was not moved on, or is gone."""
    with database.transaction(store.database_url) as conn:
        found = current_path(conn, store.workspace_id, repo_path_of(path, allow_keep=True), revision)
    return None if found is None or "/" + found == path else "/" + found


def _move_back(
    store: KnowledgeStore,
    draft: Draft,
    changes: list[PathChange],
    revision: str,
    recorded: bool,
    parent_tree: bytes | None,
) -> set[str]:
    """Undo ``revision``'s recorded moves in ``draft`` as moves (``revert``, design §3); returns
    the old paths the moved documents went back to (the path-wise restore leaves them alone).

    Each moved document is found by the moves recorded since (``current_path``), never by its
    bytes: another document of one content may stand where the revision put it. It goes back
    with the edits it got since. Its old path must be free, hold what the revision wrote there
    (move-then-write), or hold a document that itself goes back elsewhere in this revert (a
    chain: x moved out, y moved into x's place); all the moves are made at once, through a
    temporary path where one's destination is another's source. A document untouched since
    whose old path is taken is left to the path-wise restore; one edited or moved on since is
    refused (PathExists, nothing reverted): restoring its old path from the parent would leave
    a second copy of it, or drop its edits."""
    written = {c.path: c.content_id for c in changes}
    carried: set[str] = set()
    plan: list[tuple[str, PathChange, bool]] = []  # (where it is now, the change, untouched since)
    with contextlib.ExitStack() as reading:
        history = None  # one connection reads where every moved document is now
        for change in changes:
            if change.change != "moved" or change.old_path is None:
                continue
            if recorded:
                if history is None:
                    history = reading.enter_context(database.transaction(store.database_url))
                found = current_path(history, store.workspace_id, repo_path_of(change.path, allow_keep=True), revision)
                now = None if found is None else "/" + found
            else:  # not recorded (git alone has it): where it was put, if its bytes are there
                now = change.path if draft.content_id(change.path) == change.content_id else None
            if now is None or not draft.exists(now):
                continue  # removed or replaced since: the path-wise restore
            if now == change.old_path:
                carried.add(now)  # back where it was already, edits and all
                continue
            untouched = now == change.path and draft.content_id(now) == change.content_id
            plan.append((now, change, untouched))

    def free(change: PathChange, leaving: set[str]) -> bool:
        held = draft.content_id(change.old_path)
        return held is None or change.old_path in leaving or held == written.get(change.old_path)

    while True:  # drop the untouched ones whose old path stays taken, until none is dropped
        leaving = {now for now, _, _ in plan}
        kept = [entry for entry in plan if not entry[2] or free(entry[1], leaving)]
        if len(kept) == len(plan):
            break
        plan = kept
    for now, change, _ in plan:
        if not free(change, leaving):
            raise PathExists(
                f"revision {revision[:12]} moved {change.old_path} to {change.path}; that document is "
                f"at {now} now, and {change.old_path} holds another document: nothing was reverted. "
                f"Move or remove one of them, then revert again (or restore what you need with "
                f"`kb restore`)"
            )
    sources = {now for now, _, _ in plan}
    chained = any(change.old_path in sources for _, change, _ in plan)  # a chain or a cycle
    hops = []
    for number, (now, change, _) in enumerate(plan):
        if chained:  # every document first to a temporary path of its own, then to its old path
            base, extension = posixpath.splitext(now)
            temporary = f"{base}.kb-revert-{number}-{secrets.token_hex(4)}{extension}"
            draft.move(now, temporary)
            hops.append((temporary, change.old_path))
        else:
            hops.append((now, change.old_path))
    for source, target in hops:
        draft.move(source, target, overwrite=True)
        carried.add(target)
    repo = store.repository
    for _, change, _ in plan:  # a revision that moved and edited a document: its edit undone too
        before = repo.lookup(parent_tree, change.old_path[1:])
        if before is not None and change.content_id is not None and before != change.content_id:
            # merged with the head the revert records on (base: as the revision left it), so
            # the edits it got since stay (design §5)
            draft.write_merged(change.old_path, repo.blob(before), change.content_id, allow_keep=True)
    return carried


def restore(
    store: KnowledgeStore,
    path: str | StorePath,
    revision: str,
    author: str,
    committer: str | None = None,
    message: str | None = None,
    idempotency_key: str | None = None,
) -> Revision | None:
    """Bring one document back as it was at ``revision``, as a new forward revision (design §3).
    ``idempotency_key`` as in ``KnowledgeStore.transaction`` (also for :func:`revert`).

    The document at ``path`` in ``revision`` is followed through the moves recorded since, as
    ``revert`` follows them: when it is now elsewhere, its content goes there (it restored a
    second copy at the old path, beside the moved document); when it was removed, or never
    moved, it comes back at ``path``. A ``path`` with no document in ``revision`` is taken as
    where a document is now: followed back through the moves recorded since, its version in
    ``revision`` (at the path it had then) comes back at ``path``.

    Returns None when HEAD already holds those bytes there. Raises RevisionNotFound,
    DocumentNotFound (no document at ``path`` in ``revision``), InvalidPath, PathExists.
    """
    revision = store.repository.resolve(revision)
    virtual = StorePath.parse(str(path), allow_keep=True).virtual
    try:
        data = store.read_as_of(revision, path)
    except DocumentNotFound:
        # ``path`` may be where the document is now, moved there since: its version then, at
        # the path it had, comes back here (as ``log`` and ``blame`` follow it)
        earlier = store.path_in_revision(virtual, revision)
        if earlier is None or earlier == virtual:
            raise
        data = store.read_as_of(revision, earlier)
    moved = store.moved_to(virtual, revision)
    head_tree = store.repository.tree_id(store.head())
    if moved is not None and moved != virtual and store.repository.lookup(head_tree, moved[1:]) is not None:
        virtual = moved  # the same document, under the path it has now
    text = stated_message(message) or f"restore {virtual} from revision {revision[:12]}"
    with store.transaction(text, author, committer, idempotency_key) as draft:
        draft.artifact_access = artifact_rows.ACCESS_BUMP  # design §11: restore bumps generations
        draft.write(virtual, data, allow_keep=True)
    return draft.revision
