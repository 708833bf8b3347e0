"""Documents created by title (design §2.2, §5, §6): safe unique names, titles kept."""

from __future__ import annotations

import threading
import unicodedata

import psycopg
import pytest
from psycopg.rows import dict_row
from support.commands import git
from support.named_queries import queries

from kb.errors import DocumentNotFound, InvalidInput, PathExists
from kb.paths import StorePath, name_key

WS = 1
HOSTILE = [
    "",
    " ",
    "🚀",
    "Q3 plan: draft?",
    "a/b",
    "..",
    ".",
    ".git",
    ".keep",
    "é" * 200,
    "x" * 300,
    "Cafe\u0301",
    "Café",
    "CAFÉ",
    "con",
    "CON",
    "nul.txt",
    "COM1",
    "lpt9.md",
    "tab\there",
    "new\nline",
    "esc\x1bape",
    "trailing dot.",
    '<>:"|?*',
    "back\\slash",
    "Node.js",
    "Report.MD",
    "report.md",
    "Straße",
    "STRASSE",
    "日本語のタイトル",
    "$(rm -rf /)",
    "%2e%2e",
    "-",
    "Plan",
    "plan",
    "PLAN",
    "Plan (2)",
]


def _titles(kb) -> dict[str, str]:
    with psycopg.connect(kb.database_url, row_factory=dict_row) as conn:
        rows = conn.execute(queries["test_document_titles"], {"workspace_id": WS}).fetchall()
    return {r["path"]: r["title"] for r in rows}


def _ids(kb) -> dict[str, int]:
    with psycopg.connect(kb.database_url, row_factory=dict_row) as conn:
        rows = conn.execute(queries["test_document_ids"], {"workspace_id": WS}).fetchall()
    return {r["path"]: r["id"] for r in rows}


@pytest.fixture
def workspace(kb):
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "seeder") as tx:
        tx.write("/documents/Notes/Plan.md", "existing\n")
    return kb


def _check_distinct_valid(paths: list[str]) -> None:
    assert len(paths) == len(set(paths))
    by_folder: dict[str, set[str]] = {}
    for path in paths:
        sp = StorePath.parse(path)  # raises InvalidPath for anything the path law refuses
        assert sp.virtual == path and unicodedata.is_normalized("NFC", path)
        assert len(sp.name.encode()) <= 255 and sp.name.endswith((".md", ".MD"))
        keys = by_folder.setdefault("/".join(sp.parts[:-1]), set())
        assert name_key(sp.name) not in keys, path
        keys.add(name_key(sp.name))


def test_hostile_titles_get_distinct_valid_paths_and_keep_their_titles(workspace):
    with workspace.transaction(WS, "create", "user") as tx:
        created = [tx.create("/documents/Notes", title, f"body {i}\n") for i, title in enumerate(HOSTILE)]
    paths = [c.path for c in created]
    _check_distinct_valid(paths + ["/documents/Notes/Plan.md"])
    assert "/documents/Notes/Plan.md" not in paths  # taken at the base: suffixed
    assert created[HOSTILE.index("Plan")].path == "/documents/Notes/Plan (2).md"
    assert created[HOSTILE.index("🚀")].path == "/documents/Notes/🚀.md"
    assert created[HOSTILE.index("")].path == "/documents/Notes/untitled.md"
    for i, doc in enumerate(created):
        assert workspace.read(WS, doc.path) == f"body {i}\n".encode()
    workspace.project(WS)
    titles = _titles(workspace)
    for title, doc in zip(HOSTILE, created):
        assert titles[doc.path] == title  # exactly as typed
    assert titles["/documents/Notes/Plan.md"] == "Plan"  # untouched existing document
    repo = workspace.store(WS).path
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain") == ""


def test_same_titles_again_in_a_second_transaction_are_suffixed(workspace):
    with workspace.transaction(WS, "one", "user") as tx:
        first = [tx.create("/documents", t) for t in HOSTILE[:12]]
    with workspace.transaction(WS, "two", "user") as tx:
        second = [tx.create("/documents", t) for t in HOSTILE[:12]]
    _check_distinct_valid([d.path for d in first + second])


def test_racing_transactions_creating_one_title_get_distinct_paths(workspace):
    with workspace.transaction(WS, "outer", "a") as outer:
        with workspace.transaction(WS, "inner", "b") as inner:
            late = inner.create("/documents/Notes", "Meeting")
            assert late.path == "/documents/Notes/Meeting.md"
        early = outer.create("/documents/Notes", "meeting")
        assert early.path == "/documents/Notes/meeting.md"  # chosen against the draft's base
    assert early.path == "/documents/Notes/meeting (2).md"  # chosen again under the lock
    assert workspace.read(WS, early.path) == b"" and workspace.read(WS, late.path) == b""
    workspace.project(WS)
    titles = _titles(workspace)
    assert titles[early.path] == "meeting" and titles[late.path] == "Meeting"
    assert workspace.history(WS, early.path)[0].changes[0].path == early.path


def test_racing_threads_creating_one_title_get_distinct_paths(workspace):
    barrier, results, errors = threading.Barrier(6), [], []

    def create(i: int) -> None:
        try:
            with workspace.transaction(WS, f"t{i}", f"w{i}") as tx:
                doc = tx.create("/documents/Notes", "Plan", f"writer {i}\n")
                barrier.wait(timeout=30)
            results.append((i, doc.path))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    paths = [p for _, p in results]
    _check_distinct_valid(paths + ["/documents/Notes/Plan.md"])
    for i, path in results:
        assert workspace.read(WS, path) == f"writer {i}\n".encode()
    workspace.project(WS)
    assert all(_titles(workspace)[p] == "Plan" for p in paths)


def test_racing_turns_creating_one_title(workspace):
    one, two = workspace.turn(WS, "one", "a"), workspace.turn(WS, "two", "b")
    d1, d2 = one.create("/documents/Notes", "Ideas", "one\n"), two.create("/documents/Notes", "ideas", "two\n")
    assert (d1.path, d2.path) == ("/documents/Notes/Ideas.md", "/documents/Notes/ideas.md")
    r1, r2 = one.commit(), two.commit()
    assert d2.path == "/documents/Notes/ideas (2).md" and r2.titles == {d2.path: "ideas"}
    assert r2.added == [d2.path] and r1.added == [d1.path]
    assert workspace.read(WS, d2.path) == b"two\n"
    workspace.project(WS)
    assert _titles(workspace)[d2.path] == "ideas"
    assert git(workspace.store(WS).path, "status", "--porcelain") == ""


def test_turn_create_sees_its_own_files_and_moves_keep_titles(workspace):
    turn = workspace.turn(WS, "t", "a")
    first = turn.create("/documents/New folder", "Draft?")
    second = turn.create("/documents/New folder", "draft?")
    assert (first.path, second.path) == ("/documents/New folder/Draft_.md", "/documents/New folder/draft_ (2).md")
    turn.move(second.path, "/documents/Elsewhere.md")
    result = turn.commit()
    assert result.titles == {first.path: "Draft?", "/documents/Elsewhere.md": "draft?"}
    workspace.project(WS)
    assert _titles(workspace)["/documents/Elsewhere.md"] == "draft?"


def test_a_title_postgres_cannot_hold_is_refused_before_anything_is_written(workspace):
    head = workspace.head(WS)
    with pytest.raises(InvalidInput, match="NUL"):
        with workspace.transaction(WS, "nul", "user") as tx:
            tx.create("/documents", "a\x00b")
    turn = workspace.turn(WS, "nul", "user")
    with pytest.raises(InvalidInput):
        turn.create("/documents", "a\x00b")
    assert turn.commit() is None and workspace.head(WS) == head


def test_create_refuses_a_document_as_folder(workspace):
    with pytest.raises(PathExists):
        with workspace.transaction(WS, "bad", "user") as tx:
            tx.create("/documents/Notes/Plan.md", "x")


def test_retitle_moves_the_document_and_keeps_its_id(workspace):
    workspace.project(WS)
    before = _ids(workspace)["/documents/Notes/Plan.md"]
    with workspace.transaction(WS, "retitle", "user") as tx:
        doc = tx.retitle("/documents/Notes/Plan.md", "Plan: final / v2")
    assert doc.path == "/documents/Notes/Plan_ final _ v2.md"
    workspace.project(WS)
    assert _ids(workspace)[doc.path] == before
    assert _titles(workspace)[doc.path] == "Plan: final / v2"
    with workspace.transaction(WS, "case only", "user") as tx:
        again = tx.retitle(doc.path, "PLAN: FINAL / V2")
    assert again.path == "/documents/Notes/PLAN_ FINAL _ V2.md"
    workspace.project(WS)
    assert _ids(workspace)[again.path] == before and _titles(workspace)[again.path] == "PLAN: FINAL / V2"
    with pytest.raises(DocumentNotFound):
        with workspace.transaction(WS, "missing", "user") as tx:
            tx.retitle("/documents/absent.md", "x")


def test_cli_new_prints_the_final_path(workspace, kb_env):
    from support.commands import run_cli

    first = run_cli(kb_env, "new", "/documents/Plans", "Q3 plan: draft?", "-w", "1", "--body", "ship\n")
    second = run_cli(kb_env, "new", "/documents/Plans", "q3 PLAN: draft?", "-w", "1", "--body", "again\n")
    assert first.stdout.strip() == "/documents/Plans/Q3 plan_ draft_.md"
    assert second.stdout.strip() == "/documents/Plans/q3 PLAN_ draft_ (2).md"
    assert workspace.read(WS, second.stdout.strip()) == b"again\n"
    # the revision it recorded is told on stderr (stdout stays the path alone, for scripts)
    assert second.stderr.strip() == f"revision {workspace.head(WS)}"
    # before the projection writes the row, a read is titled as typed, not from the file name
    assert workspace.read_document(WS, first.stdout.strip()).title == "Q3 plan: draft?"
    workspace.project(WS)
    assert _titles(workspace)[first.stdout.strip()] == "Q3 plan: draft?"
    assert workspace.read_document(WS, first.stdout.strip()).title == "Q3 plan: draft?"


CREATE_THEN_CRASH = """
import os, sys
from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings
kb = KnowledgeBase.open(Settings(database_url=sys.argv[1], storage_root=sys.argv[2], embedding_model="hashing"))
kb.turn(1, "crashy", "crasher").create("/documents/Notes", "Crash: report?", "before the crash\\n")
os.kill(os.getpid(), 9)
"""


def test_a_crashed_turn_keeps_the_titles_it_created(workspace, settings):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(
        [sys.executable, "-c", CREATE_THEN_CRASH, settings.database_url, str(settings.storage_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    result = workspace.turn(WS, "crashy", "agent").commit()
    assert result.titles == {"/documents/Notes/Crash_ report_.md": "Crash: report?"}
    workspace.project(WS)
    assert _titles(workspace)["/documents/Notes/Crash_ report_.md"] == "Crash: report?"
