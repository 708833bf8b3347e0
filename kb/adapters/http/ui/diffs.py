"""The diff of every file a revision touched (the revision page, design §17).

Each path change of the revision (``KnowledgeBase.revision``) becomes one file diff against the
revision's parent: added and removed documents show all their lines, a modified one the changed
hunks with three lines of context, and a recorded move is shown as a rename (old path → new path)
with the hunks its content changed, if any. Line numbers are counted by ``kb.lines`` on both sides,
so they match the document page and citations (design §8).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kb.lines import KeptLinesMatcher, document_lines

if TYPE_CHECKING:
    from kb.knowledge_base import KnowledgeBase
    from kb.store.history import PathChange, Revision

CONTEXT_LINES = 3
MAX_DIFF_LINES = 2000
"""Rows shown per file; a longer diff is cut and says so."""


@dataclass(frozen=True)
class DiffRow:
    """One row: ``kind`` is ``context`` | ``removed`` | ``added`` | ``gap`` (hunks skipped);
    ``old``/``new`` the line numbers on each side (None where the side has no line)."""

    kind: str
    old: int | None
    new: int | None
    text: str


@dataclass
class FileDiff:
    """The diff of one path: ``change`` as recorded (added, modified, removed, moved), ``path``
    (the new path), ``old_path`` (the path before, for a move), ``rows``; ``truncated`` when cut."""

    change: str
    path: str
    old_path: str | None
    rows: list[DiffRow] = field(default_factory=list)
    truncated: bool = False

    @property
    def counts(self) -> tuple[int, int]:
        """(lines added, lines removed)."""
        return sum(r.kind == "added" for r in self.rows), sum(r.kind == "removed" for r in self.rows)


def revision_diffs(kb: KnowledgeBase, workspace_id: int, revision: Revision) -> list[FileDiff]:
    """One FileDiff per document the revision changed, in path order (a move's ``moved_away``
    half is folded into its ``moved`` row). Raises what ``KnowledgeBase.read`` raises."""
    diffs = []
    for change in revision.changes:
        if change.change == "moved_away":
            continue
        old_path = _old_path(change)
        old = _lines(kb, workspace_id, old_path, revision.parent_id) if old_path else []
        new = _lines(kb, workspace_id, change.path, revision.id) if change.change != "removed" else []
        diffs.append(_diff(change, old_path, old, new))
    return diffs


def _old_path(change: PathChange) -> str | None:
    if change.change == "added":
        return None
    if change.change == "moved":
        return change.old_path
    return change.path


def _lines(kb: KnowledgeBase, workspace_id: int, path: str, revision: str | None) -> list[str]:
    if revision is None:
        return []
    return document_lines(kb.read(workspace_id, path, revision))


def _diff(change: PathChange, old_path: str | None, old: list[str], new: list[str]) -> FileDiff:
    diff = FileDiff(change.change, change.path, old_path if change.change == "moved" else None)
    if old == new:  # a pure rename: nothing but the path changed
        return diff
    matcher = KeptLinesMatcher(old, new)
    groups = list(matcher.get_grouped_opcodes(CONTEXT_LINES))
    for g, group in enumerate(groups):
        if g > 0 or (group and (group[0][1] > 0 or group[0][3] > 0)):
            diff.rows.append(DiffRow("gap", None, None, "⋮"))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                diff.rows += [DiffRow("context", i + 1, j1 + (i - i1) + 1, old[i]) for i in range(i1, i2)]
                continue
            diff.rows += [DiffRow("removed", i + 1, None, old[i]) for i in range(i1, i2)]
            diff.rows += [DiffRow("added", None, j + 1, new[j]) for j in range(j1, j2)]
        if len(diff.rows) > MAX_DIFF_LINES:
            diff.rows = diff.rows[:MAX_DIFF_LINES]
            diff.truncated = True
            break
    return diff
