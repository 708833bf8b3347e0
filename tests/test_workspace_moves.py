"""design §15: moving a workspace between nodes — the read-only window every writer meets
(``kb.db.locks.locked_pipeline``), its abort and expiry; and one end-to-end move between two real
`kb serve --with-worker` nodes (two storage roots, one Postgres) while a writer loops, killed after
its window opened and resumed. The kill at every step, and the move time of a large workspace, are
``bin/move_workspace.py``'s."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
from support import serving
from support.commands import git, run_cli
from support.kb_nodes import bearer, running_nodes
from support.waiting import wait_until

from kb import KnowledgeBase, Settings
from kb.db import database, nodes
from kb.errors import MoveFailed, WorkspaceMoving, WrongNode
from kb.workspace import moves


def _write(kb: KnowledgeBase, path: str, text: str, **kw):
    with kb.transaction(1, "w", "alice", **kw) as tx:
        tx.write(path, text.encode())
    return tx.revision


def test_window_refuses_every_writer_reads_go_on_abort_and_expiry(kb: KnowledgeBase) -> None:
    kb.create_workspace(1)
    first = _write(kb, "/documents/a.md", "one\n")
    moves.open_window(kb.stores, 1, "m1", kb.settings.node, "b")
    with pytest.raises(WorkspaceMoving, match="moving to node 'b'.*nothing was written") as refused:
        _write(kb, "/documents/b.md", "two\n")  # grouped
    assert refused.value.target_node == "b" and refused.value.retry_after > 0
    with pytest.raises(WorkspaceMoving):
        kb.artifacts(1).save("Report", "# Report\n", {"data.csv": b"1,2\n"})  # alone, with blobs
    turn = kb.turn(1, "t1", author="bob")
    turn.write("/documents/c.md", "three\n")
    with pytest.raises(WorkspaceMoving):
        turn.commit()
    assert kb.read(1, "/documents/a.md") == b"one\n"  # reads go on
    assert [r.id for r in kb.history(1)] == [first.id]
    assert moves.window(kb.stores, 1)["step"] == "window"
    with pytest.raises(MoveFailed, match=r"already moving to node 'b' \(move m1.*nothing was changed"):
        moves.open_window(kb.stores, 1, "m3", kb.settings.node, "c")  # a second move started at once
    assert moves.open_window(kb.stores, 1, "m1", kb.settings.node, "b")["move_id"] == "m1"  # its own: renewed
    assert kb.abort_move(1)["move_id"] == "m1"
    assert moves.window(kb.stores, 1) is None
    assert _write(kb, "/documents/b.md", "two\n") is not None  # writes go on at once

    short = KnowledgeBase.open(kb.settings.model_copy(update={"move_window_seconds": 0.5}))
    moves.open_window(short.stores, 1, "m2", kb.settings.node, "b")
    with pytest.raises(WorkspaceMoving):
        _write(short, "/documents/d.md", "four\n")
    time.sleep(0.6)  # an abandoned window expires
    assert _write(short, "/documents/d.md", "four\n") is not None
    short.close()


def test_a_writer_on_a_node_that_is_not_the_home_writes_nothing(kb: KnowledgeBase, tmp_path: Path) -> None:
    kb.create_workspace(1)
    first = _write(kb, "/documents/a.md", "one\n")
    nodes.register(kb.database_url, kb.settings.model_copy(update={"node": "c", "storage_root": tmp_path / "c"}))
    with database.transaction(kb.database_url) as conn:  # as a move's flip does
        assert nodes.set_home(conn, 1, "c", kb.settings.node)
    with pytest.raises(WrongNode, match="homed on node 'c'.*nothing was written"):
        _write(kb, "/documents/b.md", "two\n")
    assert [r.id for r in kb.history(1)] == [first.id]


def test_a_target_pulls_the_copy_only_from_the_home_nodes_registered_url(kb: KnowledgeBase, tmp_path: Path) -> None:
    """``POST …/receive`` names a ``source_url``: a caller with an admin token must not make the
    target fetch an address of its choosing (and send it the bearer token) — nothing is fetched."""
    import socket

    kb.create_workspace(1)
    _write(kb, "/documents/a.md", "one\n")
    kb.register_node("http://127.0.0.1:9")  # the home's registered URL (nothing listens there)
    target = kb.settings.model_copy(update={"node": "b", "storage_root": tmp_path / "b"})
    nodes.register(kb.database_url, target)
    moves.open_window(kb.stores, 1, "m1", kb.settings.node, "b")
    with socket.socket() as elsewhere, KnowledgeBase.open(target, migrate=False) as on_b:
        elsewhere.bind(("127.0.0.1", 0))
        elsewhere.listen()
        elsewhere.settimeout(0.3)
        with pytest.raises(MoveFailed, match="only from its home node's registered URL.*nothing was fetched"):
            on_b.receive_workspace(1, "m1", f"http://127.0.0.1:{elsewhere.getsockname()[1]}", token="secret")
        with pytest.raises(TimeoutError):
            elsewhere.accept()  # nobody called
    assert not (target.knowledge_store / "1").exists()


def test_a_stray_retire_or_discard_renames_no_copy(kb: KnowledgeBase, tmp_path: Path) -> None:
    """The node-to-node retire and discard routes act only on what Postgres says: during a move to b,
    b's verified copy (which the flip will make the home's) is not renamed aside by a retire or
    discard call naming any move; the old home's copy is not retired before a flip away from it."""
    kb.create_workspace(1)
    _write(kb, "/documents/a.md", "one\n")
    target = kb.settings.model_copy(update={"node": "b", "storage_root": tmp_path / "b"})
    nodes.register(kb.database_url, target)
    moves.open_window(kb.stores, 1, "m1", kb.settings.node, "b")
    copy = target.knowledge_store / "1"
    git(tmp_path, "clone", "-q", str(kb.settings.knowledge_store / "1"), str(copy))  # as a receive left it
    with KnowledgeBase.open(target, migrate=False) as on_b:
        for move_id, aborted in (("m1", False), ("m1", True), ("other", False), ("other", True)):
            with pytest.raises(MoveFailed, match="nothing (renamed|discarded)"):
                on_b.retire_workspace_copy(1, move_id, aborted=aborted)
            assert copy.is_dir(), (move_id, aborted)
        with pytest.raises(MoveFailed, match="nothing renamed"):  # the home: still its copy
            kb.retire_workspace_copy(1, "m1")
        assert (kb.settings.knowledge_store / "1").is_dir()
        assert kb.abort_move(1)["move_id"] == "m1"  # the window is gone: now the copy is discarded
        assert on_b.retire_workspace_copy(1, "m1", aborted=True) == [str(target.knowledge_store / ".stale-1-m1")]
        assert not copy.exists()


def test_a_move_to_a_node_that_cannot_answer_leaves_the_workspace_writable(kb: KnowledgeBase, tmp_path: Path) -> None:
    """A target that is down (no heartbeat) is refused before any window opens; one that does not
    answer closes the window it opened: writes go on at once, not after KB_MOVE_WINDOW_SECONDS."""
    from support.named_queries import queries

    kb.create_workspace(1)
    _write(kb, "/documents/a.md", "one\n")
    kb.register_node("http://127.0.0.1:9")  # nothing listens at either node's URL
    nodes.register(
        kb.database_url,
        kb.settings.model_copy(update={"node": "b", "storage_root": tmp_path / "b"}),
        "http://127.0.0.1:9",
    )
    with pytest.raises(MoveFailed, match="does not answer.*window is closed again: writes go on"):
        kb.move_workspace(1, "b")
    assert moves.window(kb.stores, 1) is None
    assert _write(kb, "/documents/b.md", "two\n") is not None
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["test_age_node_heartbeat"], {"name": "b", "seconds": 3600})
    with pytest.raises(MoveFailed, match="target node 'b' is down.*nothing was changed"):
        kb.move_workspace(1, "b")
    assert moves.window(kb.stores, 1) is None
    assert _write(kb, "/documents/c.md", "three\n") is not None


# -- end to end: two nodes -----------------------------------------------------------------
AUTH: dict[str, str] = {}
"""The nodes' admin token header (design §16), set once the nodes run."""


def call(url: str, method: str = "GET", body: dict | None = None, headers: dict | None = None):
    """``serving.call`` with the nodes' token."""
    return serving.call(url, method, body, {**AUTH, **(headers or {})})


class Writer(threading.Thread):
    """Writes one new document per turn through a node's port until stopped; keeps what each write
    was told: landed (revision), refused with WorkspaceMoving or WrongNode (it reached a just
    before the flip and wrote after it), nothing recorded, or another error."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.landed: dict[str, str] = {}  # path → revision
        self.refused: list[str] = []
        self.empty: list[str] = []
        self.elsewhere: list[str] = []
        self.failed: list[tuple[int, object]] = []

    def write(self, n: int) -> None:
        turn, path = f"{self.url}/v1/workspaces/1/turns/w{n}", f"/documents/loop/{n}.md"
        status, answer = call(f"{turn}/files{path}", "PUT", {"content": f"write {n}\n"})
        if status == 200:
            status, answer = call(f"{turn}/commit", "POST", {"message": f"write {n}"}, {"Idempotency-Key": f"w{n}"})
        if status == 200 and answer["revision"] is None:  # a turn opened on a before the flip, committed
            self.empty.append(path)  # on b (forwarded): its writes stayed on a (--force), nothing recorded
            return
        if status == 200:
            self.landed[path] = answer["revision"]
            return
        if isinstance(answer, dict) and answer.get("error") == "WorkspaceMoving":
            self.refused.append(path)
        elif isinstance(answer, dict) and answer.get("error") == "WrongNode":  # raced the flip on a
            self.elsewhere.append(path)
        else:
            self.failed.append((status, answer))
        call(turn, "DELETE")

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.write(n)
            except OSError as exc:  # the server does not answer: a failure the test reports
                self.failed.append((0, str(exc)))
            time.sleep(0.05)


@pytest.mark.postgres
def test_move_between_two_nodes_while_a_writer_loops(database_url: str, tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")
    with running_nodes(database_url, tmp_path) as (a, b):
        notes = tmp_path / "notes"
        notes.mkdir()
        (notes / "One.md").write_text("# One\n\nfirst note\n")
        (notes / "Two.md").write_text("# Two\n\nsecond note\n")
        run_cli(a.env, "import", str(notes), "--workspace", "1")
        AUTH.update(bearer(a))
        writer = Writer(a.url)
        writer.start()
        wait_until(lambda: len(writer.landed) >= 2, 60, "writes to land on a")
        # killed right after its window opened: writes are refused, none lands, reads go on
        killed = run_cli(
            {**a.env, "KB_FAULT_POINT": "move_window_open"}, "workspace", "move", "1", "--to", "b", check=False
        )
        assert killed.returncode == -signal.SIGKILL and "read-only window open" in killed.stdout
        wait_until(lambda: len(writer.refused) >= 2, 60, "writes refused during the window")
        status, log = call(f"{a.url}/v1/workspaces/1/log?limit=1000")  # reads go on
        assert status == 200 and not {c["path"] for r in log for c in r["changes"]} & set(writer.refused)
        moved = run_cli(a.env, "workspace", "move", "1", "--to", "b", "--force")  # resumes; the writer's turns stay
        assert "resuming move" in moved.stdout and "flipped" in moved.stdout, moved.stdout
        landed_before = len(writer.landed)
        wait_until(lambda: len(writer.landed) >= landed_before + 2, 60, "writes through a to land on b")
        writer.stop.set()
        writer.join(60)
        assert not writer.failed, writer.failed
        kb = KnowledgeBase.open(
            Settings(database_url=database_url, storage_root=b.root, embedding_model="hashing", node="b")
        )
        history = {c.path for r in kb.history(1, limit=10_000) for c in r.changes}
        assert set(writer.landed) <= history  # every write reported landed is in the final history
        assert not set(writer.refused + writer.elsewhere + writer.empty) & history
        assert git(b.root / "knowledge_store" / "1", "rev-parse", "HEAD").strip() == kb.history(1, limit=1)[0].id
        assert not (a.root / "knowledge_store" / "1").exists()  # renamed aside, not deleted
        assert list((a.root / "knowledge_store").glob(".moved-1-*"))
        kb.close()

        # the move back, run by the target node a itself: without a token it stops at the copy and
        # closes its window at once (writes go on at b); with the token the target pulls with it
        tokenless = {k: v for k, v in a.env.items() if k != "KB_TOKEN"}
        refused = run_cli(tokenless, "workspace", "move", "1", "--to", "a", "--force", check=False)
        assert refused.returncode == 1 and "window closed" in refused.stdout, refused.stdout + refused.stderr
        assert not list((a.root / "knowledge_store").glob(".incoming-1-*"))  # no partial copy left behind
        turn = f"{b.url}/v1/workspaces/1/turns/after-failed-move"
        assert call(f"{turn}/files/documents/After.md", "PUT", {"content": "after\n"})[0] == 200
        status, answer = call(f"{turn}/commit", "POST", {"message": "after a failed move"})
        assert status == 200 and answer["revision"], answer
        back = run_cli(a.env, "workspace", "move", "1", "--to", "a", "--force")
        assert "flipped" in back.stdout, back.stdout + back.stderr
        assert git(a.root / "knowledge_store" / "1", "rev-parse", "HEAD").strip() == answer["revision"]
