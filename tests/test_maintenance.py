"""design §14 (design §14): repository maintenance packs loose objects, safely beside live writers."""

from __future__ import annotations

import multiprocessing

import psycopg
from support.commands import git
from support.named_queries import queries

from kb.git.maintenance import loose_object_count, maintain_workspaces
from kb.knowledge_base import KnowledgeBase
from kb.store import knowledge_store

WS = 1


def _writer(settings, url, count):
    kb = KnowledgeBase(settings, url)
    for i in range(count):
        with kb.transaction(WS, f"w{i}", "w") as tx:
            tx.write(f"/documents/n/{i % 7}.md", f"{i}\n")
            tx.write(f"/documents/log/{i}.md", f"entry {i}\n")


def test_packing_beside_a_live_writer_loses_nothing(kb):
    kb.create_workspace(WS)
    _writer(kb.settings, kb.database_url, 20)
    repo = kb.store(WS).path
    assert loose_object_count(repo) >= 60
    writer = multiprocessing.get_context("fork").Process(target=_writer, args=(kb.settings, kb.database_url, 60))
    writer.start()
    packed = 0
    while writer.is_alive():
        packed += sum(maintain_workspaces(kb.settings.knowledge_store, min_loose=5).packed.values())
    writer.join(60)
    assert writer.exitcode == 0 and packed > 0
    report = maintain_workspaces(kb.settings.knowledge_store, min_loose=1)
    assert report.checked == 1 and loose_object_count(repo) == 0
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert len(git(repo, "rev-list", "HEAD").split()) == 80 == len(kb.history(WS, limit=1000))
    assert kb.read(WS, "/documents/log/59.md") == b"entry 59\n"
    with kb.transaction(WS, "after", "w") as tx:  # writes go on after packing
        tx.write("/documents/after.md", "x")
    assert git(repo, "cat-file", "-p", "HEAD:documents/after.md") == "x"


def test_writers_defer_packing_every_n_revisions(kb):
    """design §14: every KB_PACK_EVERY_REVISIONS revisions a writer defers kb.pack_repository for its
    workspace (one waiting job covers the next); the worker packs its loose objects."""
    kb = KnowledgeBase(kb.settings.model_copy(update={"pack_every_revisions": 3}), kb.database_url)
    kb.create_workspace(WS)
    _writer(kb.settings, kb.database_url, 2)  # revisions 1, 2
    repo = kb.store(WS).path
    assert pack_jobs(kb) == []
    _writer(kb.settings, kb.database_url, 4)  # revisions 3 (due) … 6 (due, covered by the waiting job)
    assert pack_jobs(kb) == ["todo"] and loose_object_count(repo) > 20
    kb.run_worker(until_idle=True)
    assert pack_jobs(kb) == ["succeeded"] and loose_object_count(repo) == 0
    assert kb.read(WS, "/documents/log/3.md") == b"entry 3\n"
    git(repo, "fsck", "--strict")


def pack_jobs(kb) -> list[str]:
    with psycopg.connect(kb.database_url) as conn:
        return [r[0] for r in conn.execute(queries["test_pack_jobs"]).fetchall()]


def test_a_writer_packs_itself_when_no_worker_ran_the_packing_jobs(kb, monkeypatch):
    """design §2.1: with no worker to run kb.pack_repository, the writer of every
    KB_PACK_EVERY_REVISIONS-th revision packs once the loose objects pass PACK_BACKSTOP_LOOSE."""
    monkeypatch.setattr(knowledge_store, "PACK_BACKSTOP_LOOSE", 64)  # the estimate's scale, sooner
    kb = KnowledgeBase(kb.settings.model_copy(update={"pack_every_revisions": 3}), kb.database_url)
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    for r in range(5):  # ~45 loose objects a revision
        with kb.transaction(WS, f"r{r}", "w") as tx:
            for i in range(40):
                tx.write(f"/documents/r{r}/{i}.md", f"revision {r} document {i}\n")
    assert loose_object_count(repo) > 64  # revisions 4 and 5, since revision 3 packed
    with kb.transaction(WS, "r5", "w") as tx:
        for i in range(40):
            tx.write(f"/documents/r5/{i}.md", f"revision 5 document {i}\n")
    assert loose_object_count(repo) < 5 and pack_jobs(kb) == ["todo"]
    assert kb.read(WS, "/documents/r0/7.md") == b"revision 0 document 7\n"
    git(repo, "fsck", "--strict")
