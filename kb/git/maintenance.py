"""Repository maintenance (design §14): keep each workspace repository packed.

kb writes a revision's few objects loose (a pack per small commit would pile up packs). Left alone,
a busy workspace gathers tens of thousands of loose objects and every git tool — and kb's own
reads — slow down. The periodic task ``kb.maintain_repositories`` (``kb.jobs.tasks``) calls
:func:`maintain_workspaces`: every workspace repository with at least ``LOOSE_OBJECTS_TO_PACK``
loose objects has them put into one pack, and once packs pile up kb's own (plain, or kept by kb's
pending mark alone; never one with git's ``.keep`` or another side file) are consolidated into one
(``Repository.pack_loose_objects``, ``Repository.consolidate_packs``).

Besides that cron, a writer defers ``kb.pack_repository`` for its workspace every
``KB_PACK_EVERY_REVISIONS`` revisions (``kb.store.job_deferral.defer_packing``), which calls
:func:`pack_workspace`: a busy workspace never gathers more loose objects than that many revisions
write (git's own ``gc --auto`` threshold idea, counted in revisions so the writer pays nothing to
check it). Should those jobs not run (no worker, or one busy with a long index run), the writer
of every PACK_BACKSTOP_EVERY-th revision estimates the loose objects from an eighth of the
``objects/xx`` folders and, past PACK_BACKSTOP_LOOSE (a few hundred), packs them itself
(``KnowledgeStore._pack_if_behind``): only the loose objects, cost O(loose objects), and once more
than MAX_SMALL_PACKS small packs pile up it combines those (cost O(their objects)); consolidating
all packs, O(all objects), is left to maintenance.

It needs no write lock: objects are immutable, a loose object is deleted only after the pack
holding it is complete, and readers re-scan the packs on a miss, so concurrent writers and readers
are never disturbed. Every pack written here is kept pending (``keep_pending_pack``) until
maintenance releases it an hour later: a loose object may belong to a write whose ref has not moved
yet, and a user's ``git repack -a -d`` drops such an object from a plain pack (it leaves it alone
while it is loose). Two packers of one repository (the cron and a workspace's job, or two
workers, writers' backstops) never overlap: each holds ``.git/kb-pack.lock`` (an flock) and one
that finds it held leaves the work to its holder; ``kb fsck`` holds it (waiting for a packer at
work) while ``git fsck`` scans the objects, which must not vanish under it.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kb.git.repository import Repository, loose_object_ids

LOOSE_OBJECTS_TO_PACK = 512
"""Loose objects in a repository from which maintenance packs them."""
MAX_PACKS = 32
"""Packs beyond which maintenance consolidates all packs into one."""
PACK_BACKSTOP_LOOSE = 256
"""Estimated loose objects from which a writer packs them itself (``KnowledgeStore._pack_if_behind``)
when the packing jobs it deferred have not run (or not yet: it packs only the loose objects, so
cost O(loose objects), a few tens of milliseconds)."""
PACK_BACKSTOP_EVERY = 4
"""A writer estimates the loose objects (PACK_BACKSTOP_SAMPLE folders) on every revision whose
number is a multiple of this: 32 directory listings, ~0.17 ms (bin/bench_store.py's workspace)."""
PACK_BACKSTOP_SAMPLE = 32
"""``objects/xx`` folders the backstop's estimate lists: an eighth, ± ~45 objects at 256."""
MAX_SMALL_PACKS = 8
"""Small packs (``kb.git.repository.SMALL_PACK_OBJECTS``) beyond which the backstop combines them
into one: the backstop never consolidates all packs (cost O(all objects)); maintenance does."""
PACK_LOCK = "kb-pack.lock"
"""The flock under ``.git/`` a packer of the repository holds (see the module docstring)."""

log = logging.getLogger(__name__)


@dataclass
class MaintenanceReport:
    """``packed``: ``{workspace id: objects packed}``; ``checked``: repositories looked at."""

    checked: int = 0
    packed: dict[int, int] = field(default_factory=dict)


def loose_object_count(repository_path: Path) -> int:
    """Number of loose objects under ``{repository}/.git/objects/??/`` (``loose_object_ids``)."""
    return len(loose_object_ids(Path(repository_path) / ".git" / "objects"))


@contextlib.contextmanager
def pack_lock(repository_path: Path, wait: bool = False) -> Iterator[bool]:
    """Try to hold ``.git/kb-pack.lock`` for the block without waiting (``wait``: waiting for a
    packer at work — ``kb fsck``, whose ``git fsck`` must not see packs and loose objects vanish
    under it); yields whether it is held (False: another packer has it, or the repository is
    gone). Released when the holder dies."""
    try:
        fd = os.open(Path(repository_path) / ".git" / PACK_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:  # the workspace was deleted
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def pack_workspace(repository_path: Path, min_loose: int = 1, *, backstop: bool = False) -> int | None:
    """Pack the loose objects of the repository at ``repository_path`` when it has at least
    ``min_loose`` of them (consolidating its packs beyond MAX_PACKS), holding the pack lock.
    ``backstop``: a writer's own packing (``KnowledgeStore._pack_if_behind``): only the loose
    objects, and the small packs beyond MAX_SMALL_PACKS combined, never a consolidation of all
    packs. Returns the objects packed, or None when it was not packed (another packer holds the
    lock, too few loose objects, or the repository is gone). Raises OSError when the disk refuses."""
    with pack_lock(repository_path) as held:
        if not held:
            return None
        try:
            repository = Repository.open(repository_path)
        except FileNotFoundError:  # the workspace was deleted since
            return None
        try:
            repository.release_pending_packs()  # packs whose writes have long landed or died
            if loose_object_count(repository_path) < min_loose:
                return None
            if backstop:
                packed, packs = repository.pack_loose_objects(None, small_packs=MAX_SMALL_PACKS)
            else:
                packed, packs = repository.pack_loose_objects(MAX_PACKS)
        finally:
            repository.close()
    log.info("%s: packed %d objects (%d packs now)", repository_path, packed, packs)
    return packed


def estimated_loose_objects(repository_path: Path, sample: int) -> int:
    """The loose objects of a repository estimated from ``sample`` of its 256 ``objects/xx/``
    folders (``objects/00`` … in order), as ``git gc --auto`` does: ids are uniform, so ``sample``
    folders hold about ``sample``/256 of the objects. ``sample`` directory listings."""
    objects = Path(repository_path) / ".git" / "objects"
    found = 0
    for i in range(sample):
        try:
            found += sum(1 for name in os.listdir(objects / f"{i:02x}") if len(name) == 38)
        except FileNotFoundError:
            continue
    return found * 256 // sample


def maintain_workspaces(knowledge_store: Path, min_loose: int = LOOSE_OBJECTS_TO_PACK) -> MaintenanceReport:
    """Pack the loose objects of every workspace repository under ``knowledge_store`` that has at
    least ``min_loose`` of them (see the module docstring). Returns a MaintenanceReport."""
    report = MaintenanceReport()
    root = Path(knowledge_store)
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.name.isdigit() or not (path / ".git").is_dir():
            continue
        report.checked += 1
        packed = pack_workspace(path, min_loose)
        if packed is not None:
            report.packed[int(path.name)] = packed
    return report
