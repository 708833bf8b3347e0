"""Turns (design §5): lazy private worktrees, file operations, diff commits, recovery."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.commands import git
from support.named_queries import queries

from kb.errors import (
    DocumentNotFound,
    EditMismatch,
    FolderNotEmpty,
    InvalidPath,
    InvalidPattern,
    InvalidTurn,
    IsAFolder,
    PathExists,
    UnsafeWorktreeEntry,
)

WS = 1


@pytest.fixture
def workspace(kb):
    """Workspace 1 with a few documents in one revision."""
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "seeder") as tx:
        tx.write("/documents/a.md", "alpha\nbeta\ngamma\n")
        tx.write("/documents/b.md", "one\ntwo\n")
        tx.write("/documents/Notes/c.md", "see alpha\n")
        tx.write("/documents/Notes/Deep/d.md", "deep\n")
    return kb


def repo_path(kb) -> Path:
    return kb.store(WS).path


def show(kb, revision: str) -> str:
    return git(repo_path(kb), "show", "--stat", "--format=%s", revision)


def test_lazy_turn_creates_nothing_until_touched(workspace):
    turn = workspace.turn(WS, "t1", "agent")
    assert not turn.path.exists()
    assert turn.commit() is None
    assert not turn.path.exists()
    turn = workspace.turn(WS, "t1", "agent")
    assert turn.read("/documents/a.md").lines[0] == (1, "alpha")
    assert turn.path.is_dir()
    # only the touched file is on disk
    on_disk = sorted(str(p.relative_to(turn.path)) for p in turn.path.rglob("*") if p.is_file())
    assert on_disk == [".git", "documents/a.md"]
    # a real git worktree
    listing = git(repo_path(workspace), "worktree", "list", "--porcelain")
    assert f"worktree {turn.path}" in listing and "detached" in listing
    git(repo_path(workspace), "fsck", "--strict")
    assert turn.commit() is None
    assert not turn.path.exists()
    assert str(turn.path) not in git(repo_path(workspace), "worktree", "list")


def test_file_operations_and_views(workspace):
    t = workspace.turn(WS, "ops", "agent")
    assert [(e.name, e.kind) for e in t.ls()] == [("Notes", "folder"), ("a.md", "file"), ("b.md", "file")]
    r = t.read("/documents/a.md", offset=1, limit=1)
    assert r.lines == [(2, "beta")] and r.total_lines == 3
    assert t.write("/documents/New/n.md", "new alpha\n").created
    assert t.edit("/documents/b.md", "two", "deux").replacements == 1
    with pytest.raises(EditMismatch, match="not found"):
        t.edit("/documents/b.md", "three", "x")
    t.write("/documents/rep.md", "x x x\n")
    with pytest.raises(EditMismatch, match="3 times"):
        t.edit("/documents/rep.md", "x", "y")
    assert t.edit("/documents/rep.md", "x", "y", replace_all=True).replacements == 3
    assert t.read("/documents/b.md").text == "one\ndeux"  # reads see own writes
    assert t.glob("**/*.md") == [
        "/documents/New/n.md",
        "/documents/Notes/Deep/d.md",
        "/documents/Notes/c.md",
        "/documents/a.md",
        "/documents/b.md",
        "/documents/rep.md",
    ]
    assert t.glob("/documents/Notes/*.md") == ["/documents/Notes/c.md"]
    hits = t.grep("alpha")
    assert [(h.path, h.line_number, h.line) for h in hits] == [
        ("/documents/New/n.md", 1, "new alpha"),
        ("/documents/Notes/c.md", 1, "see alpha"),
        ("/documents/a.md", 1, "alpha"),
    ]
    assert [h.path for h in t.grep("^d", path="/documents/Notes")] == ["/documents/Notes/Deep/d.md"]
    with pytest.raises(InvalidPattern):
        t.grep("(")
    assert t.mkdir("/documents/Empty") is True
    assert t.mkdir("/documents/Empty") is False
    assert ("Empty", "folder") in [(e.name, e.kind) for e in t.ls()]
    assert t.ls("/documents/Empty") == []
    assert t.move("/documents/Notes", "/documents/Moved") == [
        ("/documents/Notes/Deep/d.md", "/documents/Moved/Deep/d.md"),
        ("/documents/Notes/c.md", "/documents/Moved/c.md"),
    ]
    assert "Notes" not in [e.name for e in t.ls()]
    with pytest.raises(DocumentNotFound):
        t.ls("/documents/Notes")
    with pytest.raises(FolderNotEmpty):
        t.rmdir("/documents/Moved")
    with pytest.raises(IsAFolder):
        t.remove("/documents/Moved")
    with pytest.raises(IsAFolder):
        t.write("/documents/Moved", "x")
    with pytest.raises(PathExists):
        t.write("/documents/a.md/x.md", "x")
    with pytest.raises(PathExists):
        t.move("/documents/a.md", "/documents/b.md")
    assert t.remove("/documents/rep.md") == "/documents/rep.md"
    with pytest.raises(DocumentNotFound):
        t.read("/documents/rep.md")
    t.rmdir("/documents/Empty")
    t.abort()


def test_one_turn_many_operations_is_one_revision(workspace):
    before = workspace.head(WS)
    t = workspace.turn(WS, "many", "agent")
    t.write("/documents/new.md", "fresh\n")
    t.edit("/documents/a.md", "beta", "BETA")
    t.move("/documents/b.md", "/documents/Notes/b.md")
    t.remove("/documents/Notes/Deep/d.md")
    t.mkdir("/documents/Folder")
    result = t.commit("agent turn")
    assert result is not None
    assert workspace.store(WS).repository.parents(result.revision) == [before]
    assert result.added == ["/documents/Folder/.keep", "/documents/new.md"]
    assert result.modified == ["/documents/a.md"]
    assert result.removed == ["/documents/Notes/Deep/d.md"]
    assert result.moved == [("/documents/b.md", "/documents/Notes/b.md")]
    assert result.overwrote == []
    names = git(repo_path(workspace), "diff", "--name-status", "--no-renames", before, result.revision)
    assert sorted(names.splitlines()) == sorted(
        [
            "A\tdocuments/Folder/.keep",
            "A\tdocuments/new.md",
            "M\tdocuments/a.md",
            "D\tdocuments/Notes/Deep/d.md",
            "D\tdocuments/b.md",
            "A\tdocuments/Notes/b.md",
        ]
    )
    message = git(repo_path(workspace), "log", "-1", "--format=%B", result.revision)
    assert message.strip().endswith("Turn: many")
    assert workspace.read(WS, "/documents/Notes/b.md") == b"one\ntwo\n"
    history = workspace.history(WS, "/documents/Notes/b.md")
    assert history[0].changes[0].change == "moved"
    git(repo_path(workspace), "fsck", "--strict")
    assert git(repo_path(workspace), "status", "--porcelain") == ""
    assert not t.path.exists()


def test_parallel_turns_on_different_files_both_land(workspace):
    one, two = workspace.turn(WS, "one", "a"), workspace.turn(WS, "two", "b")
    one.edit("/documents/a.md", "alpha", "ALPHA")
    two.edit("/documents/b.md", "one", "ONE")
    r1, r2 = one.commit(), two.commit()
    assert r1.overwrote == [] and r2.overwrote == []
    assert "documents/a.md" in show(workspace, r1.revision)
    assert "documents/b.md" in show(workspace, r2.revision) and "a.md" not in show(workspace, r2.revision)
    assert workspace.read(WS, "/documents/a.md").startswith(b"ALPHA")
    assert workspace.read(WS, "/documents/b.md").startswith(b"ONE")


def test_same_file_last_writer_wins_and_reports_overwrite(workspace):
    one, two = workspace.turn(WS, "one", "a"), workspace.turn(WS, "two", "b")
    one.write("/documents/a.md", "from one\n")
    two.write("/documents/a.md", "from two\n")
    two.read("/documents/b.md")  # read-only touch never reverts anything
    r_one = one.commit()
    workspace.turn(WS, "three", "c").write("/documents/b.md", "three\n")
    workspace.turn(WS, "three").commit()
    r_two = two.commit()
    assert r_one.overwrote == []
    assert r_two.overwrote == ["/documents/a.md"]
    assert r_two.modified == ["/documents/a.md"]
    assert workspace.read(WS, "/documents/a.md") == b"from two\n"
    assert workspace.read(WS, "/documents/b.md") == b"three\n"
    assert workspace.read_as_of(WS, r_one.revision, "/documents/a.md") == b"from one\n"


def test_subagents_share_the_root_turn(workspace):
    root = workspace.turn(WS, "chat1", "agent")
    sub = workspace.turn(WS, "chat1::task:7")
    assert sub is root
    sub.write("/documents/sub.md", "by sub-agent\n")
    assert root.read("/documents/sub.md").text == "by sub-agent"
    assert root.commit().added == ["/documents/sub.md"]
    root.write("/documents/again.md", "reused after commit\n")  # the same object is the open turn again
    assert workspace.turn(WS, "chat1::task:8") is root
    assert root.commit().added == ["/documents/again.md"]
    with pytest.raises(InvalidTurn):
        workspace.turn(WS, "../evil")
    with pytest.raises(InvalidTurn):
        workspace.turn(WS, "")


def test_a_turn_id_with_letters_outside_ascii_is_refused_saying_which_letters_are_allowed():
    """(design §5) the message named "letters" and refused é, a letter: it says ASCII letters."""
    from kb.git.worktree import root_turn_id

    assert root_turn_id("agent-7::task:é") == "agent-7"
    with pytest.raises(InvalidTurn, match=r"ASCII letters \(a-z, A-Z\)"):
        root_turn_id("café")


def test_a_new_name_with_a_bidirectional_override_is_refused_in_a_turn_and_by_the_store(workspace, kb):
    """(design §2.3) ``report\u202egnp.exe.md`` shows as ``reportexe.png`` … in a review page: a turn's
    write, move and mkdir, and a store transaction, refuse to create it; nothing lands."""
    spoof = "/documents/report\u202egnp.exe.md"
    t = workspace.turn(WS, "bidi", "agent")
    t.write("/documents/plain.md", "plain\n")
    for attempt in (
        lambda: t.write(spoof, "x\n"),
        lambda: t.move("/documents/plain.md", spoof),
        lambda: t.write("/documents/a\u2066b/c.md", "x\n"),
    ):
        with pytest.raises(InvalidPath, match="bidirectional control"):
            attempt()
    assert t.commit().added == ["/documents/plain.md"]
    with pytest.raises(InvalidPath, match="bidirectional control"), kb.transaction(WS, "m", "a") as tx:
        tx.write(spoof, b"x")
    paths = kb.list_paths(WS)
    assert "/documents/plain.md" in paths and not any("\u202e" in p or "\u2066" in p for p in paths)


def test_path_safety(workspace, tmp_path):
    t = workspace.turn(WS, "safe", "agent")
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    for bad in (
        "/documents/../x.md",
        "../x.md",
        "/etc/passwd",
        "/documents/.git/config",
        ".git/config",
        "/documents/a\x00.md",
        "/documents/x/.git/config",
    ):
        with pytest.raises(InvalidPath):
            t.write(bad, "pwned")
        with pytest.raises(InvalidPath):
            t.read(bad)
    t.read("/documents/a.md")  # creates the worktree
    link = t.path / "documents" / "evil.md"
    link.symlink_to(outside)
    with pytest.raises(UnsafeWorktreeEntry):
        t.read("/documents/evil.md")
    with pytest.raises(UnsafeWorktreeEntry):
        t.write("/documents/evil.md", "overwrite through link")
    (t.path / "documents" / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(UnsafeWorktreeEntry):
        t.write("/documents/linkdir/outside.txt", "pwned")
    head = workspace.head(WS)
    with pytest.raises(UnsafeWorktreeEntry, match="symlink"):
        t.commit()
    assert workspace.head(WS) == head and t.path.exists()  # nothing recorded, turn kept
    assert outside.read_text() == "secret\n"
    link.unlink()
    (t.path / "documents" / "linkdir").unlink()
    t.write("/documents/ok.md", "fine\n")
    assert t.commit().added == ["/documents/ok.md"]
    git(repo_path(workspace), "fsck", "--strict")


def test_materialize_all_gives_a_plain_directory(workspace):
    t = workspace.turn(WS, "full", "agent")
    t.edit("/documents/a.md", "alpha", "ALPHA")
    root = t.materialize_all()
    assert (root / "documents/Notes/Deep/d.md").read_bytes() == b"deep\n"
    status = git(root, "status", "--porcelain")
    assert status.splitlines() == [" M documents/a.md"]
    # an external tool edits and deletes files directly
    (root / "documents/b.md").write_text("tool\n")
    (root / "documents/Notes/c.md").unlink()
    (root / "documents/tool.md").write_text("made by a tool\n")
    assert t.grep("tool")[0].path == "/documents/b.md"
    result = t.commit()
    assert result.added == ["/documents/tool.md"]
    assert result.modified == ["/documents/a.md", "/documents/b.md"]
    assert result.removed == ["/documents/Notes/c.md"]


CRASHER = textwrap.dedent("""
    import os, sys
    from kb.knowledge_base import KnowledgeBase
    from kb.settings import Settings
    kb = KnowledgeBase.open(Settings(database_url=sys.argv[1], storage_root=sys.argv[2], embedding_model="hashing"))
    t = kb.turn(1, sys.argv[3], "crasher")
    t.write("/documents/crash.md", "written before the crash\\n")
    t.edit("/documents/a.md", "alpha", "CRASH")
    t.remove("/documents/b.md")
    os.kill(os.getpid(), 9)
""")


def crash_turn(settings, turn_id: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", CRASHER, settings.database_url, str(settings.storage_root), turn_id],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr


def test_crashed_turn_is_recovered_by_next_commit(workspace, settings):
    crash_turn(settings, "crashy")
    result = workspace.turn(WS, "crashy", "agent").commit()
    assert result.added == ["/documents/crash.md"]
    assert result.modified == ["/documents/a.md"] and result.removed == ["/documents/b.md"]
    assert workspace.read(WS, "/documents/a.md").startswith(b"CRASH")
    git(repo_path(workspace), "fsck", "--strict")


def test_janitor_removes_abandoned_worktrees_only(workspace, settings):
    crash_turn(settings, "abandoned")
    open_turn = workspace.turn(WS, "busy", "agent")
    open_turn.write("/documents/busy.md", "still working\n")
    abandoned = open_turn.path.parent / "abandoned"
    assert abandoned.is_dir()
    fresh = workspace.sweep_worktrees()  # default TTL 24 h: both young
    assert fresh.removed == [] and abandoned.is_dir()
    report = workspace.sweep_worktrees(ttl=0)
    assert report.removed == [str(abandoned)] and report.kept_open == [str(open_turn.path)]
    assert not abandoned.exists() and open_turn.path.is_dir()
    listing = git(repo_path(workspace), "worktree", "list")
    assert f"{abandoned} " not in listing and f"{open_turn.path} " in listing
    assert open_turn.commit().added == ["/documents/busy.md"]
    git(repo_path(workspace), "fsck", "--strict")


def test_janitor_runs_as_a_procrastinate_job(workspace, settings):
    from kb.jobs import tasks as jobs
    from kb.knowledge_base import KnowledgeBase

    crash_turn(settings, "left-behind")
    open_turn = workspace.turn(WS, "working", "agent")
    open_turn.write("/documents/w.md", "w\n")
    left = open_turn.path.parent / "left-behind"
    janitor_kb = KnowledgeBase.open(settings.model_copy(update={"worktree_ttl": 0.0}))
    with jobs.app.replace_connector(jobs.connector_for(janitor_kb)) as bound, bound.open():
        jobs.sweep_worktrees.defer(timestamp=0)
    janitor_kb.run_worker(until_idle=True)
    assert not left.exists() and open_turn.path.is_dir()
    assert open_turn.commit().added == ["/documents/w.md"]


def test_kb_edit_commits_on_save_and_nothing_when_unchanged(workspace, kb_env, tmp_path):
    from support.commands import run_cli

    script = tmp_path / "fake_editor.py"
    script.write_text(
        textwrap.dedent("""
        import pathlib, sys
        target = pathlib.Path(sys.argv[1])
        target.with_name("." + target.name + ".swp").write_text("swap")  # editor droppings
        target.write_text(target.read_text().replace("beta", "edited by a person"))
    """)
    )
    env = {**kb_env, "EDITOR": f"{sys.executable} {script}"}
    head = workspace.head(WS)
    out = run_cli(env, "edit", "/documents/a.md", "--workspace", "1").stdout
    assert "updated /documents/a.md" in out
    new_head = workspace.head(WS)
    assert new_head != head
    assert workspace.read(WS, "/documents/a.md") == b"alpha\nedited by a person\ngamma\n"
    assert git(repo_path(workspace), "show", "--name-only", "--format=", new_head).split() == ["documents/a.md"]
    out = run_cli(env, "edit", "/documents/b.md", "--workspace", "1").stdout  # no "beta" in b.md
    assert "no changes" in out and workspace.head(WS) == new_head
    env["EDITOR"] = "false"
    failed = run_cli(env, "edit", "/documents/a.md", "--workspace", "1", check=False)
    assert failed.returncode == 1 and "nothing was recorded" in failed.stderr
    assert workspace.head(WS) == new_head
    assert not any(p.name.startswith("edit-") for p in (repo_path(workspace).parent / ".worktrees" / "1").glob("*"))
    remover = tmp_path / "remover.py"
    remover.write_text("import os, sys\nos.remove(sys.argv[1])\n")
    env["EDITOR"] = f"{sys.executable} {remover}"
    out = run_cli(env, "edit", "/documents/b.md", "--workspace", "1").stdout
    assert ": removed /documents/b.md" in out  # names what the revision did
    assert workspace.head(WS) != new_head


def _projection_emits_events() -> bool:
    """True once the projection job emits ``kb_events`` (design §6); until then the test below skips."""
    root = Path(__file__).resolve().parents[1]
    sources = [root / "kb" / "projection.py", *(root / "sql" / "queries").glob("*.sql")]
    return any("kb_events" in p.read_text() for p in sources if p.exists())


@pytest.mark.skipif(
    not _projection_emits_events(),
    reason="projection does not emit kb_events yet (design §6 owns it); runs once it does",
)
def test_turn_commit_emits_one_event_per_document_after_projection(workspace, settings):
    import json

    import psycopg

    workspace.project(WS)
    with psycopg.connect(settings.database_url, autocommit=True) as listener:
        listener.execute(queries["listen_events"])
        t = workspace.turn(WS, "events", "agent")
        t.write("/documents/created.md", "new\n")
        t.edit("/documents/a.md", "alpha", "ALPHA")
        t.remove("/documents/b.md")
        t.rmdir("/documents/Notes", recursive=True)
        result = t.commit()
        workspace.project(WS)
        events = [json.loads(n.payload) for n in listener.notifies(timeout=5, stop_after=10)]
        ids = {row[1] for row in listener.execute(queries["test_document_ids"], {"workspace_id": WS})}
    by_kind: dict[str, int] = {}
    for event in events:
        assert event["workspace_id"] == WS and event["revision"] == result.revision
        by_kind[event["event"]] = by_kind.get(event["event"], 0) + 1
        if event["event"] in ("document_created", "document_updated"):
            assert event["id"] in ids
    assert by_kind == {"document_created": 1, "document_updated": 1, "document_deleted": 3, "folder_deleted": 2}


def test_trees_built_for_a_turn_are_in_git_order_and_fsck_clean(workspace):
    """Folder/file names that sort differently as trees (``a`` vs ``a-b.md`` vs ``a.md``)."""
    t = workspace.turn(WS, "order", "agent")
    for path in ("/documents/x/a.md", "/documents/x/a/b.md", "/documents/x/a-b.md", "/documents/x/a0.md"):
        t.write(path, path + "\n")
    t.remove("/documents/Notes/Deep/d.md")  # empties a folder: the tree must disappear
    result = t.commit()
    repo = repo_path(workspace)
    git(repo, "fsck", "--strict", "--no-dangling")
    listed = git(repo, "ls-tree", "-r", "--name-only", result.revision).split("\n")
    assert "documents/x/a/b.md" in listed and "documents/Notes/Deep/d.md" not in listed
    assert "Deep" not in git(repo, "ls-tree", "--name-only", f"{result.revision}:documents/Notes")
    assert git(repo, "status", "--porcelain") == ""


def test_grep_over_many_documents_reads_packed_and_loose_blobs_in_bulk(kb):
    """design §5: a grep over more documents than kb.git.repository.BULK_READ_MIN reads the base's
    blobs through one git process (packed and loose alike) and the turn's own files from disk,
    with the same lines, in the same order, as one read per document."""
    from kb.git.maintenance import loose_object_count, pack_workspace
    from kb.git.repository import BULK_READ_MIN

    kb.create_workspace(7)
    texts = {f"/documents/f{i // 20}/d{i:03}.md": f"title {i}\nneedle {i % 3}\n" for i in range(BULK_READ_MIN + 12)}
    texts["/documents/f0/empty.md"] = ""
    with kb.transaction(7, "many", "t") as tx:
        for path, text in texts.items():
            tx.write(path, text)
    path = kb.store(7).path
    assert pack_workspace(path) and loose_object_count(path) == 0
    with kb.transaction(7, "loose ones", "t") as tx:  # the rest stay loose
        for i in range(3):
            texts[f"/documents/late/{i}.md"] = f"needle 0 late {i}\n"
            tx.write(f"/documents/late/{i}.md", texts[f"/documents/late/{i}.md"])
    t = kb.turn(7, "bulk-grep", "t")
    t.write("/documents/f1/d021.md", "needle 0 from the turn\n")
    texts["/documents/f1/d021.md"] = "needle 0 from the turn\n"
    t.remove("/documents/f2/d040.md")
    del texts["/documents/f2/d040.md"]
    expected = [
        (p, n, line)
        for p in sorted(texts)
        for n, line in enumerate(texts[p].splitlines(), start=1)
        if "needle 0" in line
    ]
    assert len(expected) > BULK_READ_MIN // 3
    assert [(h.path, h.line_number, h.line) for h in t.grep("needle 0")] == expected
    assert [h.path for h in t.grep("^title 4$", path="/documents/f0")] == ["/documents/f0/d004.md"]
    t.abort()


def test_a_grep_whose_backtracking_explodes_stops_at_its_time_bound(workspace, monkeypatch):
    """design §5, §16: ``(a|aa)+$`` doubles its work with each character of a line of a's; on a
    40-character line Python's re would run for hours, holding a kb serve thread every tenant
    shares. The grep stops at GREP_SECONDS with InvalidPattern naming the document and line, and
    the turn is unharmed: its next grep and its commit work."""
    from kb.turns import turn as turns

    t = workspace.turn(WS, "redos", "agent")
    t.write("/documents/evil.md", "# Evil\n\n" + "a" * 40 + "b\n")
    monkeypatch.setattr(turns, "GREP_SECONDS", 0.5)
    with pytest.raises(InvalidPattern, match=r"took more than 0.5 s .*evil\.md.*simplify the pattern"):
        t.grep(r"(a|aa)+$")
    assert [h.line_number for h in t.grep(r"^a+b$")] == [3]  # re's syntax, matched per line
    assert [h.path for h in t.grep(r"EVIL", ignore_case=True)] == ["/documents/evil.md"]
    assert t.commit().revision
