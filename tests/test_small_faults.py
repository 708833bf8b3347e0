"""Faults found by using kb as a library (design §5, §7): a turn renaming a document by letter
case only, and chunk offsets outside their section."""

from __future__ import annotations

import subprocess

import pytest

from kb.errors import KbError
from kb.index.chunking import check_piece

WS = 1


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_a_turn_renames_a_document_and_a_folder_by_letter_case_only(kb):
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/ROADMAP.md", "# Roadmap\nship it\n")
        tx.write("/documents/notes/a.md", "alpha\n")
    turn = kb.turn(WS, "case", "agent")
    assert turn.move("/documents/ROADMAP.md", "/documents/Roadmap.md") == [
        ("/documents/ROADMAP.md", "/documents/Roadmap.md")]
    assert turn.move("/documents/notes", "/documents/Notes") == [("/documents/notes/a.md", "/documents/Notes/a.md")]
    assert turn.read("/documents/Roadmap.md").lines == [(1, "# Roadmap"), (2, "ship it")]
    revision = turn.commit()
    assert revision is not None
    repo = kb.store(WS).path
    assert _git(repo, "ls-tree", "-r", "--name-only", "HEAD").split() == ["documents/Notes/a.md", "documents/Roadmap.md"]
    _git(repo, "fsck", "--strict")


def test_a_case_twin_of_another_document_is_still_refused(kb):
    from kb.errors import PathExists

    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/ROADMAP.md", "a\n")
        tx.write("/documents/other.md", "b\n")
    turn = kb.turn(WS, "twin", "agent")
    with pytest.raises(PathExists, match="differs only in case"):
        turn.move("/documents/other.md", "/documents/Roadmap.md")


@pytest.mark.parametrize(("start", "end"), [(-5, 5), (-3, -1), (3, 2), (0, 0), (0, 99), (2, 2)])
def test_chunk_offsets_outside_their_section_are_refused(start, end):
    section = "hello world"
    with pytest.raises(KbError, match="outside its section"):
        check_piece(section, start, end, section[start:end], offset=100)


def test_chunk_offsets_that_do_not_reproduce_the_text_are_refused():
    with pytest.raises(KbError, match="do not reproduce"):
        check_piece("hello world", 0, 5, "HELLO")
    check_piece("hello world", 6, 11, "world")  # a true piece passes
