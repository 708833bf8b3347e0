#!/usr/bin/env python
"""Check that py3langid's DFA is an Aho-Corasick automaton over strings of at most ``WINDOW`` bytes,
which makes kb.index.langid_batch's windowed walk exact (design §7), and print its fingerprint.

Every state is given the string of its shortest path from the start state (breadth first); the
check is that each transition ``δ(s, c)`` leads to the state spelling the longest suffix of
``str(s) + c`` that any state spells (the start state for none) — the Aho-Corasick rule, under
which the state after a byte depends only on the last ``WINDOW`` bytes read. Run it after a
py3langid upgrade: when it passes, put the fingerprint it prints in
``kb.index.langid_batch.MODEL_FINGERPRINT`` (and ``WINDOW`` if the depth changed).

Usage: python bin/verify_langid_dfa.py   (about 10 s and 1 GB of memory)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb.index.langid_batch import WINDOW, fingerprint


def main() -> None:
    import py3langid.langid as langid

    identifier = langid._get_identifier()
    dtypes = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    nextmove = np.frombuffer(identifier.tk_nextmove, dtype=dtypes[identifier.tk_nextmove.itemsize]).astype(np.int64)
    rowbase = np.asarray(identifier._rowbase, dtype=np.int64)
    states = rowbase.size
    depth = np.full(states, -1, dtype=np.int64)
    spelled = np.zeros(states, dtype=np.int64)  # the state's string as a big-endian number
    depth[0], frontier, level = 0, np.array([0]), 0
    while frontier.size:
        level += 1
        source = np.repeat(frontier, 256)
        byte = np.tile(np.arange(256), frontier.size)
        target = nextmove[rowbase[source] + byte]
        new = depth[target] < 0
        target, first = np.unique(target[new], return_index=True)
        depth[target] = level
        spelled[target] = spelled[source[new][first]] * 256 + byte[new][first]
        frontier = target
    longest = int(depth.max())
    if (depth < 0).any():
        sys.exit("some states are unreachable from the start state: not an Aho-Corasick automaton")
    keys = spelled + (depth << 56)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    if (np.diff(sorted_keys) == 0).any():
        sys.exit("two states spell the same string: not an Aho-Corasick automaton")
    violations = 0
    for low in range(0, states, 2048):
        source = np.repeat(np.arange(low, min(states, low + 2048)), 256)
        byte = np.tile(np.arange(256), source.size // 256)
        target = nextmove[rowbase[source] + byte]
        text, length = spelled[source] * 256 + byte, depth[source] + 1
        expected = np.zeros(source.size, dtype=np.int64)
        settled = np.zeros(source.size, dtype=bool)
        for size in range(longest + 1, 0, -1):  # the longest suffix some state spells
            key = text % (256**size) + (size << 56)
            at = np.minimum(np.searchsorted(sorted_keys, key), states - 1)
            hit = (length >= size) & ~settled & (sorted_keys[at] == key)
            expected[hit] = order[at[hit]]
            settled |= hit
        violations += int((expected != target).sum())
    print(
        f"states {states}, longest string {longest} bytes (WINDOW {WINDOW}), transitions violating the rule {violations}"
    )
    print(f"fingerprint {fingerprint(identifier)}")
    if violations or longest > WINDOW:
        sys.exit("the windowed walk is not exact for this model: keep MODEL_FINGERPRINT as it is")


if __name__ == "__main__":
    main()
