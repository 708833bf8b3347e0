"""Group commit (design §3, §4): the write lock's holder records every queued draft as
consecutive revisions in one Postgres transaction and one ref update.

Other writers are played by intents queued on connections the test keeps open (a writer's session
owns its intent, kb/store/group_commit.py); the holder is an ordinary ``kb.transaction`` or a real
subprocess that SIGKILLs itself at a fault point."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
from support.commands import git
from support.named_queries import queries

from kb.db import database
from kb.db.locks import WRITE_LOCK_NAMESPACE, locked_transaction
from kb.errors import LockTimeout, PathExists
from kb.knowledge_base import KnowledgeBase
from kb.store import group_commit
from kb.store.draft import Draft

BASE = {"/documents/keep.md": b"keep"}


def _base(kb) -> str:
    kb.create_workspace(1)
    with kb.transaction(1, "base", "t") as tx:
        for path, data in BASE.items():
            tx.write(path, data)
    return tx.revision.id


def _queue(kb, writes: dict[str, bytes], message: str) -> tuple[psycopg.Connection, int]:
    """Another writer: its draft staged and queued on a connection of its own (kept open: alive)."""
    store = kb.store(1)
    repo = store.repository
    draft = Draft(repo, repo.tree_id(repo.head()))
    for path, data in writes.items():
        draft.write(path, data)
    conn = database.connect(kb.database_url)
    intent_id, _ = group_commit.enqueue(conn, 1, draft, store._stage(draft), message, "other", "other")
    return conn, intent_id


def _outcome(conn: psycopg.Connection, intent_id: int):
    """What the queued writer learns: its Revision, or the error raised for it."""
    with conn.transaction():
        outcome = group_commit.take(conn, intent_id)
    assert outcome is not None, "the holder left this intent unrecorded"
    return group_commit.result_of(outcome)


def test_holder_records_queued_drafts_as_consecutive_revisions_and_a_colliding_one_fails_alone(kb):
    base = _base(kb)
    a, a_id = _queue(kb, {"/documents/Foo.md": b"a"}, "writer a")
    b, b_id = _queue(kb, {"/documents/FOO.md": b"case twin"}, "writer b")  # collides with a's Foo.md
    c, c_id = _queue(kb, {"/documents/c.md": b"c"}, "writer c")
    try:
        with kb.transaction(1, "holder", "t") as tx:
            tx.write("/documents/lead.md", b"lead")
        lead = tx.revision
        rev_a, rev_c = _outcome(a, a_id), _outcome(c, c_id)
        with pytest.raises(PathExists, match="FOO.md"):
            _outcome(b, b_id)
    finally:
        for conn in (a, b, c):
            conn.close()
    history = kb.history(1)
    # oldest queued first, the refused draft leaves no revision, the holder's own comes last
    assert [r.id for r in history] == [lead.id, rev_c.id, rev_a.id, base]
    assert [r.seq for r in history] == [4, 3, 2, 1]
    assert [r.message for r in history[:3]] == ["holder", "writer c", "writer a"]
    assert (rev_a.seq, rev_c.seq, lead.seq) == (2, 3, 4)
    assert [c.path for c in rev_a.changes] == ["/documents/Foo.md"]
    assert kb.store(1).repository.parents(lead.id) == [rev_c.id]
    assert sorted(kb.list_paths(1)) == [
        "/documents/Foo.md",
        "/documents/c.md",
        "/documents/keep.md",
        "/documents/lead.md",
    ]
    repo = kb.settings.knowledge_store / "1"
    git(repo, "fsck", "--strict")
    # the holder refreshed its own path; each queued writer refreshes its own when it returns
    assert (repo / "documents" / "lead.md").read_bytes() == b"lead"
    with database.transaction(kb.database_url) as conn:
        assert conn.execute(queries["test_count_write_intents"]).fetchone()["n"] == 0


def test_a_holder_whose_path_a_later_queued_draft_rewrote_checks_out_that_drafts_bytes(kb):
    """The holder refreshes every path of its group (design §2.1). When a draft queued after the
    holder's own rewrites a path the holder wrote too, HEAD holds the later bytes: the holder's
    own bytes at hand are not that blob and must not be checked out under its id (the working
    file then differed from the index: ``git status`` showed `` M``)."""
    _base(kb)
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:  # the holder queues first and waits for this lock
        with locked_transaction(kb.database_url, 1, kb.settings):
            held.set()
            release.wait(60)

    def lead() -> None:
        with kb.transaction(1, "holder", "t") as tx:
            tx.write("/documents/shared.md", b"by the holder\n")

    blocker, holder = threading.Thread(target=hold_the_lock), threading.Thread(target=lead)
    blocker.start()
    held.wait(60)
    holder.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the holder's intent is queued, so the next one follows it
        with database.transaction(kb.database_url) as conn:
            if conn.execute(queries["test_write_intents"], {"workspace_id": 1}).fetchall():
                break
        time.sleep(0.01)
    later, later_id = _queue(kb, {"/documents/shared.md": b"by a writer queued later, longer\n"}, "later")
    try:
        release.set()
        blocker.join(60)
        holder.join(60)
        assert not holder.is_alive()
        _outcome(later, later_id)
    finally:
        later.close()
    assert [r.message for r in kb.history(1)[:2]] == ["later", "holder"]  # the holder's draft came first
    repo = kb.settings.knowledge_store / "1"
    assert (repo / "documents" / "shared.md").read_bytes() == b"by a writer queued later, longer\n"
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_a_killed_writers_queued_draft_is_never_recorded(kb):
    base = _base(kb)
    dead, _ = _queue(kb, {"/documents/dead.md": b"never"}, "killed writer")
    dead.close()  # its session ends, as a SIGKILLed writer's does
    with kb.transaction(1, "holder", "t") as tx:
        tx.write("/documents/lead.md", b"lead")
    assert [r.id for r in kb.history(1)] == [tx.revision.id, base]
    assert "/documents/dead.md" not in kb.list_paths(1)
    with database.transaction(kb.database_url) as conn:  # the holder forgot the dead intent
        assert conn.execute(queries["test_count_write_intents"]).fetchone()["n"] == 0


HOLDER = """
from kb.knowledge_base import KnowledgeBase
kb = KnowledgeBase.open()
with kb.transaction(1, "crashing holder", "writer") as tx:
    tx.write("/documents/holder.md", b"holder")
print("committed")
"""


def test_crash_between_ref_and_postgres_within_a_group_records_each_queued_draft_once(kb, kb_env):
    """The holder dies after the ref moved over its group and before Postgres committed: the
    queued writer's revision is in git. The next holder records it (catch-up) and, from the
    journal, settles the queued writer with that revision instead of applying its draft again."""
    base = _base(kb)
    queued, queued_id = _queue(kb, {"/documents/q.md": b"queued"}, "queued writer")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", HOLDER],
            env={**kb_env, "KB_FAULT_POINT": "ref_advanced"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        repo_path = kb.settings.knowledge_store / "1"
        in_git = git(repo_path, "log", "--format=%H %s", "HEAD").splitlines()
        assert [line.split(" ", 1)[1] for line in in_git] == ["crashing holder", "queued writer", "base"]
        queued_rev = in_git[1].split()[0]
        assert [r.id for r in kb.history(1)] == [base]  # Postgres has neither yet
        with kb.transaction(1, "next holder", "t") as tx:
            tx.write("/documents/next.md", b"next")
        got = _outcome(queued, queued_id)
    finally:
        queued.close()
    assert got.id == queued_rev  # the revision that landed, not a second one
    history = kb.history(1)
    assert [r.message for r in history] == ["next holder", "crashing holder", "queued writer", "base"]
    assert [r.seq for r in history] == [4, 3, 2, 1]
    assert not (repo_path / ".git" / group_commit.JOURNAL / str(queued_id)).exists()
    git(repo_path, "fsck", "--strict")


def test_a_writer_that_gives_up_waiting_withdraws_its_draft(kb, settings):
    base = _base(kb)
    impatient = KnowledgeBase.open(settings.model_copy(update={"lock_timeout": 1.0}))
    with database.transaction(kb.database_url) as holder:  # someone holds the write lock
        holder.execute(queries["test_hold_advisory_lock"], {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": 1})
        with pytest.raises(LockTimeout):
            with impatient.transaction(1, "too late", "t") as tx:
                tx.write("/documents/late.md", b"late")
        with database.transaction(kb.database_url) as conn:
            assert conn.execute(queries["test_count_write_intents"]).fetchone()["n"] == 0
    # once the lock is free, the next writer records only its own draft
    with kb.transaction(1, "after", "t") as tx:
        tx.write("/documents/after.md", b"after")
    assert [r.id for r in kb.history(1)] == [tx.revision.id, base]
    assert "/documents/late.md" not in kb.list_paths(1)


def test_a_blob_another_writer_is_storing_at_the_same_time_is_stored_without_waiting(kb):
    """Writers stage blobs before taking the lock, so two may store the same object at once: the
    second met dulwich's FileLocked, a raw error, in 2 of 10 runs of ``adversarial_store.py
    fsck-load``. Here the other writer's ``.lock`` is held (or left by a killed one) throughout."""
    _base(kb)
    repo = kb.store(1).repository
    data = b"the same bytes from two writers\n"
    blob_id = (
        subprocess.run(["git", "hash-object", "--stdin"], input=data, capture_output=True, check=True)
        .stdout.decode()
        .strip()
    )
    folder = repo.path / ".git" / "objects" / blob_id[:2]
    folder.mkdir(exist_ok=True)
    lock = folder / f"{blob_id[2:]}.lock"
    lock.write_bytes(b"")  # another writer is mid-write
    with kb.transaction(1, "same blob", "t") as tx:
        tx.write("/documents/same.md", data)
    assert kb.read(1, "/documents/same.md") == data
    assert lock.exists() and not list(folder.glob("tmp_obj_*"))  # the other writer's lock is its own
    lock.unlink()
    git(repo.path, "fsck", "--strict")
    assert git(repo.path, "cat-file", "-p", blob_id).encode() == data


@pytest.mark.postgres  # starts its own embedded Postgres
def test_intent_ids_are_never_reused_after_a_postgres_crash(tmp_path):
    """Migration 0017: a Postgres crash empties the UNLOGGED kb.write_intents and, before the fix,
    reset its id sequence to 1 as well, while the group-commit journal in .git survives. A stale
    journal entry (here for the id the reset sequence would hand out next, naming a revision
    already recorded) then "settled" the next write with that old revision: the write returned
    without error and its document was never committed."""
    from support.named_queries import queries

    from kb.db import embedded_server
    from kb.settings import Settings

    root = Path(tempfile.mkdtemp(prefix="kbcrash-"))  # outside tmp_path: the server's OS user must reach it
    pgdata = root / "pg"
    url = embedded_server.start_embedded(pgdata, database="kb_crash")
    kb = None
    try:
        kb = KnowledgeBase.open(Settings(storage_root=root / "storage", database_url=url, embedding_model="hashing"))
        base = _base(kb)
        with database.connect(url) as conn:
            before = conn.execute(queries["test_write_intent_sequence"]).fetchone()
        assert before["persistence"] == "p"
        ep = embedded_server._embedded_module()
        ep.pg_ctl(
            ["-w", "-m", "immediate", "stop"], pgdata=pgdata, user=embedded_server._system_user(ep, pgdata), timeout=120
        )
        database.close_pools()
        embedded_server.start_embedded(pgdata, database="kb_crash")  # crash recovery
        repo = kb.settings.knowledge_store / "1"
        journal = repo / ".git" / group_commit.JOURNAL
        journal.mkdir(exist_ok=True)
        (journal / "1").write_text(base)  # left by a holder that died with the server
        with kb.transaction(1, "after the crash", "t") as tx:
            tx.write("/documents/after.md", b"written after the crash")
        assert tx.revision.id != base
        assert [r.message for r in kb.history(1)] == ["after the crash", "base"]
        assert kb.read(1, "/documents/after.md") == b"written after the crash"
        with database.connect(url) as conn:
            after = conn.execute(queries["test_write_intent_sequence"]).fetchone()
        assert after["last_value"] > before["last_value"]
        git(repo, "fsck", "--strict")
    finally:
        if kb is not None:
            kb.close()
        embedded_server.stop_embedded(pgdata)
        shutil.rmtree(root, ignore_errors=True)
