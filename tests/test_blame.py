"""design §17: ``KnowledgeBase.blame`` — each line at HEAD names the revision that last changed it,
following a recorded move (the moved document keeps its lines' origins) and starting afresh after
a removal; ``revision`` returns the recorded row with every change, a move as a move."""

from __future__ import annotations

import pytest

from kb.errors import RevisionNotFound


def test_blame_follows_moves_and_restarts_after_a_removal(kb):
    kb.create_workspace(1)
    with kb.transaction(1, "first", "ann") as tx:
        tx.write("/documents/a.md", "one\ntwo\nthree\n")
    first = tx.revision
    with kb.transaction(1, "second", "bob") as tx:
        tx.write("/documents/a.md", "one\nTWO\nthree\nfour\n")
    second = tx.revision
    with kb.transaction(1, "move", "cat") as tx:
        tx.move("/documents/a.md", "/documents/b/a.md")
    moved = tx.revision
    with kb.transaction(1, "third", "dan") as tx:
        tx.write("/documents/b/a.md", "zero\none\nTWO\nthree\nfour\n")
    third = tx.revision

    blame = kb.blame(1, "/documents/b/a.md")
    assert blame.complete and blame.revision == third.id
    assert [(line.number, line.text, line.revision.id) for line in blame.lines] == [
        (1, "zero", third.id),
        (2, "one", first.id),
        (3, "TWO", second.id),
        (4, "three", first.id),
        (5, "four", second.id),
    ]
    assert {c.change for c in kb.revision(1, moved.id).changes} == {"moved", "moved_away"}

    with kb.transaction(1, "remove", "eve") as tx:
        tx.remove("/documents/b/a.md")
    with kb.transaction(1, "again", "fay") as tx:
        tx.write("/documents/b/a.md", "one\n")
    again = tx.revision
    assert [line.revision.id for line in kb.blame(1, "/documents/b/a.md").lines] == [again.id]
    with pytest.raises(RevisionNotFound):
        kb.revision(1, "0" * 40)
