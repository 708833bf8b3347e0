"""Writers' expectations (issue 13, SPEC §5): three-way merge of turns, committer, missing_ok."""

from __future__ import annotations

import pytest

from kb.errors import DocumentNotFound
from kb.git.merge import merge_documents
from support.commands import git

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


def test_turn_modifying_a_document_another_removed_recreates_it(workspace):
    b = _edit_line(workspace, "B", 2, "B's line 2")
    with workspace.transaction(WS, "rm", "tx") as tx:
        tx.remove("/documents/Plan.md")
    result = b.commit()
    assert result.overwrote == ["/documents/Plan.md"] and result.lost_hunks == {}
    assert b"B's line 2\n" in workspace.read(WS, "/documents/Plan.md")


def test_transaction_write_keeps_meaning_these_bytes_at_head(workspace):
    with workspace.transaction(WS, "one", "tx") as first:
        first.write("/documents/Plan.md", PLAN.replace(b"line 5\n", b"X\n"))
    with workspace.transaction(WS, "two", "tx") as second:
        second.write("/documents/Plan.md", b"only this\n")
    assert workspace.read(WS, "/documents/Plan.md") == b"only this\n"
    assert second.merges == {}


@pytest.mark.parametrize("base, ours, theirs, merged, lost", [
    (b"a\nb\nc\n", b"A\nb\nc\n", b"a\nb\nC\n", b"A\nb\nC\n", 0),
    (b"a\nb\nc\n", b"a\nX\nc\n", b"a\nY\nc\n", b"a\nY\nc\n", 1),
    (b"1\n2\n3\n4\n", b"1\nA\n3\n4\n", b"1\n2\nB\n4\n", b"1\nA\nB\n4\n", 0),  # adjacent lines
    (b"1\n2\n3\n4\n", b"X\nA\n3\nZ\n", b"Y\n2\nB\nW\n", b"Y\nA\nB\nW\n", 2),
    (b"a\nb", b"a\nb\nours tail\n", b"head\na\nb", b"head\na\nb\nours tail\n", 0),
    (None, b"x\n", b"y\n", b"y\n", 1),
    (b"a\0b", b"a\0c", b"a\0d", b"a\0d", 1),
    (b"same\n", b"same\n", b"changed\n", b"changed\n", 0),
    (b"a\r\nb\r\nc\r\n", b"A\r\nb\r\nc\r\n", b"a\r\nb\r\nC\r\n", b"A\r\nb\r\nC\r\n", 0),
])
def test_merge_documents_table(base, ours, theirs, merged, lost):
    outcome = merge_documents("/documents/x.md", base, ours, theirs)
    assert outcome.data == merged
    assert len(outcome.lost) == lost


def test_committer_is_recorded_separately_from_author(workspace):
    turn = workspace.turn(WS, "agent-turn", "Ada <ada@example.org>", committer="helper-bot <bot@example.org>")
    turn.write("/documents/new.md", "x\n")
    result = turn.commit()
    repo = workspace.store(WS).path
    assert git(repo, "log", "-1", "--format=%an|%cn|%ce", result.revision).strip() == \
        "Ada|helper-bot|bot@example.org"
    default = workspace.turn(WS, "plain", "Ada")
    default.write("/documents/new2.md", "y\n")
    r2 = default.commit()
    assert git(repo, "log", "-1", "--format=%an|%cn", r2.revision).strip() == "Ada|kb"
    assert workspace.history(WS, "/documents/new.md")[0].committer.startswith("helper-bot")


def test_edit_document_records_committer(workspace):
    def editor(path):
        path.write_bytes(path.read_bytes() + b"more\n")

    result = workspace.edit_document(WS, "/documents/other.md", editor, author="Ada", committer="cli-agent")
    assert git(workspace.store(WS).path, "log", "-1", "--format=%an|%cn", result.revision).strip() == \
        "Ada|cli-agent"


def test_remove_missing_ok(workspace):
    with pytest.raises(DocumentNotFound):
        with workspace.transaction(WS, "strict", "tx") as tx:
            tx.remove("/documents/absent.md")
    with workspace.transaction(WS, "lenient", "tx") as tx:
        tx.remove("/documents/absent.md", missing_ok=True)
        tx.remove("/documents/other.md", missing_ok=True)
    assert tx.revision is not None and "/documents/other.md" not in workspace.list_paths(WS)
    assert "/documents/Plan.md" in workspace.list_paths(WS)
    turn = workspace.turn(WS, "t", "user")
    assert turn.remove("/documents/absent.md", missing_ok=True) is None
    with pytest.raises(DocumentNotFound):
        turn.remove("/documents/absent.md")
    turn.abort()
