"""(design §3) the store's transaction semantics (call order), reads, history, revert/restore,
reconcile/fsck and the lock, checked against the real git CLI."""

from __future__ import annotations

import os
import threading

import psycopg
import pytest
from support.commands import git, run_cli
from support.named_queries import queries

from kb.db.locks import locked_transaction
from kb.errors import DocumentNotFound, InvalidPath, KbError, LockTimeout, LockUnavailable, PathExists, RevisionNotFound
from kb.knowledge_base import KnowledgeBase
from kb.paths import blob_id
from kb.store.history import pair_moves

A, B, C = "/documents/a.md", "/documents/b.md", "/documents/c.md"


def repo_of(kb, ws):
    return kb.settings.knowledge_store / str(ws)


def commit(kb, ws, *ops, message="test", overwrite=False):
    kb.create_workspace(ws)
    with kb.transaction(ws, message, "tester") as tx:
        for op, *args in ops:
            if op == "move":
                tx.move(*args, overwrite=overwrite)
            else:
                getattr(tx, op)(*args)
    return tx.revision


def assert_git_clean(kb, ws):
    repo = repo_of(kb, ws)
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def tree(kb, ws):
    return {p: kb.read(ws, p) for p in kb.list_paths(ws)}


def test_call_order_semantics(kb):
    rev = commit(kb, 1, ("write", A, b"one"), ("write", B, "two"))
    assert rev.seq == 1 and {c.change for c in rev.changes} == {"added"}
    # move then write at the old path: the document moves, a new one appears at the old path
    rev = commit(kb, 1, ("move", A, C), ("write", A, b"new a"))
    assert tree(kb, 1) == {A: b"new a", B: b"two", C: b"one"}
    by_path = {c.path: c for c in rev.changes}
    assert by_path[C].change == "moved" and by_path[C].old_path == A
    assert by_path[A].change == "modified" and by_path[A].new_path == C
    # move then write at the new path: the moved document gets the new bytes, still a move
    rev = commit(kb, 1, ("move", B, "/documents/d.md"), ("write", "/documents/d.md", b"two v2"))
    assert {c.path: (c.change, c.old_path) for c in rev.changes} == {
        B: ("moved_away", None),
        "/documents/d.md": ("moved", B),
    }
    # chained moves collapse; a -> b -> a nets to nothing
    rev = commit(kb, 1, ("move", C, "/documents/x.md"), ("move", "/documents/x.md", "/documents/y.md"))
    assert {c.path: c.change for c in rev.changes} == {C: "moved_away", "/documents/y.md": "moved"}
    assert commit(kb, 1, ("move", A, C), ("move", C, A)) is None
    # write then remove of a new file nets to nothing; remove then write back nets to nothing
    assert commit(kb, 1, ("write", "/documents/tmp.md", b"t"), ("remove", "/documents/tmp.md")) is None
    assert commit(kb, 1, ("remove", A), ("write", A, b"new a")) is None
    assert_git_clean(kb, 1)
    assert len(git(repo_of(kb, 1), "log", "--format=%H").split()) == 4


def test_net_empty_on_unborn_repo_and_exception_records_nothing(kb):
    assert commit(kb, 2, ("write", A, b"x"), ("remove", A)) is None
    assert kb.head(2) is None and kb.history(2) == []
    with pytest.raises(RuntimeError):
        with kb.transaction(2, "boom", "t") as tx:
            tx.write(A, b"x")
            raise RuntimeError("caller failed")
    assert kb.head(2) is None
    with pytest.raises(DocumentNotFound):
        commit(kb, 2, ("move", A, B))


def test_move_onto_existing_and_tree_conflicts(kb):
    commit(kb, 3, ("write", A, b"a"), ("write", B, b"b"), ("write", "/documents/f/x.md", b"x"))
    with pytest.raises(PathExists, match="overwrite=True"):
        commit(kb, 3, ("move", A, B))
    rev = commit(kb, 3, ("move", A, B), overwrite=True)
    assert tree(kb, 3) == {B: b"a", "/documents/f/x.md": b"x"}
    assert {c.path: c.change for c in rev.changes} == {A: "moved_away", B: "moved"}
    with pytest.raises(PathExists, match="is a document"):
        commit(kb, 3, ("write", "/documents/b.md/under.md", b"no"))
    with pytest.raises(PathExists, match="folder holding documents"):
        commit(kb, 3, ("write", "/documents/f", b"no"))
    with pytest.raises(PathExists, match="is a document"):
        commit(kb, 3, ("move", "/documents/f/x.md", "/documents/b.md/x.md"))
    with pytest.raises(PathExists, match="into itself"):
        commit(kb, 3, ("move", "/documents/f", "/documents/f/g"))
    # a folder emptied earlier in the same draft may become a document
    rev = commit(kb, 3, ("remove", "/documents/f"), ("write", "/documents/f", b"now a file"))
    assert tree(kb, 3) == {B: b"a", "/documents/f": b"now a file"}
    # and back: the document makes room for a folder in the same draft
    commit(kb, 3, ("remove", "/documents/f"), ("write", "/documents/f/y.md", b"y"))
    assert tree(kb, 3) == {B: b"a", "/documents/f/y.md": b"y"}
    assert_git_clean(kb, 3)
    # folder move keeps every document and records each move
    commit(kb, 3, ("write", "/documents/g/1.md", b"1"), ("write", "/documents/g/h/2.md", b"2"))
    rev = commit(kb, 3, ("move", "/documents/g", "/documents/k"))
    assert {c.path for c in rev.changes if c.change == "moved"} == {"/documents/k/1.md", "/documents/k/h/2.md"}
    for bad in ("/documents/../etc/passwd", "/documents/.git/config", "/notes/a.md", "/documents/x/.keep"):
        with pytest.raises(InvalidPath):
            commit(kb, 3, ("write", bad, b"x"))
    assert_git_clean(kb, 3)


def test_reads_history_follows_moves(kb):
    r1 = commit(kb, 4, ("write", A, b"v1"))
    r2 = commit(kb, 4, ("write", A, b"v2"), ("write", B, b"b"))
    r3 = commit(kb, 4, ("move", A, C))
    r4 = commit(kb, 4, ("write", C, b"v3"))
    assert kb.read_as_of(4, r1.id, A) == b"v1"
    assert kb.list_paths(4, r2.id) == {A: blob_id(b"v2"), B: blob_id(b"b")}
    assert [(c.path, c.change, c.old_path) for c in kb.list_changes(4, r3.id)] == [
        (A, "moved_away", None),
        (C, "moved", A),
    ]
    assert [r.id for r in kb.history(4, C)] == [r4.id, r3.id, r2.id, r1.id]
    assert [r.id for r in kb.history(4, C, limit=2)] == [r4.id, r3.id]
    assert [r.id for r in kb.history(4)] == [r4.id, r3.id, r2.id, r1.id]
    follow = git(repo_of(kb, 4), "log", "--follow", "--format=%H", "--", C[1:]).split()
    assert follow == [r.id for r in kb.history(4, C)]
    # the workspace's log carries each change's blob as the path's log does (it gave None)
    assert {(c.path, c.content_id) for c in kb.history(4)[2].changes} == {(A, blob_id(b"v2")), (B, blob_id(b"b"))}
    assert [c.content_id for c in kb.history(4)[0].changes] == [c.content_id for c in kb.history(4, C)[0].changes]
    with pytest.raises(RevisionNotFound):
        kb.read_as_of(4, "0" * 40, A)


def test_revert_and_restore(kb, kb_env):
    r1 = commit(kb, 5, ("write", A, b"a1"), ("write", B, b"b1"))
    r2 = commit(kb, 5, ("write", A, b"a2"), ("remove", B), ("write", C, b"c"))
    r3 = commit(kb, 5, ("move", A, "/documents/moved.md"))
    undone = kb.revert(5, r3.id, author="alice")
    assert tree(kb, 5) == {A: b"a2", C: b"c"}
    assert {c.path: c.change for c in undone.changes} == {"/documents/moved.md": "moved_away", A: "moved"}
    assert kb.revert(5, r3.id) is None  # already undone
    # move-then-write at the old path is undone as a move back over the new document
    r4 = commit(kb, 5, ("move", C, "/documents/c2.md"), ("write", C, b"replacement"))
    undone = kb.revert(5, r4.id)
    assert {c.path: (c.change, c.old_path) for c in undone.changes} == {
        "/documents/c2.md": ("moved_away", None),
        C: ("moved", "/documents/c2.md"),
    }
    assert tree(kb, 5) == {A: b"a2", C: b"c"}
    assert [c.change for c in kb.history(5, limit=1)[0].changes] == ["moved", "moved_away"]
    out = run_cli(kb_env, "revert", r2.id, "--workspace", "5").stdout
    assert out.startswith("revision ")
    assert tree(kb, 5) == {A: b"a1", B: b"b1"}
    assert kb.history(5, limit=1)[0].message.startswith('Revert "test"')
    commit(kb, 5, ("remove", B))
    out = run_cli(kb_env, "restore", B, "--revision", r1.id, "--workspace", "5").stdout
    assert out.strip() == f"revision {kb.head(5)}: created {B}" and kb.read(5, B) == b"b1"
    assert kb.restore(5, B, r1.id) is None
    err = run_cli(kb_env, "restore", C, "--revision", r1.id, "--workspace", "5", check=False)
    assert err.returncode == 1 and "no document" in err.stderr
    err = run_cli(kb_env, "revert", "f" * 40, "--workspace", "5", check=False)
    assert err.returncode == 1 and "not in this workspace" in err.stderr
    assert_git_clean(kb, 5)
    log = run_cli(kb_env, "log", "--workspace", "5", A).stdout
    assert "moved" in log


def test_reverting_a_folder_move_after_a_file_in_it_moved_again_never_duplicates_it(kb, kb_env):
    """A folder moved (A → B), then one of its documents moved on (B/x → C/x) and was edited
    there, another edited in place (B/y): reverting the folder move puts each back where it was
    before the folder move, with its later edit, as one document (never a copy at A/x beside C/x,
    never its edit dropped). When its old place now holds another document, the revert is
    refused, naming both paths, and changes nothing (design §3)."""
    x, y, z = "/documents/A/x.md", "/documents/A/y.md", "/documents/A/z.md"
    moved_x, later_x = "/documents/B/x.md", "/documents/C/x.md"
    commit(kb, 9, ("write", x, b"x\n"), ("write", y, b"y\n"), ("write", z, b"z\n"))
    folder_move = commit(kb, 9, ("move", "/documents/A", "/documents/B"))
    commit(kb, 9, ("move", moved_x, later_x))
    commit(kb, 9, ("write", later_x, b"x, edited after it moved on\n"), ("write", "/documents/B/y.md", b"y2\n"))
    undone = kb.revert(9, folder_move.id, author="alice")
    assert tree(kb, 9) == {x: b"x, edited after it moved on\n", y: b"y2\n", z: b"z\n"}
    assert {c.path: (c.change, c.old_path) for c in undone.changes if c.path.endswith("x.md")} == {
        later_x: ("moved_away", None),
        x: ("moved", later_x),
    }
    assert_git_clean(kb, 9)
    # its old place taken meanwhile by another document: which one belongs there is not kb's to guess
    folder_move = commit(kb, 10, ("write", x, b"x\n"), ("write", y, b"y\n"))
    folder_move = commit(kb, 10, ("move", "/documents/A", "/documents/B"))
    commit(kb, 10, ("move", moved_x, later_x), ("write", x, b"another x\n"))
    before = tree(kb, 10)
    refused = run_cli(kb_env, "revert", folder_move.id, "--workspace", "10", check=False)
    assert refused.returncode == 1 and later_x in refused.stderr and x in refused.stderr, refused.stderr
    assert "nothing was reverted" in refused.stderr, refused.stderr
    assert tree(kb, 10) == before
    assert_git_clean(kb, 10)


def test_documents_of_one_content_moved_through_each_others_paths_are_recorded_and_reverted_as_moves(kb):
    """Two documents of one content (copies of a template) moved with their folder; then one moves
    on and the other takes its place, so that path's bytes never change. Both moves are recorded
    (not a removal and an addition), and reverting the folder move brings each back once: the
    document that stands where the revision put the first is not taken for it (design §3)."""
    same = b"# Template\n"
    x, y = "/documents/A/x.md", "/documents/A/y.md"
    commit(kb, 9, ("write", x, same), ("write", y, same))
    folder_move = commit(kb, 9, ("move", "/documents/A", "/documents/B"))
    rotated = commit(
        kb, 9, ("move", "/documents/B/x.md", "/documents/C/x.md"), ("move", "/documents/B/y.md", "/documents/B/x.md")
    )
    assert {c.path: (c.change, c.old_path, c.new_path) for c in rotated.changes} == {
        "/documents/B/x.md": ("moved", "/documents/B/y.md", "/documents/C/x.md"),
        "/documents/B/y.md": ("moved_away", None, "/documents/B/x.md"),
        "/documents/C/x.md": ("moved", "/documents/B/x.md", None),
    }
    first = kb.history(9, limit=10)[-1]
    undone = kb.revert(9, folder_move.id, author="alice")
    assert tree(kb, 9) == {x: same, y: same}  # was: A/x, A/y and C/x, a copy
    # A/x's document came back from C/x: its history follows it through every move
    assert [r.id for r in kb.history(9, x)] == [undone.id, rotated.id, folder_move.id, first.id]
    assert_git_clean(kb, 9)


def test_reverting_a_chain_of_moves_moves_each_document_back(kb):
    """One revision moved x out of M/x and y into M/x. Reverting it moves y back to Z/y and x back
    to M/x — right after, or after y was edited and x moved on — each once and with its edits,
    recorded as moves; a swap (a cycle) alike. y was overwritten by x, and x written twice (design §3)."""
    x, y, moved_x = "/documents/M/x.md", "/documents/Z/y.md", "/documents/B/x.md"
    for ws, later in ((11, ()), (12, (("write", x, b"y, edited\n"), ("move", moved_x, "/documents/C/x.md")))):
        commit(kb, ws, ("write", x, b"x\n"), ("write", y, b"y\n"))
        chain = commit(kb, ws, ("move", x, moved_x), ("move", y, x))
        if later:
            commit(kb, ws, *later)
        undone = kb.revert(ws, chain.id, author="alice")
        assert tree(kb, ws) == {x: b"x\n", y: b"y, edited\n" if later else b"y\n"}, ws
        moves = {c.path: c.old_path for c in undone.changes if c.change == "moved"}
        assert moves == {x: "/documents/C/x.md" if later else moved_x, y: x}, undone.changes
        assert_git_clean(kb, ws)
    p, q = "/documents/p.md", "/documents/q.md"
    commit(kb, 13, ("write", p, b"p\n"), ("write", q, b"q\n"))
    swap = commit(kb, 13, ("move", p, "/documents/t.md"), ("move", q, p), ("move", "/documents/t.md", q))
    kb.revert(13, swap.id, author="alice")
    assert tree(kb, 13) == {p: b"p\n", q: b"q\n"}
    assert_git_clean(kb, 13)


def test_reverting_an_edit_undoes_it_where_the_document_moved_since(kb):
    """An edit at A, then A moved to B (and edited there, apart from the edit): reverting the edit
    undoes it at B, keeping the later edit. It said "nothing to revert" and left the edit in place,
    taking the moved-away document for a removed one (design §3: a revert follows recorded moves).
    A document removed since stays removed (nothing to revert)."""
    a, b, c = "/documents/A.md", "/documents/Moved/B.md", "/documents/C.md"
    commit(kb, 14, ("write", a, b"one\ntwo\nthree\nfour\nfive\n"), ("write", c, b"c\n"))
    edit = commit(kb, 14, ("write", a, b"one\nTWO\nthree\nfour\nfive\n"))
    commit(kb, 14, ("move", a, b))
    commit(kb, 14, ("write", b, b"one\nTWO\nthree\nfour\nFIVE\n"))
    undone = kb.revert(14, edit.id, author="alice")
    assert undone is not None and tree(kb, 14) == {b: b"one\ntwo\nthree\nfour\nFIVE\n", c: b"c\n"}
    assert [(ch.path, ch.change) for ch in undone.changes] == [(b, "modified")]
    assert_git_clean(kb, 14)
    gone = commit(kb, 14, ("write", c, b"c2\n"))
    commit(kb, 14, ("move", c, "/documents/D.md"))
    commit(kb, 14, ("remove", "/documents/D.md"))
    assert kb.revert(14, gone.id, author="alice") is None  # removed since: left removed


def test_a_read_of_a_path_the_document_moved_away_from_says_where_it_went(kb):
    """``read`` (kb read, kb blame) of a path a recorded move emptied said only "no document
    there"; it names where the moves took the document, following a chain (design §3)."""
    a, b, c = "/documents/A.md", "/documents/B.md", "/documents/Sub/C.md"
    commit(kb, 15, ("write", a, b"a\n"))
    commit(kb, 15, ("move", a, b))
    commit(kb, 15, ("move", b, c))
    for gone in (a, b):
        with pytest.raises(DocumentNotFound, match=f"no document at '{gone}' now: it was moved to '{c}'"):
            kb.read(15, gone)
    with pytest.raises(DocumentNotFound, match="moved to '/documents/Sub/C.md'"):
        kb.blame(15, a)
    commit(kb, 15, ("remove", c))
    with pytest.raises(DocumentNotFound) as removed:  # moved, then removed: nothing to point at
        kb.read(15, a)
    assert "moved to" not in str(removed.value)


def test_lock_timeout_names_the_workspace(kb, settings):
    commit(kb, 6, ("write", A, b"a"))
    quick = KnowledgeBase(settings.model_copy(update={"lock_timeout": 0.2}), kb.database_url)
    held, release = threading.Event(), threading.Event()

    def holder():
        with locked_transaction(kb.database_url, 6, settings):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    try:
        with pytest.raises(LockTimeout) as caught:
            with quick.transaction(6, "blocked", "t") as tx:
                tx.write(B, b"b")
        assert caught.value.workspace_id == 6 and "workspace 6" in str(caught.value)
    finally:
        release.set()
        thread.join()
    assert kb.list_paths(6) == {A: blob_id(b"a")}


def _object_files(repo):
    return sorted(p for p in (repo / ".git" / "objects").rglob("*") if p.is_file())


def test_postgres_unreachable_writes_nothing_to_git(kb, settings):
    commit(kb, 7, ("write", A, b"a"))
    repo = repo_of(kb, 7)
    before = (_object_files(repo), kb.head(7))
    dead = KnowledgeBase(
        settings.model_copy(update={"database_url": "postgresql://kb@127.0.0.1:1/kb"}),
        "postgresql://kb@127.0.0.1:1/kb?connect_timeout=2",
    )
    from kb.errors import DatabaseUnavailable

    with pytest.raises(DatabaseUnavailable):
        with dead.transaction(7, "m", "t") as tx:
            tx.write(B, b"never stored")
    assert (_object_files(repo), kb.head(7)) == before
    assert_git_clean(kb, 7)


def test_reconcile_records_revisions_git_has(kb, kb_env):
    commit(kb, 8, ("write", A, b"a"))
    repo = repo_of(kb, 8)
    # a revision made behind kb's back (as a crashed writer would leave it): git has it, Postgres not
    (repo / "documents" / "b.md").write_bytes(b"b from git")
    git(repo, "mv", "documents/a.md", "documents/c.md")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=git", "-c", "user.email=g@x", "commit", "-q", "-m", "outside")
    outside = git(repo, "rev-parse", "HEAD").strip()
    out = run_cli(kb_env, "fsck", "--workspace", "8").stdout
    assert "git fsck --strict: ok" in out and f"recorded revision {outside}" in out
    assert kb.history(8, limit=1)[0].id == outside
    changes = {c.path: (c.change, c.old_path) for c in kb.list_changes(8, outside)}
    assert changes == {A: ("moved_away", None), C: ("moved", A), B: ("added", None)}
    assert kb.reconcile(8) == []
    assert "clean" in run_cli(kb_env, "fsck", "--workspace", "8").stdout
    # a stale working tree is repaired
    (repo / "documents" / "c.md").write_bytes(b"scribbled")
    (repo / "documents" / "stray.md").write_bytes(b"stray")
    out = run_cli(kb_env, "fsck", "--workspace", "8").stdout
    assert "repaired working tree: 2 paths" in out
    assert_git_clean(kb, 8)
    # the next commit after an unrecorded revision records it first (history stays linear)
    git(repo, "rm", "-q", "documents/b.md")
    git(repo, "-c", "user.name=git", "-c", "user.email=g@x", "commit", "-q", "-m", "outside 2")
    rev = commit(kb, 8, ("write", "/documents/d.md", b"d"))
    seqs = [r.seq for r in kb.history(8)]
    assert seqs == [4, 3, 2, 1] and rev.seq == 4


@pytest.fixture
def redis_settings(settings):
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(settings.redis_url)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis server at {settings.redis_url} (start one: redis-server --daemonize yes; .ci/run does)")
    return settings.model_copy(update={"lock_backend": "redis", "lock_timeout": 0.3, "lock_ttl": 5.0})


def test_redis_lock_backend(kb, redis_settings):
    from kb.db.redis_lock import RedisLock

    rkb = KnowledgeBase(redis_settings, kb.database_url)
    commit(rkb, 9, ("write", A, b"a"))
    lock = RedisLock(redis_settings)
    key = RedisLock.key(9)
    assert lock._redis.get(key) is None  # released after the commit
    with lock.hold(9) as token:
        assert lock._redis.get(key).decode() == token
        assert 0 < lock._redis.pttl(key) <= 5000
        with pytest.raises(LockTimeout) as caught:
            commit(rkb, 9, ("write", B, b"b"))
        assert caught.value.backend == "redis" and caught.value.workspace_id == 9
        lock._redis.set(key, "someone-else")  # our token expired and another holder took it
    assert lock._redis.get(key) == b"someone-else"  # token-owned release left it alone
    lock._redis.delete(key)
    down = KnowledgeBase(redis_settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"}), kb.database_url)
    head = kb.head(9)
    with pytest.raises(LockUnavailable, match="no write was made"):
        commit(down, 9, ("write", B, b"b"))
    assert kb.head(9) == head and kb.list_paths(9) == {A: blob_id(b"a")}


def test_a_write_waits_for_gits_ref_lock_held_a_moment(kb):
    """``git gc``'s pack-refs, or any git command updating the branch, holds
    ``refs/heads/main.lock`` for a moment; a write meeting it waits, as git's commands wait for
    each other (design §2.1), and lands instead of failing "the branch ref is locked"."""
    commit(kb, 10, ("write", A, b"a"))
    ref_lock = repo_of(kb, 10) / ".git" / "refs" / "heads" / "main.lock"
    ref_lock.write_bytes(b"held by a git command")
    released = threading.Timer(0.2, ref_lock.unlink)
    released.start()
    try:
        assert commit(kb, 10, ("write", B, b"b")).seq == 2
    finally:
        released.join()
    assert kb.read(10, B) == b"b" and not ref_lock.exists()
    assert_git_clean(kb, 10)


def test_cli_fsck_unknown_workspace(kb_env):
    out = run_cli(kb_env, "fsck", "--workspace", "99", check=False)
    assert out.returncode == 1 and "does not exist" in out.stderr
    assert os.environ.get("KB_FAULT_POINT") is None


def test_git_lock_files_left_by_a_killed_writer(kb, kb_env):
    commit(kb, 10, ("write", A, b"a"))
    repo = repo_of(kb, 10)
    index_lock, ref_lock = repo / ".git" / "index.lock", repo / ".git" / "refs" / "heads" / "main.lock"
    for lock in (index_lock, ref_lock):
        lock.write_bytes(b"partial")
        os.utime(lock, (0, 0))  # old: a killed writer's leftover
    commit(kb, 10, ("write", B, b"b"))
    assert not index_lock.exists() and not ref_lock.exists()
    ref_lock.write_bytes(b"held")  # young: maybe a git command running right now
    with pytest.raises(KbError, match="locked"):
        commit(kb, 10, ("write", C, b"c"))
    assert len(kb.history(10)) == 2 and C not in kb.list_paths(10)
    out = run_cli(kb_env, "fsck", "--workspace", "10").stdout
    assert "removed stale lock .git/refs/heads/main.lock" in out
    assert commit(kb, 10, ("write", C, b"c")).seq == 3
    assert_git_clean(kb, 10)


def test_swap_records_two_moves_whatever_the_order(kb):
    """A swap p <-> q through a temporary name is two moves, so each document keeps its history."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/p.md", "P\n")
        tx.write("/documents/q.md", "Q\n")
    with kb.transaction(1, "swap", "t") as tx:
        tx.move("/documents/p.md", "/documents/tmp.md")
        tx.move("/documents/q.md", "/documents/p.md")
        tx.move("/documents/tmp.md", "/documents/q.md")
    changes = {(c.path, c.change, c.old_path, c.new_path) for c in tx.revision.changes}
    assert changes == {
        ("/documents/p.md", "moved", "/documents/q.md", "/documents/q.md"),
        ("/documents/q.md", "moved", "/documents/p.md", "/documents/p.md"),
    }
    assert kb.read(1, "/documents/p.md") == b"Q\n"
    history = kb.history(1, "/documents/q.md")
    assert [r.message for r in history] == ["swap", "seed"]
    assert history[1].changes[0].path.endswith("/p.md")  # followed back to where it was seeded


def test_revision_prefixes_resolve_like_git(kb):
    """A unique prefix of 4+ hex digits names a revision, as in git; anything else is refused."""
    from kb.errors import RevisionNotFound

    kb.create_workspace(1)
    with kb.transaction(1, "one", "t") as tx:
        tx.write("/documents/a.md", "v1\n")
    first = tx.revision.id
    with kb.transaction(1, "two", "t") as tx:
        tx.write("/documents/a.md", "v2\n")
    assert kb.read(1, "/documents/a.md", first[:8]) == b"v1\n"
    assert kb.read_document(1, "/documents/a.md", first[:7].upper()).revision == first
    restored = kb.restore(1, "/documents/a.md", first[:10], author="t")
    assert restored is not None and kb.read(1, "/documents/a.md") == b"v1\n"
    for bad in ("abc", "zzzzzzzz", "0000000"):
        with pytest.raises(RevisionNotFound):
            kb.read(1, "/documents/a.md", bad)


def test_case_and_normalization_only_collisions_are_refused_but_renames_allowed(kb, settings):
    """design §2.2/§14: names differing only in case or NFC/NFD would not check out on macOS or
    Windows; a retitle that changes only case is a move of the same document."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/Roadmap.md", "r\n")
        tx.write("/documents/Caf\u00e9.md", "nfc\n")
        tx.write("/documents/Notes/a.md", "a\n")
    for path in ("/documents/roadmap.md", "/documents/Cafe\u0301.md", "/documents/notes/b.md", "/documents/NOTES"):
        with pytest.raises(PathExists, match="differs only in case"):
            with kb.transaction(1, "clash", "t") as tx:
                tx.write(path, "x\n")
    with pytest.raises(PathExists):
        with kb.transaction(1, "clash in one draft", "t") as tx:
            tx.write("/documents/New.md", "1\n")
            tx.write("/documents/NEW.md", "2\n")
    with kb.transaction(1, "case-only retitle", "t") as tx:
        tx.move("/documents/Roadmap.md", "/documents/roadmap.md")
        tx.write("/documents/Notes/b.md", "same spelling is fine\n")
    assert ("/documents/roadmap.md", "moved", "/documents/Roadmap.md") in {
        (c.path, c.change, c.old_path) for c in tx.revision.changes
    }
    assert sorted(kb.list_paths(1)) == [
        "/documents/Café.md",
        "/documents/Notes/a.md",
        "/documents/Notes/b.md",
        "/documents/roadmap.md",
    ]
    git(settings.knowledge_store / "1", "fsck", "--strict")


def test_paths_with_any_characters_are_recorded_verbatim(kb):
    """design §14: a revision's path changes travel to Postgres as JSON columns (one text value
    per column, not an array per value): paths holding the JSON and array separators and escapes —
    commas, quotes, braces, brackets, backslashes, newlines, NULL-looking and non-ASCII names —
    come back byte for byte, recorded from git (outside commits: an addition, then a move) and
    from kb's own folder move (of the names kb's paths allow)."""
    kb.create_workspace(31)
    repo = repo_of(kb, 31)
    odd = ["back\\slash.md", "new\nline.md", "tab\there.md", '","\\u0000.md']  # only git writes these
    names = ["a,b.md", 'quote".md', "apo'strophe.md", "{brace}.md", "[bracket].md", "NULL", "überß ☃ 日本.md"]
    (repo / "documents" / "odd").mkdir(parents=True)
    for i, name in enumerate(names + odd):
        (repo / "documents" / "odd" / name).write_text(f"{i}\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=o", "-c", "user.email=o@o", "commit", "-q", "-m", "odd names")
    git(repo, "mv", "documents/odd", 'documents/{"odd"}, [moved]')
    git(repo, "-c", "user.name=o", "-c", "user.email=o@o", "commit", "-q", "-m", "moved by git")
    added, moved = kb.reconcile(31)
    before = {f"/documents/odd/{name}" for name in names + odd}
    after = {p.replace("/odd/", '/{"odd"}, [moved]/') for p in before}
    assert {(c.path, c.change) for c in kb.list_changes(31, added.id)} == {(p, "added") for p in before}
    assert {(c.path, c.change, c.old_path, c.new_path) for c in kb.list_changes(31, moved.id)} == {
        (p, "moved_away", None, p.replace("/odd/", '/{"odd"}, [moved]/')) for p in before
    } | {(p, "moved", p.replace('/{"odd"}, [moved]/', "/odd/"), None) for p in after}
    for name in odd:  # kb's own paths refuse these names (git's are recorded as they are)
        git(repo, "rm", "-q", f'documents/{{"odd"}}, [moved]/{name}')
    git(repo, "-c", "user.name=o", "-c", "user.email=o@o", "commit", "-q", "-m", "drop what kb cannot move")
    kb.reconcile(31)
    with kb.transaction(31, "move the folder", "tester") as tx:
        tx.move('/documents/{"odd"}, [moved]', "/documents/moved, 'again' ☃")
    changes = {(c.path, c.change, c.old_path, c.new_path) for c in kb.list_changes(31, tx.revision.id)}
    old = {f'/documents/{{"odd"}}, [moved]/{name}' for name in names}
    new = {f"/documents/moved, 'again' ☃/{name}" for name in names}
    assert changes == {(p, "moved_away", None, p.replace('{"odd"}, [moved]', "moved, 'again' ☃")) for p in old} | {
        (p, "moved", p.replace("moved, 'again' ☃", '{"odd"}, [moved]'), None) for p in new
    }
    for name in names:  # history follows each of them across both moves
        path = f"/documents/moved, 'again' ☃/{name}"
        assert [r.id for r in kb.history(31, path)] == [tx.revision.id, moved.id, added.id]


@pytest.mark.parametrize("documents", [3, 300])  # grouped, and a big draft built before the lock
def test_a_move_whose_source_another_writer_moved_meanwhile_is_refused(kb, documents):
    """design §3: a move is checked under the lock against the head then. When another revision
    moved (or removed) the folder after this draft saw it, recording the draft's adds alone would
    put a second copy of every document at the new path, with no history behind it; it is refused
    instead, and nothing is recorded."""
    kb.create_workspace(34)
    with kb.transaction(34, "folder", "tester") as tx:
        for i in range(documents):
            tx.write(f"/documents/src/{i}.md", f"{i}\n")
    other = KnowledgeBase(kb.settings, kb.database_url)
    with pytest.raises(DocumentNotFound, match="meanwhile"):
        with kb.transaction(34, "one", "tester") as tx:
            tx.move("/documents/src", "/documents/one")
            with other.transaction(34, "two", "other") as meanwhile:
                meanwhile.move("/documents/src", "/documents/two")
    assert sorted(tree(kb, 34)) == sorted(f"/documents/two/{i}.md" for i in range(documents))
    assert [r.message for r in kb.history(34)] == ["two", "folder"]
    assert [r.message for r in kb.history(34, "/documents/two/0.md")] == ["two", "folder"]
    other.close()
    assert_git_clean(kb, 34)


@pytest.mark.parametrize("documents", [3, 300])  # 300: past PREBUILD_PATHS, built before the lock
def test_a_document_moved_unchanged_carries_an_edit_that_landed_meanwhile(kb, documents):
    """design §3: a folder move and an edit of a document in it, by two writers at once: the edit
    follows the move (the moved document is the edited one), where recording the draft's blob put
    the document back as it was and dropped the edit from the head without a word. A document the
    draft moved and changed itself keeps the draft's content, as any write does."""
    kb.create_workspace(35)
    with kb.transaction(35, "folder", "tester") as tx:
        for i in range(documents):
            tx.write(f"/documents/src/{i}.md", f"{i}\n")
    other = KnowledgeBase(kb.settings, kb.database_url)
    with kb.transaction(35, "rename", "tester") as tx:
        tx.move("/documents/src", "/documents/dst")
        tx.write("/documents/dst/2.md", "the rename's own 2\n")
        with other.transaction(35, "edit", "other") as meanwhile:
            meanwhile.write("/documents/src/1.md", "edited meanwhile\n")
            meanwhile.write("/documents/src/2.md", "lost to the rename's write\n")
    assert sorted(tree(kb, 35)) == sorted(f"/documents/dst/{i}.md" for i in range(documents))
    assert kb.read(35, "/documents/dst/1.md") == b"edited meanwhile\n"
    assert kb.read(35, "/documents/dst/2.md") == b"the rename's own 2\n"
    assert kb.read(35, "/documents/dst/0.md") == b"0\n"
    assert [r.message for r in kb.history(35, "/documents/dst/1.md")] == ["rename", "edit", "folder"]
    other.close()
    assert_git_clean(kb, 35)


def test_a_keyed_folder_move_sent_twice_at_once_lands_once_and_both_get_it(kb, monkeypatch):
    """design §3, §14: two requests with one idempotency key moving one folder at once (a client's
    retry while the first is still at work) build the same commit when they start on the same head
    in the same second, and so the same path-change rows ahead of the lock. The second must get the
    revision the first recorded, not a unique-key failure reported as "nothing was recorded"."""
    import types

    from kb.git import repository
    from kb.store import knowledge_store

    monkeypatch.setattr(knowledge_store, "PREBUILD_PATHS", 4)
    monkeypatch.setattr(repository, "time", types.SimpleNamespace(time=lambda: 1_800_000_000.0))  # one second
    kb.create_workspace(33)
    with kb.transaction(33, "folder", "tester") as tx:
        for i in range(6):
            tx.write(f"/documents/src/{i}.md", f"{i}\n")
    other = KnowledgeBase(kb.settings, kb.database_url)
    prebuild, revisions = knowledge_store.KnowledgeStore._prebuild, []

    def prebuild_then_the_same_request(store, draft, staged, ahead=None):
        shape = prebuild(store, draft, staged, ahead)
        if store is kb.store(33) and not revisions:  # the first request's work is built: the second runs
            with other.transaction(33, "move", "tester", idempotency_key="twice") as again:
                again.move("/documents/src", "/documents/dst")
            revisions.append(again.revision)
        return shape

    monkeypatch.setattr(knowledge_store.KnowledgeStore, "_prebuild", prebuild_then_the_same_request)
    with kb.transaction(33, "move", "tester", idempotency_key="twice") as tx:
        tx.move("/documents/src", "/documents/dst")
    assert revisions and tx.revision.id == revisions[0].id
    assert [r.message for r in kb.history(33)] == ["move", "folder"]
    assert [r.id for r in kb.history(33, "/documents/dst/3.md")][:1] == [tx.revision.id]
    assert len(kb.list_changes(33, tx.revision.id)) == 12
    with psycopg.connect(kb.database_url) as conn:
        assert conn.execute(queries["test_path_changes_without_revision"]).fetchall() == []
    other.close()
    assert_git_clean(kb, 33)


def test_a_folder_move_built_before_the_lock_is_rebuilt_when_the_head_moved(kb, monkeypatch):
    """design §4: a big draft's tree is checked and built before the write lock on the head of
    then (``KnowledgeStore._prebuild``); a revision another writer records in between makes that
    work stale, and the move is checked and built again on the new head under the lock: the other
    writer's document stays, and a name it took meanwhile that collides is refused."""
    from kb.store import knowledge_store

    monkeypatch.setattr(knowledge_store, "PREBUILD_PATHS", 4)
    kb.create_workspace(32)
    with kb.transaction(32, "folder", "tester") as tx:
        for i in range(6):
            tx.write(f"/documents/src/{i}.md", f"{i}\n")
    other = KnowledgeBase(kb.settings, kb.database_url)
    prebuild, built, meanwhile = knowledge_store.KnowledgeStore._prebuild, [], []

    def prebuild_then_another_writer(store, draft, staged, ahead=None):
        shape = prebuild(store, draft, staged, ahead)
        if store is kb.store(32):  # not for the other writer's own commits
            built.append(shape)
        if meanwhile:
            with other.transaction(32, "meanwhile", "other") as tx:
                meanwhile.pop()(tx)
        return shape

    monkeypatch.setattr(knowledge_store.KnowledgeStore, "_prebuild", prebuild_then_another_writer)
    meanwhile.append(lambda tx: tx.write("/documents/other.md", "o"))
    with kb.transaction(32, "move", "tester") as moved:
        moved.move("/documents/src", "/documents/dst")
    moved = moved.revision
    assert built[0] is not None and built[0].built is not None and built[0].built.revision.id != moved.id
    assert tree(kb, 32) == {
        "/documents/other.md": b"o",
        **{f"/documents/dst/{i}.md": f"{i}\n".encode() for i in range(6)},
    }
    meanwhile.append(lambda tx: tx.write("/documents/back/0.MD", "t"))  # 0.md but for its case
    with pytest.raises(PathExists, match="another revision created meanwhile"):
        with kb.transaction(32, "move back", "tester") as tx:
            tx.move("/documents/dst", "/documents/back")
    assert tree(kb, 32)["/documents/back/0.MD"] == b"t" and "/documents/dst/5.md" in tree(kb, 32)
    with kb.transaction(32, "move again", "tester") as tx:  # nobody meanwhile: what was built is used
        tx.move("/documents/dst", "/documents/again")
    assert built[-1].built is not None and built[-1].built.revision.id == tx.revision.id
    assert sorted((c.path, c.change) for c in kb.list_changes(32, tx.revision.id)) == sorted(
        [(f"/documents/dst/{i}.md", "moved_away") for i in range(6)]
        + [(f"/documents/again/{i}.md", "moved") for i in range(6)]
    )
    assert [r.id for r in kb.history(32, "/documents/again/3.md")][:2] == [tx.revision.id, moved.id]
    for attempt in ("first", "retry"):  # a retry of a landed write records nothing: its rows go
        with kb.transaction(32, "keyed", "tester", idempotency_key="key-32") as tx:
            for i in range(6):
                tx.write(f"/documents/keyed/{i}.md", f"{attempt} {i}\n")
        if attempt == "first":
            first = tx.revision
    assert tx.revision.id == first.id and kb.read(32, "/documents/keyed/5.md") == b"first 5\n"
    assert built[-1].built is not None and built[-1].built.revision.id != first.id  # built, inserted, dropped
    with psycopg.connect(kb.database_url) as conn:  # the rows inserted ahead of the lock: none left over
        assert conn.execute(queries["test_path_changes_without_revision"]).fetchall() == []
    other.close()
    assert_git_clean(kb, 32)


def test_a_folder_move_git_made_pairs_files_of_one_content(kb):
    """design §3: a revision recorded from git (a writer killed after moving the ref) infers its
    moves; files of one content moved with their folder (empty notes, copies of a template) are
    moves too, told apart by the folder rename the other files show and by their names, so each
    keeps its history. They were recorded as removed and added."""
    same = b"# Template\n"
    commit(
        kb,
        9,
        ("write", "/documents/F/a.md", same),
        ("write", "/documents/F/b.md", same),
        ("write", "/documents/F/sub/a.md", same),
        ("write", "/documents/F/unique.md", b"only here\n"),
        ("write", "/documents/G/x/index.md", same),
    )
    repo = repo_of(kb, 9)
    git(repo, "mv", "documents/F", "documents/H")  # no unique file tells this rename: names do
    git(repo, "mv", "documents/G/x", "documents/G/y")
    git(repo, "-c", "user.name=git", "-c", "user.email=g@x", "commit", "-q", "-m", "outside")
    outside = git(repo, "rev-parse", "HEAD").strip()
    assert [r.id for r in kb.reconcile(9)] == [outside]
    moved = {c.path: c.old_path for c in kb.list_changes(9, outside) if c.change == "moved"}
    assert moved == {
        "/documents/H/a.md": "/documents/F/a.md",
        "/documents/H/b.md": "/documents/F/b.md",
        "/documents/H/sub/a.md": "/documents/F/sub/a.md",
        "/documents/H/unique.md": "/documents/F/unique.md",
        "/documents/G/y/index.md": "/documents/G/x/index.md",
    }
    assert {c.change for c in kb.list_changes(9, outside)} == {"moved", "moved_away"}
    assert len(kb.history(9, "/documents/H/sub/a.md", limit=10)) == 2  # the move, then the write


def test_pair_moves_leaves_what_it_cannot_tell_apart():
    """Two files of one content and one name whose folders moved to two folders: no pairing is
    sure, so they stay removals and additions. With a unique move showing one folder's rename,
    that folder's copy pairs by it, and the one left on each side by its name."""
    removed = {"e": ["d/p/x.md", "d/q/x.md"], "u": ["d/p/u.md"]}
    added = {"e": ["d/r/x.md", "d/s/x.md"], "u": ["d/r/u.md"]}
    assert pair_moves(removed, added) == {"d/r/u.md": "d/p/u.md", "d/r/x.md": "d/p/x.md", "d/s/x.md": "d/q/x.md"}
    assert pair_moves({"e": ["d/p/x.md", "d/q/x.md"]}, {"e": ["d/r/x.md", "d/s/x.md"]}) == {}


def test_revert_keeps_the_work_of_later_revisions(kb):
    """design §3: a revert undoes its revision, not the revisions after it. A later edit of a
    document the revision edited survives (three-way merge); a document written later where the
    revision removed one, or one the revision added and someone edited since, is not removed or
    replaced (PathExists, nothing recorded); a document written later at a moved document's old
    destination stays. Each of these was overwritten or deleted by the path-by-path restore."""
    lines = "".join(f"line {i}\n" for i in range(1, 11))
    commit(kb, 4, ("write", "/documents/plan.md", lines), ("write", "/documents/gone.md", b"old\n"))
    edit = commit(kb, 4, ("write", "/documents/plan.md", lines.replace("line 2\n", "line two\n")))
    commit(
        kb,
        4,
        ("write", "/documents/plan.md", lines.replace("line 2\n", "line two\n").replace("line 9\n", "line nine\n")),
    )
    assert kb.revert(4, edit.id, "t") is not None
    assert kb.read(4, "/documents/plan.md") == lines.replace("line 9\n", "line nine\n").encode()
    # removed by a revision, a new document written there since: reverting the removal refuses
    removal = commit(kb, 4, ("remove", "/documents/gone.md"))
    commit(kb, 4, ("write", "/documents/gone.md", b"a new page\n"))
    with pytest.raises(PathExists, match="gone.md changed since"):
        kb.revert(4, removal.id, "t")
    # added by a revision, edited since: reverting the addition refuses
    added = commit(kb, 4, ("write", "/documents/new.md", b"draft\n"))
    commit(kb, 4, ("write", "/documents/new.md", b"draft, then finished\n"))
    with pytest.raises(PathExists, match="new.md changed since"):
        kb.revert(4, added.id, "t")
    assert kb.read(4, "/documents/gone.md") == b"a new page\n"
    # a move; the document moved on; a new document at the move's destination stays
    move = commit(kb, 4, ("move", "/documents/new.md", "/documents/B/x.md"))
    commit(kb, 4, ("move", "/documents/B/x.md", "/documents/C/x.md"))
    commit(kb, 4, ("write", "/documents/B/x.md", b"someone else's page\n"))
    assert kb.revert(4, move.id, "t") is not None
    assert kb.read(4, "/documents/new.md") == b"draft, then finished\n"
    assert kb.read(4, "/documents/B/x.md") == b"someone else's page\n"
    assert "/documents/C/x.md" not in kb.list_paths(4)


def _edit_after_the_revert_began(monkeypatch, kb, ws, *ops):
    """Interleave a real writer between the revert's draft snapshot and its commit: the revert's
    ``_move_back`` runs inside its draft, so a commit made there lands on the head after the
    revert read the document and before it records."""
    from kb.store import reverts

    original = reverts._move_back

    def then_another_writer(store, *args, **kwargs):
        carried = original(store, *args, **kwargs)
        monkeypatch.setattr(reverts, "_move_back", original)
        commit(kb, ws, *ops, message="a writer meanwhile")
        return carried

    monkeypatch.setattr(reverts, "_move_back", then_another_writer)


def test_a_revert_keeps_an_edit_that_lands_while_it_runs(kb, monkeypatch):
    """design §3, §5: the revert reads the document as the revision left it, then another writer
    edits it before the revert records: that edit survives (merged), as a later edit made before
    the revert began does. It was overwritten with the parent's bytes (a plain write)."""
    lines = "".join(f"line {i}\n" for i in range(1, 11))
    commit(kb, 5, ("write", "/documents/plan.md", lines))
    edit = commit(kb, 5, ("write", "/documents/plan.md", lines.replace("line 2\n", "line two\n")))
    _edit_after_the_revert_began(
        monkeypatch,
        kb,
        5,
        ("write", "/documents/plan.md", lines.replace("line 2\n", "line two\n").replace("line 9\n", "line nine\n")),
    )
    assert kb.revert(5, edit.id, "t") is not None
    assert kb.read(5, "/documents/plan.md") == lines.replace("line 9\n", "line nine\n").encode()


def test_reverting_twice_and_reverting_a_revert(kb):
    """design §3: a second revert of one revision has nothing left to undo; a revert of the revert
    puts back what the revert replaced; an overlapping later edit yields to the revert's lines
    and stays in history."""
    lines = "".join(f"line {i}\n" for i in range(1, 11))
    commit(kb, 6, ("write", "/documents/plan.md", lines))
    edit = commit(kb, 6, ("write", "/documents/plan.md", lines.replace("line 2\n", "line two\n")))
    later = lines.replace("line 2\n", "line TWO\n")
    overlap = commit(kb, 6, ("write", "/documents/plan.md", later))
    undo = kb.revert(6, edit.id, "t")
    assert undo is not None
    assert kb.read(6, "/documents/plan.md") == lines.encode()
    assert kb.revert(6, edit.id, "t") is None
    assert kb.read(6, "/documents/plan.md", revision=overlap.id) == later.encode()
    assert kb.revert(6, undo.id, "t") is not None  # puts back what the revert replaced
    assert kb.read(6, "/documents/plan.md") == later.encode()


def test_a_revert_never_removes_or_replaces_work_that_lands_while_it_runs(kb, monkeypatch):
    """design §3: where the revert found a document as the revision left it and another writer
    changes it before the revert records, the undo would remove or replace that work: PathExists,
    nothing recorded — as when the change landed before the revert began. The revert deleted the
    edited document it had added, and overwrote the document written where it had removed one."""
    added = commit(kb, 8, ("write", "/documents/new.md", b"draft\n"))
    _edit_after_the_revert_began(monkeypatch, kb, 8, ("write", "/documents/new.md", b"draft, then finished\n"))
    with pytest.raises(PathExists, match="new.md"):
        kb.revert(8, added.id, "t")
    assert kb.read(8, "/documents/new.md") == b"draft, then finished\n"
    assert len(kb.history(8)) == 2  # its addition and the edit meanwhile: no revert recorded
    commit(kb, 8, ("write", "/documents/gone.md", b"old\n"))
    removal = commit(kb, 8, ("remove", "/documents/gone.md"))
    _edit_after_the_revert_began(monkeypatch, kb, 8, ("write", "/documents/gone.md", b"a new page\n"))
    with pytest.raises(PathExists, match="gone.md"):
        kb.revert(8, removal.id, "t")
    assert kb.read(8, "/documents/gone.md") == b"a new page\n"


def test_a_revert_leaves_removed_a_document_removed_while_it_runs(kb, monkeypatch):
    """design §3: a document the revision edited and a later revision removed stays removed —
    also when the removal lands while the revert runs. The revert failed with DocumentGone (a
    400 over HTTP) instead of reverting the rest."""
    lines = "".join(f"line {i}\n" for i in range(1, 6))
    commit(kb, 9, ("write", "/documents/plan.md", lines), ("write", "/documents/other.md", b"one\n"))
    edit = commit(
        kb,
        9,
        ("write", "/documents/plan.md", lines.replace("line 2\n", "line two\n")),
        ("write", "/documents/other.md", b"two\n"),
    )
    _edit_after_the_revert_began(monkeypatch, kb, 9, ("remove", "/documents/plan.md"))
    assert kb.revert(9, edit.id, "t") is not None
    assert "/documents/plan.md" not in kb.list_paths(9)
    assert kb.read(9, "/documents/other.md") == b"one\n"


def test_reverting_a_revision_that_moved_and_edited_undoes_its_edit_too(kb):
    """design §3: a revert puts every path the revision touched back as it was in its parent. A
    revision that moved a folder and edited a document in it was undone as a move only: the
    document went back with the revision's own edit. Now its edit is undone as well, the edits
    it got since kept (three-way merge)."""
    commit(kb, 12, ("write", "/documents/F/a.md", b"a\nb\nc\n"), ("write", "/documents/F/b.md", b"x\n"))
    moved = commit(kb, 12, ("move", "/documents/F", "/documents/G"), ("write", "/documents/G/a.md", b"A\nb\nc\n"))
    undone = kb.revert(12, moved.id, "t")
    assert tree(kb, 12) == {"/documents/F/a.md": b"a\nb\nc\n", "/documents/F/b.md": b"x\n"}
    assert {c.path: c.change for c in undone.changes}["/documents/F/a.md"] == "moved"
    moved = commit(kb, 12, ("move", "/documents/F/a.md", "/documents/H.md"), ("write", "/documents/H.md", b"A\nb\nc\n"))
    commit(kb, 12, ("write", "/documents/H.md", b"A\nb\nC\n"), ("write", "/documents/G/new.md", b"n\n"))
    assert kb.revert(12, moved.id, "t") is not None
    assert tree(kb, 12) == {
        "/documents/F/a.md": b"a\nb\nC\n",
        "/documents/F/b.md": b"x\n",
        "/documents/G/new.md": b"n\n",
    }
    assert kb.revert(12, moved.id, "t") is None


def test_reverting_the_addition_of_a_document_moved_since_refuses(kb):
    """design §3: a document the revision added and a later revision moved is later work, as one
    edited since: reverting the addition refuses (PathExists, nothing recorded). It answered
    None, "nothing to revert", while the document it added was still there under its new path."""
    added = commit(kb, 13, ("write", "/documents/x.md", b"x\n"), ("write", "/documents/y.md", b"y\n"))
    commit(kb, 13, ("move", "/documents/x.md", "/documents/z.md"))
    with pytest.raises(PathExists, match="x.md") as refused:
        kb.revert(13, added.id, "t")
    assert tree(kb, 13) == {"/documents/y.md": b"y\n", "/documents/z.md": b"x\n"}
    # the refusal says it was moved, and where — it said "edited or replaced", which it was not
    assert "/documents/x.md (moved since to /documents/z.md)" in str(refused.value)
    assert "edited or replaced" not in str(refused.value) and "--workspace 13" in str(refused.value)


@pytest.mark.parametrize("value", ["inf", "1e400", "1e10", "-1"])
def test_kb_lock_timeout_past_any_wait_is_a_settings_error(value: str, monkeypatch) -> None:
    """``KB_LOCK_TIMEOUT`` (design §3, §4) bounds every wait for a workspace lock: the write lock
    (a Postgres ``lock_timeout``, at most about 24 days) and the write-key fence (a thread lock
    and an flock poll). ``inf`` or ``1e10`` seconds was taken as a setting and met later: a keyed
    write or ``kb write-outcome`` crashed with OverflowError ("timestamp out of range for platform
    time_t"), an unkeyed write failed as "Postgres failed during the write … Retry". It is refused
    as a setting now, as ``KB_POOL_TIMEOUT`` is; a negative wait is no wait anyone means."""
    from pydantic import ValidationError

    from kb.settings import Settings

    monkeypatch.setenv("KB_LOCK_TIMEOUT", value)
    with pytest.raises(ValidationError, match="lock_timeout"):
        Settings()
    monkeypatch.setenv("KB_LOCK_TIMEOUT", "86400")  # a day: the longest wait taken
    assert Settings().lock_timeout == 86400.0


@pytest.mark.parametrize("name", ["KB_TURN_IDLE_SECONDS", "KB_MCP_CHAT_IDLE_SECONDS"])
def test_an_idle_release_shorter_than_a_second_is_a_settings_error(name: str, monkeypatch) -> None:
    """``kb serve`` looks for idle API turns and MCP chats every quarter of these settings (design
    §5, §16). ``0.0001`` was taken, and an idle server spun its loop — a thread hop every 25 µs, 1.8
    s of CPU in 5 s with both set — while no client could use a turn that is released between two
    of its calls. A second is the shortest idle time taken."""
    from pydantic import ValidationError

    from kb.settings import Settings

    monkeypatch.setenv(name, "0.0001")
    with pytest.raises(ValidationError, match=name.removeprefix("KB_").lower()):
        Settings()
    monkeypatch.setenv(name, "1")
    assert getattr(Settings(), name.removeprefix("KB_").lower()) == 1.0


def test_fsck_keeps_a_copy_of_what_it_repairs_away_that_no_revision_holds(kb, kb_env):
    """design §2.1: `kb fsck` brings the working tree to HEAD. A file edited or added there by
    hand holds content no revision has, and the repair destroyed it while saying "repaired"; now
    it is copied under .git/kb-set-aside first and fsck says where. A file holding content git
    has (an older revision's, as a lost refresh leaves it) is repaired without a copy."""
    kb.create_workspace(1)
    with kb.transaction(1, "base", "t") as tx:
        tx.write("/documents/Notes/Index.md", b"# Index\n")
        tx.write("/documents/Notes/Old.md", b"old\n")
    with kb.transaction(1, "edit", "t") as tx:
        tx.write("/documents/Notes/Old.md", b"new\n")
    repo = kb.settings.knowledge_store / "1"
    (repo / "documents" / "Notes" / "Index.md").write_bytes(b"# Index\ntampered by hand\n")
    (repo / "documents" / "Notes" / "stray.md").write_bytes(b"a note written in the working tree\n")
    (repo / "documents" / "Notes" / "Old.md").write_bytes(b"old\n")  # an older revision's content
    out = run_cli(kb_env, "fsck", "-w", "1").stdout
    assert "repaired working tree: 3 paths" in out
    assert "kept 2 changed files no revision holds" in out and "kb-set-aside" in out
    [folder] = (repo / ".git" / "kb-set-aside").iterdir()
    assert str(folder) in out
    assert (folder / "documents" / "Notes" / "Index.md").read_bytes() == b"# Index\ntampered by hand\n"
    assert (folder / "documents" / "Notes" / "stray.md").read_bytes() == b"a note written in the working tree\n"
    assert not (folder / "documents" / "Notes" / "Old.md").exists()
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert "clean" in run_cli(kb_env, "fsck", "-w", "1").stdout


def test_restore_follows_the_document_through_later_moves(kb, kb_env):
    """design §3: `kb restore PATH --revision R` brings back the document that was at PATH in R.
    When a later revision moved it, the content goes to where it is now; it re-created the old
    path beside the moved document, two copies of one document (as `kb revert` never does). A
    document removed since comes back at PATH."""
    r1 = commit(kb, 5, ("write", A, b"todo v1"), ("write", B, b"b1"))
    commit(kb, 5, ("write", A, b"todo v2"))
    commit(kb, 5, ("move", A, "/documents/Archive/a.md"), ("remove", B))
    out = run_cli(kb_env, "restore", A, "--revision", r1.id, "--workspace", "5").stdout
    assert "/documents/Archive/a.md" in out
    assert tree(kb, 5) == {"/documents/Archive/a.md": b"todo v1"}
    run_cli(kb_env, "restore", B, "--revision", r1.id, "--workspace", "5")
    assert tree(kb, 5) == {"/documents/Archive/a.md": b"todo v1", B: b"b1"}


def test_restore_takes_a_documents_path_now_with_a_revision_before_its_moves(kb, kb_env):
    """design §3: `kb restore PATH --revision R` with the path a document has *now* and a revision
    before moves took it there brings back its version in R (found at the path it had then), as
    `kb log PATH` and `kb blame` follow it; it said "no document at PATH in revision R". A path
    that held nothing in R, and that no recorded move leads back from, still says so."""
    r1 = commit(kb, 7, ("write", A, b"policy v1"))
    commit(kb, 7, ("move", A, "/documents/Policies/a.md"))
    commit(kb, 7, ("write", "/documents/Policies/a.md", b"policy v2"))
    commit(kb, 7, ("move", "/documents/Policies/a.md", "/documents/Archive/a.md"))
    out = run_cli(kb_env, "restore", "/documents/Archive/a.md", "--revision", r1.id, "--workspace", "7").stdout
    assert "/documents/Archive/a.md" in out
    assert tree(kb, 7) == {"/documents/Archive/a.md": b"policy v1"}
    failed = run_cli(kb_env, "restore", "/documents/nothing.md", "--revision", r1.id, "--workspace", "7", check=False)
    assert failed.returncode == 1 and "no document at" in failed.stderr, failed.stderr


def test_restore_does_not_take_a_document_created_since_for_one_that_left_its_path(kb, kb_env):
    """design §3: a document moved from a path, then removed, and another created at that path:
    `kb restore PATH --revision R` (R before the move) replaced the new document's text with the
    old one's, following the path's history across the removal as if they were one document. The
    document now at PATH did not exist in R, so the restore says there was none there."""
    r1 = commit(kb, 9, ("write", A, b"old document"))
    commit(kb, 9, ("move", A, B))
    commit(kb, 9, ("remove", B))
    commit(kb, 9, ("write", B, b"another document"))
    failed = run_cli(kb_env, "restore", B, "--revision", r1.id, "--workspace", "9", check=False)
    assert failed.returncode == 1 and "no document at" in failed.stderr, (failed.stdout, failed.stderr)
    assert tree(kb, 9) == {B: b"another document"}


def test_a_message_of_only_whitespace_is_no_message_and_each_writer_writes_its_own(kb, tmp_path):
    """(design §3) git refuses a blank message as empty: a transaction, a turn's commit, an import,
    a revert and a restore given one write what they write when given none."""
    blank = " \n\t \n"
    first = commit(kb, 6, ("write", A, b"a1"), message=blank)
    assert first.message.startswith("docs: add 1 file"), first.message
    turn = kb.turn(6, "blank-message")
    turn.write("/documents/t.md", "in a turn\n")
    landed = turn.commit(blank)
    assert kb.history(6, limit=1)[0].message.startswith("docs: add 1 file"), landed
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "n.md").write_text("# n\n")
    kb.import_folder(folder, 6, prefix="imported", message=blank)
    assert kb.history(6, limit=1)[0].message.startswith("import 1 documents from notes")
    kb.revert(6, first.id, message="  ")
    assert kb.history(6, limit=1)[0].message.startswith('Revert "docs: add 1 file')
    kb.restore(6, A, first.id, message="\n")
    assert kb.history(6, limit=1)[0].message.startswith(f"restore {A} from revision")
    for revision in kb.history(6, limit=10):
        assert revision.message.strip(), revision
    git(repo_of(kb, 6), "fsck", "--strict")


def test_an_identity_past_the_bound_is_refused_before_anything_is_written(kb):
    """(design §3) a 60,000-character author was recorded in the commit, the history row and every
    log line; author and committer are at most MAX_IDENTITY_CHARS."""
    from kb.errors import InvalidInput
    from kb.store.knowledge_store import MAX_IDENTITY_CHARS

    commit(kb, 7, ("write", A, b"a1"))
    head = kb.head(7)
    for author, committer in (("x" * 60_000, None), ("tester", "y" * (MAX_IDENTITY_CHARS + 1))):
        with pytest.raises(InvalidInput, match="characters long; an identity is at most 1,024"):
            with kb.transaction(7, "m", author, committer) as tx:
                tx.write(B, b"b")
    with pytest.raises(InvalidInput, match="an identity is at most"):
        kb.turn(7, "long-author", author="z" * 60_000)  # refused as the turn is asked for
    assert kb.head(7) == head
    fitting = commit(kb, 7, ("write", B, b"b"))
    with kb.transaction(7, "m", "n" * MAX_IDENTITY_CHARS) as tx:
        tx.write(A, b"a2")
    assert tx.revision is not None and fitting is not None
