"""Writers' expectations (design §5): three-way merge of turns, committer, missing_ok."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.commands import git

from kb.errors import DocumentGone, DocumentNotFound

WS = 1
PLAN = "".join(f"line {n}\n" for n in range(1, 11)).encode()


@pytest.fixture
def workspace(kb):
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "seeder") as tx:
        tx.write("/documents/Plan.md", PLAN)
        tx.write("/documents/other.md", "other\n")
    return kb


def _edit_line(kb, turn_id: str, number: int, text: str):
    turn = kb.turn(WS, turn_id, "user")
    turn.edit("/documents/Plan.md", f"line {number}\n", f"{text}\n")
    return turn


def test_non_overlapping_edits_of_one_file_both_survive(workspace):
    a, b = _edit_line(workspace, "A", 3, "A's line 3"), _edit_line(workspace, "B", 4, "B's line 4")
    ra, rb = a.commit(), b.commit()
    head = workspace.read(WS, "/documents/Plan.md").decode()
    assert "A's line 3\nB's line 4\n" in head and head.count("\n") == 10
    assert ra.merged == [] and ra.outcome("/documents/Plan.md") == "plain"
    assert rb.merged == ["/documents/Plan.md"] and rb.overwrote == [] and rb.lost_hunks == {}
    assert rb.outcome("/documents/Plan.md") == "merged"
    assert rb.modified == ["/documents/Plan.md"]
    repo = workspace.store(WS).path
    assert git(repo, "show", f"{rb.revision}:documents/Plan.md") == head
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / "documents/Plan.md").read_text() == head  # working tree holds the merged bytes
    git(repo, "fsck", "--strict")


def test_overlapping_edits_last_writer_wins_and_name_the_lost_hunk(workspace):
    a, b = _edit_line(workspace, "A", 3, "A's line 3"), _edit_line(workspace, "B", 3, "B's line 3")
    b.edit("/documents/Plan.md", "line 9\n", "B's line 9\n")  # a clean hunk of B besides the conflict
    ra, rb = a.commit(), b.commit()
    head = workspace.read(WS, "/documents/Plan.md").decode()
    assert "B's line 3\n" in head and "A's line 3" not in head and "B's line 9\n" in head
    assert rb.overwrote == ["/documents/Plan.md"] and rb.merged == []
    (hunk,) = rb.lost_hunks["/documents/Plan.md"]
    assert (hunk.start_line, hunk.lost, hunk.kept) == (3, ("A's line 3\n",), ("B's line 3\n",))
    # the loser stays in history: the revision's parent is A's commit, which has A's line
    assert workspace.read_as_of(WS, ra.revision, "/documents/Plan.md").decode().count("A's line 3") == 1


def test_merge_with_a_commit_that_lands_while_the_turn_waits(workspace):
    """A transaction (bytes at HEAD) lands between a turn's base and its commit: still merged."""
    b = _edit_line(workspace, "B", 8, "B's line 8")
    with workspace.transaction(WS, "direct", "tx") as tx:
        tx.write("/documents/Plan.md", PLAN.replace(b"line 1\n", b"TX line 1\n"))
    result = b.commit()
    head = workspace.read(WS, "/documents/Plan.md")
    assert head.startswith(b"TX line 1\n") and b"B's line 8\n" in head
    assert result.merged == ["/documents/Plan.md"]


def test_turn_modifying_a_document_another_removed_is_refused_and_kept(workspace):
    """An edit of a document removed since the turn's base is reported, not recreated (design §5):
    nothing is recorded, the turn is kept, and dropping or moving the edit lets it commit."""
    b = _edit_line(workspace, "B", 2, "B's line 2")
    b.write("/documents/new.md", "new\n")
    with workspace.transaction(WS, "rm", "tx") as tx:
        tx.remove("/documents/Plan.md")
    head = workspace.store(WS).head()
    with pytest.raises(DocumentGone) as refused:
        b.commit()
    assert refused.value.paths == ["/documents/Plan.md"] and "the turn is kept" in str(refused.value)
    assert workspace.store(WS).head() == head and b.path.is_dir()
    b.move("/documents/Plan.md", "/documents/Plan (kept).md")  # keep the text under a new path
    result = b.commit()
    assert result.added == ["/documents/Plan (kept).md", "/documents/new.md"]
    assert b"B's line 2\n" in workspace.read(WS, "/documents/Plan (kept).md")
    with pytest.raises(DocumentNotFound):
        workspace.read(WS, "/documents/Plan.md")


def test_turn_modifying_a_document_another_moved_follows_the_move(workspace):
    b = _edit_line(workspace, "B", 2, "B's line 2")
    with workspace.transaction(WS, "mv", "tx") as tx:
        tx.move("/documents/Plan.md", "/documents/Archive/Plan.md")
        tx.write("/documents/Archive/Plan.md", PLAN.replace(b"line 9\n", b"TX line 9\n"))
    result = b.commit()
    assert result.followed == [("/documents/Plan.md", "/documents/Archive/Plan.md")]
    moved = workspace.read(WS, "/documents/Archive/Plan.md")
    assert b"B's line 2\n" in moved and b"TX line 9\n" in moved  # merged at the new path
    with pytest.raises(DocumentNotFound):
        workspace.read(WS, "/documents/Plan.md")  # no second copy at the old path


def test_a_killed_turns_edit_recovered_after_a_move_follows_it(workspace, settings):
    """The edit a killed process left in a turn's worktree, committed by the next commit() of its
    id (recovery) after another writer moved the document, lands at the new path only; after a
    removal it is refused, not recreated."""
    killed = textwrap.dedent("""
        import os, sys
        from kb.knowledge_base import KnowledgeBase
        from kb.settings import Settings
        kb = KnowledgeBase.open(Settings(database_url=sys.argv[1], storage_root=sys.argv[2], embedding_model="hashing"))
        kb.turn(1, "T", "crasher").edit("/documents/Plan.md", "line 5", "T's line 5")
        kb.turn(1, "U", "crasher").edit("/documents/other.md", "other", "U's other")
        os.kill(os.getpid(), 9)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", killed, settings.database_url, str(settings.storage_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    with workspace.transaction(WS, "mv", "tx") as tx:
        tx.move("/documents/Plan.md", "/documents/Moved.md")
        tx.remove("/documents/other.md")
    result = workspace.turn(WS, "T", "user").commit()
    assert result is not None and result.followed == [("/documents/Plan.md", "/documents/Moved.md")]
    assert b"T's line 5\n" in workspace.read(WS, "/documents/Moved.md")
    assert sorted(workspace.store(WS).list_paths()) == ["/documents/Moved.md"]
    with pytest.raises(DocumentGone):
        workspace.turn(WS, "U", "user").commit()
    assert sorted(workspace.store(WS).list_paths()) == ["/documents/Moved.md"]


def test_an_edit_follows_a_move_even_when_a_new_document_took_the_old_path(workspace):
    with workspace.transaction(WS, "seed p", "seeder") as tx:
        tx.write("/documents/p.md", "p1\np2\n")
    turn = workspace.turn(WS, "follow-new", "user")
    turn.read("/documents/p.md")
    with workspace.transaction(WS, "mv+new", "tx") as tx:
        tx.move("/documents/p.md", "/documents/q.md")
        tx.write("/documents/p.md", "brand new\n")
    turn.edit("/documents/p.md", "p2", "P2")
    result = turn.commit()
    assert result.followed == [("/documents/p.md", "/documents/q.md")]
    assert workspace.read(WS, "/documents/q.md") == b"p1\nP2\n"  # the edit went where its document went
    assert workspace.read(WS, "/documents/p.md") == b"brand new\n"  # the new document is untouched
    assert result.overwrote == [] and result.lost_hunks == {}


def test_a_followed_edit_is_not_reported_as_an_overwrite(workspace):
    turn = _edit_line(workspace, "follow-plain", 2, "B's line 2")
    with workspace.transaction(WS, "mv", "tx") as tx:
        tx.move("/documents/Plan.md", "/documents/Moved.md")
    result = turn.commit()
    assert result.followed == [("/documents/Plan.md", "/documents/Moved.md")]
    assert result.overwrote == [] and result.lost_hunks == {}
    assert result.outcome("/documents/Plan.md") == "plain"
