"""A document a draft moved without changing it carries the content it has at the head (design §3).

A draft records a move as "the destination gets the source's blob, the source goes". When another
writer edits the source between the draft's start and its commit, recording that blob would put
the document back as it was before the edit: the edit would be in the history, but gone from the
head, without a word. Under the write lock, a moved document whose blob is still the one the
draft's base had at the source takes the source's blob at the head instead, so the edit follows
the move as it would follow ``git mv`` through a rebase. A document the draft moved *and* changed
keeps the draft's content (the draft's write wins, as every plain write does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kb.git.repository import Repository
    from kb.store.draft import Draft


def follow_moved_edits(
    repo: Repository, draft: Draft, staged: dict[str, str | None], head_tree: bytes | None
) -> dict[str, str | None]:
    """``staged`` (``{repo path: blob id or None}``) with each document ``draft`` moved unchanged
    given its source's blob at ``head_tree`` where another revision changed that source since the
    draft's base; the same mapping (not a copy) when nothing needs to follow. Cost O(moves), only
    when the head moved since the draft's base."""
    moves = draft.moves()
    base_tree = draft.base_tree
    if not moves or base_tree == head_tree:
        return staged
    pairs = [(new, old) for new, old in moves.items() if staged.get(new) is not None]
    sources = [old for _, old in pairs]
    at_base = repo.lookup_many(base_tree, sources)
    at_head = repo.lookup_many(head_tree, sources)
    followed: dict[str, str | None] | None = None
    for new, old in pairs:
        then, now = at_base.get(old), at_head.get(old)
        if not then or not now or then[0] != "file" or now[0] != "file":
            continue  # a source gone from the head is refused by the shape check (DocumentNotFound)
        if staged[new] == then[1] and now[1] != then[1]:
            if followed is None:
                followed = dict(staged)
            followed[new] = now[1]
    return staged if followed is None else followed
