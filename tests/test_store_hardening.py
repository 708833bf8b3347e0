"""design §14 (design §2, §3, §4, §5, §14): the store and turns under contention and crashes.

Each test is one kind of fault the issue found, with real Postgres, the real git CLI and real
subprocesses killed with SIGKILL; each failed before its fix.
"""

from __future__ import annotations

import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import time
import unicodedata

import pytest
from support.commands import git, run_cli
from support.named_queries import queries

from kb.db import database
from kb.db.locks import WRITE_LOCK_NAMESPACE
from kb.errors import (
    ConfigurationError,
    DatabaseUnavailable,
    InvalidInput,
    InvalidPath,
    KbError,
    PathExists,
)
from kb.index.chunking import Chunker
from kb.knowledge_base import KnowledgeBase
from kb.paths import MAX_PATH_BYTES, safe_filename
from kb.store import knowledge_store as store_module

WS = 1
NFC = unicodedata.normalize("NFC", "Café.md")
NFD = unicodedata.normalize("NFD", "Café.md")


@pytest.fixture
def ws(kb):
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "seeder") as tx:
        tx.write("/documents/a.md", "alpha\n")
    return kb


def raw_commit(kb, files: dict[str, bytes], record: bool = True) -> str:
    """Commit ``{repo path: bytes}`` with git plumbing only, bypassing the path law (what an older
    kb, or git by hand, may have left), then let kb record it (``reconcile``) if ``record``."""
    repo = kb.store(WS).repository
    head = repo.head()
    tree = repo.build_tree(repo.tree_id(head), [(p, repo.add_blob(d)) for p, d in files.items()])
    commit = repo.make_commit(tree, head, "raw", "old kb", "old kb")
    assert repo.advance(head, commit.id.decode())
    if record:
        kb.reconcile(WS)
    return commit.id.decode()


# -- 1. case / normalization collisions re-checked against the tree the commit is built on ----
@pytest.mark.parametrize("first,second", [("Foo.md", "FOO.md"), (NFC, NFD), ("dir/x.md", "DIR/y.md")])
def test_overlapping_transactions_cannot_both_create_twins(ws, first, second):
    with pytest.raises(PathExists):
        with ws.transaction(WS, "one", "a") as one:
            one.write(f"/documents/{first}", "1")
            with ws.transaction(WS, "two", "b") as two:  # same base: its draft sees no twin
                two.write(f"/documents/{second}", "2")
            assert two.revision is not None
    # one's commit is built on HEAD, which now holds the twin: refused, nothing recorded
    assert sorted(ws.list_paths(WS)) == sorted(["/documents/a.md", f"/documents/{second}"])
    assert len(ws.history(WS)) == 2


def test_second_twin_refused_with_escaped_names(ws):
    store = ws.store(WS)
    repo = store.repository
    with pytest.raises(PathExists) as caught:
        with ws.transaction(WS, "one", "a") as one:
            one.write(f"/documents/{NFC}", "1")
            with ws.transaction(WS, "two", "b") as two:
                two.write(f"/documents/{NFD}", "2")
    message = str(caught.value)
    assert ascii(NFC) in message and ascii(NFD) in message  # 'Caf\xe9.md' vs 'Cafe\u0301.md'
    names = [p for p in ws.list_paths(WS) if p != "/documents/a.md"]
    assert names == [f"/documents/{NFD}"]
    assert git(repo.path, "status", "--porcelain", "--untracked-files=all") == ""
    # a removal of the twin in the same change set makes the new spelling fine (a case rename)
    with ws.transaction(WS, "rename", "a") as tx:
        tx.move(f"/documents/{NFD}", f"/documents/{NFC}")
    assert [p for p in ws.list_paths(WS) if p != "/documents/a.md"] == [f"/documents/{NFC}"]


def test_racing_turns_cannot_both_create_twins(ws):
    t1, t2 = ws.turn(WS, "t1", "a"), ws.turn(WS, "t2", "b")
    t1.write("/documents/Notes/Foo.md", "1")
    t2.write("/documents/NOTES/foo.md", "2")
    assert t1.commit() is not None
    with pytest.raises(PathExists):
        t2.commit()
    assert sorted(ws.list_paths(WS)) == ["/documents/Notes/Foo.md", "/documents/a.md"]


def test_turn_write_refuses_a_twin_at_write_time(ws):
    with ws.transaction(WS, "nfc", "a") as tx:
        tx.write(f"/documents/{NFC}", "x")
    turn = ws.turn(WS, "t", "a")
    with pytest.raises(PathExists) as caught:
        turn.write(f"/documents/{NFD}", "y")
    assert ascii(NFC) in str(caught.value) and ascii(NFD) in str(caught.value)
    with pytest.raises(PathExists):
        turn.write("/documents/A.md", "y")
    with pytest.raises(PathExists):
        turn.mkdir("/documents/CAF\u00c9.md")
    turn.write(f"/documents/{NFC}", "y")  # the existing spelling is fine
    turn.write("/documents/New/b.md", "z")
    with pytest.raises(PathExists):
        turn.write("/documents/NEW/c.md", "z")  # a twin of the turn's own new folder
    assert turn.commit().modified == [f"/documents/{NFC}"]


# -- 2. the whole-path limit -----------------------------------------------------------------
def long_path(total: int) -> str:
    """A path whose part below /documents is ``total`` UTF-8 bytes (segments of ≤ 200 bytes)."""
    segments, left = [], total - len(".md")
    while left > 0:
        size = min(200, left)
        segments.append("d" * size)
        left -= size + 1
    body = "/".join(segments)
    body = body[: total - 3] + ".md"
    assert len(body.encode()) == total, len(body.encode())
    return "/documents/" + body


def test_whole_path_limit_in_transactions_and_turns(ws):
    fits, too_long = long_path(MAX_PATH_BYTES), long_path(MAX_PATH_BYTES + 1)
    with ws.transaction(WS, "fits", "a") as tx:
        tx.write(fits, "x")
        with pytest.raises(InvalidPath, match="exceeds 1024"):
            tx.write(too_long, "x")
        with pytest.raises(InvalidPath):
            tx.write(long_path(4200), "x")
        with pytest.raises(InvalidPath):
            tx.move("/documents/a.md", too_long)
    turn = ws.turn(WS, "t", "a")
    for path in (too_long, long_path(4200)):
        with pytest.raises(InvalidPath):
            turn.write(path, "x")
    turn.write(fits.replace("/documents/d", "/documents/e", 1), "y")  # the deepest allowed path fits on disk
    assert turn.read(fits).text == "x"
    assert turn.commit() is not None
    repo = ws.store(WS).path
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_storage_root_too_deep_is_refused_at_start_up(settings, tmp_path):
    deep = tmp_path.joinpath(*(["x" * 200] * 15))
    with pytest.raises(ConfigurationError, match="storage root is too deep"):
        KnowledgeBase(settings.model_copy(update={"storage_root": deep}), settings.database_url)


def test_fsck_lists_an_overlong_committed_path_and_kb_mv_fixes_it(ws, kb_env):
    path = long_path(4200)[1:]
    revision = raw_commit(ws, {path: b"long\n"}, record=False)
    # a later write still works and Postgres catches up with the revision
    with ws.transaction(WS, "later", "a") as tx:
        tx.write("/documents/b.md", "b")
    assert [r.id for r in ws.history(WS)][1] == revision
    result = run_cli(kb_env, "fsck", "--workspace", str(WS))
    assert "git fsck --strict: ok" in result.stdout
    assert "path too long to check out (4200 bytes below /documents)" in result.stdout
    fix = next(line for line in result.stdout.splitlines() if "fix: kb mv" in line).split("fix: ", 1)[1]
    assert ws.read(WS, "/" + path) == b"long\n"  # an existing over-long path stays readable
    src, dst = shlex.split(fix)[-2:]  # kb mv --workspace 1 SRC DST
    run_cli(kb_env, "mv", "--workspace", str(WS), src, dst)
    assert ws.read(WS, dst) == b"long\n"
    out = run_cli(kb_env, "fsck", "--workspace", str(WS)).stdout
    assert "too long" not in out
    assert git(ws.store(WS).path, "status", "--porcelain", "--untracked-files=all") == ""


# -- 3. turn recovery never re-applies a recorded revision -----------------------------------
TURN_WRITER = """
from kb.knowledge_base import KnowledgeBase
from kb.db.locks import WRITE_LOCK_NAMESPACE
kb = KnowledgeBase.open()
turn = kb.turn(1, "crash-turn", "agent")
turn.write("/documents/a.md", "from the turn\\n")
turn.commit()
print("committed")
"""


@pytest.mark.parametrize("point", ["ref_advanced", "before_pg_commit"])
def test_recovered_turn_is_not_replayed_over_newer_work(ws, kb_env, point):
    proc = subprocess.run(
        [sys.executable, "-c", TURN_WRITER],
        env={**kb_env, "KB_FAULT_POINT": point},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    landed = ws.head(WS)
    assert ws.read(WS, "/documents/a.md") == b"from the turn\n"
    with ws.transaction(WS, "someone else", "b") as tx:
        tx.write("/documents/a.md", "newer work\n")
    result = ws.turn(WS, "crash-turn", "agent").commit()  # recovery of the killed turn
    assert result is not None and result.revision == landed
    assert ws.read(WS, "/documents/a.md") == b"newer work\n"
    assert len(ws.history(WS)) == 3
    assert not ws.turn(WS, "crash-turn", "agent").path.exists()


# -- 4. Postgres going away at commit --------------------------------------------------------
def terminate(database_url: str, pid: int) -> None:
    with database.connect(database_url, autocommit=True) as admin:
        admin.execute(queries["test_terminate_backend"], {"pid": pid})


def kill_lock_holder(database_url: str) -> None:
    """Terminate the backend holding workspace WS's write lock (Postgres going away mid-commit)."""
    with database.connect(database_url, autocommit=True) as admin:
        pids = admin.execute(
            queries["test_write_lock_holders"], {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": WS}
        ).fetchall()
    assert pids
    for row in pids:
        terminate(database_url, row["pid"])
    time.sleep(0.2)


@pytest.mark.parametrize("opener", ["connect", "transaction", "pooled_connection", "pooled_transaction"])
def test_a_connection_lost_in_use_is_a_kb_error(database_url, opener):
    with pytest.raises(DatabaseUnavailable, match="connection to Postgres was lost"):
        with getattr(database, opener)(database_url) as conn:
            terminate(database_url, conn.execute(queries["test_backend_pid"]).fetchone()["pid"])
            conn.execute(queries["test_backend_pid"])
    database.close_pools()


@pytest.mark.parametrize("point", ["objects_written", "before_pg_commit"])
def test_postgres_gone_at_commit_is_settled_before_the_writer_is_answered(ws, monkeypatch, point):
    """The writer's own session is terminated mid-commit; Postgres is still up, so the writer
    settles its write under the lock (design §3) and tells the truth: before the ref moved nothing
    landed; after it moved the revision landed (recorded now) and the call returns it."""
    base = ws.head(WS)

    def fault(name):
        if name == point:
            kill_lock_holder(ws.database_url)

    monkeypatch.setattr(store_module, "fault_point", fault)
    if point == "objects_written":  # before the ref moved: nothing landed, and it says so
        with pytest.raises(DatabaseUnavailable, match="nothing was recorded"):
            with ws.transaction(WS, "doomed", "a") as tx:
                tx.write("/documents/b.md", "b")
        monkeypatch.undo()
        assert ws.head(WS) == base
        return
    with ws.transaction(WS, "landed", "a") as tx:
        tx.write("/documents/b.md", "b")
    monkeypatch.undo()
    head = ws.head(WS)
    assert head != base and tx.revision.id == head
    assert ws.history(WS)[0].id == head
    assert ws.fsck(WS).recorded == []
    assert ws.read(WS, "/documents/b.md") == b"b"


# -- 5. fsck on a live workspace -------------------------------------------------------------
def _write_loop(settings, url, count):
    kb = KnowledgeBase(settings, url)
    for i in range(count):
        with kb.transaction(WS, f"w{i}", "w") as tx:
            tx.write(f"/documents/live/{i % 20}.md", f"{i}\n")


def test_fsck_under_write_load_reports_no_false_corruption(ws):
    ctx = multiprocessing.get_context("fork")
    writer = ctx.Process(target=_write_loop, args=(ws.settings, ws.database_url, 150))
    writer.start()
    reports = []
    while writer.is_alive() or not reports:
        reports.append(ws.fsck(WS))
    writer.join(120)
    assert writer.exitcode == 0
    bad = [r.git_messages for r in reports if not r.ok]
    assert not bad, bad
    assert len(reports) >= 2


def test_fsck_reports_a_real_reflog_corruption(ws):
    logs = ws.store(WS).path / ".git" / "logs" / "refs" / "heads" / "main"
    with logs.open("ab") as handle:
        handle.write(b"0" * 40 + b" " + b"1" * 40 + b" x <> 0 +0000\tkb: commit\n")
    report = ws.fsck(WS)
    assert not report.ok and any("invalid reflog entry" in m for m in report.git_messages)


# -- 6. smaller faults of the same kind ------------------------------------------------------
def test_half_deleted_turn_worktree_is_cleaned_not_committed(ws):
    turn = ws.turn(WS, "half", "agent")
    turn.write("/documents/x.md", "x")
    turn.write("/documents/y.md", "y")
    turn.close()
    admin = ws.store(WS).path / ".git" / "worktrees" / "half"
    (admin / "HEAD").unlink()  # killed during removal (the admin HEAD goes first)
    head = ws.head(WS)
    assert ws.turn(WS, "half", "agent").commit() is None
    assert ws.head(WS) == head
    assert not turn.path.exists() and not admin.exists()
    # and abort cleans the same state
    turn = ws.turn(WS, "half2", "agent")
    turn.write("/documents/x.md", "x")
    turn.close()
    (turn.path / ".git").unlink()
    ws.turn(WS, "half2", "agent").abort()
    assert not turn.path.exists()
    assert str(turn.path) not in git(ws.store(WS).path, "worktree", "list")


def test_fsck_removes_temporary_packs_of_killed_imports(ws):
    objects = ws.store(WS).path / ".git" / "objects"
    old_tmp, old_pack, fresh = objects / "tmp_pack_abc", objects / "pack" / "pack-dead.pack", objects / "tmp_pack_new"
    old_pack.parent.mkdir(exist_ok=True)
    for file in (old_tmp, old_pack, fresh):
        file.write_bytes(b"PACK partial")
    past = time.time() - 3600
    for file in (old_tmp, old_pack):
        os.utime(file, (past, past))
    report = ws.fsck(WS)
    assert report.ok
    assert report.temporary_packs_removed == [".git/objects/pack/pack-dead.pack", ".git/objects/tmp_pack_abc"]
    assert fresh.exists() and not old_tmp.exists() and not old_pack.exists()


def test_lone_surrogates_are_kb_errors(ws):
    assert safe_filename("report \udcff.md") == "report \ufffd.md"
    with ws.transaction(WS, "s", "a") as tx:
        with pytest.raises(InvalidPath):
            tx.write("/documents/\ud800.md", "x")
        with pytest.raises(InvalidInput):
            tx.write("/documents/s.md", "bad \ud800 text")
    turn = ws.turn(WS, "s", "a")
    with pytest.raises(InvalidPath):
        turn.write("/documents/\udcff.md", "x")
    with pytest.raises(InvalidInput):
        turn.write("/documents/s.md", "bad \ud800")
    turn.abort()


@pytest.mark.parametrize("name", ["NUL", "nul.md", "lpt9.txt", "COM1", "CON .md", "a.", "b ", "dir./x.md"])
def test_new_device_and_dot_space_names_are_refused(ws, name):
    with ws.transaction(WS, "d", "a") as tx:
        with pytest.raises(InvalidPath):
            tx.write(f"/documents/{name}", "x")
        with pytest.raises(InvalidPath):
            tx.move("/documents/a.md", f"/documents/{name}")
    turn = ws.turn(WS, "d", "a")
    with pytest.raises(InvalidPath):
        turn.write(f"/documents/{name}", "x")
    turn.abort()


def test_existing_device_names_stay_readable_movable_removable(ws):
    raw_commit(ws, {"documents/NUL.md": b"n", "documents/trail./x.md": b"t", "documents/c.md": b"c"})
    assert ws.read(WS, "/documents/NUL.md") == b"n"
    with ws.transaction(WS, "edit", "a") as tx:
        tx.write("/documents/NUL.md", "n2")  # replacing an existing document is fine
        tx.write("/documents/trail./y.md", "in an existing folder")
    turn = ws.turn(WS, "t", "a")
    assert turn.read("/documents/trail./x.md").text == "t"
    turn.move("/documents/NUL.md", "/documents/null.md")
    turn.remove("/documents/trail./x.md")
    result = turn.commit()
    assert result.moved == [("/documents/NUL.md", "/documents/null.md")]
    with ws.transaction(WS, "rm", "a") as tx:
        tx.remove("/documents/trail.")
    assert sorted(ws.list_paths(WS)) == ["/documents/a.md", "/documents/c.md", "/documents/null.md"]


class _Piece:
    def __init__(self, text, start):
        self.text, self.start_index, self.end_index, self.token_count = text, start, start + len(text), 1


class _FirstOccurrenceChunker:
    """A chunker with the fault the issue names: each piece placed at its text's first occurrence."""

    def chunk(self, text):
        return [_Piece(line, text.index(line)) for line in text.split("\n") if line]


def test_chunks_with_overlapping_ranges_are_refused():
    # chunk_size=1: every span (here one block, no blank lines) is too big and goes to the chunker
    chunker = Chunker(chunk_size=1)
    chunker._chunker = _FirstOccurrenceChunker()
    with pytest.raises(KbError, match="overlapping or before"):
        chunker.chunk("same words\nother\nsame words\n")
    assert [c.start_char for c in chunker.chunk("one\ntwo\nthree\n")] == [0, 4, 8]
