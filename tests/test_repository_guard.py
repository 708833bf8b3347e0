"""Never converge backwards (design §3): a repository behind what Postgres recorded — restored from
an older backup, or a stale copy — or another repository in the workspace's folder is refused with
HistoryDiverged by every job and writer; nothing is deleted, the workspace is marked, the sweep
skips it with the reason and goes on with the others, and kb fsck explains."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from support.commands import run_cli
from support.named_queries import queries

from kb.db import database
from kb.errors import HistoryDiverged
from kb.knowledge_base import KnowledgeBase

WS = 1


def _rows(kb: KnowledgeBase, ws: int = WS) -> dict[str, int]:
    with database.transaction(kb.database_url) as conn:
        return {r["path"]: r["id"] for r in conn.execute(queries["test_document_ids_of"], {"workspace_id": ws})}


def _workspace(kb: KnowledgeBase, ws: int = WS) -> dict:
    with database.transaction(kb.database_url) as conn:
        return conn.execute(queries["get_workspace"], {"workspace_id": ws}).fetchone()


def _git_config(path, key: str, value: str | None = None) -> str:
    args = ["git", "-C", str(path), "config", key] + ([] if value is None else [value])
    return subprocess.run(args, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def restored(kb, tmp_path):
    """Workspace 1 indexed at revision 2 whose repository is then replaced by a backup taken at
    revision 1 (``kb.restored_newest`` holds the newest repository)."""
    kb.create_workspace(WS)
    with kb.transaction(WS, "one", "t") as tx:
        tx.write("/documents/a.md", "# A\n\nalpha\n")
    kb.index(WS)
    backup = tmp_path / "backup"
    shutil.copytree(kb.store(WS).path, backup)
    with kb.transaction(WS, "two", "t") as tx:
        tx.write("/documents/c.md", "# C\n\ngamma\n")
    kb.index(WS)
    newest = tmp_path / "newest"
    path = kb.store(WS).path
    kb.store(WS).close()
    shutil.move(str(path), str(newest))
    shutil.copytree(backup, path)
    fresh = KnowledgeBase(kb.settings, kb.database_url)
    fresh.restored_newest = newest
    return fresh


def test_a_repository_restored_from_an_older_backup_is_never_projected_backwards(restored):
    kb = restored
    before, workspace = _rows(kb), _workspace(kb)
    assert "/documents/c.md" in before
    for job in (lambda: kb.project(WS), lambda: kb.index(WS), lambda: kb.reindex(WS)):
        with pytest.raises(HistoryDiverged, match="lacks the recorded head"):
            job()
    with pytest.raises(HistoryDiverged):
        with kb.transaction(WS, "write on the old copy", "t") as tx:
            tx.write("/documents/d.md", "d\n")
    for reader in (lambda: kb.search(WS, "alpha"), lambda: kb.read_document(WS, "/documents/a.md")):
        with pytest.raises(HistoryDiverged, match="lacks the recorded head"):
            reader()
    after = _workspace(kb)
    assert _rows(kb) == before, "document rows were deleted or changed"
    assert (after["last_projected_revision"], after["last_indexed_revision"]) == (
        workspace["last_projected_revision"],
        workspace["last_indexed_revision"],
    )
    assert "lacks the recorded head" in after["diverged"]
    # the newest repository comes back: the same rows, same ids, and the mark is cleared
    path = kb.store(WS).path
    kb.store(WS).close()
    shutil.rmtree(path)
    shutil.move(str(kb.restored_newest), str(path))
    kb.project(WS)
    assert _rows(kb) == before and _workspace(kb)["diverged"] is None


def test_the_sweep_skips_a_diverged_workspace_with_the_reason_and_goes_on(restored):
    kb = restored
    kb.create_workspace(2)
    with kb.transaction(2, "lagging", "t") as tx:
        tx.write("/documents/x.md", "x\n")
    report = kb.sweep()
    assert WS in report.diverged and "lacks the recorded head" in report.diverged[WS]
    assert WS not in report.projection_deferred and 2 in report.projection_deferred


def test_fsck_explains_a_diverged_workspace(restored, kb_env):
    result = run_cli(kb_env, "fsck", "--workspace", str(WS), check=False)
    assert result.returncode != 0
    assert "lacks the recorded head" in result.stderr and "backup" in result.stderr


def test_another_repository_in_the_folder_is_refused_by_its_identity(kb):
    kb.create_workspace(WS)
    path = kb.store(WS).path
    identity = _git_config(path, "kb.repositoryid")
    assert identity and _workspace(kb)["repository_id"] == identity
    with kb.transaction(WS, "one", "t") as tx:
        tx.write("/documents/a.md", "a\n")
    _git_config(path, "kb.repositoryid", "0" * 32)  # another repository with the same history
    with pytest.raises(HistoryDiverged, match="another repository"):
        with kb.transaction(WS, "two", "t") as tx:
            tx.write("/documents/b.md", "b\n")
    with pytest.raises(HistoryDiverged, match="another repository"):
        kb.project(WS)
    assert kb.history(WS)[0].message == "one"


def test_a_repository_made_before_identities_adopts_one(kb):
    kb.create_workspace(WS)
    path = kb.store(WS).path
    subprocess.run(["git", "-C", str(path), "config", "--unset", "kb.repositoryid"], check=True)
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["test_forget_repository_identity"], {"workspace_id": WS})
    with kb.transaction(WS, "one", "t") as tx:
        tx.write("/documents/a.md", "a\n")
    identity = _git_config(path, "kb.repositoryid")
    assert identity and _workspace(kb)["repository_id"] == identity


def test_import_into_a_known_workspace_whose_repository_is_missing_creates_nothing(kb, kb_env, tmp_path):
    kb.create_workspace(WS)
    with kb.transaction(WS, "one", "t") as tx:
        tx.write("/documents/a.md", "a\n")
    path = kb.store(WS).path
    kb.store(WS).close()
    shutil.rmtree(path)
    source = tmp_path / "src"
    source.mkdir()
    (source / "n.md").write_text("n\n")
    result = run_cli(kb_env, "import", str(source), "--workspace", str(WS), check=False)
    assert result.returncode != 0
    assert "repository" in result.stderr and "missing" in result.stderr and "backup" in result.stderr
    assert not path.exists()


def test_a_branch_moved_off_a_recorded_revision_by_hand_is_told_as_such_and_the_told_repair_works(kb, kb_env):
    """design §3: a `git reset` and `git commit` by hand in the workspace's repository (or a
    `git commit` racing a kb write, which git's own ref check can miss beside `git pack-refs`)
    leave the recorded head off the branch though the repository still holds it. kb refused, rightly,
    but said the repository "was restored from an older backup or replaced by a stale copy" and
    offered only deleting rows. It now says what happened and the rebase that repairs it."""
    kb.create_workspace(WS)
    for name in ("a", "b"):
        with kb.transaction(WS, name, "t") as tx:
            tx.write(f"/documents/{name}.md", f"{name}\n")
    recorded = kb.store(WS).head()
    path = kb.store(WS).path
    git = ["git", "-C", str(path), "-c", "user.name=Hand", "-c", "user.email=hand@example.com"]
    subprocess.run([*git, "reset", "-q", "--hard", "HEAD~1"], check=True)
    (path / "documents" / "c.md").write_text("c by hand\n")
    subprocess.run([*git, "add", "documents/c.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "by hand"], check=True)
    with pytest.raises(HistoryDiverged) as refused:
        with kb.transaction(WS, "next", "t") as tx:
            tx.write("/documents/d.md", "d\n")
    message = str(refused.value)
    assert "moved the branch off it" in message and "older backup" not in message, message
    assert f"rebase {recorded}" in message, message
    subprocess.run([*git, "rebase", "-q", recorded], check=True)  # the repair the message gives
    run_cli(kb_env, "fsck", "--workspace", str(WS))
    with kb.transaction(WS, "next", "t") as tx:
        tx.write("/documents/d.md", "d\n")
    assert [r.message.splitlines()[0] for r in kb.history(WS)] == ["next", "by hand", "b", "a"]
    assert {p: kb.read(WS, p) for p in kb.list_paths(WS)} == {
        "/documents/a.md": b"a\n",
        "/documents/b.md": b"b\n",
        "/documents/c.md": b"c by hand\n",
        "/documents/d.md": b"d\n",
    }
