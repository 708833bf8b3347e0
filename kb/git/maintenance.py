"""Repository maintenance (design §14): keep each workspace repository packed.

kb writes a revision's few objects loose (a pack per small commit would pile up packs). Left alone,
a busy workspace gathers tens of thousands of loose objects and every git tool — and kb's own
reads — slow down. The periodic task ``kb.maintain_repositories`` (``kb.jobs.tasks``) calls
:func:`maintain_workspaces`: every workspace repository with at least ``LOOSE_OBJECTS_TO_PACK``
loose objects has them put into one pack, and once packs pile up they are consolidated into one
(``Repository.pack_loose_objects``, dulwich's ``pack_loose_objects``/``repack``).

It needs no write lock: objects are immutable, a loose object is deleted only after the pack
holding it is complete, and readers re-scan the packs on a miss, so concurrent writers and readers
are never disturbed. Two runs never overlap (the task's queueing lock).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from kb.git.repository import Repository

LOOSE_OBJECTS_TO_PACK = 512
"""Loose objects in a repository from which maintenance packs them."""
MAX_PACKS = 32
"""Packs beyond which maintenance consolidates all packs into one."""

log = logging.getLogger(__name__)


@dataclass
class MaintenanceReport:
    """``packed``: ``{workspace id: objects packed}``; ``checked``: repositories looked at."""

    checked: int = 0
    packed: dict[int, int] = field(default_factory=dict)


def loose_object_count(repository_path: Path) -> int:
    """Number of loose objects under ``{repository}/.git/objects/??/``."""
    objects = Path(repository_path) / ".git" / "objects"
    return (
        sum(
            sum(1 for entry in folder.iterdir() if len(entry.name) == 38)
            for folder in objects.iterdir()
            if len(folder.name) == 2 and folder.is_dir()
        )
        if objects.is_dir()
        else 0
    )


def maintain_workspaces(knowledge_store: Path, min_loose: int = LOOSE_OBJECTS_TO_PACK) -> MaintenanceReport:
    """Pack the loose objects of every workspace repository under ``knowledge_store`` that has at
    least ``min_loose`` of them (see the module docstring). Returns a MaintenanceReport."""
    report = MaintenanceReport()
    root = Path(knowledge_store)
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.name.isdigit() or not (path / ".git").is_dir():
            continue
        report.checked += 1
        try:
            repository = Repository.open(path)
        except FileNotFoundError:  # the workspace was deleted since the listing
            continue
        try:
            repository.release_pending_packs()  # packs whose writes have long landed or died
            if loose_object_count(path) < min_loose:
                continue
            packed, packs = repository.pack_loose_objects(MAX_PACKS)
        finally:
            repository.close()
        report.packed[int(path.name)] = packed
        log.info("workspace %s: packed %d objects (%d packs now)", path.name, packed, packs)
    return report
