"""A writer learns the truth about its write (design §3): landed (with the revision), not landed,
or unknown with the one call that settles it; and an idempotency key makes a retry apply a change
at most once.

The faults are real: ``pg_terminate_backend`` of a writer's own server session while the group
commit's leader (kb/store/group_commit.py) records that writer's queued draft, held at the right
moment by a row lock the test takes on the workspace row (the leader's last write before the ref
moves)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from support.named_queries import queries

from kb.db import database
from kb.db.locks import WRITE_LOCK_NAMESPACE
from kb.errors import CommitOutcomeUnknown, KbError
from kb.knowledge_base import KnowledgeBase

WS = 1


@pytest.fixture
def ws(kb):
    kb.create_workspace(WS)
    with kb.transaction(WS, "base", "t") as tx:
        tx.write("/documents/base.md", "base\n")
    return kb


def _admin(url: str) -> psycopg.Connection:
    return database.connect(url, autocommit=True)


def _intents(admin: psycopg.Connection) -> list[dict]:
    return admin.execute(queries["test_write_intents"], {"workspace_id": WS}).fetchall()


def _wait(predicate, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _writer(kb: KnowledgeBase, path: str, results: dict, key: str | None = None) -> None:
    try:
        with kb.transaction(WS, f"write {path}", "w", **({} if key is None else {"idempotency_key": key})) as tx:
            tx.write(path, f"{path}\n")
        results[path] = tx.revision
    except KbError as exc:
        results[path] = exc


def _leader_records_a_killed_waiter(ws: KnowledgeBase, keys: dict[str, str] | None = None) -> dict:
    """Two writers queue while the test holds the write lock; the one that leads claims both and
    is held before its ref moves; the other's server session is terminated; then the leader goes
    on and records both. Returns ``{path: Revision or KbError}`` and the killed writer's path."""
    url, keys = ws.database_url, keys or {}
    paths = ["/documents/a.md", "/documents/b.md"]
    results: dict = {}
    lock = _admin(url)
    lock.execute(queries["begin_transaction"])
    lock.execute(
        queries["lock_workspace_write_bounded"],
        {"timeout": "30s", "namespace": WRITE_LOCK_NAMESPACE, "workspace_id": WS},
    )
    threads = [
        threading.Thread(target=_writer, args=(KnowledgeBase(ws.settings, url), p, results, keys.get(p))) for p in paths
    ]
    admin = _admin(url)
    try:
        for queued, thread in enumerate(threads, start=1):
            thread.start()
            _wait(lambda n=queued: len(_intents(admin)) >= n or None, "the intent")
        row = _admin(url)
        row.execute(queries["begin_transaction"])
        row.execute(queries["test_hold_workspace_row"], {"workspace_id": WS})
        lock.execute(queries["commit_transaction"])  # the leader takes the lock, claims both, and waits for the row
        leader = _wait(
            lambda: [
                r["pid"]
                for r in admin.execute(queries["test_backends_blocked_by"], {"pids": [row.info.backend_pid]}).fetchall()
            ],
            "the leader to wait for the workspace row",
        )[0]
        victim = next(i for i in _intents(admin) if i["backend_pid"] != leader)
        admin.execute(queries["test_terminate_backend"], {"pid": victim["backend_pid"]})
        time.sleep(0.2)
        row.execute(queries["commit_transaction"])
        for thread in threads:
            thread.join(60)
        killed = next(p for p in paths if p[1:] in victim["payload"]["staged"])
        return {"results": results, "killed": killed}
    finally:
        for conn in (lock, admin):
            conn.close()
        database.close_pools()


def test_a_waiter_killed_while_the_leader_records_it_is_told_it_landed(ws):
    run = _leader_records_a_killed_waiter(ws)
    results, killed = run["results"], run["killed"]
    history = ws.history(WS)
    landed = {c.path: r.id for r in history for c in r.changes}
    assert killed in landed, "the leader recorded the killed writer's draft"
    outcome = results[killed]
    assert not isinstance(outcome, KbError), f"a write that landed was reported as {outcome!r}"
    assert outcome.id == landed[killed]
    other = next(p for p in results if p != killed)
    assert results[other].id == landed[other]


def test_a_retry_with_the_same_key_returns_the_first_revision(ws):
    with ws.transaction(WS, "first", "w", idempotency_key="order-17") as tx:
        tx.write("/documents/x.md", "x\n")
    first = tx.revision
    with ws.transaction(WS, "again", "w", idempotency_key="order-17") as tx:
        tx.write("/documents/x.md", "x\n")
        tx.write("/documents/y.md", "y\n")
    assert tx.revision.id == first.id
    assert len(ws.history(WS)) == 2
    assert ws.write_outcome(WS, "order-17").id == first.id
    assert ws.write_outcome(WS, "never-used") is None


def test_a_killed_waiter_retrying_with_its_key_applies_the_write_once(ws):
    keys = {"/documents/a.md": "key-a", "/documents/b.md": "key-b"}
    run = _leader_records_a_killed_waiter(ws, keys)
    killed = run["killed"]
    with ws.transaction(WS, "retry", "w", idempotency_key=keys[killed]) as tx:
        tx.write(killed, "retried\n")
    assert tx.revision.id == ws.write_outcome(WS, keys[killed]).id
    assert ws.read(WS, killed) == f"{killed}\n".encode()
    assert len(ws.history(WS)) == 3


def test_the_key_survives_a_revision_git_has_and_postgres_lacks(ws, monkeypatch):
    """The leader's own session dies after the ref moved (before Postgres committed): the key is
    in the commit object, so catching up records it and the writer is told the write landed."""
    from kb.store import knowledge_store as store_module

    def fault(name):
        if name == "before_pg_commit":
            with _admin(ws.database_url) as admin:
                for r in admin.execute(
                    queries["test_write_lock_holders"], {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": WS}
                ).fetchall():
                    admin.execute(queries["test_terminate_backend"], {"pid": r["pid"]})
            time.sleep(0.2)

    monkeypatch.setattr(store_module, "fault_point", fault)
    with ws.transaction(WS, "doomed?", "w", idempotency_key="k-pg-commit") as tx:
        tx.write("/documents/z.md", "z\n")
    monkeypatch.undo()
    assert tx.revision is not None and tx.revision.id == ws.head(WS)
    assert ws.write_outcome(WS, "k-pg-commit").id == ws.head(WS)
    database.close_pools()


def test_outcome_unknown_names_the_key_and_the_settling_call():
    error = CommitOutcomeUnknown(3, "k-1", "server closed the connection")
    assert error.idempotency_key == "k-1"
    assert "write_outcome(3, 'k-1')" in str(error) and "k-1" in str(error)


# -- the HTTP API (kb serve): Idempotency-Key, and the status of an unknown outcome ------------
def _app(settings, extra=None):
    pytest.importorskip("fastapi", reason="kb serve needs the serve extra")
    from fastapi.testclient import TestClient

    from kb.adapters.http.server import create_app

    return TestClient(create_app(settings, routers=extra or [], insecure_no_auth=True))


def test_http_commit_with_the_same_idempotency_key_records_once(ws, settings):
    with _app(settings) as client:
        turn = "/v1/workspaces/1/turns/agent-1"
        assert client.put(f"{turn}/files/documents/h.md", json={"content": "h\n"}).status_code == 200
        first = client.post(f"{turn}/commit", json={"message": "h"}, headers={"Idempotency-Key": "req-42"})
        assert first.status_code == 200, first.text
        client.put(f"{turn}/files/documents/h.md", json={"content": "h\n"})  # the same change again
        second = client.post(f"{turn}/commit", json={"message": "h"}, headers={"Idempotency-Key": "req-42"})
        assert second.status_code == 200 and second.json()["revision"] == first.json()["revision"]
        client.put(f"{turn}/files/documents/h.md", json={"content": "h again\n"})  # another change, same key
        reused = client.post(f"{turn}/commit", json={"message": "h"}, headers={"Idempotency-Key": "req-42"})
        assert reused.status_code == 409 and reused.json()["error"] == "IdempotencyKeyReused", reused.text
        kept = client.get(f"{turn}/files/documents/h.md").json()  # nothing recorded, the turn kept
        assert kept["lines"] == [[1, "h again"]], kept
        client.delete(turn)
        settled = client.get("/v1/workspaces/1/writes/req-42").json()
        assert settled["landed"] and settled["revision"]["id"] == first.json()["revision"]
        logged = client.get("/v1/workspaces/1/log").json()[0]  # the settled revision is the logged one
        assert settled["revision"]["committed_at"] == logged["committed_at"] is not None
        assert client.get("/v1/workspaces/1/writes/other").json() == {
            "idempotency_key": "other",
            "landed": False,
            "revision": None,
        }
        assert len(client.get("/v1/workspaces/1/log").json()) == 2


def test_a_commit_retried_as_it_was_sent_answers_the_revision_that_landed(ws, settings):
    """design §3: the common retry — a client whose commit timed out sends the same request again —
    finds nothing left to record (the turn was committed; a new turn's same write is what head
    already holds) and must still answer the revision its key landed as, never "nothing
    recorded". Over HTTP and in Python, on the same turn and on a new one; a key that never
    landed still answers None."""
    with _app(settings) as client:
        turn = "/v1/workspaces/1/turns/agent-2"
        assert client.put(f"{turn}/files/documents/r.md", json={"content": "r\n"}).status_code == 200
        first = client.post(f"{turn}/commit", json={"message": "r"}, headers={"Idempotency-Key": "req-43"})
        assert first.status_code == 200 and first.json()["revision"], first.text
        again = client.post(f"{turn}/commit", json={"message": "r"}, headers={"Idempotency-Key": "req-43"})
        assert again.status_code == 200 and again.json()["revision"] == first.json()["revision"], again.text
    turn = ws.turn(WS, "agent-3", "w")
    turn.write("/documents/s.md", "s\n")
    landed = turn.commit("s", idempotency_key="idem-s")
    assert landed is not None
    assert turn.commit("s", idempotency_key="idem-s").revision == landed.revision  # the same turn
    repeat = ws.turn(WS, "agent-4", "w")
    repeat.write("/documents/s.md", "s\n")  # what head already holds: nothing to record
    result = repeat.commit("s", idempotency_key="idem-s")
    assert result is not None and result.revision == landed.revision and "/documents/s.md" in result.added
    idle = ws.turn(WS, "agent-5", "w")
    idle.write("/documents/s.md", "s\n")
    assert idle.commit("s", idempotency_key="never-landed") is None
    assert len(ws.history(WS)) == 3  # base, r, s


def test_http_outcome_unknown_is_503_naming_the_settling_call(ws, settings):
    from fastapi import APIRouter

    def failing(service):
        router = APIRouter()

        @router.post("/v1/fail")
        def fail() -> dict:
            raise CommitOutcomeUnknown(1, "k/1", "server closed the connection", "abc123")

        return router

    with _app(settings, [failing]) as client:
        answer = client.post("/v1/fail")
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
    body = answer.json()
    assert body["error"] == "CommitOutcomeUnknown" and body["idempotency_key"] == "k/1"
    assert body["settle"] == {"method": "GET", "path": "/v1/workspaces/1/writes/k%2F1"}


def test_cli_write_outcome_settles_a_key(ws, kb_env):
    from support.commands import run_cli

    with ws.transaction(WS, "keyed", "w", idempotency_key="cli-1") as tx:
        tx.write("/documents/k.md", "k\n")
    landed = run_cli(kb_env, "write-outcome", "cli-1", "--workspace", "1")
    assert tx.revision.id in landed.stdout
    missing = run_cli(kb_env, "write-outcome", "cli-2", "--workspace", "1", check=False)
    assert missing.returncode == 1 and "recorded nothing" in missing.stdout


def test_a_keyed_retry_sent_while_the_first_commit_is_in_flight_answers_its_revision(ws, monkeypatch):
    """design §3: a client's commit is still in flight (staging its blobs, not yet at the write
    lock) when its retry — same key, a new turn with nothing to record — arrives. The retry
    settled the key at once and answered None; then the first commit landed with that key. It now
    waits for the first one and answers the revision it landed as."""
    from kb.store.knowledge_store import KnowledgeStore

    staging, go = threading.Event(), threading.Event()
    original = KnowledgeStore._stage_merged

    def held_while_staging(self, draft):
        monkeypatch.setattr(KnowledgeStore, "_stage_merged", original)
        staging.set()
        go.wait(60)
        return original(self, draft)

    monkeypatch.setattr(KnowledgeStore, "_stage_merged", held_while_staging)
    answers: dict = {}
    busy, idle = ws.turn(WS, "agent-8", "w"), ws.turn(WS, "agent-9", "w")
    busy.write("/documents/base.md", "base\nmore\n")
    first = threading.Thread(target=lambda: answers.setdefault("first", busy.commit("f", idempotency_key="k-2")))
    retry = threading.Thread(target=lambda: answers.setdefault("retry", idle.commit("f", idempotency_key="k-2")))
    first.start()
    assert staging.wait(60)
    retry.start()

    time.sleep(0.3)  # the retry's settle, on the old code, answered within this
    go.set()
    first.join()
    retry.join()
    assert answers["first"] is not None
    assert answers["retry"] is not None and answers["retry"].revision == answers["first"].revision


KEYED_COMMIT_STOPPED_BEFORE_THE_LOCK = """
import sys
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
kb = KnowledgeBase.open(Settings(database_url=sys.argv[1], storage_root=sys.argv[2], embedding_model="hashing"))
turn = kb.turn(1, "agent-1", "w")
turn.write("/documents/first.md", "first\\n")
result = turn.commit("first", idempotency_key="k-proc")
print(result.revision if result else "none", flush=True)
"""


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


@contextlib.contextmanager
def _first_commit_stopped_before_the_lock(settings):
    """A process whose keyed turn commit (key ``k-proc``) is stopped (SIGSTOP) at the
    ``draft_ready`` fault point: its draft is keyed, nothing staged, queued or locked. Yields the
    Popen; the block sends SIGCONT when done with it (a process still there at the end is killed)."""
    env = {**os.environ, "KB_FAULT_POINT": "draft_ready", "KB_FAULT_SIGNAL": "STOP"}
    first = subprocess.Popen(
        [sys.executable, "-c", KEYED_COMMIT_STOPPED_BEFORE_THE_LOCK, settings.database_url, str(settings.storage_root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait(lambda: first.poll() is None and _stopped(first.pid), "the first commit to stop before the lock")
        yield first
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()


def test_a_keyed_retry_in_another_process_waits_for_the_first_commit_in_flight(ws, settings):
    """design §3: a keyed turn commit in one process is between its draft and the write lock (held
    there by SIGSTOP at the ``draft_ready`` fault point) when its retry — same key, a new turn with
    nothing to record — runs in another process. The retry settled the key at once and answered
    None; then the first commit landed with that key. Now the retry waits on the key's fence
    (kb.git.key_fence) and answers the revision the first commit landed as."""
    answers: dict = {}
    with _first_commit_stopped_before_the_lock(settings) as first:
        retry = threading.Thread(
            target=lambda: answers.setdefault(
                "retry", ws.turn(WS, "agent-2", "w").commit("r", idempotency_key="k-proc")
            )
        )
        retry.start()
        retry.join(0.5)  # on the old code the retry had answered None by now
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=60)
        retry.join(60)
    assert first.returncode == 0, err
    assert answers["retry"] is not None, "the retry answered None while the first commit was in flight"
    assert answers["retry"].revision == out.strip()
    assert ws.read(WS, "/documents/first.md") == b"first\n"


def test_a_settle_waits_for_the_keyed_write_in_flight_and_times_out_truthfully(ws, settings):
    """design §3: ``write_outcome`` of a key whose write is in flight in another process waits for
    it; when it stays in flight past KB_LOCK_TIMEOUT the settle says so (LockTimeout naming the
    write-key fence), and the write then lands and is settled as landed."""
    from kb.errors import LockTimeout
    from kb.settings import Settings

    with _first_commit_stopped_before_the_lock(settings) as first:
        impatient = KnowledgeBase.open(Settings(**{**settings.model_dump(), "lock_timeout": 0.5}))
        with pytest.raises(LockTimeout, match="write-key lock .* still in flight"):
            impatient.write_outcome(WS, "k-proc")
        assert _stopped(first.pid)
        os.kill(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert ws.write_outcome(WS, "k-proc").id == out.strip()


def test_a_key_that_is_not_utf8_is_refused_as_input(ws, kb_env):
    """design §3: a key is text stored in a commit header and a Postgres row, and the write-key
    fence hashes its UTF-8 bytes. A key holding a lone surrogate — what Python makes of a non-UTF-8
    byte in a command-line argument, or a JSON ``"\\ud800"`` — passed ``check_key`` and crashed the
    fence with UnicodeEncodeError: a traceback from ``kb write-outcome``, an HTTP 500. It is now
    InvalidInput, as any other bad key is, and nothing is written."""
    from support.commands import run_cli

    from kb.errors import InvalidInput

    head = ws.store(WS).head()
    for key in ("\ud800", "order-\udcff"):
        with pytest.raises(InvalidInput, match="UTF-8"):
            ws.write_outcome(WS, key)
        with pytest.raises(InvalidInput, match="UTF-8"), ws.transaction(WS, "bad key", "w", idempotency_key=key) as tx:
            tx.write("/documents/never.md", "never\n")
    assert ws.store(WS).head() == head
    cli = run_cli(kb_env, "write-outcome", "order-\udcff", "--workspace", "1", check=False)  # argv byte 0xff
    assert "Traceback" not in cli.stderr and "UTF-8" in cli.stderr, cli.stderr


@contextlib.contextmanager
def _read_only(folder):
    """``folder`` as a read-only file system for the block (a bind mount: a disk the kernel
    remounted read-only after an error); skips the test where mounting is not permitted."""
    bind = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if bind.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bind.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True, capture_output=True)


def test_a_key_is_settled_on_a_repository_gone_read_only(ws, settings, kb_env):
    """design §3: a file system that went read-only (ext4's errors=remount-ro) fails a write with
    OSError, and its caller is told to settle the key with ``kb write-outcome``. That settle only
    reads git and writes Postgres, and worked on a read-only repository — until the write-key
    fence made it create its stripe file first: StorageError "the write-key fence cannot be
    taken", so the one call that settles a key could not. A fence file that exists is locked
    through a read-only descriptor (a shared lock: it still waits for a writer of the key); one
    that does not exist and cannot be made is held by no writer (each writer makes it before its
    draft), so there is nothing to wait for."""
    from support.commands import run_cli

    from kb.git.key_fence import FENCE_FILE

    with ws.transaction(WS, "keyed", "w", idempotency_key="ro-1") as tx:
        tx.write("/documents/ro.md", "ro\n")
    git_dir = settings.knowledge_store / str(WS) / ".git"
    for fence_file_there in (True, False):
        if not fence_file_there:
            (git_dir / FENCE_FILE).unlink()
        with _read_only(git_dir):
            assert ws.write_outcome(WS, "ro-1").id == tx.revision.id
            assert ws.write_outcome(WS, "ro-2") is None
            landed = run_cli(kb_env, "write-outcome", "ro-1", "--workspace", "1", check=False)
            assert tx.revision.id in landed.stdout, landed.stderr


def _keys_of_one_stripe() -> tuple[str, str]:
    """Two keys that fell on one of the write-key fence's 256 stripe files (by their sha-256)."""
    import hashlib

    seen: dict[int, str] = {}
    for n in range(10_000):
        key = f"order-{n}"
        stripe = int.from_bytes(hashlib.sha256(key.encode()).digest()[:2], "big") % 256
        if stripe in seen:
            return seen[stripe], key
        seen[stripe] = key
    raise AssertionError("unreachable: 257 keys fill 256 stripes")


def test_a_keyed_write_never_waits_for_another_key_in_flight(ws, settings):
    """design §3: a keyed write holds its key's fence for as long as it prepares — all of ``kb
    import`` reading its folder, or whatever a ``transaction`` block does. The fence was one of
    256 stripe files, so an unrelated write whose key shared the stripe (1 in 256) waited for it
    and failed with LockTimeout after KB_LOCK_TIMEOUT, saying "a write with the same idempotency
    key is still in flight" — false, and the write lost; a settle of that key could not answer
    either. A key now waits only for writes of the same key."""
    first_key, other_key = _keys_of_one_stripe()
    quick = KnowledgeBase.open(settings.model_copy(update={"lock_timeout": 1.0}))
    preparing, go = threading.Event(), threading.Event()
    answers: dict = {}

    def long_write() -> None:
        with ws.transaction(WS, "a long import", "w", idempotency_key=first_key) as tx:
            tx.write("/documents/long.md", "long\n")
            preparing.set()
            go.wait(60)
        answers["long"] = tx.revision

    writer = threading.Thread(target=long_write)
    writer.start()
    try:
        assert preparing.wait(30)
        with quick.transaction(WS, "unrelated", "w", idempotency_key=other_key) as tx:
            tx.write("/documents/unrelated.md", "unrelated\n")
        assert tx.revision is not None
        assert quick.write_outcome(WS, other_key).id == tx.revision.id
        with pytest.raises(KbError, match="same idempotency key"):  # the same key still waits
            quick.write_outcome(WS, first_key)
    finally:
        go.set()
        writer.join(60)
    assert quick.write_outcome(WS, first_key).id == answers["long"].id


def test_http_outcome_unknown_names_the_key_as_the_token_gave_it(ws, settings):
    """Behind a token kb keeps a key as ``t<token id>@KEY``; the 503's message named that stored
    key, and the settle route — which adds the prefix itself — looked up ``t<id>@t<id>@KEY``, which
    no write has: "did not land" for a write that may have (design §3, §16). The message, like the
    structured fields, names the key the client gave."""
    pytest.importorskip("fastapi", reason="kb serve needs the serve extra")
    from fastapi import APIRouter, Depends
    from fastapi.testclient import TestClient

    from kb.adapters.http.auth import require
    from kb.adapters.http.server import create_app

    token, secret = ws.tokens().create("writer", "write", [WS])

    def failing(service):
        router = APIRouter(dependencies=[Depends(require("write"))])

        @router.post("/v1/workspaces/{workspace_id}/fail")
        def fail(workspace_id: int) -> dict:
            raise CommitOutcomeUnknown(workspace_id, f"t{token.id}@k-1", "server closed the connection")

        return router

    with TestClient(create_app(settings, routers=[failing])) as client:
        answer = client.post(f"/v1/workspaces/{WS}/fail", headers={"Authorization": f"Bearer {secret}"})
    body = answer.json()
    assert answer.status_code == 503 and body["idempotency_key"] == "k-1", body
    assert f"t{token.id}@" not in body["message"] and "'k-1'" in body["message"], body["message"]
    assert f"t{token.id}@" not in body["cli_message"], body["cli_message"]


def test_a_key_used_again_by_a_turn_with_other_changes_is_refused_and_the_turn_kept(ws):
    """Turn x commits X.md with key ``same``; turn y commits Y.md with ``same``: y was answered
    x's revision as its own and its worktree deleted — told it landed, its work gone (design §3,
    §5). Now y's commit is IdempotencyKeyReused, nothing recorded, the turn kept to commit with a
    new key; a turn repeating x's very change with the key is answered x's revision."""
    from kb.errors import IdempotencyKeyReused

    x = ws.turn(WS, "x", "w")
    x.write("/documents/X.md", "x\n")
    landed = x.commit("x", idempotency_key="same")
    y = ws.turn(WS, "y", "w")
    y.write("/documents/Y.md", "y\n")
    with pytest.raises(IdempotencyKeyReused) as refused:
        y.commit("y", idempotency_key="same")
    assert refused.value.revision == landed.revision and "nothing of the turn was recorded" in str(refused.value)
    assert ws.head(WS) == landed.revision
    assert y.read("/documents/Y.md").text == "y"  # kept
    again = y.commit("y", idempotency_key="new")
    assert again is not None and again.added == ["/documents/Y.md"]
    z = ws.turn(WS, "z", "w")
    z.write("/documents/X.md", "x\n")  # already at head: nothing to record, the key's revision answers
    assert z.commit("x", idempotency_key="same").revision == landed.revision
    w = ws.turn(WS, "w", "w")
    w.write("/documents/X.md", "x, other\n")
    with pytest.raises(IdempotencyKeyReused):
        w.commit("x", idempotency_key="same")
    assert ws.read(WS, "/documents/X.md") == b"x\n"


def test_http_errors_name_turn_ids_as_the_token_gave_them(ws, settings):
    """Behind a token kb keeps turn ids and keys as ``t<token id>@NAME``; HTTP error messages named
    those (``turn 't1@t2'``) where the client had sent ``t2`` (a new user's report, design §16).
    They name what the client sent; an id ending in ``.lock`` is refused saying that rule."""
    pytest.importorskip("fastapi", reason="kb serve needs the serve extra")
    from fastapi.testclient import TestClient

    from kb.adapters.http.server import create_app

    token, secret = ws.tokens().create("writer", "write", [WS])
    auth = {"Authorization": f"Bearer {secret}"}
    turns = f"/v1/workspaces/{WS}/turns"
    with TestClient(create_app(settings)) as client:
        locked = client.put(f"{turns}/a.lock/files/documents/A.md", json={"content": "a\n"}, headers=auth)
        assert client.put(f"{turns}/x/files/documents/X.md", json={"content": "x\n"}, headers=auth).status_code == 200
        assert client.post(f"{turns}/x/commit", json={}, headers=auth | {"Idempotency-Key": "k"}).status_code == 200
        assert client.put(f"{turns}/y/files/documents/Y.md", json={"content": "y\n"}, headers=auth).status_code == 200
        reused = client.post(f"{turns}/y/commit", json={}, headers=auth | {"Idempotency-Key": "k"})
    message = locked.json()["message"]
    assert locked.status_code == 400 and "'a.lock'" in message and "'.lock'" in message, message
    assert reused.status_code == 409 and "turn 'y'" in reused.json()["message"], reused.text
    for answer in (locked, reused):
        assert f"t{token.id}@" not in answer.json()["message"] + answer.json()["cli_message"], answer.text
