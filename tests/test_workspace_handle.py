"""``kb.workspace(id)`` hands out one workspace's reads and writes (design §3); the facade's
per-workspace methods are the same calls."""

from __future__ import annotations

import pytest

from kb.errors import InvalidWorkspace, WorkspaceNotFound


def test_a_workspace_reads_and_writes_as_the_facade_does(kb):
    kb.create_workspace(3)
    ws = kb.workspace(3)
    with ws.transaction("add", author="alice") as tx:
        tx.write("/documents/a.md", "a\n")
    assert ws.head() == kb.head(3) == tx.revision.id
    assert ws.read("/documents/a.md") == kb.read(3, "/documents/a.md") == b"a\n"
    assert [e.path for e in ws.ls()] == ["/documents/a.md"]
    moved = ws.move("/documents/a.md", "/documents/Archive/a.md", message="archive")
    assert moved is not None and list(ws.list_paths()) == ["/documents/Archive/a.md"]
    assert [r.id for r in ws.history("/documents/Archive/a.md")] == [moved.id, tx.revision.id]
    assert ws.history()[1].author.startswith("alice")
    assert ws.move("/documents/Archive/a.md", "/documents/Archive/a.md") is None
    reverted = ws.revert(moved.id)
    assert list(kb.list_paths(3)) == ["/documents/a.md"] and reverted is not None
    assert ws.artifacts().list() == [] and ws.reconcile() == []


def test_a_missing_workspace_is_refused_on_use(kb):
    with pytest.raises(InvalidWorkspace):
        kb.workspace(0)
    with pytest.raises(WorkspaceNotFound):
        kb.workspace(99).read("/documents/a.md")
