"""A writer whose write lock is lost — its Postgres session ended by ``pg_terminate_backend`` while
the process goes on — must not make another writer misreport its outcome (design §3, §4).

The write lock is a Postgres session's, so when that session ends the lock is free while its
holder, a thread of this process, still runs: it may move the branch ref after another writer took
the lock. The faults are real: the holder's session is terminated from a side connection at the
moment its ref is about to move (a hook on ``Repository.advance``), and the other writer runs
through the window that opens.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
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


def _group_behind_a_held_lock(url: str, threads: list[threading.Thread], started: list | None = None) -> None:
    """Hold the write lock while each writer thread starts and queues its intent (in order: the
    first leads, the others wait for its outcome), then release it and join them. ``started``
    gets each thread's ident as it starts."""
    lock = _admin(url)
    admin = _admin(url)
    try:
        lock.execute(queries["begin_transaction"])
        lock.execute(
            queries["lock_workspace_write_bounded"],
            {"timeout": "30s", "namespace": WRITE_LOCK_NAMESPACE, "workspace_id": WS},
        )
        for queued, thread in enumerate(threads, start=1):
            thread.start()
            if started is not None:
                started.append(thread.ident)
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


def test_a_follower_whose_change_a_lockless_leader_moved_the_branch_with_is_told_it_landed(ws, monkeypatch):
    """The leader L records its own draft and W's; its session ends just before its ref moves. W
    takes the lock, catches up (nothing yet), then L moves the branch with W's change. W must not
    build on that unrecorded head (W's change would look already there: "nothing changed", None)
    and is told the revision its change landed in."""
    url = ws.database_url
    state: dict = {"leader": None, "writers": []}
    killed, proceed, advanced = threading.Event(), threading.Event(), threading.Event()
    original_advance, original_catch_up = Repository.advance, KnowledgeStore._catch_up

    def advance(self, old, new):
        if state["leader"] is None:
            state["leader"] = threading.get_ident()
            killed.set()  # before: the other writer takes the lock as soon as the session ends
            _terminate_lock_holders(url)  # this thread's own session: its lock is gone
            # the other writer caught up (no fence) or waits at the ref-update fence this holds
            _wait(lambda: proceed.is_set() or any(_in_stack(t, "_ref_fenced") for t in state["writers"]), "W")
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
    threads = [
        threading.Thread(target=_writer, args=(KnowledgeBase(ws.settings, url), p, results, keys[p])) for p in paths
    ]
    try:
        _group_behind_a_held_lock(url, threads, state["writers"])
    finally:
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


def test_a_writer_whose_session_ends_before_its_ref_update_lands_and_the_next_writer_builds_on_it(ws, monkeypatch):
    """The writer's session ends between its lock check and its ref update; another writer takes
    the free lock at once. The other waits at the ref-update fence until the first has moved the
    branch, catches that revision up and records its own on top (design §3): both writes land,
    and each writer is told its own revision — the first settles by its key."""
    url = ws.database_url
    state: dict = {"first": None}
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
            state["other"] = thread
            _wait(lambda: _in_stack(thread.ident, "_ref_fenced"), "the other writer at the fence")
        return original_advance(self, old, new)

    monkeypatch.setattr(Repository, "advance", advance)
    # a merged write: committed by its own writer under the lock (not group-committed)
    try:
        with ws.transaction(WS, "first", "w", idempotency_key="key-l") as tx:
            tx.write_merged("/documents/l.md", "l\n", None)
        first = tx.revision
        state["other"].join(60)
    finally:
        monkeypatch.undo()
        database.close_pools()
    second = other["/documents/x.md"]
    assert not isinstance(second, KbError), second
    assert first is not None and second is not None
    history = [r.id for r in ws.history(WS)]
    assert history[:2] == [second.id, first.id]  # newest first: x on top of l
    assert ws.write_outcome(WS, "key-l").id == first.id
    assert ws.read(WS, "/documents/l.md") == b"l\n" and ws.read(WS, "/documents/x.md") == b"/documents/x.md\n"


def test_a_branch_moved_without_the_lock_during_a_write_is_told_and_settled(ws, monkeypatch):
    """A git command run by hand moves the branch while a writer holds the lock, between its
    check and its ref update. The writer's compare-and-swap fails: WriteLockLost, saying a process
    moved the branch without the lock, and (settled by its key) that its write did not land."""
    repo_path = ws.settings.knowledge_store / str(WS)
    original_advance = Repository.advance
    moved: list = []

    def advance(self, old, new):
        if not moved:
            subprocess.run(
                ["git", "-C", str(repo_path), "commit", "-q", "--allow-empty", "-m", "by hand"],
                check=True,
                env={
                    **os.environ,
                    "GIT_AUTHOR_NAME": "h",
                    "GIT_AUTHOR_EMAIL": "h@x",
                    "GIT_COMMITTER_NAME": "h",
                    "GIT_COMMITTER_EMAIL": "h@x",
                },
            )
            moved.append(True)
        return original_advance(self, old, new)

    monkeypatch.setattr(Repository, "advance", advance)
    try:
        with pytest.raises(WriteLockLost) as raised:
            with ws.transaction(WS, "doomed", "w", idempotency_key="key-l") as tx:
                tx.write_merged("/documents/l.md", "l\n", None)
    finally:
        monkeypatch.undo()
        database.close_pools()
    message = str(raised.value)
    assert "without the lock" in message and "did not land" in message, message
    assert ws.write_outcome(WS, "key-l") is None
    assert [r.message.splitlines()[0] for r in ws.history(WS)][0] == "by hand"  # recorded as it is


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


def _in_stack(ident: int | None, function: str) -> bool:
    """Whether the thread ``ident`` is running ``function`` now (anywhere in its stack)."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    while frame is not None:
        if frame.f_code.co_name == function:
            return True
        frame = frame.f_back
    return False


def test_a_settle_in_the_gap_before_a_lockless_leaders_ref_update_tells_the_truth(ws, monkeypatch):
    """The leader L records its own draft and the follower W's; both sessions end between L's lock
    check and L's ref update (the connection killer of ``bin/stress_outcomes.py``). W settles its
    write by its key at once: it takes the free lock, and git has nothing new yet. It must not
    answer "nothing was recorded" while L may still move the branch with W's change: it waits at
    the ref-update fence (design §3, ``kb.git.ref_fence``), and answers the revision L landed."""
    url = ws.database_url
    state: dict = {"leader": None, "follower": None}
    killed, caught_up = threading.Event(), threading.Event()
    original_advance, original_catch_up = Repository.advance, KnowledgeStore._catch_up

    def advance(self, old, new):  # L, after its lock check
        if state["leader"] is None:
            state["leader"] = threading.get_ident()
            with _admin(url) as admin:  # L's session and W's, waiting for L's outcome
                admin.execute(queries["test_terminate_busy_client_backends"]).fetchall()
            killed.set()
            # W has caught up (the fault: it then answers from git as it is now), or waits at the fence
            _wait(lambda: caught_up.is_set() or _in_stack(state["follower"], "_ref_fenced"), "the settle")
        return original_advance(self, old, new)

    def catch_up(self, conn, workspace):
        result = original_catch_up(self, conn, workspace)
        if killed.is_set() and threading.get_ident() != state["leader"]:
            caught_up.set()
        return result

    def writer(kb, path, key):
        if path == "/documents/w.md":
            state["follower"] = threading.get_ident()
        _writer(kb, path, results, key)

    monkeypatch.setattr(Repository, "advance", advance)
    monkeypatch.setattr(KnowledgeStore, "_catch_up", catch_up)
    paths, keys = ["/documents/l.md", "/documents/w.md"], {"/documents/l.md": "key-l", "/documents/w.md": "key-w"}
    results: dict = {}
    # L queues first and leads; W queues behind it and waits for its outcome
    threads = [threading.Thread(target=writer, args=(KnowledgeBase(ws.settings, url), p, keys[p])) for p in paths]
    try:
        _group_behind_a_held_lock(url, threads)
    finally:
        monkeypatch.undo()
        database.close_pools()
    assert killed.is_set(), results
    ws.reconcile(WS)  # whatever git has, recorded
    landed = {c.path: r.id for r in ws.history(WS) for c in r.changes}
    assert "/documents/w.md" in landed, (landed, results)  # L moved the branch with W's change
    outcome = results["/documents/w.md"]
    assert not isinstance(outcome, KbError), f"W's write landed in {landed['/documents/w.md']}, W was told: {outcome}"
    assert outcome is not None and outcome.id == landed["/documents/w.md"]


@pytest.mark.parametrize("merged", [False, True], ids=["group-committed", "committed-alone"])
def test_a_writer_at_its_ref_update_behind_a_stopped_fence_holder_times_out_and_records_nothing(
    ws, monkeypatch, merged
):
    """A writer W has caught up under the write lock when a writer whose lock ended enters the
    ref-update fence and is stopped there (SIGSTOP, a debugger: here the fence's flock is held by
    the test, as that process holds it). W's ref update waited for the fence without a bound,
    holding the write lock, so W and every writer of the workspace behind it waited for as long as
    the other stayed stopped (found by the breaker with two real processes). W now gives up after
    KB_LOCK_TIMEOUT with LockTimeout naming the ref-update lock, and nothing is recorded (design §3)."""
    from kb.errors import LockTimeout
    from kb.git.ref_fence import ref_fence

    url = ws.database_url
    impatient = KnowledgeBase(ws.settings.model_copy(update={"lock_timeout": 1.0}), url)
    head = ws.head(WS)
    held = contextlib.ExitStack()
    original_catch_up = KnowledgeStore._catch_up

    def catch_up(self, conn, workspace):
        result = original_catch_up(self, conn, workspace)
        if not held._exit_callbacks:  # W has passed the fence: the stopped writer enters it now
            held.enter_context(ref_fence(self.repository.path / ".git", 60))
        return result

    monkeypatch.setattr(KnowledgeStore, "_catch_up", catch_up)
    results: dict = {}

    def write() -> None:
        try:
            with impatient.transaction(WS, "w", "w", idempotency_key="key-w") as tx:
                if merged:
                    tx.write_merged("/documents/w.md", "w\n", None)
                else:
                    tx.write("/documents/w.md", "w\n")
            results["w"] = tx.revision
        except KbError as exc:
            results["w"] = exc

    writer = threading.Thread(target=write, daemon=True)
    try:
        writer.start()
        writer.join(60)
        assert not writer.is_alive(), "the writer still waits at its ref update, holding the write lock"
    finally:
        held.close()  # the stopped writer goes on (and its check fails: it moves nothing)
        writer.join(60)
        monkeypatch.undo()
        database.close_pools()
    assert isinstance(results["w"], LockTimeout) and "ref-update" in str(results["w"]), results
    assert ws.head(WS) == head
    assert ws.write_outcome(WS, "key-w") is None  # nothing was recorded, as it said
    with ws.transaction(WS, "after", "w") as tx:  # the lock was let go
        tx.write("/documents/after.md", "after\n")
    assert tx.revision is not None
