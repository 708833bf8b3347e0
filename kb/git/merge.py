"""Three-way merge of a document two writers changed (design §5).

A turn records its changes on top of the *current* head. When a path it changed was also changed
by a revision recorded after the turn's base, the two versions are merged line by line with
``merge3`` (the diff3 implementation dulwich uses): base = the document at the turn's base
revision, ours = the document at the current head, theirs = the turn's document.

* Non-overlapping edits both survive (the path is reported as ``merged``).
* Overlapping hunks fall back to the design's rule, last writer wins: the turn's lines replace head's
  in each conflicting hunk, and every such hunk is reported as a :class:`LostHunk` (the path is
  reported in ``overwrote``). The lines that lost are not gone: they are the document at the
  parent revision, so ``read_as_of(parent, path)`` / ``git show parent:path`` still has them.
* Documents that are not line-structured text (a NUL byte) are never merged: the turn's bytes win
  whole and the whole document is the lost hunk.

The store applies a :class:`MergeRequest` for every path a draft wrote with ``merge_base=``; it
merges optimistically before taking the write lock and merges again under the lock only when the
head moved for that path in between (``kb.store``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from merge3 import Merge3

from kb.errors import DocumentGone, PathExists


@dataclass(frozen=True)
class LostHunk:
    """Lines of head's version that a later writer's overlapping edit replaced.

    ``start_line`` is the 1-based line number in head's version (the parent revision) where the
    hunk starts; ``lost`` are head's lines there (line endings kept, possibly empty when head only
    inserted lines), ``kept`` the lines of the writer that won.
    """

    path: str
    start_line: int
    lost: tuple[str, ...]
    kept: tuple[str, ...]


@dataclass(frozen=True)
class MergeOutcome:
    """The merged bytes and the hunks that lost (empty: a clean merge)."""

    data: bytes
    lost: tuple[LostHunk, ...]

    @property
    def clean(self) -> bool:
        """True when every edit of both sides survived."""
        return not self.lost


def _text(lines) -> tuple[str, ...]:
    return tuple(line.decode("utf-8", errors="replace") for line in lines)


def merge_documents(path: str, base: bytes | None, ours: bytes, theirs: bytes) -> MergeOutcome:
    """Three-way merge of one document (design §5): ``base`` = the common ancestor (None: both sides
    created the path), ``ours`` = head's bytes, ``theirs`` = the later writer's bytes.

    Returns the merged bytes; overlapping hunks take ``theirs`` and are listed as lost hunks with
    ``path`` (the virtual path, for reporting). Never raises for any bytes.
    """
    if ours in (theirs, base):
        return MergeOutcome(theirs, ())
    if theirs == base:
        return MergeOutcome(ours, ())
    if b"\0" in ours or b"\0" in theirs or (base is not None and b"\0" in base):
        return MergeOutcome(theirs, (LostHunk(path, 1, _text(ours.splitlines(True)), _text(theirs.splitlines(True))),))
    base_lines = (base or b"").splitlines(True)
    our_lines, their_lines = ours.splitlines(True), theirs.splitlines(True)
    merged: list[bytes] = []
    lost: list[LostHunk] = []
    merger = Merge3(base_lines, our_lines, their_lines)
    for region in merger.merge_regions():
        kind = region[0]
        if kind == "unchanged":
            merged.extend(base_lines[region[1] : region[2]])
        elif kind in ("a", "same"):
            merged.extend(our_lines[region[1] : region[2]])
        elif kind == "b":
            merged.extend(their_lines[region[1] : region[2]])
        else:
            # a conflict region carries all three ranges (merge3 types regions as 3-tuples)
            _, z_start, z_end, a_start, a_end, b_start, b_end = cast(tuple[str, int, int, int, int, int, int], region)
            if z_end - z_start == a_end - a_start == b_end - b_start:
                _merge_line_by_line(
                    path,
                    base_lines[z_start:z_end],
                    our_lines[a_start:a_end],
                    their_lines[b_start:b_end],
                    a_start,
                    merged,
                    lost,
                )
            else:  # overlapping hunks: last writer wins
                merged.extend(their_lines[b_start:b_end])
                lost.append(
                    LostHunk(path, a_start + 1, _text(our_lines[a_start:a_end]), _text(their_lines[b_start:b_end]))
                )
    return MergeOutcome(b"".join(merged), tuple(lost))


def _merge_line_by_line(
    path: str,
    base: list[bytes],
    ours: list[bytes],
    theirs: list[bytes],
    our_start: int,
    merged: list[bytes],
    lost: list[LostHunk],
) -> None:
    """Resolve a diff3 conflict whose three sides have the same number of lines line by line.

    diff3 reports *adjacent* edits (one side changed line 3, the other line 4) as one conflict;
    when every side replaced lines one for one, each line can be decided on its own: a line only
    one side changed takes that side, and only lines both changed differently are overlapping
    (last writer wins, consecutive ones reported as one lost hunk).
    """
    pending: list[int] = []

    def flush() -> None:
        if pending:
            lost.append(
                LostHunk(
                    path,
                    our_start + pending[0] + 1,
                    _text(ours[pending[0] : pending[-1] + 1]),
                    _text(theirs[pending[0] : pending[-1] + 1]),
                )
            )
            pending.clear()

    for i, (b, o, t) in enumerate(zip(base, ours, theirs)):
        if o in (b, t):
            merged.append(t)
        elif t == b:
            merged.append(o)
        else:
            merged.append(t)
            if pending and pending[-1] != i - 1:
                flush()
            pending.append(i)
            continue
        flush()
    flush()


@dataclass(frozen=True)
class MergeRequest:
    """A draft's write that is an edit of ``base_blob`` (None: a document the writer created),
    to be merged with whatever head holds at ``head_path`` when the revision is recorded.
    ``exact``: no merge — the draft's write or removal there stands only if head still holds
    ``base_blob`` (None: no document) or already what the draft puts there; else nothing is
    recorded (PathExists: a revert never removes or replaces later work, design §3)."""

    base_blob: str | None
    head_path: str
    exact: bool = False


@dataclass(frozen=True)
class MergedBlob:
    """The result of one request against one head: the head blob merged against, the outcome
    (None when head still held the base, so the writer's bytes stand), the blob to record."""

    head_blob: str | None
    outcome: MergeOutcome | None
    blob: str | None


def merge_staged(
    repo,
    requests: Mapping[str, MergeRequest],
    staged: dict[str, str | None],
    head_tree: bytes | None,
    earlier: dict[str, MergedBlob] | None = None,
) -> dict[str, MergedBlob]:
    """Merge every requested path of ``staged`` (``{repo path: blob}``, the writer's blobs) with
    the documents in ``head_tree``; returns ``{repo path: MergedBlob}`` and writes merged blobs to
    the object store. An ``earlier`` result whose head blob is unchanged is reused, so the merge
    under the write lock only redoes what moved since the unlocked one (design §4: no slow work
    under the lock). ``repo`` is a ``kb.git.repository.Repository``.
    """
    results: dict[str, MergedBlob] = {}
    gone, changed = [], []
    for path, request in requests.items():
        theirs_blob = staged.get(path)
        if request.exact:
            if repo.lookup(head_tree, request.head_path) not in (request.base_blob, theirs_blob):
                changed.append("/" + request.head_path)
            continue
        if theirs_blob is None:
            continue
        head_blob = repo.lookup(head_tree, request.head_path)
        if head_blob is None and request.base_blob is not None:
            gone.append("/" + request.head_path)  # an edit of a document removed since the base
            continue
        previous = (earlier or {}).get(path)
        if previous is not None and previous.head_blob == head_blob:
            results[path] = previous
            continue
        if head_blob is None or head_blob == request.base_blob or head_blob == theirs_blob:
            results[path] = MergedBlob(head_blob, None, theirs_blob)
            continue
        base = None if request.base_blob is None else repo.blob(request.base_blob)
        outcome = merge_documents("/" + path, base, repo.blob(head_blob), repo.blob(theirs_blob))
        results[path] = MergedBlob(head_blob, outcome, repo.add_blob(outcome.data))
    if changed:
        raise PathExists(
            f"{', '.join(sorted(changed))}: changed by another revision since the writer began, and this "
            "write would remove or replace that work; nothing was recorded. Look again, then retry"
        )
    if gone:
        raise DocumentGone(
            f"{', '.join(gone)}: edited by this writer but removed by another revision since the writer "
            "began; nothing was recorded. Keep the text under a new path or drop the edit, then write again",
            gone,
        )
    return results
