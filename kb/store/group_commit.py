"""Group commit of one workspace's writers (design §3, §4).

A commit's fixed costs under the write lock — the branch ref's fsync and Postgres' WAL flush at
COMMIT, ~10 ms each here — cap one workspace at a few dozen revisions a second when every writer
pays them alone. So a writer whose draft is *groupable* (plain writes, removes and moves: no
three-way merge, no title, no artifact hook) queues its staged change set as a row of
``kb.write_intents`` (UNLOGGED, committed before it waits) and then waits for the write lock.
Whoever holds the lock next claims every waiting intent in the same round trip as the lock and
records them, oldest first, as **consecutive revisions**: each built on top of the one before, each
checked on its own (a draft whose paths conflict or collide gets its own error and the others go
on), all in one Postgres transaction and one ref update. Each intent's outcome — its revision, or
the error that refused it — is written to its row in that same transaction. A writer that gets the
lock and finds its outcome there just takes it; one that finds none leads a group itself.

Waiting never makes the lock pass from writer to writer: a writer that sees others queued first
waits for the holder with BEGIN, the bounded lock, the read of its outcome and COMMIT sent in one
round trip (``await_outcome``: the lock is held only while the server runs those), and a writer
that wants to lead only *tries* the lock (in the claim's statement). While other writers are
active, a holder claims again, before recording, the drafts queued while it built its group.
An intent belongs to its writer's server session (``backend_pid``): a killed writer's intent is
never recorded and is deleted by the next holder.

Crash safety keeps design §3's shape: git moves first, Postgres catches up. Before the ref moves the
holder writes a journal file per intent it records for another writer (``.git/kb-intents/<id>``
holding the revision id). If it dies after the ref moved and before Postgres committed, the
intents are still waiting and git has their revisions; the next holder records those revisions
(``KnowledgeStore.catch_up``) and, finding the journal, settles each intent with the revision that
landed instead of applying it twice. A writer that gives up waiting (LockTimeout) withdraws its
intent unless a holder already claimed it; if a holder that claimed it died, the journal tells it
the revision that may have landed (CommitOutcomeUnknown).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from kb import errors
from kb.db.locks import WRITE_LOCK_NAMESPACE, lock_statements
from kb.db.sql import queries
from kb.errors import ArtifactReadOnly, KbError, LockTimeout
from kb.store import artifact_rows
from kb.store.draft import Draft
from kb.store.history import PathChange, Revision

if TYPE_CHECKING:
    from kb.db.database import Connection
    from kb.git.repository import Repository

MORE_ROUNDS = 2
"""How many times a holder claims again the drafts queued while it built its group."""
MAX_GROUP = 64
"""At most this many drafts in one group (bounds the lock's hold)."""
CONTENDED_SECONDS = 1.0
"""A holder claims again only if it saw other writers this recently (a lone writer never waits)."""
JOURNAL = "kb-intents"
"""Folder under ``.git`` holding ``<intent id>`` → revision id files while a group is recorded."""


@dataclass(frozen=True)
class Intent:
    """A queued change set: ``staged`` ``{repo path: blob id or None}``, ``moves`` ``{new: old}``."""

    id: int
    staged: dict[str, str | None]
    moves: dict[str, str]
    message: str | None
    author: str
    committer: str
    artifact_paths: frozenset[str]
    """Virtual paths among ``staged`` that are ARTIFACT documents (refused, design §11)."""
    key: str | None = None
    """The write's idempotency key (design §3, ``kb.store.write_keys``)."""

    def draft(self, repo: Repository, base_tree: bytes | None) -> Draft:
        """A Draft equal to the writer's (blobs already in the object store)."""
        return Draft.from_staged(repo, base_tree, self.staged, self.moves)


def groupable(draft: Draft) -> bool:
    """True when another writer may record ``draft`` for its writer: nothing but plain writes,
    removes and moves (no ``write_merged``, no titles, no ``on_record`` hooks, artifact access
    ``refuse``). Other drafts are committed by their own writer under the lock."""
    return (
        not draft.merge_requests()
        and not draft.titles()
        and not draft.on_record
        and draft.artifact_access == artifact_rows.ACCESS_REFUSE
    )


def enqueue(
    conn: Connection,
    workspace_id: int,
    draft: Draft,
    staged: dict[str, str | None],
    message: str | None,
    author: str,
    committer: str,
    key: str | None = None,
) -> tuple[int, bool]:
    """Queue ``draft`` (its blobs ``staged``) as an intent, committed at once; returns ``(intent
    id, ahead)``, ``ahead`` True when another live writer's intent was already waiting. ``key``:
    the write's idempotency key (design §3). Call outside any transaction on ``conn``; the intent
    lives as long as its session. Raises psycopg.Error."""
    payload = {
        "staged": staged,
        "moves": draft.moves(),
        "message": message,
        "author": author,
        "committer": committer,
        "key": key,
    }
    conn.autocommit = True  # one round trip: the INSERT is its own transaction
    try:
        row = conn.execute(
            queries["enqueue_write_intent"],
            {
                "workspace_id": workspace_id,
                "paths": ["/" + p for p in staged],
                "payload": json.dumps(payload),
            },
        ).fetchone()
    finally:
        conn.autocommit = False
    return row["id"], row["ahead"]


def await_outcome(conn: Connection, workspace_id: int, intent_id: int, timeout: float) -> dict | None:
    """Wait for the write lock's current holder to finish and take the outcome it recorded for
    intent ``intent_id`` (removing the intent), or None when it did not record it (the caller then
    queues to lead). One round trip — BEGIN, the bounded lock, the read, COMMIT sent together — so
    the lock is held only while the server runs them, never across a wake-up of this process, and
    writers recorded by one holder do not each hold the lock in turn. Raises LockTimeout after
    ``timeout`` seconds, psycopg.Error."""
    conn.autocommit = True  # explicit BEGIN/COMMIT, so that the COMMIT travels in the same pipeline
    try:
        try:
            with conn.pipeline():
                conn.execute(queries["begin_transaction"])
                lock_statements(conn, WRITE_LOCK_NAMESPACE, workspace_id, timeout)
                taken = conn.execute(queries["take_settled_write_intent"], {"intent_id": intent_id})
                conn.execute(queries["commit_transaction"])
        except psycopg.errors.LockNotAvailable:
            conn.execute(queries["rollback_transaction"])
            raise LockTimeout(workspace_id, timeout) from None
        row = taken.fetchone()
        return None if row is None else row["outcome"]
    finally:
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE and not conn.broken:
            conn.execute(queries["rollback_transaction"])
        conn.autocommit = False


def claim(conn: Connection, workspace_id: int, intent_id: int):
    """Execute (in one round trip with the workspace row) the try of the write lock and, when it
    is held, the claim of the caller's intent and every waiting one; returns the cursor (rows: id,
    payload, outcome, artifact_paths; none when another writer holds the lock)."""
    return conn.execute(
        queries["claim_write_intents"],
        {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": workspace_id, "intent_id": intent_id},
    )


def intent_of(row: dict) -> Intent:
    """The Intent of a claimed row."""
    payload = row["payload"]
    return Intent(
        row["id"],
        payload["staged"],
        payload["moves"],
        payload["message"],
        payload["author"],
        payload["committer"],
        frozenset(row["artifact_paths"] or ()),
        payload.get("key"),
    )


def refuse_artifacts(intent: Intent, effective: dict[str, str | None]) -> None:
    """Raise ArtifactReadOnly (as ``artifact_rows.guard`` with ``refuse``) when a changed path is
    an ARTIFACT document."""
    for path in sorted(intent.artifact_paths):
        if path[1:] in effective:
            refused = f"{path} is an ARTIFACT; plain writes, turns and editor saves refuse it: use"
            raise ArtifactReadOnly(
                f"{refused} artifacts(workspace).revise or .delete",
                cli=f"{refused} `kb artifact revise` or `kb artifact delete`",
            )


# -- outcomes ------------------------------------------------------------------------------
def outcome_of(result: Revision | KbError | None) -> str:
    """JSON of an intent's outcome: its revision (repo paths), ``null`` revision for a net-empty
    change, or the error's class name and message."""
    if isinstance(result, KbError):
        return json.dumps({"error": type(result).__name__, "message": str(result)})
    if result is None:
        return json.dumps({"revision": None})
    return json.dumps(
        {
            "revision": {
                "id": result.id,
                "seq": result.seq,
                "parent_id": result.parent_id,
                "author": result.author,
                "committer": result.committer,
                "message": result.message,
                "changes": [[c.path, c.change, c.content_id, c.old_path, c.new_path] for c in result.changes],
            }
        }
    )


def result_of(outcome: dict) -> Revision | None:
    """The Revision (virtual paths) an outcome records, None for a net-empty change; raises the
    KbError subclass it names (KbError for an unknown name)."""
    if "error" in outcome:
        kind = getattr(errors, outcome["error"], None)
        message = outcome["message"]
        if isinstance(kind, type) and issubclass(kind, KbError):
            try:
                error = kind(message)
            except TypeError:  # an error whose constructor takes fields, not a message
                error = KbError(message)
        else:
            error = KbError(message)
        raise error
    rev = outcome["revision"]
    if rev is None:
        return None
    return Revision(
        rev["id"],
        rev["seq"],
        rev["parent_id"],
        rev["author"],
        rev["committer"],
        rev["message"],
        None,
        tuple(PathChange(*c).virtual() for c in rev["changes"]),
    )


def take(conn: Connection, intent_id: int) -> dict | None:
    """Delete the caller's intent in ``conn``'s transaction; returns its outcome (None if unset)."""
    row = conn.execute(queries["take_write_intent"], {"intent_id": intent_id}).fetchone()
    return None if row is None else row["outcome"]


def drop(conn: Connection, intent_id: int) -> None:
    """Delete the caller's intent in ``conn``'s transaction without reading it (pipeline-friendly)."""
    conn.execute(queries["take_write_intent"], {"intent_id": intent_id})


def forget_dead(conn: Connection, workspace_id: int, intent_id: int) -> None:
    """Delete the intents of killed writers (their server session ended), except the caller's."""
    conn.execute(queries["forget_dead_write_intents"], {"workspace_id": workspace_id, "intent_id": intent_id})


def settle(conn: Connection, outcomes: dict[int, str]) -> None:
    """Write the outcomes ``{intent id: JSON}`` of intents recorded for other writers."""
    if outcomes:
        conn.execute(queries["settle_write_intents"], {"ids": list(outcomes), "outcomes": list(outcomes.values())})


def withdraw(conn: Connection, intent_id: int) -> bool:
    """Delete the caller's intent unless a holder recorded it (waits for a holder that claimed it);
    True when it was withdrawn (nothing will record it)."""
    return conn.execute(queries["withdraw_write_intent"], {"intent_id": intent_id}).fetchone() is not None


# -- the journal (crash between the ref update and Postgres' COMMIT) -------------------------
def _journal(repo: Repository) -> Path:
    return repo.path / ".git" / JOURNAL


def write_journal(repo: Repository, revisions: dict[int, str]) -> None:
    """Before the ref moves: ``{intent id: revision id}`` of the intents recorded for others. No
    fsync: it matters only to writers alive while the holder died, not across a machine crash."""
    if not revisions:
        return
    folder = _journal(repo)
    folder.mkdir(exist_ok=True)
    for intent_id, revision in revisions.items():
        (folder / str(intent_id)).write_text(revision)


def read_journal(repo: Repository) -> dict[int, str]:
    """``{intent id: revision id}`` left in the journal (empty almost always)."""
    try:
        names = os.listdir(_journal(repo))
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        try:
            found[int(name)] = (_journal(repo) / name).read_text().strip()
        except (ValueError, OSError):
            continue
    return found


def clear_journal(repo: Repository, intent_ids) -> None:
    """Remove the journal files of ``intent_ids`` (missing ones are fine)."""
    folder = _journal(repo)
    for intent_id in intent_ids:
        try:
            os.unlink(folder / str(intent_id))
        except FileNotFoundError:
            pass


def recorded_revision(conn: Connection, repo: Repository, workspace_id: int, revision_id: str) -> Revision | None:
    """The Revision (repo paths) Postgres records as ``revision_id``, or None when it has none."""
    row = conn.execute(
        queries["revision_exists"], {"workspace_id": workspace_id, "revision_id": revision_id}
    ).fetchone()
    if row is None:
        return None
    commit = repo.commit(revision_id)
    changes = conn.execute(
        queries["revision_changes"], {"workspace_id": workspace_id, "revision_id": revision_id}
    ).fetchall()
    from kb.store.history import _identity

    return Revision(
        revision_id,
        row["seq"],
        (commit.parents[0].decode() if commit.parents else None),
        _identity(commit.author),
        _identity(commit.committer),
        commit.message.decode("utf-8", errors="replace").rstrip("\n"),
        row["committed_at"],
        tuple(PathChange(**c) for c in changes),
    )
