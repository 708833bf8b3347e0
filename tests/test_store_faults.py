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
