"""design §14 (design §14): repository maintenance packs loose objects, safely beside live writers."""

from __future__ import annotations

import errno
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from dulwich.objects import Blob
from support.commands import git, missing_objects
from support.named_queries import queries

from kb.git import maintenance
from kb.git.maintenance import PACK_BACKSTOP_LOOSE, loose_object_count, maintain_workspaces
from kb.git.repository import PENDING_PACK_MARK, Repository
from kb.knowledge_base import KnowledgeBase

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
    PACK_BACKSTOP_EVERY-th revision packs once the loose objects pass PACK_BACKSTOP_LOOSE (a few
    hundred): only the loose objects, and the small packs beyond MAX_SMALL_PACKS combined into one
    that stays kept while any of them was (a write's pending pack); every object stays readable and
    git fsck clean."""
    monkeypatch.setattr(maintenance, "MAX_SMALL_PACKS", 2)  # combine after 3 small packs, not 9
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    with kb.transaction(WS, "import", "w") as tx:  # a batch this big is written as a kept pack
        for i in range(300):
            tx.write(f"/documents/import/{i}.md", f"imported {i}\n")
    kept = {p.stem for p in (repo / ".git/objects/pack").glob("*.keep")}
    assert len(kept) == 1 and loose_object_count(repo) < 10
    loose = []
    for r in range(60):  # ~45 loose objects a revision: 2,700 in all
        with kb.transaction(WS, f"r{r}", "w") as tx:
            for i in range(40):
                tx.write(f"/documents/r{r}/{i}.md", f"revision {r} document {i}\n")
        loose.append(loose_object_count(repo))
    assert max(loose) < 700, loose  # 256 + PACK_BACKSTOP_EVERY revisions' worth + the estimate's error
    assert min(loose[10:]) < PACK_BACKSTOP_LOOSE  # it packed, again and again
    packs = {p.stem for p in (repo / ".git/objects/pack").glob("*.pack")}
    assert len(packs) <= 1 + maintenance.MAX_SMALL_PACKS + 2  # small packs were combined
    # each pack (the import's folded into a combined one) kept pending: no ref may reach its objects yet
    assert {p.stem for p in (repo / ".git/objects/pack").glob("*.keep")} == packs
    for r in range(60):
        assert kb.read(WS, f"/documents/r{r}/39.md") == f"revision {r} document 39\n".encode()
    assert kb.read(WS, "/documents/import/299.md") == b"imported 299\n"
    git(repo, "fsck", "--strict")


def test_a_packing_failure_of_any_kind_is_logged_never_the_writes_outcome(kb, caplog):
    """design §2.1: the writer's backstop packing runs after its revision landed; whatever it
    raises (here dulwich's error for a loose object that is not a zlib stream; in the stress run,
    a pack a concurrent `git repack` removed) is logged, and the write reports that it landed."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    broken = repo / ".git/objects/ab" / ("c" * 38)
    broken.parent.mkdir(exist_ok=True)
    broken.write_bytes(b"not a zlib stream")
    heads = []
    with caplog.at_level("WARNING", logger="kb"):
        for r in range(40):  # ~45 loose objects a revision: past the backstop's threshold
            with kb.transaction(WS, f"r{r}", "w") as tx:
                for i in range(40):
                    tx.write(f"/documents/r{r}/{i}.md", f"revision {r} document {i}\n")
            heads.append(kb.head(WS))
    assert len(set(heads)) == 40  # every write landed, and its caller was told so
    assert "packing loose objects failed" in caplog.text
    # the command it names runs as it stands (kb fsck requires --workspace; `kb fsck` alone failed)
    assert f"`kb fsck --workspace {WS}` checks" in caplog.text, caplog.text
    broken.unlink()
    assert kb.read(WS, "/documents/r39/39.md") == b"revision 39 document 39\n"
    git(repo, "fsck", "--strict")


def test_a_pack_another_thread_still_reads_can_vanish_under_a_read(kb):
    """design §4, §14: `git repack -ad` (or maintenance) replaces a pack while another thread of this
    process holds a view into its mapping (mid-read). A read that misses re-scans the pack folder
    and drops the vanished pack; closing its mapping then raised BufferError, which escaped a
    search in the stress run of threads under repacks. The read finds its object in the new pack."""
    kb.create_workspace(WS)
    with kb.transaction(WS, "a", "w") as tx:
        tx.write("/documents/a.md", "a\n")
    repo = kb.store(WS).path
    git(repo, "repack", "-a", "-d", "-q")
    assert kb.read(WS, "/documents/a.md") == b"a\n"  # the pack is mapped and cached
    store = kb.store(WS).repository._repo.object_store
    (pack,) = store._pack_cache.values()
    view = memoryview(pack.data._contents)  # what a thread mid-read holds
    try:
        with kb.transaction(WS, "b", "w") as tx:
            tx.write("/documents/b.md", "b\n")
        git(repo, "repack", "-a", "-d", "-q")  # the old pack goes, b's objects are in the new one
        assert kb.read(WS, "/documents/b.md") == b"b\n"
        assert kb.read(WS, "/documents/a.md") == b"a\n"
    finally:
        view.release()
    git(repo, "fsck", "--strict")


def _backstop_writer(settings, url, name, count):
    kb = KnowledgeBase(settings, url)
    for r in range(count):
        with kb.transaction(WS, f"{name} {r}", name) as tx:
            for i in range(30):
                tx.write(f"/documents/{name}/{r}/{i}.md", f"{name} {r} {i}\n")


def _reader(settings, url, stop, failures):
    kb = KnowledgeBase(settings, url)
    while not stop.is_set():
        try:
            for path in kb.list_paths(WS):
                kb.read(WS, path)
        except Exception as exc:  # reported, not raised: the test names it
            failures.append(repr(exc))


def test_writers_packing_side_by_side_with_readers_lose_nothing(kb, monkeypatch):
    """design §2.1, §14: three writer processes whose backstops pack (and combine small packs)
    on one repository while a reader process reads every document over and over: the pack lock
    lets one packer at a time, no read fails, nothing is lost, git fsck --strict is clean."""
    monkeypatch.setattr(maintenance, "MAX_SMALL_PACKS", 2)  # inherited by the forked processes
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "w") as tx:
        tx.write("/documents/seed.md", "seed\n")
    ctx = multiprocessing.get_context("fork")
    stop, failures = ctx.Event(), ctx.Manager().list()
    reader = ctx.Process(target=_reader, args=(kb.settings, kb.database_url, stop, failures))
    writers = [ctx.Process(target=_backstop_writer, args=(kb.settings, kb.database_url, f"w{k}", 25)) for k in range(3)]
    reader.start()
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(300)
    stop.set()
    reader.join(60)
    assert [w.exitcode for w in writers] == [0, 0, 0] and reader.exitcode == 0
    assert list(failures) == []
    repo = kb.store(WS).path
    packs = len(list((repo / ".git/objects/pack").glob("*.pack")))
    assert 1 <= packs <= 1 + maintenance.MAX_SMALL_PACKS + 2, packs  # the small packs were combined
    assert len(kb.history(WS, limit=1000)) == 76 == len(git(repo, "rev-list", "HEAD").split())
    for k in range(3):
        for r in range(25):
            assert kb.read(WS, f"/documents/w{k}/{r}/29.md") == f"w{k} {r} 29\n".encode()
    git(repo, "fsck", "--strict")


def test_combining_small_packs_keeps_every_object_of_packs_with_deltas(kb):
    """design §14: the small packs the backstop combines may hold deltas (a pack git wrote, its
    side files gone): their objects are resolved, and every object stays readable, fsck clean."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    body = "".join(f"line {i} of a long document\n" for i in range(200))
    for r in range(6):  # near-identical versions: git stores them as deltas
        with kb.transaction(WS, f"v{r}", "w") as tx:
            tx.write("/documents/long.md", body + f"version {r}\n")
    git(repo, "repack", "-d", "-q")  # loose objects into a pack of git's own, with deltas
    pack_dir = repo / ".git/objects/pack"
    for side in [p for p in pack_dir.iterdir() if p.suffix not in (".pack", ".idx")]:
        side.unlink()  # a plain .pack/.idx pair, as the combiner takes them
    assert "chain length = 1" in git(repo, "verify-pack", "-v", str(next(pack_dir.glob("*.idx"))))
    with kb.transaction(WS, "more", "w") as tx:
        tx.write("/documents/other.md", "other\n")
    assert maintenance.pack_workspace(repo, backstop=True)  # a second small pack, beside git's
    store = kb.store(WS).repository
    objects = int(git(repo, "count-objects", "-v").split("in-pack: ")[1].split()[0])
    assert store.combine_small_packs(1) == objects and len(list(pack_dir.glob("*.pack"))) == 1
    git(repo, "fsck", "--strict")
    for r in range(6):
        revision = kb.history(WS, "/documents/long.md", limit=10)[5 - r]
        assert kb.read_as_of(WS, revision.id, "/documents/long.md") == (body + f"version {r}\n").encode()


def test_consolidating_packs_keeps_pending_packs_kept_and_leaves_gits_own_alone(kb):
    """design §14: maintenance's consolidation (more than MAX_PACKS packs) combines kb's packs, the
    plain ones and those kb marked pending (a write's, or a packer's of loose objects, whose objects
    no ref may reach yet): the combined pack stays kept until the newest of their marks is released,
    so ``git repack -a -d`` or ``git gc`` still cannot drop those objects (dulwich's ``repack``
    folded a kept pack into an unmarked one). A pack kept by git's own ``.keep`` is left as it is."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    pack_dir = repo / ".git/objects/pack"
    for r in range(4):  # four packs of kb's own, each marked pending by the packer
        with kb.transaction(WS, f"r{r}", "w") as tx:
            tx.write(f"/documents/r{r}.md", f"round {r}\n")
        assert maintenance.pack_workspace(repo, backstop=True)
    marks = sorted(pack_dir.glob("*.keep"))
    assert len(marks) == 4 and all(mark.read_bytes() == PENDING_PACK_MARK for mark in marks)
    gits = marks[0].with_suffix(".pack")
    marks[0].write_bytes(b"")  # as `git index-pack --keep` leaves it: git's own
    gits_objects = int(git(repo, "verify-pack", "-s", str(gits.with_suffix(".idx"))).split("non delta: ")[1].split()[0])
    now = time.time()
    for age, mark in zip((300, 100, 200), marks[1:]):  # the newest mark is 100 s old
        os.utime(mark, (now - age, now - age))
    store = kb.store(WS).repository
    assert store.consolidate_packs() > 0
    packs = sorted(pack_dir.glob("*.pack"))
    assert len(packs) == 2 and gits in packs and gits.with_suffix(".keep").read_bytes() == b""
    (new,) = [pack for pack in packs if pack != gits]
    mark = new.with_suffix(".keep")  # dated as the newest of the folded packs' marks
    assert mark.read_bytes() == PENDING_PACK_MARK and abs(mark.stat().st_mtime - (now - 100)) < 1
    assert len(list(pack_dir.glob("*.keep"))) == 2  # the folded packs' marks went with them
    git(repo, "repack", "-a", "-d", "-q")  # what a user's git gc does: the kept packs stay
    git(repo, "fsck", "--strict")
    for r in range(4):
        assert kb.read(WS, f"/documents/r{r}.md") == f"round {r}\n".encode()
    assert gits.exists() and gits_objects > 0


def test_objects_packed_before_their_ref_moves_survive_a_users_git_repack(kb):
    """design §14: a loose object may belong to a write whose ref has not moved yet (its blobs and
    trees are stored first). ``git repack -a -d`` leaves such an object alone while it is loose,
    but drops it from a plain pack: kb's packers put it in one, and a user's repack right after
    lost the blobs of a revision that then landed (``git fsck``: "broken link", "missing blob"; the
    stress run of threads under repacks). The packers' packs — the writer's backstop, the deferred
    job's, combined small packs, a consolidation — stay kept until maintenance releases them."""
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "w") as tx:
        tx.write("/documents/seed.md", "seed\n")
    repo = kb.store(WS).path
    repository = kb.store(WS).repository
    pending = []
    for packer in ("backstop", "job", "combine", "consolidate"):
        pending += repository.add_blobs(
            [f"{packer}: a write's blob {i}, its ref not moved yet\n".encode() for i in range(3)]
        )
        if packer == "backstop":
            assert maintenance.pack_workspace(repo, backstop=True) >= 3
        elif packer == "job":
            assert maintenance.pack_workspace(repo) >= 3
        elif packer == "combine":
            assert maintenance.pack_workspace(repo, backstop=True) >= 3
            assert repository.combine_small_packs(1) >= len(pending)
        else:
            assert maintenance.pack_workspace(repo) >= 3
            assert repository.consolidate_packs() >= len(pending)
        assert loose_object_count(repo) == 0
        git(repo, "repack", "-a", "-d", "-q")
        assert missing_objects(repo, pending) == []
    assert kb.read(WS, "/documents/seed.md") == b"seed\n"
    git(repo, "fsck", "--strict")
    assert repository.release_pending_packs(older_than=0) >= 1  # as maintenance does after an hour
    git(repo, "repack", "-a", "-d", "-q")  # by then no write needs them: garbage, dropped
    assert missing_objects(repo, pending) == pending
    assert kb.read(WS, "/documents/seed.md") == b"seed\n"


def test_a_writes_pack_is_kept_from_the_moment_it_appears(kb):
    """design §14: a write's pack (a large batch of blobs no ref reaches yet) is marked ``.keep``
    before it appears in the pack directory, so maintenance consolidating plain packs at that very
    moment (it holds no write lock) leaves it as it is. The mark was written after the pack was in
    place: a consolidation in between folded its objects into an unmarked pack (a ``.keep`` beside
    a pack that no longer existed), where ``git repack -a -d`` could drop them."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    for r in range(2):  # two plain packs of kb's own, for the consolidation to combine
        with kb.transaction(WS, f"r{r}", "w") as tx:
            tx.write(f"/documents/r{r}.md", f"round {r}\n")
        assert maintenance.pack_workspace(repo, backstop=True)
    repository = kb.store(WS).repository
    store = repository._repo.object_store
    complete = store._complete_pack

    def maintenance_meanwhile(*args, **kwargs):  # the write's pack is in place: maintenance runs now
        store._complete_pack = complete  # once (the consolidation writes a pack of its own)
        pack = complete(*args, **kwargs)
        repository.consolidate_packs()
        return pack

    store._complete_pack = maintenance_meanwhile
    ids = repository.add_blobs([f"imported {i}\n".encode() for i in range(300)])
    assert store._complete_pack is complete
    kept = [keep.with_suffix(".idx") for keep in (repo / ".git/objects/pack").glob("*.keep")]
    assert kept and all(idx.exists() for idx in kept), kept
    in_kept = {line.split()[0] for idx in kept for line in git(repo, "verify-pack", "-v", str(idx)).splitlines()}
    assert set(ids) <= in_kept  # every blob of the write in a kept pack
    git(repo, "fsck", "--strict")


def test_packing_beside_a_users_git_repack_taking_the_same_objects_loses_nothing_and_raises_nothing(kb, monkeypatch):
    """design §2.1, §14: a user's ``git repack -d`` may remove the loose objects kb's packer has just
    packed (``prune-packed``: those a pack holds) before the packer removes them, and may replace the
    plain packs the packer listed to combine before it reads them. Both raised out of the packer
    (FileNotFoundError, PackFileDisappeared), which the writer's backstop logged as a failure beside
    every repack; the objects are in a pack either way, so the packer goes on (or leaves the
    combining to that repack), and nothing is lost."""
    _three_rounds(kb)
    repo = kb.store(WS).path
    repository = kb.store(WS).repository
    write_pack = repository._write_pack

    def packed_then_git_prunes(records, **kwargs):
        pack = write_pack(records, **kwargs)
        git(repo, "prune-packed")  # as a user's `git repack -d` ends: loose objects a pack holds go
        return pack

    monkeypatch.setattr(repository, "_write_pack", packed_then_git_prunes)
    packed, _ = repository.pack_loose_objects(None)
    assert packed > 0 and loose_object_count(repo) == 0
    monkeypatch.undo()

    for r in range(3, 6):  # three more small packs, plain (as an hour after their marks)
        with kb.transaction(WS, f"r{r}", "w") as tx:
            tx.write(f"/documents/r{r}.md", f"round {r}\n")
        assert maintenance.pack_workspace(repo, backstop=True)
    repository.release_pending_packs(older_than=0)
    own_packs = repository._own_packs

    def listed_then_git_repacks():
        listed = own_packs()
        git(repo, "repack", "-a", "-d", "-q")  # replaces every plain pack the packer listed
        return listed

    monkeypatch.setattr(repository, "_own_packs", listed_then_git_repacks)
    repository.combine_small_packs(1)  # raises nothing: what it can still read it combines, the rest git did
    monkeypatch.undo()
    git(repo, "fsck", "--strict")
    for r in range(6):
        assert kb.read(WS, f"/documents/r{r}.md") == f"round {r}\n".encode()


def test_a_pack_a_users_git_repack_removed_after_the_packer_listed_it_does_not_fail_the_packing(kb):
    """design §14: dulwich compares a new pack with every pack the store has listed, reading each
    index; one a user's ``git repack -a -d`` removed since the listing raised PackFileDisappeared
    and the packing failed (the writer's backstop logged it beside almost every repack). The
    packer forgets the vanished pack and writes once more; nothing is lost."""

    kb.create_workspace(WS)
    with kb.transaction(WS, "r0", "w") as tx:
        tx.write("/documents/r0.md", "round 0\n")
    repo = kb.store(WS).path
    git(repo, "repack", "-a", "-d", "-q")
    repository = Repository.open(repo)  # a packer of its own: its store lists that pack, unread
    try:
        store = repository._repo.object_store
        assert len(store.packs) == 1
        other = subprocess.run(
            ["git", "-C", str(repo), "hash-object", "-w", "--stdin"],
            input="reached by another ref\n",
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        git(repo, "update-ref", "refs/kb-test/other", other)
        git(repo, "repack", "-a", "-d", "-q")  # the listed pack is replaced by one with `other` too
        blob = repository.add_blob(b"a write's blob, its ref not moved yet\n")
        packed, _ = repository.pack_loose_objects(None)
        assert packed == 1 and loose_object_count(repo) == 0
    finally:
        repository.close()
    assert missing_objects(repo, [blob, other]) == []
    git(repo, "fsck", "--strict")
    assert kb.read(WS, "/documents/r0.md") == b"round 0\n"


def test_packing_while_a_users_git_repack_empties_the_object_folders_it_listed(kb, monkeypatch):
    """design §14: a user's ``git repack -d`` removes the ``objects/xx`` folders it empties; one the
    packer had listed and then opened raised FileNotFoundError out of the packing (seen beside
    ``git gc`` in the big-folder stress). The packer passes over a vanished folder: its objects
    are in a pack."""
    _three_rounds(kb)
    repo = kb.store(WS).path
    repository = kb.store(WS).repository
    objects, listdir, fired = str(repo / ".git" / "objects"), os.listdir, []

    def listed_then_git_repacks(path="."):
        names = listdir(path)
        if os.fspath(path).rstrip("/") == objects and not fired:
            fired.append(path)
            git(repo, "repack", "-d", "-q")  # packs the loose objects, removes the emptied folders
        return names

    monkeypatch.setattr(os, "listdir", listed_then_git_repacks)
    repository.pack_loose_objects(None)
    monkeypatch.undo()
    assert fired and loose_object_count(repo) == 0
    git(repo, "fsck", "--strict")
    for r in range(3):
        assert kb.read(WS, f"/documents/r{r}.md") == f"round {r}\n".encode()


def test_a_writes_pack_of_repeated_blobs_is_kept_from_the_moment_it_appears(kb):
    """design §2.1: a write's batch may hold the same blob twice (two documents of the same text in
    one import, identical new folders' trees). dulwich names a pack by the SHA-1 of the ids it
    holds, repeats included, so the mark made beforehand under the name of the distinct ids missed
    it: the pack appeared plain and was marked only afterwards, and a ``git repack -a -d`` at that
    moment dropped every blob of the write (its pack also held the repeat twice, which ``git
    verify-pack`` calls bad). The batch is written once per object."""
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "w") as tx:
        tx.write("/documents/seed.md", "seed\n")
    repo = kb.store(WS).path
    repository = kb.store(WS).repository
    store = repository._repo.object_store
    complete = store._complete_pack

    def users_repack_meanwhile(*args, **kwargs):  # the write's pack is in place: a user repacks now
        pack = complete(*args, **kwargs)
        git(repo, "repack", "-a", "-d", "-q")
        return pack

    store._complete_pack = users_repack_meanwhile
    bodies = [f"imported {i}\n".encode() for i in range(300)] + [b"the same text\n"] * 2
    ids = repository.add_blobs(bodies)
    assert len(ids) == len(bodies) and ids[-1] == ids[-2]
    assert missing_objects(repo, ids) == []
    marks = list((repo / ".git/objects/pack").glob("*.keep"))
    assert len(marks) == 1 and marks[0].with_suffix(".pack").exists()
    git(repo, "verify-pack", str(marks[0].with_suffix(".idx")))
    git(repo, "fsck", "--strict")


def test_packing_goes_on_when_git_removes_what_it_would_remove(kb, monkeypatch):
    """design §2.1: a user's ``git repack -d`` or ``git gc`` beside kb's packer removes what the
    packer is about to remove itself: ``git prune-packed`` deletes the loose copies of objects
    once kb's new pack holds them, and ``git repack -a -d`` deletes a plain pack (git's own, or
    one whose mark maintenance released) kb was about to combine. Either made the packer raise
    midway (FileNotFoundError, dulwich's PackFileDisappeared): the maintenance cron stopped there
    for every later workspace and never consolidated, so kept packs piled up (124 packs after
    300 revisions of three writers beside repeated ``git repack -a -d`` and ``git gc``). What is
    gone already is skipped; every object stays readable."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    for r in range(3):  # plain packs: the marks released, as an hour later
        with kb.transaction(WS, f"r{r}", "w") as tx:
            tx.write(f"/documents/r{r}.md", f"round {r}\n")
        assert maintenance.pack_workspace(repo)
        assert kb.store(WS).repository.release_pending_packs(older_than=0) == 1
    with kb.transaction(WS, "loose", "w") as tx:
        tx.write("/documents/loose.md", "loose\n")
    write_pack, own_packs = Repository._write_pack, Repository._own_packs

    def prune_packed_meanwhile(self, *args, **kwargs):  # the new pack is in place: git prunes now
        pack = write_pack(self, *args, **kwargs)
        git(repo, "prune-packed")
        return pack

    def repack_meanwhile(self):  # the plain packs listed: git replaces them now
        own = own_packs(self)
        git(repo, "repack", "-a", "-d", "-q")
        return own

    monkeypatch.setattr(Repository, "_write_pack", prune_packed_meanwhile)
    monkeypatch.setattr(Repository, "_own_packs", repack_meanwhile)
    monkeypatch.setattr(maintenance, "MAX_PACKS", 1)  # consolidate now
    assert maintenance.pack_workspace(repo) > 0
    assert loose_object_count(repo) == 0
    git(repo, "fsck", "--strict")
    for name in ("r0", "r1", "r2", "loose"):
        assert kb.read(WS, f"/documents/{name}.md") in (b"loose\n", f"round {name[1:]}\n".encode())
    marks = list((repo / ".git/objects/pack").glob("*.keep"))
    assert marks and all(mark.with_suffix(".pack").exists() for mark in marks)


def test_combining_packs_clears_gits_multi_pack_index_as_git_repack_does(kb):
    """design §2.1: a user's ``git multi-pack-index write`` (``git maintenance``'s incremental
    repack, ``git repack --write-midx``) indexes the packs there; kb's consolidation then removed
    packs it names, and ``git fsck`` failed on every later run ("failed to load pack entry", kb
    fsck with it) though every object was there: ``git gc`` did not mend it. kb clears the index
    before it removes a pack, as git's repack does; git works without one."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    for r in range(3):
        with kb.transaction(WS, f"r{r}", "w") as tx:
            tx.write(f"/documents/r{r}.md", f"round {r}\n")
        assert maintenance.pack_workspace(repo)
    git(repo, "multi-pack-index", "write")
    assert kb.store(WS).repository.consolidate_packs() > 0
    git(repo, "fsck", "--strict")
    assert not (repo / ".git/objects/pack/multi-pack-index").exists()
    for r in range(3):
        assert kb.read(WS, f"/documents/r{r}.md") == f"round {r}\n".encode()


def test_a_writes_pack_lands_when_git_repack_removes_a_pack_the_writer_knew(kb):
    """design §2.1: dulwich, putting a write's pack in place, looks among the packs it knows for
    one of the same objects; a pack a user's concurrent ``git repack -a -d`` removed meanwhile
    cannot tell its name (PackFileDisappeared) and the write failed (imports failed so beside a
    loop of ``git repack -a -d`` and ``git gc``). The write looks again."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    repository = kb.store(WS).repository
    store = repository._repo.object_store
    _two_plain_packs(kb, repo)  # packs this writer has not looked into
    rescan = _git_repacks_after_the_next_rescan(store, repo)  # the writer knows the packs then
    ids = repository.add_blobs([f"imported {i}\n".encode() for i in range(300)])
    assert store._update_pack_cache is rescan and missing_objects(repo, ids) == []
    assert len(list((repo / ".git/objects/pack").glob("*.keep"))) == 1
    git(repo, "fsck", "--strict")


def test_a_packers_pack_lands_when_git_repack_removes_a_pack_it_knew(kb):
    """design §2.1: as a write's pack (above), a packer's: dulwich's look among the packs it has
    cached for one of the same objects met a pack a concurrent ``git repack -a -d`` had removed
    (PackFileDisappeared) and the packer gave up. It looks again; the loose objects are packed."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    _two_plain_packs(kb, repo)
    with kb.transaction(WS, "loose", "w") as tx:
        tx.write("/documents/loose.md", "loose\n")
    with Repository.open(repo) as packer:
        store = packer._repo.object_store
        _git_repacks_after_the_next_rescan(store, repo)  # the packer knows the packs then
        packed, _ = packer.pack_loose_objects(None)
    assert packed > 0 and loose_object_count(repo) == 0
    git(repo, "fsck", "--strict")
    assert kb.read(WS, "/documents/loose.md") == b"loose\n"


class _DiskFullMidPack(list):
    """A blob's raw chunks whose reading, as its pack is written, finds the disk full: right
    after another process began a temporary pack of its own in the same folder."""

    def __init__(self, chunks, pack_dir: Path):
        super().__init__(chunks)
        self.pack_dir = pack_dir

    def __iter__(self):
        self.readings = getattr(self, "readings", 0) + 1
        if self.readings == 1:  # dulwich's first reading, its length, before the pack is begun
            return super().__iter__()
        assert any(self.pack_dir.glob("tmp_pack_*")), "read before the pack was begun"
        (self.pack_dir / "tmpanotherwriter.pack").write_bytes(b"PACK, being written by another process")
        raise OSError(errno.ENOSPC, "No space left on device")


class _BlobOnAFullDisk(Blob):
    """A blob whose bytes, once ``pack_dir`` is set, are written to a full disk (above)."""

    pack_dir: Path | None = None

    def as_raw_chunks(self):
        chunks = super().as_raw_chunks()
        return chunks if self.pack_dir is None else _DiskFullMidPack(chunks, self.pack_dir)


def test_a_write_failing_mid_pack_removes_its_own_temporary_pack_and_no_one_elses(kb):
    """design §2.1: a large write whose pack fails half-written (the disk full) removes the
    temporary pack it began, and only that one: it removed every ``tmp*.pack`` that had appeared
    since it started, another process's pack in the making included, whose write then failed."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    pack_dir = repo / ".git/objects/pack"
    blobs = [Blob.from_string(f"imported {i}\n".encode()) for i in range(299)]
    last = _BlobOnAFullDisk.from_string(b"the last one\n")
    assert last.id  # its id known before the write, as a write's are
    last.pack_dir = pack_dir
    blobs.append(last)
    with pytest.raises(OSError, match="No space left"):
        kb.store(WS).repository._add_objects(blobs)
    left = sorted(path.name for path in pack_dir.iterdir())
    assert left == ["tmpanotherwriter.pack"], left  # no half pack, mark or temporary file of the write
    assert missing_objects(repo, [blob.id.decode() for blob in blobs[:5]]) == [blob.id.decode() for blob in blobs[:5]]


def _three_rounds(kb) -> None:
    """Workspace WS with three revisions, each writing ``/documents/r{n}.md`` ("round n")."""
    kb.create_workspace(WS)
    for r in range(3):
        with kb.transaction(WS, f"r{r}", "w") as tx:
            tx.write(f"/documents/r{r}.md", f"round {r}\n")


def _two_plain_packs(kb, repo) -> None:
    """Two revisions, each packed by kb's packer and its mark released (plain, as an hour later)."""
    for r in range(2):
        with kb.transaction(WS, f"r{r}", "w") as tx:
            tx.write(f"/documents/r{r}.md", f"round {r}\n")
        assert maintenance.pack_workspace(repo)
        assert kb.store(WS).repository.release_pending_packs(older_than=0) == 1


def _git_repacks_after_the_next_rescan(store, repo):
    """Make ``store``'s next pack re-scan (once) be followed by a real ``git repack -a -d``, which
    replaces the packs it has just listed; returns the store's own re-scan."""
    rescan = store._update_pack_cache

    def repack_after_the_rescan():
        store._update_pack_cache = rescan  # once
        found = rescan()
        git(repo, "repack", "-a", "-d", "-q")
        return found

    store._update_pack_cache = repack_after_the_rescan
    return rescan


_WRITE_ON_A_FULL_DISK = """
import resource, signal, sys
from kb.git.repository import Repository
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
with Repository.open(sys.argv[1]) as repository:
    blobs = [f"{i}".encode() for i in range(300)]  # tiny: the pack (3.5 kB) is smaller than its index (9.5 kB)
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try:
        repository.add_blobs(blobs)
    except OSError as exc:
        print("refused", exc.errno)
"""


def test_a_write_refused_by_a_full_disk_leaves_no_pending_mark_behind(kb):
    """design §14: a large write whose pending mark cannot be written in full (the disk full, a
    file size limit) removes the mark it began. It left it empty or half written, which is no
    mark of kb's (release_pending_packs never removed it) but a ``.keep`` as git's: one more for
    every refused write, kept for ever, and keeping the pack the same import makes on its retry."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    _write_on_a_full_disk(repo, 16)  # the mark's 62 bytes do not fit
    left = sorted(path.name for path in (repo / ".git/objects/pack").iterdir())
    assert left == [], left  # no mark, half pack or temporary file of the write
    git(repo, "fsck", "--strict")


def _write_on_a_full_disk(repo: Path, room: int) -> None:
    """Store 300 tiny blobs in ``repo`` (one pack) in a process that can write ``room`` bytes to
    a file; asserts the write was refused (EFBIG, as ENOSPC on a full disk)."""
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_ON_A_FULL_DISK, str(repo), str(room)], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == f"refused {errno.EFBIG}", done.stdout + done.stderr


def test_a_write_whose_pack_index_finds_the_disk_full_removes_the_pack_it_moved_into_place(kb):
    """design §2.1: dulwich moves a new pack into place before it writes its index, as git does.
    A large write whose index then found the disk full (here: room for the pack, not its index)
    left the whole pack there without an index (``git count-objects`` garbage, which ``git
    fsck`` warns of) until a ``kb fsck``; now it removes it as it removes its temporary pack."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    _write_on_a_full_disk(repo, 6000)
    left = sorted(path.name for path in (repo / ".git/objects/pack").iterdir())
    assert left == [], left  # no pack without index, mark or temporary file of the write
    assert "garbage: 0" in git(repo, "count-objects", "-v")


class _SameBatchBesideIt(list):
    """A blob's raw chunks whose first reading, as its pack is written, lets another writer store
    the same batch in full (its own pack, under the same name) and then finds the disk full."""

    def __init__(self, chunks, other_write):
        super().__init__(chunks)
        self.other_write = other_write

    def __iter__(self):
        self.readings = getattr(self, "readings", 0) + 1
        if self.readings == 1:  # dulwich's first reading, its length, before the write begins
            return super().__iter__()
        self.other_write()
        raise OSError(errno.ENOSPC, "No space left on device")


class _BlobWrittenTwiceAtOnce(Blob):
    """A blob whose first packing, once ``other_write`` is set, runs another write beside it."""

    other_write = None

    def as_raw_chunks(self):
        chunks = super().as_raw_chunks()
        return chunks if self.other_write is None else _SameBatchBesideIt(chunks, self.other_write)


def test_a_failed_write_leaves_the_pending_mark_of_the_same_batch_another_writer_packed(kb):
    """design §14: two writes of the same batch (one import run twice at once) share one pending
    mark: the pack's name is its objects', and the second writer finds the first's mark there and
    makes none. When the first then failed (the disk full) it removed the mark, and the second's
    pack — complete, its revision not recorded yet — was plain: a ``git repack -a -d`` then drops
    its objects and the revision lands without them. The mark is left while that pack is there
    (released an hour on, as any)."""
    kb.create_workspace(WS)
    repo = kb.store(WS).path
    blobs = [Blob.from_string(f"imported {i}\n".encode()) for i in range(299)]
    last = _BlobWrittenTwiceAtOnce.from_string(b"the last one\n")
    assert last.id
    blobs.append(last)
    with Repository.open(repo) as second:

        def other_write():
            last.other_write = None  # the second writer packs the blob's bytes as they are
            second._add_objects(blobs)

        last.other_write = other_write
        with pytest.raises(OSError, match="No space left"):
            kb.store(WS).repository._add_objects(blobs)
    packs = sorted(path.name for path in (repo / ".git/objects/pack").iterdir())
    assert [name.rsplit(".", 1)[1] for name in packs] == ["idx", "keep", "pack"], packs  # the second's, marked
    git(repo, "repack", "-a", "-d", "-q")  # the second's revision not recorded yet: its objects unreachable
    assert missing_objects(repo, [last.id.decode()]) == []
