"""Which entries of a sorted binary file another version of it repeats, found in C-speed blocks
(design §2.1: O(changed entries) writes).

Another process's revision rewrites a big folder's tree object and the checkout's index file with
a few entries changed; parsing either again costs a Python step per entry. Both files are runs of
entries sorted by a key, so the new version is the old one's runs of entries with the changed
entries between them. Reading the new version entry by entry, the first entry of each unchanged
run is found among the old entries by its key (a bisection), and the run's length by comparing the
bytes that follow in blocks (each a ``memcmp`` of a slice): only the changed entries, and one entry
per run, are parsed in Python (``kb.git.tree_layout.derive``, ``kb.git.gitindex``).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

BLOCK = 8192
"""Bytes compared by the first step; each next step compares twice as many, up to MAX_BLOCK, and
the first difference is then narrowed by bisection."""
MAX_BLOCK = 262144


def same_bytes(a: bytes, a_start: int, b: bytes, b_start: int, limit: int) -> int:
    """How many bytes ``a[a_start:]`` and ``b[b_start:]`` share at their start (at most ``limit``)."""
    end = min(limit, len(a) - a_start, len(b) - b_start)
    n, block, grow = 0, BLOCK, 2
    while n < end:
        step = min(block, end - n)
        if a[a_start + n : a_start + n + step] != b[b_start + n : b_start + n + step]:
            if step <= BLOCK:
                break
            block, grow = BLOCK, 1  # the difference is in this step: look at it in small steps
            continue
        n += step
        block = min(grow * block, MAX_BLOCK)  # long runs in few steps
    else:
        return end
    lo, hi = n, n + step - 1  # a and b agree on n bytes; they differ within the next `step`
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[a_start + n : a_start + mid] == b[b_start + n : b_start + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def repeated_run(
    old: bytes, starts: Sequence[int], keys: Sequence, new: bytes, offset: int, key, stop: int
) -> tuple[int, int]:
    """``(j, k)``: the old entries ``j`` to ``k - 1`` (``starts``: each old entry's offset in
    ``old``, then the end of the last; ``keys``: their sort keys, ascending) whose bytes ``new``
    repeats from ``offset`` (where an entry of key ``key`` starts), without reading past ``stop``;
    ``k == j`` when the old entry of that key is not the same bytes (or there is none). Those
    bytes, read from an entry boundary, parse as exactly those entries."""
    j = bisect.bisect_left(keys, key)
    if j >= len(keys) or keys[j] != key:
        return j, j
    same = same_bytes(old, starts[j], new, offset, stop - offset)
    k = bisect.bisect_right(starts, starts[j] + same, j) - 1
    return j, max(k, j)
