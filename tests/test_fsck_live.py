"""``kb fsck`` on a live workspace (design §3, design §4): it never removes a git lock a working-tree
refresh holds, reports no repairs while writers work, and repairs an index that is not a file."""

from __future__ import annotations

import threading
import time

from support.commands import git

WS = 1


def seed(kb) -> None:
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "t") as tx:
        tx.write("/documents/a.md", "a\n")


def test_fsck_waits_for_a_refresh_holding_the_index_lock(kb):
    seed(kb)
    repo = kb.store(WS).repository
    index_lock = kb.store(WS).path / ".git" / "index.lock"
    holding, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def refresh() -> None:  # a writer's refresh after its commit, outside the write lock
        with repo.worktree_lock():
            index_lock.write_bytes(b"")
            holding.set()
            release.wait(10)
            seen.append(index_lock.exists())
            index_lock.unlink()

    writer = threading.Thread(target=refresh)
    writer.start()
    holding.wait(10)
    report: list = []
    checker = threading.Thread(target=lambda: report.append(kb.fsck(WS)))
    checker.start()
    time.sleep(1.0)  # fsck is now waiting (or, before the fix, already deleted the lock)
    release.set()
    writer.join()
    checker.join()
    assert seen == [True]  # the live refresh's lock was left alone
    assert report[0].stale_locks_removed == [] and report[0].worktree_repaired == []


def test_fsck_beside_live_writers_reports_no_repairs(kb):
    seed(kb)
    stop = time.monotonic() + 8
    errors: list[Exception] = []

    def writer(k: int) -> None:
        i = 0
        try:
            while time.monotonic() < stop:
                with kb.transaction(WS, f"w{k} {i}", "t") as tx:
                    tx.write(f"/documents/w{k}/{i % 5}.md", f"{k} {i}\n")
                i += 1
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    reports = []
    while time.monotonic() < stop:
        reports.append(kb.fsck(WS))
    for t in threads:
        t.join()
    assert not errors
    assert [
        (r.stale_locks_removed, r.worktree_repaired, r.index_repaired)
        for r in reports
        if r.stale_locks_removed or r.worktree_repaired or r.index_repaired
    ] == []
    assert git(kb.store(WS).path, "status", "--porcelain", "--untracked-files=all") == ""


def test_fsck_repairs_an_index_that_is_a_folder(kb):
    seed(kb)
    path = kb.store(WS).path
    index = path / ".git" / "index"
    index.unlink()
    index.mkdir()
    report = kb.fsck(WS)
    assert report.index_repaired is not None and "not a file" in report.index_repaired
    assert index.is_file()
    with kb.transaction(WS, "after", "t") as tx:
        tx.write("/documents/b.md", "b\n")
    assert git(path, "status", "--porcelain", "--untracked-files=all") == ""
