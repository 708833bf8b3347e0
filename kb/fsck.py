"""``kb fsck``: check and repair one workspace (SPEC §2.1, §3).

1. git's own consistency check (``git fsck --strict``, the real git CLI) — errors are reported and
   stop the repair (nothing is rewritten in a corrupt repository);
2. under the workspace write lock, so no kb writer is mid-commit: stale git lock files left by a
   killed writer (``index.lock``, ``refs/heads/main.lock`` …) are removed;
3. revisions git has and Postgres lacks are recorded (history rows + deferred jobs), the same
   function the periodic sweep calls (``KnowledgeStore.reconcile``);
4. a stale working tree (``git status`` not clean) is repaired path by path from HEAD.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kb.errors import ConfigurationError

if TYPE_CHECKING:
    from kb.history import Revision
    from kb.store import KnowledgeStore

@dataclass
class FsckReport:
    """Outcome of ``kb fsck`` for one workspace."""

    workspace_id: int
    git_ok: bool
    git_messages: list[str] = field(default_factory=list)
    stale_locks_removed: list[str] = field(default_factory=list)
    recorded: list["Revision"] = field(default_factory=list)
    worktree_repaired: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when git found no error (repairs made are not errors)."""
        return self.git_ok


def _git(store: "KnowledgeStore", *args: str) -> subprocess.CompletedProcess:
    executable = shutil.which("git")
    if executable is None:
        raise ConfigurationError("kb fsck runs git's own check but no `git` executable is on PATH; install git")
    return subprocess.run(
        [executable, "--no-optional-locks", "-C", str(store.path), *args],
        capture_output=True, timeout=3600, env={"LC_ALL": "C", "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"},
    )


def stale_worktree_paths(store: "KnowledgeStore") -> list[str]:
    """Repo paths where the working tree or index differs from HEAD (``git status``), sorted."""
    out = _git(store, "status", "--porcelain=v1", "-z", "--untracked-files=all").stdout
    paths = set()
    entries = out.split(b"\0")
    i = 0
    while i < len(entries):
        entry = entries[i]
        i += 1
        if len(entry) < 4:
            continue
        paths.add(entry[3:].decode("utf-8", errors="surrogateescape"))
        if entry[:1] in (b"R", b"C"):  # rename/copy: the source path follows
            paths.add(entries[i].decode("utf-8", errors="surrogateescape"))
            i += 1
    return sorted(paths)


def fsck(store: "KnowledgeStore") -> FsckReport:
    """Check and repair ``store``'s workspace (see the module docstring); returns the report.

    Raises WorkspaceNotFound, ConfigurationError (no git CLI), HistoryDiverged, LockTimeout.
    """
    from kb.locks import locked_transaction

    repo = store.repository
    checked = _git(store, "fsck", "--strict", "--no-progress", "--no-dangling")
    report = FsckReport(store.workspace_id, checked.returncode == 0)
    report.git_messages = [
        line for line in (checked.stdout + checked.stderr).decode(errors="replace").splitlines() if line.strip()
    ]
    if not report.git_ok:
        return report
    with locked_transaction(store.database_url, store.workspace_id, store.settings) as (conn, _):
        report.stale_locks_removed = repo.clear_stale_locks(min_age=0)
        report.recorded = store._catch_up(conn, store._workspace_row(conn))
        stale_paths = stale_worktree_paths(store)
        if stale_paths:
            head_tree = repo.tree_id(repo.head())
            repo.refresh_worktree([(p, repo.lookup(head_tree, p)) for p in stale_paths])
            report.worktree_repaired = ["/" + p for p in stale_paths]
    return report
