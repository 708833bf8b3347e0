"""A writer whose write lock is lost — its Postgres session ended by ``pg_terminate_backend`` while
the process goes on — must not make another writer misreport its outcome (design §3, §4).

The write lock is a Postgres session's, so when that session ends the lock is free while its
holder, a thread of this process, still runs: it may move the branch ref after another writer took
the lock. The faults are real: the holder's session is terminated from a side connection at the
moment its ref is about to move (a hook on ``Repository.advance``), and the other writer runs
through the window that opens.
"""

from __future__ import annotations

import subprocess
import threading
import time

import psycopg
import pytest
from support.named_queries import queries

from kb.db import database
from kb.db.locks import WRITE_LOCK_NAMESPACE
from kb.errors import KbError, WriteLockLost
from kb.git.repository import Repository
from kb.knowledge_base import KnowledgeBase
from kb.store.knowledge_store import KnowledgeStore

WS = 1


@pytest.fixture
def ws(kb):
    kb.create_workspace(WS)
    with kb.transaction(WS, "base", "t") as tx:
        tx.write("/documents/base.md", "base\n")
    return kb


def _admin(url: str) -> psycopg.Connection:
    return database.connect(url, autocommit=True)


def _terminate_lock_holders(url: str) -> None:
    with _admin(url) as admin:
        for r in admin.execute(
            queries["test_write_lock_holders"], {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": WS}
        ).fetchall():
            admin.execute(queries["test_terminate_backend"], {"pid": r["pid"]})
    time.sleep(0.2)


def _writer(kb: KnowledgeBase, path: str, results: dict, key: str) -> None:
    try:
        with kb.transaction(WS, f"write {path}", "w", idempotency_key=key) as tx:
            tx.write(path, f"{path}\n")
        results[path] = tx.revision
    except KbError as exc:
        results[path] = exc


def _wait(predicate, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_follower_whose_change_a_lockless_leader_moved_the_branch_with_is_told_it_landed(ws, monkeypatch):
    """The leader L records its own draft and W's; its session ends just before its ref moves. W
    takes the lock, catches up (nothing yet), then L moves the branch with W's change. W must not
    build on that unrecorded head (W's change would look already there: "nothing changed", None)
    and is told the revision its change landed in."""
    url = ws.database_url
    state = {"leader": None}
    killed, proceed, advanced = threading.Event(), threading.Event(), threading.Event()
    original_advance, original_catch_up = Repository.advance, KnowledgeStore._catch_up

    def advance(self, old, new):
        if state["leader"] is None:
            state["leader"] = threading.get_ident()
            killed.set()  # before: the other writer takes the lock as soon as the session ends
            _terminate_lock_holders(url)  # this thread's own session: its lock is gone
            proceed.wait(30)
            try:
                return original_advance(self, old, new)
            finally:
                advanced.set()
        return original_advance(self, old, new)

    def catch_up(self, conn, workspace):
        result = original_catch_up(self, conn, workspace)
        if killed.is_set() and threading.get_ident() != state["leader"] and not proceed.is_set():
            proceed.set()  # the lockless leader moves the branch now, after this catch-up
            advanced.wait(30)
        return result

    monkeypatch.setattr(Repository, "advance", advance)
    monkeypatch.setattr(KnowledgeStore, "_catch_up", catch_up)
    paths, keys = ["/documents/a.md", "/documents/b.md"], {"/documents/a.md": "key-a", "/documents/b.md": "key-b"}
    results: dict = {}
    lock = _admin(url)
    admin = _admin(url)
    try:
        lock.execute(queries["begin_transaction"])
        lock.execute(
            queries["lock_workspace_write_bounded"],
            {"timeout": "30s", "namespace": WRITE_LOCK_NAMESPACE, "workspace_id": WS},
        )
        threads = [
            threading.Thread(target=_writer, args=(KnowledgeBase(ws.settings, url), p, results, keys[p])) for p in paths
        ]
        for queued, thread in enumerate(threads, start=1):
            thread.start()
            _wait(
                lambda n=queued: (
                    len(admin.execute(queries["test_write_intents"], {"workspace_id": WS}).fetchall()) >= n
                ),
                "the intent",
            )
        lock.execute(queries["commit_transaction"])  # one writer leads and records both
        for thread in threads:
            thread.join(90)
    finally:
        lock.close()
        admin.close()
        monkeypatch.undo()
        database.close_pools()
    assert killed.is_set() and proceed.is_set(), results
    landed = {c.path: r.id for r in ws.history(WS) for c in r.changes}
    for path in paths:
        outcome = results[path]
        if path in landed:
            assert outcome is not None, f"{path} landed in {landed[path]} but its writer was told 'nothing changed'"
            assert not isinstance(outcome, KbError), f"{path} landed but its writer was told {outcome}"
            assert outcome.id == landed[path]
        else:
            assert isinstance(outcome, KbError) and "nothing was recorded" in str(outcome)
    assert "/documents/a.md" in landed or "/documents/b.md" in landed


def test_a_writer_that_lost_its_lock_to_another_writer_says_so_and_what_landed(ws, monkeypatch):
    """The writer's session ends just before its ref moves; another writer takes the lock and
    moves the branch; the first one's compare-and-swap fails. It says the session holding the lock
    ended (not "another process writes without the lock") and, settled by its key, that its write
    did not land."""
    url = ws.database_url
    state = {"first": None}
    original_advance = Repository.advance
    other: dict = {}

    def advance(self, old, new):
        if state["first"] is None:
            state["first"] = threading.get_ident()
            _terminate_lock_holders(url)
            thread = threading.Thread(
                target=_writer, args=(KnowledgeBase(ws.settings, url), "/documents/x.md", other, "key-x")
            )
            thread.start()
            thread.join(60)
        return original_advance(self, old, new)

    monkeypatch.setattr(Repository, "advance", advance)
    # a merged write: committed by its own writer under the lock (not group-committed)
    try:
        with pytest.raises(KbError) as raised:
            with ws.transaction(WS, "doomed", "w", idempotency_key="key-l") as tx:
                tx.write_merged("/documents/l.md", "l\n", None)
    finally:
        monkeypatch.undo()
        database.close_pools()
    assert not isinstance(other["/documents/x.md"], KbError), other
    message = str(raised.value)
    assert "without the lock. Nothing" not in message
    assert isinstance(raised.value, WriteLockLost), message
    assert "session holding the lock ended" in message and "did not land" in message
    assert ws.write_outcome(WS, "key-l") is None
    assert ws.head(WS) == other["/documents/x.md"].id


def test_a_leader_whose_ref_update_fails_tells_the_outcome_another_holder_recorded(kb, monkeypatch):
    """A group's leader whose ref update fails (git's ref lock held: ``git gc`` packing refs, a
    git command) rolls back and withdraws its queued intent; a writer that took the lock in
    between claimed that intent and recorded it. The leader must answer with that revision, not
    "Nothing was recorded; retry" (design §3: kb never lies about a write's outcome)."""
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "t") as tx:
        tx.write("/documents/seed.md", "seed\n")
    repo_path = kb.settings.knowledge_store / str(WS)
    lock_file = repo_path / ".git" / "refs" / "heads" / "main.lock"
    other = KnowledgeBase(kb.settings, kb.database_url)
    original = KnowledgeStore._withdraw_quietly
    interleaved: list = []

    def withdraw_after_another_holder(self, intent_id):
        if not interleaved:  # the leader's group failed: its lock is free, its intent still queued
            lock_file.unlink()
            with other.transaction(WS, "the other writer", "o") as other_tx:
                other_tx.write("/documents/other.md", "other\n")
            interleaved.append(other_tx.revision)
        return original(self, intent_id)

    monkeypatch.setattr(KnowledgeStore, "_withdraw_quietly", withdraw_after_another_holder)
    lock_file.write_text("held by a git command\n")
    outcome: object
    try:
        with kb.transaction(WS, "the leader's write", "l") as tx:
            tx.write("/documents/leader.md", "leader\n")
        outcome = tx.revision
    except KbError as exc:
        outcome = exc
    log = subprocess.run(
        ["git", "-C", str(repo_path), "log", "--format=%s"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert interleaved and "the leader's write" in log  # the other holder recorded it
    assert not isinstance(outcome, KbError), f"landed, but the leader said: {outcome}"
    assert outcome is not None and kb.read(WS, "/documents/leader.md") == b"leader\n"
    other.close()
