"""Per-line last change of a document (design §17): for each line at HEAD, the revision that last
changed it, with author and time — what ``git blame`` answers, built from the history kb records.

The document's history comes from Postgres (``KnowledgeStore.history(path)``, which follows the
moves kb recorded, never similarity guesses: design §3, invariant 12); each version's bytes come
from git by the blob id the history recorded. Consecutive versions are compared line by line
(``kb.lines.kept_lines``: difflib's matcher without its junk heuristic, bounded for long texts): a line kept from the previous version
keeps its origin, every other line belongs to the revision that wrote that version. Lines are
counted by ``kb.lines`` (the numbers match the document page and citations, design §8).

History is read up to ``limit`` revisions back: lines older than the oldest revision read are
attributed to it with ``complete`` False (the page says "or earlier").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kb.lines import document_lines, kept_lines
from kb.store.knowledge_store import MAX_HISTORY_LIMIT

if TYPE_CHECKING:
    from kb.store.history import Revision
    from kb.store.knowledge_store import KnowledgeStore

BLAME_HISTORY_LIMIT = 500
"""How many of a document's revisions ``blame`` reads by default."""

_STARTS_AFRESH = {"added", "moved", "modified"}
"""Changes that leave a document at the path (``removed``/``moved_away`` leave none)."""


@dataclass(frozen=True)
class LineOrigin:
    """Line ``number`` (1-based, ``kb.lines``) of the document with its ``text`` and the
    ``revision`` that last changed it (None only when the recorded history does not reach HEAD's
    text: a revision Postgres has not recorded yet)."""

    number: int
    text: str
    revision: Revision | None


@dataclass(frozen=True)
class Blame:
    """``lines``: one LineOrigin per line at ``revision`` (HEAD); ``complete``: False when the
    history read stopped at ``limit`` before the document's creation."""

    path: str
    revision: str | None
    lines: list[LineOrigin]
    complete: bool

    def as_json(self) -> dict:
        """``{"path", "revision", "complete", "lines": [{"number", "text", "revision": {"id",
        "seq", "parent_id", "author", "committer", "committed_at" (ISO 8601), "message"} or
        null}]}`` — the form ``kb blame --json`` prints and the HTTP API answers (a revision's
        path changes left out); ``from_json`` reads it back."""
        return {
            "path": self.path,
            "revision": self.revision,
            "complete": self.complete,
            "lines": [
                {
                    "number": line.number,
                    "text": line.text,
                    "revision": None
                    if line.revision is None
                    else {
                        "id": line.revision.id,
                        "seq": line.revision.seq,
                        "parent_id": line.revision.parent_id,
                        "author": line.revision.author,
                        "committer": line.revision.committer,
                        "committed_at": line.revision.committed_at.isoformat() if line.revision.committed_at else None,
                        "message": line.revision.message,
                    },
                }
                for line in self.lines
            ],
        }

    @classmethod
    def from_json(cls, data: dict) -> Blame:
        """The Blame of ``as_json()`` output (``kb blame`` through ``kb serve``)."""
        from datetime import datetime

        from kb.store.history import Revision

        revisions: dict[str, Revision] = {}

        def revision(row: dict | None) -> Revision | None:
            if row is None:
                return None
            if row["id"] not in revisions:
                when = row.get("committed_at")
                revisions[row["id"]] = Revision(
                    row["id"],
                    row["seq"],
                    row.get("parent_id"),
                    row["author"],
                    row.get("committer", ""),
                    row.get("message", ""),
                    datetime.fromisoformat(when) if when else None,
                )
            return revisions[row["id"]]

        lines = [LineOrigin(line["number"], line["text"], revision(line["revision"])) for line in data["lines"]]
        return cls(data["path"], data["revision"], lines, data["complete"])


def blame(store: KnowledgeStore, path: str, limit: int = BLAME_HISTORY_LIMIT) -> Blame:
    """Each line of the document at ``path`` (virtual) at HEAD with the revision that last changed
    it. Reads at most ``limit`` revisions of its history (1 … the store's history limit). Raises
    InvalidPath, DocumentNotFound, IsAFolder, InvalidInput (limit), WorkspaceNotFound."""
    # the history first, then HEAD: a revision landing in between is then newer than the history
    # read (its lines "not recorded yet", or here at the next look), never a version newer than
    # the text blamed (whose lines it would leave without origin)
    # newest first, each with its one change of this path; one revision more than read tells
    # whether the history read reached the document's creation (an invalid limit: history raises)
    asked = limit + 1 if type(limit) is int and 1 <= limit < MAX_HISTORY_LIMIT else limit
    history = store.history(path, asked)
    complete = len(history) <= limit
    history = history[:limit]
    head = store.head()
    current = document_lines(store.read(path, head))
    versions: list[tuple[Revision, list[str]]] = []
    for revision in reversed(history):
        change = revision.changes[0] if revision.changes else None
        if change is None or change.change not in _STARTS_AFRESH:
            versions.append((revision, []))  # removed here: a later version starts afresh
            continue
        if change.change == "modified" and change.new_path:  # its document moved away; a new one here
            versions.append((revision, []))
        data = (
            store.repository.blob(change.content_id)
            if change.content_id
            else store.read(change.path, revision.id)  # a row without its blob id: read by path
        )
        versions.append((revision, document_lines(data)))
    origins: list[Revision | None] = []
    previous: list[str] = []
    for revision, lines in versions:
        origins = _carry(previous, origins, lines, revision)
        previous = lines
    if previous != current:  # HEAD's text is newer than the recorded history (not recorded yet)
        origins = _carry(previous, origins, current, None)
    return Blame(path, head, [LineOrigin(n, t, o) for n, (t, o) in enumerate(zip(current, origins), 1)], complete)


def _carry(
    old: list[str], old_origins: list[Revision | None], new: list[str], revision: Revision | None
) -> list[Revision | None]:
    """Origins of ``new``'s lines: kept lines keep theirs, the others get ``revision``."""
    origins: list[Revision | None] = [revision] * len(new)
    for i, j, size in kept_lines(old, new):
        origins[j : j + size] = old_origins[i : i + size]
    return origins
