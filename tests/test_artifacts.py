"""design §11 (design §11): artifacts — saved durably before indexing, revised with an expected
generation, deleted with their blobs purged, refused by every other writer; crash-safe saves."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from support.commands import git, run_cli
from support.events import received_events

from kb.db import database
from kb.errors import ArtifactNotFound, ArtifactReadOnly, InvalidInput, StaleGeneration
from kb.faults import COMMIT_POINTS
from kb.index.embedding import HashingEmbedder
from kb.knowledge_base import KnowledgeBase

CSV, PNG = b"region,total\nnorth,12\nsouth,7\n", bytes(range(256)) * 40


class SwitchableEmbedder(HashingEmbedder):
    """The hashing embedder that raises while ``down`` is set (an embedding service outage)."""

    down = False

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.down:
            raise ConnectionError("embedding service unreachable")
        return super().embed(texts)


def _row(kb, sql_name: str, **params):
    from support.named_queries import queries

    with database.connect(kb.database_url) as conn:
        return conn.execute(queries[sql_name], params).fetchall()


def _blob_files(kb, ws=1) -> set[str]:
    root = kb.settings.storage_root / "artifact_blobs" / str(ws)
    return {p.name for p in root.glob("*/*") if not p.name.startswith(".")} if root.exists() else set()


def test_save_with_two_files_is_one_revision_with_hashed_readable_blobs(kb):
    kb.create_workspace(1)
    before = len(kb.history(1))
    saved = kb.artifacts(1).save(
        "Q3: report?", "# Q3\n\nRevenue grew.\n", {"data.csv": CSV, "chart.png": PNG}, author="agent"
    )
    assert saved.path == "/documents/Artifacts/Q3_ report_.md" and saved.generation == 1
    assert len(kb.history(1)) == before + 1 and kb.history(1)[0].id == saved.revision
    assert [c.path for c in kb.list_changes(1, saved.revision)] == [saved.path]
    assert kb.read(1, saved.path) == b"# Q3\n\nRevenue grew.\n"
    files = {f.role: f for f in saved.files}
    assert files["data.csv"].sha256 == hashlib.sha256(CSV).hexdigest() and files["data.csv"].size == len(CSV)
    assert kb.artifacts(1).read_file(saved.id, "chart.png") == PNG
    assert _blob_files(kb) == {hashlib.sha256(CSV).hexdigest(), hashlib.sha256(PNG).hexdigest()}
    kb.project(1)  # projection keeps the ARTIFACT type (never demoted to NOTE)
    row = kb.read_document(1, saved.path)
    assert row.title == "Q3: report?"
    docs = _row(kb, "document_by_path", workspace_id=1, path=saved.path)
    assert docs[0]["document_type"] == "ARTIFACT" and docs[0]["id"] == saved.id
    again = kb.artifacts(1).save("Q3: report?", "# second\n")
    assert again.path == "/documents/Artifacts/Q3_ report_ (2).md"
    assert sorted(a.id for a in kb.artifacts(1).list()) == sorted([saved.id, again.id])
    with pytest.raises(InvalidInput):
        kb.artifacts(1).save("  ", "x")
    with pytest.raises(InvalidInput):
        kb.artifacts(1).save("t", "x", {"a": "not bytes"})


def test_save_never_waits_for_the_embedder_and_is_indexed_once_it_returns(kb):
    kb.create_workspace(1)
    embedder = kb.use_embedder(SwitchableEmbedder())
    embedder.down = True
    saved = kb.artifacts(1).save("Outage notes", "# Outage\n\nThe pager fired at 03:00.\n", {"log.txt": b"x"})
    assert kb.read(1, saved.path).startswith(b"# Outage")
    for _ in range(kb.settings.max_attempts):  # the index job keeps failing while the embedder is down
        kb.index(1)
    state = _row(kb, "document_by_path", workspace_id=1, path=saved.path)[0]
    assert state["status"] == "quarantined" and state["document_type"] == "ARTIFACT"
    kb.settings.quarantine_retry_seconds = 0
    kb.sweep()  # the probe fails: still quarantined
    assert _row(kb, "document_by_path", workspace_id=1, path=saved.path)[0]["status"] == "quarantined"
    embedder.down = False
    report = kb.sweep()
    assert report.quarantine_retried == [1]
    kb.index(1)
    assert _row(kb, "document_by_path", workspace_id=1, path=saved.path)[0]["status"] == "indexed"
    hits = kb.search(1, "pager fired", k=3)
    assert hits and hits[0].path == saved.path


def test_concurrent_revisions_of_one_generation_exactly_one_wins(kb, settings):
    kb.create_workspace(1)
    saved = kb.artifacts(1).save("Deck", "# v1\n", {"slides.pdf": b"v1"})
    generation = saved.generation
    for round_ in range(4):
        barrier, outcomes = threading.Barrier(3), []

        def revise(n: int) -> None:
            artifacts = KnowledgeBase(settings, kb.database_url).artifacts(1)
            barrier.wait()
            try:
                outcomes.append(
                    artifacts.revise(
                        saved.id,
                        generation,
                        markdown=f"# r{round_} w{n}\n",
                        files={"slides.pdf": f"{round_}{n}".encode()},
                    )
                )
            except StaleGeneration as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=revise, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if not isinstance(o, Exception)]
        losers = [o for o in outcomes if isinstance(o, StaleGeneration)]
        assert len(winners) == 1 and len(losers) == 2, outcomes
        generation += 1
        assert winners[0].generation == generation
        assert all(e.current == generation and str(generation) in str(e) for e in losers)
        current = kb.artifacts(1).get(saved.id)
        assert current.generation == generation
        [n] = [n for n in range(3) if hashlib.sha256(f"{round_}{n}".encode()).hexdigest() == winners[0].files[0].sha256]
        assert kb.read(1, saved.path) == f"# r{round_} w{n}\n".encode()  # the winner's markdown and file
        assert kb.artifacts(1).read_file(saved.id, "slides.pdf") == f"{round_}{n}".encode()
        assert kb.history(1)[0].id == winners[0].revision
    assert len(kb.history(1, saved.path)) == 5  # the save and one revision per round, no more
    check = kb.artifacts(1).check()  # the losers' blobs were never referenced: removed as orphans
    assert check.problems == [] and len(_blob_files(kb)) == 1


def test_files_only_revision_bumps_the_generation_and_purges_the_old_blob(kb):
    kb.create_workspace(1)
    a = kb.artifacts(1)
    saved = a.save("Data", "# data\n", {"d.csv": b"old"})
    head = kb.head(1)
    revised = a.revise(saved.id, 1, files={"d.csv": b"new", "e.csv": b"e"})
    assert revised.generation == 2 and revised.revision is None and kb.head(1) == head
    assert a.read_file(saved.id, "d.csv") == b"new"
    assert hashlib.sha256(b"old").hexdigest() not in _blob_files(kb)
    with pytest.raises(StaleGeneration, match="generation 2, not 1"):
        a.revise(saved.id, 1, markdown="# stale\n")
    assert kb.read(1, saved.path) == b"# data\n"


def test_delete_removes_file_rows_and_blobs_but_history_keeps_the_markdown(kb):
    kb.create_workspace(1)
    a = kb.artifacts(1)
    keep = a.save("Shared", "# keep\n", {"shared.bin": b"shared"})
    gone = a.save("Gone", "# gone\n", {"shared.bin": b"shared", "own.bin": b"own"})
    revision = a.delete(gone.id)
    assert gone.path not in kb.list_paths(1)
    assert kb.read_as_of(1, gone.revision, gone.path) == b"# gone\n"
    assert [r.id for r in kb.history(1, gone.path)][:2] == [revision.id, gone.revision]
    assert _blob_files(kb) == {hashlib.sha256(b"shared").hexdigest()}  # still used by "Shared"
    with pytest.raises(ArtifactNotFound):
        a.get(gone.id)
    assert _row(kb, "document_by_path", workspace_id=1, path=gone.path) == []
    assert a.read_file(keep.id, "shared.bin") == b"shared"
    assert [x.id for x in a.list()] == [keep.id]


def test_a_failed_purge_leaves_an_entry_the_sweep_retries(kb):
    kb.create_workspace(1)
    a = kb.artifacts(1)
    saved = a.save("Big", "# big\n", {"big.bin": b"payload"})
    sha = saved.files[0].sha256
    blob = a.blobs.path(sha)
    blob.unlink()
    blob.mkdir()  # a directory where the blob file was: unlink fails (even as root)
    (blob / "x").write_bytes(b"")
    a.delete(saved.id)
    pending = _row(kb, "pending_blob_purges", workspace_id=1)
    assert [p["sha256"] for p in pending] == [sha] and pending[0]["attempts"] == 1 and pending[0]["last_error"]
    shutil.rmtree(blob)
    blob.write_bytes(b"payload")
    assert kb.sweep().blobs_purged == [1]
    assert not blob.exists() and _row(kb, "pending_blob_purges", workspace_id=1) == []


def test_turns_edits_and_plain_transactions_refuse_artifact_files(kb):
    kb.create_workspace(1)
    saved = kb.artifacts(1).save("Locked", "# locked\n")
    with pytest.raises(ArtifactReadOnly, match=r"artifacts\(1\)\.revise|artifacts\(workspace\)\.revise"):
        with kb.transaction(1, "sneaky", "me") as tx:
            tx.write(saved.path, b"overwritten")
    with pytest.raises(ArtifactReadOnly, match=r"artifacts\(1\)\.revise|artifacts\(workspace\)\.revise"):
        with kb.transaction(1, "sneaky", "me") as tx:
            tx.move(saved.path, "/documents/elsewhere.md")
    turn = kb.turn(1, "t1")
    turn.write(saved.path, "turn text")
    turn.write("/documents/other.md", "fine")
    with pytest.raises(ArtifactReadOnly, match=r"artifacts\(1\)\.revise|artifacts\(workspace\)\.revise"):
        turn.commit()
    turn.abort()
    with pytest.raises(ArtifactReadOnly, match=r"artifacts\(1\)\.revise|artifacts\(workspace\)\.revise"):
        kb.edit_document(1, saved.path, lambda p: p.write_text("edited"))
    assert kb.read(1, saved.path) == b"# locked\n"
    assert "/documents/other.md" not in kb.list_paths(1)


def test_revert_and_restore_bump_the_generation_and_sidecarless_rows_start_at_one(kb):
    kb.create_workspace(1)
    a = kb.artifacts(1)
    saved = a.save("Plan", "# v1\n")
    v2 = a.revise(saved.id, 1, markdown="# v2\n")
    kb.revert(1, v2.revision)
    assert kb.read(1, saved.path) == b"# v1\n" and a.get(saved.id).generation == 3
    kb.restore(1, saved.path, v2.revision)
    assert kb.read(1, saved.path) == b"# v2\n" and a.get(saved.id).generation == 4
    # a legacy ARTIFACT row without sidecar (e.g. seeded): generation 1 on first use
    with kb.transaction(1, "legacy", "seed") as tx:
        tx.write("/documents/Artifacts/Legacy.md", b"# legacy\n")
    kb.project(1)
    from support.named_queries import queries

    with database.transaction(kb.database_url) as conn:
        conn.execute(
            queries["test_set_document_type"],
            {"document_type": "ARTIFACT", "workspace_id": 1, "path": "/documents/Artifacts/Legacy.md"},
        )
    legacy = next(x for x in a.list() if x.path.endswith("Legacy.md"))
    assert legacy.generation == 1
    assert a.revise(legacy.id, 1, markdown="# legacy v2\n").generation == 2
    kb.project(1)
    assert _row(kb, "document_by_path", workspace_id=1, path=legacy.path)[0]["document_type"] == "ARTIFACT"


def test_fsck_reports_corrupt_blobs_and_removes_orphans(kb, kb_env):
    kb.create_workspace(1)
    a = kb.artifacts(1)
    saved = a.save("Checked", "# c\n", {"c.bin": b"good bytes"})
    orphan = a.blobs.put(b"nobody references me")
    assert "clean" in run_cli(kb_env, "fsck", "--workspace", "1").stdout
    assert orphan not in _blob_files(kb)
    a.blobs.path(saved.files[0].sha256).write_bytes(b"bad bytes!")
    result = run_cli(kb_env, "fsck", "--workspace", "1", check=False)
    assert result.returncode == 1 and "artifact ERROR" in result.stdout and "c.bin" in result.stdout


SAVER = """
from kb.knowledge_base import KnowledgeBase
kb = KnowledgeBase.open()
kb.artifacts(1).save("Crash", "# crash\\n", {"a.bin": b"A" * 5000, "b.bin": b"B"})
print("saved")
"""


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_kill_during_save_leaves_a_complete_artifact_or_none(kb, kb_env, point):
    kb.create_workspace(1)
    with kb.transaction(1, "base", "t") as tx:
        tx.write("/documents/base.md", b"base")
    base = kb.head(1)
    proc = subprocess.run(
        [sys.executable, "-c", SAVER],
        env={**kb_env, "KB_FAULT_POINT": point},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    out = run_cli(kb_env, "fsck", "--workspace", "1").stdout
    assert "git fsck --strict: ok" in out and "artifact ERROR" not in out
    repo = kb.settings.knowledge_store / "1"
    git(repo, "fsck", "--strict")
    artifacts = kb.artifacts(1).list()
    if kb.head(1) == base:  # none: no row, no blob left behind
        assert artifacts == [] and _blob_files(kb) == set()
        assert _row(kb, "document_by_path", workspace_id=1, path="/documents/Artifacts/Crash.md") == []
    else:  # complete: markdown in git, rows in Postgres, blobs on disk
        [crash] = artifacts
        assert crash.path == "/documents/Artifacts/Crash.md" and crash.generation == 1
        assert kb.read(1, crash.path) == b"# crash\n"
        assert kb.artifacts(1).read_file(crash.id, "a.bin") == b"A" * 5000
        assert {f.role for f in crash.files} == {"a.bin", "b.bin"}
        assert kb.artifacts(1).revise(crash.id, 1, markdown="# after\n").generation == 2
    assert kb.artifacts(1).check().problems == []


def test_cli_save_list_show_revise_delete(kb, kb_env, tmp_path):
    kb.create_workspace(1)
    (tmp_path / "r.md").write_text("# cli\n")
    (tmp_path / "d.csv").write_bytes(CSV)
    out = run_cli(
        kb_env,
        "artifact",
        "save",
        str(tmp_path / "r.md"),
        "--title",
        "CLI report",
        "--file",
        f"d.csv={tmp_path / 'd.csv'}",
        "-w",
        "1",
    ).stdout
    artifact_id = out.split()[1].rstrip(":")
    assert "generation: 1" in out and "/documents/Artifacts/CLI report.md" in out
    assert "CLI report.md" in run_cli(kb_env, "artifact", "list", "-w", "1").stdout
    assert run_cli(kb_env, "artifact", "show", artifact_id, "--file", "d.csv", "-w", "1").stdout == CSV.decode()
    stale = run_cli(
        kb_env,
        "artifact",
        "revise",
        artifact_id,
        "-g",
        "7",
        "--markdown",
        str(tmp_path / "r.md"),
        "-w",
        "1",
        check=False,
    )
    assert stale.returncode == 1 and "generation 1, not 7" in stale.stderr
    assert (
        "generation: 2" in run_cli(kb_env, "artifact", "revise", artifact_id, "-g", "1", "--no-files", "-w", "1").stdout
    )
    assert "deleted artifact" in run_cli(kb_env, "artifact", "delete", artifact_id, "-w", "1").stdout


def test_concurrent_saves_with_one_title_get_distinct_names(kb, settings):
    kb.create_workspace(1)
    barrier, saved = threading.Barrier(3), []

    def save(n: int) -> None:
        artifacts = KnowledgeBase(settings, kb.database_url).artifacts(1)
        barrier.wait()
        saved.append(artifacts.save("Weekly", f"# weekly {n}\n", {"n.txt": str(n).encode()}))

    threads = [threading.Thread(target=save, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.path for a in saved) == [
        "/documents/Artifacts/Weekly (2).md",
        "/documents/Artifacts/Weekly (3).md",
        "/documents/Artifacts/Weekly.md",
    ]
    for a in saved:  # each name holds its own save's markdown and file: nothing overwritten
        n = kb.artifacts(1).read_file(a.id, "n.txt").decode()
        assert kb.read(1, a.path) == f"# weekly {n}\n".encode()


def test_bad_titles_and_formats_are_refused_before_anything_is_written(kb):
    kb.create_workspace(1)
    head = kb.head(1)
    for title, fmt in (("a\x00b", "markdown"), ("ok", "Not A Format!"), ("ok", "")):
        with pytest.raises(InvalidInput):
            kb.artifacts(1).save(title, "# x\n", {"f": b"bytes"}, format=fmt)
    assert kb.head(1) == head and _blob_files(kb) == set()
    two_lines = kb.artifacts(1).save("first\nsecond", "# x\n")
    assert two_lines.title == "first second" and two_lines.path == "/documents/Artifacts/first second.md"


def test_delete_announces_document_deleted_on_kb_events(kb, listener):
    kb.create_workspace(1)
    saved = kb.artifacts(1).save("Announced", "# a\n")
    kb.project(1)
    received_events(listener)
    revision = kb.artifacts(1).delete(saved.id)
    kb.project(1)  # finds no row left to delete: the artifact layer announced it
    deleted = [e for e in received_events(listener) if e["event"] == "document_deleted"]
    assert deleted == [
        {"event": "document_deleted", "workspace_id": 1, "revision": revision.id, "id": saved.id, "path": saved.path}
    ]


def test_fsck_removes_old_temp_files_of_killed_writes_but_not_fresh_ones(kb):
    kb.create_workspace(1)
    a = kb.artifacts(1)
    a.save("T", "# t\n", {"x": b"x"})
    folder = next(p for p in a.blobs.root.iterdir() if p.is_dir())
    old, fresh = folder / ".tmp-old", folder / ".tmp-fresh"
    old.write_bytes(b"half a blob")
    fresh.write_bytes(b"being written")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    check = a.check()
    assert check.problems == [] and ".tmp-old" in check.orphans_removed
    assert not old.exists() and fresh.exists()
    with pytest.raises(InvalidInput, match="nothing to revise"):
        a.revise(a.list()[0].id, 1)


DELETER = """
from kb.knowledge_base import KnowledgeBase
kb = KnowledgeBase.open()
kb.artifacts(1).delete(int(__import__("sys").argv[1]))
print("deleted")
"""


def test_kill_during_delete_after_git_moved_is_completed_by_catch_up(kb, kb_env):
    kb.create_workspace(1)
    saved = kb.artifacts(1).save("Doomed", "# doomed\n", {"d.bin": b"doomed bytes"})
    proc = subprocess.run(
        [sys.executable, "-c", DELETER, str(saved.id)],
        env={**kb_env, "KB_FAULT_POINT": "before_pg_commit"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert saved.path not in kb.list_paths(1)  # git has the delete; Postgres does not yet
    out = run_cli(kb_env, "fsck", "--workspace", "1").stdout
    assert "artifact ERROR" not in out and "recorded revision" in out
    assert kb.artifacts(1).list() == [] and _blob_files(kb) == set()
    assert _row(kb, "pending_blob_purges", workspace_id=1) == []
