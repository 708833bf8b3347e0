"""``kb fsck``: check and repair one workspace (design §2.1, §3).

1. git's own consistency check (``git fsck --strict``, the real git CLI) of a consistent snapshot:
   every object, and connectivity from the HEAD read just before git starts — errors are reported
   and stop the repair (nothing is rewritten in a corrupt repository). It runs without the lock,
   so writers go on: objects are immutable and all written before the ref moves. Left to itself
   git would read the refs and reflogs *after* its object scan, and report the commits writers
   made meanwhile as "missing" or "invalid reflog entry"; so the snapshot's HEAD is passed to it,
   and the reflogs are checked under the lock instead (step 2);
2. under the workspace write lock, so no kb writer is mid-commit: every reflog entry names
   objects that exist; temporary packs of killed imports (older than TEMPORARY_PACK_AGE) are
   removed; stale git lock files left by a killed writer (``index.lock``,
   ``refs/heads/main.lock`` …) are removed in step 4, once no refresh can hold one;
3. revisions git has and Postgres lacks are recorded (history rows + deferred jobs), the same
   function the periodic sweep calls (``KnowledgeStore.reconcile``);
4. once every working-tree refresh writers owe is done (``Repository.refreshes_settled``: a commit
   refreshes the working tree after it released the write lock, and a refresh on its way is not
   damage) and holding the working-tree lock: stale git lock files are removed; a ``.git/index``
   that is not a file, or one git cannot read (duplicate or
   unordered entries, as two threads writing it at once once left) is rebuilt from HEAD
   (``index_repaired`` says what git found); then a stale working tree (``git status`` not clean)
   is repaired path by path from HEAD; a path at HEAD too long for the path law (design §2.3)
   cannot be checked out: it is listed in ``overlong_paths`` with the ``kb mv`` that fixes it,
   never a crash.
5. artifacts (design §11, ``kb.workspace.artifacts.Artifacts.check``): every attached file's blob must exist
   and hash to its sha256 (else an error); pending purges run; orphan blobs are removed;
6. the git remote (design §13), when one is configured and reachable: its branch must be absent or an
   ancestor of HEAD (else an error).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kb.errors import ConfigurationError
from kb.git.maintenance import pack_lock
from kb.paths import MAX_PATH_BYTES

TEMPORARY_PACK_AGE = 600.0
"""Seconds since its last write after which a temporary pack is a killed import's, not a live one's."""

if TYPE_CHECKING:
    from kb.store.history import Revision
    from kb.store.knowledge_store import KnowledgeStore


@dataclass
class FsckReport:
    """Outcome of ``kb fsck`` for one workspace."""

    workspace_id: int
    git_ok: bool
    git_messages: list[str] = field(default_factory=list)
    stale_locks_removed: list[str] = field(default_factory=list)
    recorded: list[Revision] = field(default_factory=list)
    worktree_repaired: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)
    """Virtual paths of repaired working-tree files whose content no revision held (hand edits),
    copied to ``set_aside_folder`` before the repair (design §2.1: nothing is deleted)."""
    set_aside_folder: str | None = None
    index_repaired: str | None = None
    """What git found wrong with ``.git/index`` (then rebuilt from HEAD), None when it was sound."""
    temporary_packs_removed: list[str] = field(default_factory=list)
    overlong_paths: list[str] = field(default_factory=list)
    """Virtual paths at HEAD longer than MAX_PATH_BYTES below /documents (cannot be checked out)."""
    artifact_problems: list[str] = field(default_factory=list)
    artifact_orphans_removed: list[str] = field(default_factory=list)
    remote_problem: str | None = None

    @property
    def ok(self) -> bool:
        """True when git found no error and every artifact blob is intact (repairs are not errors)."""
        return self.git_ok and not self.artifact_problems and self.remote_problem is None

    def fix_for(self, path: str) -> str:
        """The command that moves an over-long ``path`` to a name that fits (design §2.3)."""
        shorter = "/documents/" + path.rsplit("/", 1)[-1][:120]
        return f"kb mv --workspace {self.workspace_id} {shlex.quote(path)} {shlex.quote(shorter)}"


def _git(store: KnowledgeStore, *args: str) -> subprocess.CompletedProcess:
    executable = shutil.which("git")
    if executable is None:
        raise ConfigurationError("kb fsck runs git's own check but no `git` executable is on PATH; install git")
    return subprocess.run(
        [executable, "--no-optional-locks", "-C", str(store.path), *args],
        capture_output=True,
        timeout=3600,
        env={"LC_ALL": "C", "PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1"},
    )


def stale_worktree_paths(store: KnowledgeStore) -> list[str]:
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


def repair_lost_refreshes(store: KnowledgeStore) -> list[str] | None:
    """Repair the working tree of ``store``'s workspace when a writer died owing its refresh
    (killed between moving the branch and refreshing: ``Repository.lost_refreshes``): every path
    ``git status`` shows differing from HEAD is brought to HEAD. The periodic sweep calls it for
    each workspace (design §2.1, §14), so ``git status`` in the workspace — and a person's ``git
    commit -a`` there, which would revert the lost revision — sees HEAD again without ``kb fsck``.
    Returns the repo paths repaired, None when no refresh was lost. Raises ConfigurationError (no
    git CLI), OSError (the index cannot be written)."""
    return store.repository.repair_lost_refreshes(lambda: stale_worktree_paths(store))


def _in_flight(store: KnowledgeStore, line: str) -> bool:
    """True for git's ``bad sha1 file: PATH`` about a file gone since (a temporary file another
    program, or an older kb, was writing into ``objects/`` while git scanned it): not damage."""
    if not line.startswith("bad sha1 file: "):
        return False
    named = line.removeprefix("bad sha1 file: ").strip()
    path = Path(named) if Path(named).is_absolute() else store.path / ".git" / named
    return not path.exists() and not (store.path / named).exists()


def fsck(store: KnowledgeStore) -> FsckReport:
    """Check and repair ``store``'s workspace (see the module docstring); returns the report.

    Raises WorkspaceNotFound, ConfigurationError (no git CLI), HistoryDiverged, LockTimeout.
    """
    from kb.db.locks import locked_transaction

    repo = store.repository
    head = repo.head()  # the snapshot: everything it reaches was written before the ref moved
    with pack_lock(store.path, wait=True):  # no packer removes objects or packs under git fsck
        checked = _git(
            store, "fsck", "--strict", "--no-progress", "--no-dangling", "--no-reflogs", *([head] if head else [])
        )
    report = FsckReport(store.workspace_id, checked.returncode == 0)
    report.git_messages = [
        line
        for line in (checked.stdout + checked.stderr).decode(errors="replace").splitlines()
        if line.strip() and not _in_flight(store, line)
    ]
    if not report.git_ok:
        return report
    with locked_transaction(store.database_url, store.workspace_id, store.settings) as (conn, _):
        broken = repo.invalid_reflog_entries()
        if broken:
            report.git_ok = False
            report.git_messages += broken
            return report
        report.temporary_packs_removed = repo.remove_temporary_packs(TEMPORARY_PACK_AGE)
        report.recorded = store.catch_up(conn)
        head_tree = repo.tree_id(repo.head())
        report.overlong_paths = [
            "/" + p
            for p, _ in repo.walk(head_tree, "documents")
            if len(p.encode("utf-8", "surrogateescape")) - len("documents/") > MAX_PATH_BYTES
        ]
        overlong = {p[1:] for p in report.overlong_paths}
        with repo.refreshes_settled():
            # only now: a commit refreshes the working tree after releasing the write lock, so an
            # ``index.lock`` seen earlier may be a live refresh's; settled, none is (design §4)
            report.stale_locks_removed = repo.clear_stale_locks(min_age=0)
            report.index_repaired = repo.index_problem()
            if report.index_repaired is not None:
                repo.rebuild_index()
            lost = repo.lost_refreshes()  # settled: every marker left is a dead writer's
            stale_paths = [p for p in stale_worktree_paths(store) if p not in overlong]
            if stale_paths:
                # a hand edit among them is copied aside first: the repair would destroy it
                report.set_aside_folder, kept = repo.set_aside_unrecorded(stale_paths)
                report.set_aside = ["/" + p for p in kept]
                refused = set(repo.refresh_worktree([(p, repo.lookup(head_tree, p)) for p in stale_paths]))
                report.worktree_repaired = ["/" + p for p in stale_paths if p not in refused]
            for marker in lost:  # repaired above
                Path(marker).unlink(missing_ok=True)
    from kb.workspace.artifacts import Artifacts

    checked_artifacts = Artifacts(store, lambda: "kb").check()
    report.artifact_problems = checked_artifacts.problems
    report.artifact_orphans_removed = checked_artifacts.orphans_removed + checked_artifacts.purged
    from kb.workspace.remotes import Remote

    report.remote_problem = Remote(store).check()
    return report
