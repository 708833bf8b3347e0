"""Fault test (design §3, §14): a writer SIGKILLed at each step of a commit (the documented
``KB_FAULT_POINT`` hook in kb/faults.py, a real subprocess killing itself) leaves git fsck-clean,
no partial revision visible, and ``kb fsck`` brings Postgres level with git."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from support.commands import git, run_cli

from kb.faults import COMMIT_POINTS

WRITER = """
from kb.knowledge_base import KnowledgeBase
kb = KnowledgeBase.open()
with kb.transaction(1, "crashing write", "writer") as tx:
    tx.move("/documents/a.md", "/documents/moved/a.md")
    tx.write("/documents/b.md", b"b v2")
    tx.write("/documents/new/c.md", b"c")
print("committed")
"""


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_kill_at_each_commit_step(kb, kb_env, point):
    kb.create_workspace(1)
    with kb.transaction(1, "base", "t") as tx:
        tx.write("/documents/a.md", b"a")
        tx.write("/documents/b.md", b"b")
    base = tx.revision.id
    repo = kb.settings.knowledge_store / "1"
    proc = subprocess.run(
        [sys.executable, "-c", WRITER],
        env={**kb_env, "KB_FAULT_POINT": point},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "committed" not in proc.stdout
    git(repo, "fsck", "--strict")
    head = git(repo, "rev-parse", "HEAD").strip()
    # Postgres never saw the revision: its history still ends at the base
    assert [r.id for r in kb.history(1)] == [base]
    if point == "objects_written":
        assert head == base  # the ref never moved: nothing visible
    else:
        assert head != base  # the ref moved: the whole revision is there
        assert sorted(git(repo, "ls-tree", "-r", "--name-only", head).split()) == [
            "documents/b.md",
            "documents/moved/a.md",
            "documents/new/c.md",
        ]
    out = run_cli(kb_env, "fsck", "--workspace", "1").stdout
    assert "git fsck --strict: ok" in out
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    history = kb.history(1)
    assert [r.id for r in history] == ([head, base] if head != base else [base])
    if head != base:
        assert f"recorded revision {head}" in out
        changes = {c.path: (c.change, c.old_path) for c in kb.list_changes(1, head)}
        assert changes["/documents/moved/a.md"] == ("moved", "/documents/a.md")
        assert [r.id for r in kb.history(1, "/documents/moved/a.md")] == [head, base]
    # the workspace keeps working and history stays linear
    with kb.transaction(1, "after", "t") as tx:
        tx.write("/documents/d.md", b"d")
    assert [r.seq for r in kb.history(1)] == list(range(len(history) + 1, 0, -1))
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_a_writer_killed_before_its_refresh_leaves_a_working_tree_the_sweep_repairs(kb, kb_env):
    """design §2.1, §14: a writer SIGKILLed after its revision landed but before it refreshed the
    working tree left ``git status`` showing the revision's changes undone — a person's ``git
    commit -a`` in the workspace would have reverted them — until someone ran ``kb fsck``. Its
    marker under .git/kb-refresh-owed outlives it; the periodic sweep (``kb sweep``) finds it and
    repairs the working tree."""
    kb.create_workspace(1)
    with kb.transaction(1, "base", "t") as tx:
        tx.write("/documents/a.md", b"a")
        tx.write("/documents/b.md", b"b")
    repo = kb.settings.knowledge_store / "1"
    proc = subprocess.run(
        [sys.executable, "-c", WRITER],
        env={**kb_env, "KB_FAULT_POINT": "refresh_owed"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [r.message for r in kb.history(1)][0].startswith("crashing write")  # it landed
    assert git(repo, "status", "--porcelain", "--untracked-files=all") != ""  # the refresh it owed
    assert kb.store(1).repository.lost_refreshes()
    # a live writer's owed refresh is not lost: its marker is locked while it writes
    with kb.transaction(1, "another", "t") as tx:
        tx.write("/documents/d.md", b"d")
    # and a person's hand edit meanwhile, content no revision holds: the repair keeps a copy
    (repo / "documents" / "b.md").write_bytes(b"b, edited by hand\n")
    swept = run_cli(kb_env, "sweep")
    assert swept.returncode == 0
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    [kept] = (repo / ".git" / "kb-set-aside").glob("*/documents/b.md")
    assert kept.read_bytes() == b"b, edited by hand\n"
    assert (repo / "documents" / "b.md").read_bytes() == b"b v2"  # HEAD's, from the killed write
    assert not list((repo / ".git" / "kb-set-aside").glob("*/documents/moved"))  # kb's own content: git has it
    assert kb.store(1).repository.lost_refreshes() == []
    assert not list((repo / ".git" / "kb-refresh-owed").iterdir())  # every marker gone
    assert (repo / "documents" / "moved" / "a.md").read_bytes() == b"a"
    assert not (repo / "documents" / "a.md").exists()


def test_a_live_writers_owed_refresh_is_never_judged_lost(kb):
    """The marker of a refresh still on its way is flocked by its writer: ``lost_refreshes`` never
    lists it (the sweep would otherwise repair under a live writer — harmless, but a false alarm)."""
    kb.create_workspace(1)
    with kb.transaction(1, "base", "t") as tx:
        tx.write("/documents/a.md", b"a")
    repo = kb.store(1).repository
    hold = repo.refresh_pending()
    try:
        assert repo.lost_refreshes() == []
        assert len([p for p in (repo.path / ".git" / "kb-refresh-owed").iterdir()]) == 1
    finally:
        hold.release()
    assert not list((repo.path / ".git" / "kb-refresh-owed").iterdir())
