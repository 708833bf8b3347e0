"""Threads sharing one KnowledgeBase (design §4, §5; docs/python-api.md "Threads").

A web server or an agent runtime keeps one ``KnowledgeBase`` per process and calls it from many
threads. These tests run writers, turns and ``kb fsck`` in threads of this process against one
object and check the repository with the real git CLI: the index has no duplicate or unordered
entries, ``git status`` is clean, no thread hangs, and no raw OS error escapes.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter

from support.commands import git

from kb.errors import KbError

SECONDS = 5.0
THREADS = 4
JOIN_SECONDS = 120.0


def run_threads(target, count: int = THREADS) -> list[BaseException]:
    """Run ``target(k)`` in ``count`` daemon threads; returns their exceptions. A thread still
    alive after JOIN_SECONDS is a hang and fails the test."""
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            target(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(k,), daemon=True) for k in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_SECONDS)
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads hung (the working-tree lock?): {hung}"
    return errors


def staged_duplicates(repo) -> list[str]:
    """Paths listed more than once by ``git ls-files --stage`` (git itself refuses an unordered
    index: that raises here)."""
    listed = git(repo, "ls-files", "--stage", "-z").split("\0")
    names = Counter(line.split("\t", 1)[1] for line in listed if line)
    return [name for name, count in names.items() if count > 1]


def test_threads_sharing_one_knowledge_base_keep_the_index_sound(kb, settings):
    kb.create_workspace(1)
    repo = settings.knowledge_store / "1"
    deadline = time.monotonic() + SECONDS
    done: Counter = Counter()

    def writer(k: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            with kb.transaction(1, f"thread {k} write {i}", f"thread{k}") as tx:
                tx.write(f"/documents/t{k}/{i}.md", f"{k}:{i}\n")
                if i % 3 == 0:
                    tx.write("/documents/shared.md", f"last by {k}:{i}\n")
                if i % 5 == 4:
                    tx.move(f"/documents/t{k}/{i - 1}.md", f"/documents/t{k}/moved-{i - 1}.md")
            done[k] += 1
            i += 1

    assert run_threads(writer) == []
    assert staged_duplicates(repo) == []
    git(repo, "fsck", "--strict")  # reads the index too (no head given)
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert len(git(repo, "rev-list", "HEAD").split()) == sum(done.values())
    assert kb.fsck(1).worktree_repaired == []


def test_threaded_turns_never_break_each_others_worktrees(kb, settings):
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/seed.md", "seed\n")
    deadline = time.monotonic() + SECONDS
    commits: Counter = Counter()

    def agent(k: int) -> None:
        i = 0
        while time.monotonic() < deadline:
            turn = kb.turn(1, f"agent-{k}-{i}", f"agent{k}")
            turn.write(f"/documents/a{k}/{i}.md", f"{k}:{i}\n")
            if i % 2:
                turn.commit(f"agent {k} turn {i}")
                commits[k] += 1
            else:
                turn.abort()  # removes its worktree while the others create theirs
            i += 1

    errors = run_threads(agent)
    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors]
    repo = settings.knowledge_store / "1"
    assert staged_duplicates(repo) == []
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert len(git(repo, "rev-list", "HEAD").split()) == 1 + sum(commits.values())


def test_fsck_on_a_live_workspace_reports_no_damage(kb, settings):
    kb.create_workspace(1)
    stop = threading.Event()
    reports = []

    def writer(k: int) -> None:
        i = 0
        while not stop.is_set():
            with kb.transaction(1, None, f"thread{k}") as tx:
                tx.write(f"/documents/w{k}/{i % 20}.md", f"{k}:{i}\n")
            i += 1

    def checker() -> None:
        try:
            for _ in range(6):
                reports.append(kb.fsck(1))
        finally:
            stop.set()

    def role(k: int) -> None:
        checker() if k == THREADS else writer(k)

    errors = run_threads(role, THREADS + 1)
    assert errors == []
    assert len(reports) == 6
    damage = [
        (r.git_messages, r.worktree_repaired)
        for r in reports
        if not r.ok or r.worktree_repaired or any("bad sha1 file" in m for m in r.git_messages)
    ]
    assert damage == []
    assert [r.index_repaired for r in reports] == [None] * len(reports)


def test_fsck_detects_and_repairs_a_corrupt_index(kb, settings):
    kb.create_workspace(1)
    with kb.transaction(1, "two", "t") as tx:
        tx.write("/documents/a.md", "a\n")
        tx.write("/documents/b.md", "b\n")
    repo = settings.knowledge_store / "1"
    index = repo / ".git" / "index"
    from kb.git.gitindex import IndexFile

    parsed = IndexFile(index)
    parsed.load()
    parsed.names = parsed.names + parsed.names[:1]  # a path twice, out of order (two writers at once)
    parsed.entries = parsed.entries + parsed.entries[:1]
    parsed.write()
    broken = subprocess.run(["git", "-C", str(repo), "fsck"], capture_output=True, text=True)
    assert broken.returncode != 0 and "unordered stage entries" in broken.stderr
    assert git(repo, "status", "--porcelain") == "A  documents/a.md\n"  # committed, shown as added
    assert staged_duplicates(repo) == ["documents/a.md"]

    report = kb.fsck(1)
    assert report.index_repaired  # says what was wrong
    assert "unordered" in report.index_repaired or "twice" in report.index_repaired
    assert staged_duplicates(repo) == []
    git(repo, "fsck")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert kb.fsck(1).index_repaired is None


def test_turn_worktrees_created_and_removed_at_once_in_threads(kb, settings):
    """One turn's cleanup never removes the shared folders (``.git/worktrees``,
    ``.worktrees/{ws}``) while another thread creates its worktree in them."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/seed.md", "seed\n")
    deadline = time.monotonic() + SECONDS
    cycles: Counter = Counter()

    def agent(k: int) -> None:
        while time.monotonic() < deadline:
            turn = kb.turn(1, f"short-{k}-{cycles[k]}", f"agent{k}")
            turn.read("/documents/seed.md")
            turn.abort()
            cycles[k] += 1

    errors = run_threads(agent, 6)
    assert errors == [], [f"{type(e).__name__}: {e}" for e in errors[:3]]
    assert sum(cycles.values()) > 0


def test_a_draft_used_from_another_thread_is_refused(kb):
    kb.create_workspace(1)
    caught: list[BaseException] = []
    with kb.transaction(1, "one", "t") as tx:
        thread = threading.Thread(target=lambda: _write_catching(tx, caught))
        thread.start()
        thread.join(30)
        tx.write("/documents/mine.md", "mine\n")
    assert len(caught) == 1 and isinstance(caught[0], KbError)
    assert "thread" in str(caught[0])
    assert kb.list_paths(1) == {"/documents/mine.md": kb.list_paths(1)["/documents/mine.md"]}


def _write_catching(tx, caught) -> None:
    try:
        tx.write("/documents/other.md", "other\n")
    except BaseException as exc:
        caught.append(exc)
