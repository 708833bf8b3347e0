#!/usr/bin/env python
"""Check that py3langid's DFA is an Aho-Corasick automaton over strings of at most ``WINDOW`` bytes,
which makes kb.index.langid_batch's windowed walk exact (design §7), that the double array the walk
follows (``walk_tables``) is the trie of its states' strings with their outputs, and print both
fingerprints.

Every state is given the string of its shortest path from the start state (breadth first); the
check is that each transition ``δ(s, c)`` leads to the state spelling the longest suffix of
``str(s) + c`` that any state spells (the start state for none) — the Aho-Corasick rule, under
which the state after a byte depends only on the last ``WINDOW`` bytes read. Then every slot of
the double array is given the string of its path of edges from slot 0, and the check is that the
slots spell exactly the states' strings, each with its state's output: the longest suffix the walk
finds spelled by a slot is then the DFA's state, and counts the same feature. Run it after a
py3langid upgrade (or a change to ``walk_tables``): when it passes, put the fingerprints it prints
in ``kb.index.langid_batch.MODEL_FINGERPRINT`` and ``WALK_FINGERPRINT`` (and ``WINDOW`` if the
depth changed).

Usage: python bin/verify_langid_dfa.py   (about 10 s and 1 GB of memory)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kb.index.langid_batch import WINDOW, fingerprint, walk_tables


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
    tables = walk_tables(identifier.tk_nextmove, identifier._rowbase, identifier.tk_output)
    output = np.asarray(identifier.tk_output, dtype=np.int64)
    mismatch = _double_array_mismatch(tables, sorted_keys, output[order], longest)
    print(f"double array: {tables.base.size} slots, {mismatch or 'the trie of the states, with their outputs'}")
    print(f"walk fingerprint {tables.fingerprint()}")
    if mismatch:
        sys.exit("the double array is not the DFA's trie: keep WALK_FINGERPRINT as it is")


def _double_array_mismatch(tables, sorted_keys: np.ndarray, sorted_outputs: np.ndarray, longest: int) -> str:
    """What differs between the double array's slots and the DFA's states (``sorted_keys``: their
    strings as numbers, sorted; ``sorted_outputs``: their outputs in that order); "" when nothing."""
    base, check = tables.base.astype(np.int64), tables.check.astype(np.int64)
    children = np.flatnonzero(check >= 0)
    if (check[children] >= base.size).any():
        return "a slot's parent is past the array"
    byte = children - base[check[children]]
    if ((byte < 0) | (byte > 255)).any():
        return "a slot is no byte away from its parent's base"
    depth = np.full(base.size, -1, dtype=np.int64)
    spelled = np.zeros(base.size, dtype=np.int64)
    depth[0] = 0
    for level in range(1, longest + 2):
        ready = (depth[children] < 0) & (depth[check[children]] == level - 1)
        depth[children[ready]] = level
        spelled[children[ready]] = spelled[check[children[ready]]] * 256 + byte[ready]
    if (depth[children] < 0).any():
        return "slots off the tree or deeper than the states"
    used = np.r_[0, children]
    keys = spelled[used] + (depth[used] << 56)
    by_key = np.argsort(keys)
    if not np.array_equal(keys[by_key], sorted_keys):
        return "the slots spell other strings than the states"
    if not np.array_equal(np.asarray(tables.output, dtype=np.int64)[used[by_key]], sorted_outputs):
        return "a slot's output is not its state's"
    return ""


if __name__ == "__main__":
    main()
