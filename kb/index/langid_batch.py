"""py3langid's classification of many texts at once, with numpy instead of its per-byte loop
(design §7: an index run detects every document's language).

py3langid counts a text's features by walking a DFA over its UTF-8 bytes in a Python loop (~0.1 ms
for a 650-character page): 40 % of what detection costs the indexer, which detects every document
it writes. The DFA of py3langid 0.4's model is an Aho-Corasick automaton whose states spell at
most ``WINDOW`` (6) bytes: the state after a byte is the longest suffix of the text read so far
that some state spells, so it depends on the last ``WINDOW`` bytes alone. The states' strings are
a trie (every prefix of one is one), so that suffix is found by following the trie's edges from
the start state along each of the last ``WINDOW`` starts: numpy does it for every position of a
batch of texts at once in ``WINDOW`` vectorised steps, each one edge further. The feature counts
come out equal to py3langid's, in its order (first occurrence), and are scored as its
``_sparse_score`` scores them, with the rows of its table gathered once per batch (``_scores``), so
the scores and languages are its own, bit for bit.

The trie's edges are kept as a double array (``walk_tables``: 119,000 states' ``base`` and
``check``, 1.4 MB with the states' outputs), not read from py3langid's transition table: that
table holds a 1 kB row for each of 38,000 distinct states' 256 bytes (39 MB), and one batch of
64 pages visits ~3,000 of its rows all over it — ~8 MB of 4 kB pages, ~21 MB mapped in the
process, since the kernel maps the whole page-cache folio a read page belongs to (design §7).

That holds for the model it was proved on: ``bin/verify_langid_dfa.py`` checks every transition
of the DFA against the Aho-Corasick rule and every entry of the double array against the DFA's
trie, and prints both fingerprints (``MODEL_FINGERPRINT``, ``WALK_FINGERPRINT``). Another model
(another py3langid) has another fingerprint, and its texts are classified by py3langid itself,
one by one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import os
from typing import Any, BinaryIO

import numpy as np

WINDOW = 6
"""The longest byte string a state of the verified model's DFA spells."""
MODEL_FINGERPRINT = "2e5413ca69d6fd46d48d685d91df48fb"
"""sha256 (first 32 hex digits) of the verified model's DFA (``fingerprint``), as
``bin/verify_langid_dfa.py`` prints it."""
WALK_FINGERPRINT = "06025e98fd941a7fa985e405630f72fd"
"""sha256 (first 32 hex digits) of the verified model's double array (``walk_tables``,
``WalkTables.fingerprint``), as ``bin/verify_langid_dfa.py`` prints it."""


PIECE = 1 << 20
"""Bytes of the model's tables read at a time: by ``fingerprint`` and ``digest_tables``, by
``walk_tables`` (of the transition table) and by ``RowFile`` (of the naive-Bayes table)."""


def fingerprint(identifier: Any) -> str:
    """sha256 (first 32 hex digits) of a py3langid identifier's DFA: its transitions, row table
    and outputs. Read ``PIECE`` bytes at a time; where a table is a read-only map of a file (the
    model cache, kb.index.languages) the pages of each piece are given back once it is read
    (``_release``), so the 39 MB transition table does not stay resident in every process that
    checks it."""
    digest = hashlib.sha256()
    for table in (identifier.tk_nextmove, identifier.tk_row):
        _digest_in_pieces(digest, table)
    digest.update(np.asarray(identifier.tk_output, dtype=np.int64).tobytes())
    return digest.hexdigest()[:32]


def digest_tables(tables: Any) -> str:
    """sha256 (hex) of the bytes of each of ``tables`` (C-contiguous arrays or buffers) in turn,
    read ``PIECE`` bytes at a time; a read-only map's pages are given back as each piece is read
    (``_release``), so checking a mapped model leaves none of it resident (design §7)."""
    digest = hashlib.sha256()
    for table in tables:
        _digest_in_pieces(digest, table)
    return digest.hexdigest()


def _digest_in_pieces(digest: Any, table: Any) -> None:
    """Feed ``table``'s bytes to ``digest`` ``PIECE`` bytes at a time, releasing each piece's
    pages of a mapped table once read."""
    view = memoryview(table).cast("B")
    for start in range(0, len(view), PIECE):
        digest.update(view[start : start + PIECE])
        _release(table, start, min(start + PIECE, len(view)))


def _release(table: Any, start: int = 0, stop: int | None = None) -> None:
    """Give back the pages holding bytes ``start``..``stop`` (default: all) of ``table`` when it is
    (a view of) a read-only ``numpy.memmap``: ``madvise(MADV_DONTNEED)`` drops them from this
    process's resident set; the file's pages stay in the page cache, and a later read maps them
    again (a minor fault, no disk read). The partial page at each end is left to its neighbour's
    release (the last piece's runs to the map's end). Does nothing for memory that is not such a
    map, or where madvise is missing."""
    import mmap

    owner: Any = memoryview(table).obj
    while isinstance(owner, np.ndarray) and not isinstance(owner, np.memmap):
        owner = owner.base
    mapping = getattr(owner, "_mmap", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if not isinstance(owner, np.memmap) or owner.flags.writeable or not isinstance(mapping, mmap.mmap):
        return
    if advice is None or mapping.closed:
        return
    stop = owner.nbytes if stop is None else stop
    base = np.frombuffer(mapping, dtype=np.uint8).ctypes.data
    offset = owner.ctypes.data - base
    low = (offset + start) // mmap.PAGESIZE * mmap.PAGESIZE
    high = len(mapping) if stop >= owner.nbytes else (offset + stop) // mmap.PAGESIZE * mmap.PAGESIZE
    if high > low:
        mapping.madvise(advice, low, high - low)


def release_pages(identifier: Any) -> None:
    """Give back the pages of ``identifier``'s two big tables (the 28 MB naive-Bayes table and the
    39 MB transition table) when they are maps of the model cache (kb.index.languages), once a
    batch is classified. The batch walk over the cache's tables reads neither (``WalkTables``,
    ``RowFile``); py3langid's own classification (a text without features, another model) and
    scores gathered from a map reach pages all over them (the kernel maps the whole folio of the
    page cache a read page belongs to), which stayed resident for good in every process that
    classified an index run's documents, on top of its own memory. Reading them again costs minor
    faults from the page cache, not disk reads (design §7)."""
    for table in (getattr(identifier, "nb_ptc", None), getattr(identifier, "tk_nextmove", None)):
        if table is not None:
            with contextlib.suppress(TypeError, ValueError, OSError):
                _release(table)


@dataclasses.dataclass(frozen=True, eq=False)
class RowFile:
    """A C-ordered 2-D table of a model's file (the naive-Bayes table of the model cache,
    kb.index.languages) whose rows are read from the open file (``os.preadv``) rather than from a
    map of it: the rows one batch's features pick lie all over the 28 MB table, and each row read
    through a map made the whole page-cache folio around it resident, ~15 MB a batch (design §7)."""

    handle: BinaryIO
    """The open file, the very one the table's map was made from."""
    offset: int
    """Where the table's first row starts in the file."""
    shape: tuple[int, int]
    dtype: np.dtype

    def rows(self, indexes: np.ndarray) -> np.ndarray:
        """The table's rows at ``indexes`` (ascending, distinct), as ``table[indexes]`` gives them.
        The wanted rows of each ``PIECE`` of the table are read at once, from the first to the last,
        into one buffer (a read a row cost 20 ms a batch of 64 pages, a fresh buffer a read 17 ms;
        this way ~4 ms, as gathering them from the map). Raises ValueError when the file holds
        fewer bytes than the table (cut short since it was checked)."""
        width = self.shape[1] * self.dtype.itemsize
        found = np.empty((indexes.size, self.shape[1]), dtype=self.dtype)
        buffer = memoryview(bytearray(PIECE + width))
        cuts = (np.flatnonzero(np.diff(indexes * width // PIECE)) + 1).tolist()
        for first, last in zip([0, *cuts], [*cuts, indexes.size]):
            low, high = int(indexes[first]), int(indexes[last - 1]) + 1
            size = (high - low) * width
            if _read_at(self.handle.fileno(), buffer[:size], self.offset + low * width) != size:
                raise ValueError("the model's table file is shorter than its table: unpack the model again")
            block = np.frombuffer(buffer[:size], dtype=self.dtype).reshape(high - low, self.shape[1])
            found[first:last] = block[indexes[first:last] - low]
        return found


def _read_at(descriptor: int, into: memoryview, offset: int) -> int:
    """Read ``len(into)`` bytes of the file at ``offset`` into ``into``; the count read."""
    if hasattr(os, "preadv"):
        return os.preadv(descriptor, [into], offset)
    piece = os.pread(descriptor, len(into), offset)
    into[: len(piece)] = piece
    return len(piece)


@dataclasses.dataclass(frozen=True, eq=False)
class WalkTables:
    """The DFA's trie as a double array (``walk_tables``) and, where the model is a cache's files,
    its naive-Bayes table's file (``RowFile``): what ``classify_many`` reads besides py3langid's
    identifier. The state reached from ``s`` by byte ``b`` along a trie edge is ``t = base[s] + b``
    where ``check[t] == s`` (no edge otherwise); ``output[t]`` is the feature ``t`` counts (-1: none)."""

    base: np.ndarray
    check: np.ndarray
    output: np.ndarray
    rows: RowFile | None = None

    def fingerprint(self) -> str:
        """sha256 (first 32 hex digits) of the three arrays' bytes (int32, as ``walk_tables``
        makes them); the verified model's is ``WALK_FINGERPRINT``."""
        arrays = (self.base, self.check, self.output)
        if any(np.asarray(a).dtype != np.int32 or np.asarray(a).ndim != 1 for a in arrays):
            raise TypeError("the walk's tables are int32 vectors")
        return digest_tables(arrays)[:32]


EDGE_STATES = 256
"""States whose 256 transitions ``walk_tables`` reads at a time (a 512 kB index array)."""
FIT_SPAN = 1024
"""Slots of the double array ``walk_tables`` looks through at once for room for a state's edges."""


def _trie_edges(nextmove: np.ndarray, rowbase: np.ndarray, mapped: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edges ``(parents, bytes, children)`` of the DFA's breadth-first tree, in breadth-first
    order (a parent's edges together, by byte): the transitions to a state first reached one level
    deeper (the first such transition, in that order, when two reach it). In an Aho-Corasick
    automaton (``bin/verify_langid_dfa.py``) they are its trie's edges, a state's string its
    parent's and the byte. Each level reads the table from start to end, ``PIECE`` bytes at a time,
    each piece's pages given back once read when ``mapped`` (the table ``nextmove`` views) is a
    map: read in the order of the level's states, rows all over the table made most of its 39 MB
    resident at once (whole page-cache folios, design §7)."""
    depth = np.full(rowbase.size, -1, dtype=np.int16)
    depth[0] = 0
    frontier = np.zeros(1, dtype=np.intp)
    alphabet = np.arange(256, dtype=np.intp)
    step = max(PIECE // (256 * nextmove.itemsize), 1) * 256  # entries of whole rows in a piece
    parents: list[np.ndarray] = []
    bytes_: list[np.ndarray] = []
    children: list[np.ndarray] = []
    while frontier.size:
        by_row = np.argsort(rowbase[frontier], kind="stable")  # positions in the frontier
        offsets = rowbase[frontier[by_row]]
        found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for low in range(0, nextmove.size, step):
            first, last = np.searchsorted(offsets, [low, low + step])
            for start in range(int(first), int(last), EDGE_STATES):
                at = by_row[start : min(start + EDGE_STATES, int(last))]
                targets = nextmove[(rowbase[frontier[at]][:, None] + alphabet).ravel()].reshape(at.size, 256)
                row, byte = np.nonzero(depth[targets] < 0)
                found.append((at[row], byte, targets[row, byte].astype(np.intp)))
            with contextlib.suppress(TypeError, ValueError, OSError):
                _release(mapped, low * nextmove.itemsize, (low + step) * nextmove.itemsize)
        if not found:
            break
        at, byte, reached = (np.concatenate(parts) for parts in zip(*found))
        order = np.lexsort((byte, at))  # the frontier's order, then bytes
        at, byte, reached = at[order], byte[order], reached[order]
        _, first_reach = np.unique(reached, return_index=True)
        first_reach.sort()
        at, byte, reached = at[first_reach], byte[first_reach], reached[first_reach]
        depth[reached] = len(parents) + 1
        parents.append(frontier[at])
        bytes_.append(byte)
        children.append(reached)
        frontier = reached
    if not parents:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    return np.concatenate(parents), np.concatenate(bytes_), np.concatenate(children)


def walk_tables(nextmove: Any, rowbase: Any, output: Any) -> WalkTables:
    """The trie of the DFA (py3langid's transitions ``nextmove``, its rows' offsets ``rowbase`` and
    its states' ``output``) as a double array, ``WalkTables`` (without ``rows``): the edges of its
    breadth-first tree (``_trie_edges``) packed by ``_pack``. Deterministic, so the verified model
    always gives the tables ``WALK_FINGERPRINT`` names. Reads the transition table a piece at a
    time (its pages given back when mapped) and holds ~10 MB while it works (about a second).
    Made once, when the model cache is unpacked (kb.index.languages). Raises ValueError for a DFA
    too large for int32 tables."""
    dtypes = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    view = memoryview(nextmove)
    transitions = np.frombuffer(view, dtype=dtypes[view.itemsize]) if view.ndim == 1 else np.asarray(nextmove)
    offsets = np.asarray(rowbase, dtype=np.intp)
    parents, bytes_, children = _trie_edges(transitions, offsets, nextmove)
    slot, base_of = _pack(offsets.size, parents, bytes_, children)
    reached = np.flatnonzero(slot >= 0)
    size = max(int(slot.max()) + 1, int(base_of.max()) + 256)
    if size >= 2**31:
        raise ValueError("the DFA is too large for the walk's int32 tables")
    base = np.zeros(size, dtype=np.int32)
    check = np.full(size, -1, dtype=np.int32)
    states = np.full(size, -1, dtype=np.int32)
    base[slot[reached]] = base_of[reached]
    check[slot[children]] = slot[parents]
    states[slot[reached]] = np.asarray(output)[reached]
    return WalkTables(base, check, states)


def _pack(states: int, parents: np.ndarray, bytes_: np.ndarray, children: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The double array of a tree's edges (``_trie_edges``) over ``states`` states: ``(slot,
    base)`` by state, a child's slot being its parent's base plus its byte, every slot used once
    (the start state's is 0; -1 for a state off the tree). States with more edges are placed first
    (they are the hard ones to fit), each at the first base where all its edges find free slots
    (looked for after the first free slot, then near the last used one); states of one edge fill
    the gaps left, in order: 119,000 slots for py3langid's 104,583 states."""
    starts = np.flatnonzero(np.r_[True, parents[1:] != parents[:-1]])
    counts = np.diff(np.r_[starts, parents.size])
    slot = np.full(states, -1, dtype=np.intp)
    slot[0] = 0
    base_of = np.zeros(states, dtype=np.intp)
    used = np.zeros(children.size + 2 * (FIT_SPAN + 512), dtype=bool)
    used[0] = True
    free, top = 1, 0
    order = np.argsort(-counts, kind="stable")
    for group in order[counts[order] > 1].tolist():
        edges = bytes_[starts[group] : starts[group] + counts[group]]
        low = int(edges[0])
        gaps = (edges[1:] - low).tolist()
        while used[free]:
            free += 1
        for first in (max(free, low + 1), max(top + 1 - FIT_SPAN // 2, low + 1, free)):
            if first + FIT_SPAN + 256 > used.size:
                used = np.concatenate([used, np.zeros(used.size, dtype=bool)])
            window = used[first : first + FIT_SPAN + 256]
            room = ~window[:FIT_SPAN]
            for gap in gaps:
                room &= ~window[gap : gap + FIT_SPAN]
            fits = np.flatnonzero(room)
            if fits.size:
                first += int(fits[0])
                break
        else:  # the second window reaches past every used slot: never
            raise ValueError("no room for a state's edges in the double array")
        placed = first - low + edges
        used[placed] = True
        top = max(top, int(placed[-1]))
        base_of[parents[starts[group]]] = first - low
        slot[children[starts[group] : starts[group] + counts[group]]] = placed
    single = starts[counts == 1]
    holes = np.flatnonzero(~used[256:])[: single.size] + 256  # base = slot - byte >= 1
    base_of[parents[single]] = holes - bytes_[single]
    slot[children[single]] = holes
    return slot, base_of


class _Walker:
    """The verified DFA's walk over the trie's double array (``WalkTables``)."""

    def __init__(self, tables: WalkTables, features: int) -> None:
        self.base, self.check, self.output = (np.asarray(a) for a in (tables.base, tables.check, tables.output))
        self.features = features

    def visits(self, samples: list[bytes]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """For each sample (UTF-8 bytes), ``py3langid.langid.visit_counts``' answer as ``(features,
        counts)`` arrays in order of first occurrence; None when the sample has no feature.

        The samples' bytes are one array. Step ``k`` follows the trie's edge from the state each
        start position reached after ``k`` bytes (the start state at first) by the byte ``k``
        further, within the start's sample; where it exists, the position it ends at is reached by
        a ``k + 1``-byte suffix, longer than the earlier steps', so it overwrites theirs. After
        ``WINDOW`` steps each position holds the state spelling its longest suffix, the DFA's."""
        lengths = np.fromiter((len(s) for s in samples), dtype=np.intp, count=len(samples))
        data = np.frombuffer(b"".join(samples), dtype=np.uint8)
        total = data.size
        if total == 0:
            return [None] * len(samples)
        owner = np.repeat(np.arange(len(samples), dtype=np.intp), lengths)
        end = np.cumsum(lengths)[owner]  # where each position's sample ends
        reached = np.zeros(total, dtype=np.int32)  # the start state where no state ends
        start = np.arange(total, dtype=np.intp)
        state = np.zeros(total, dtype=np.int32)
        for step in range(WINDOW):
            at = start + step
            if step:
                inside = at < end[start]
                start, at, state = start[inside], at[inside], state[inside]
            child = self.base[state] + data[at]
            edge = self.check[child] == state
            start, at, state = start[edge], at[edge], child[edge]
            if not state.size:
                break
            reached[at] = state
        found = self.output[reached]
        hit = found >= 0
        keys = owner[hit] * self.features + found[hit]
        distinct, first, counts = np.unique(keys, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")  # positions are in text order: texts, then occurrences
        distinct, counts = distinct[order], counts[order]
        texts, features = np.divmod(distinct, self.features)
        bounds = np.searchsorted(texts, np.arange(len(samples) + 1))
        return [
            (features[a:b], counts[a:b].astype(np.float32)) if b > a else None
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())
        ]


@functools.cache
def _walker(identifier: Any, tables: WalkTables | None = None) -> _Walker | None:
    """The batch walker for ``identifier`` over ``tables`` when they are the verified model's
    (``WALK_FINGERPRINT``), else None. Without ``tables`` (py3langid's own identifier, a process
    without the model cache) they are made from the identifier's DFA when it is the verified one
    (``MODEL_FINGERPRINT``; about a second)."""
    try:
        if tables is None:
            if fingerprint(identifier) != MODEL_FINGERPRINT:
                return None
            tables = walk_tables(identifier.tk_nextmove, identifier._rowbase, identifier.tk_output)
        if tables.fingerprint() != WALK_FINGERPRINT:
            return None
        return _Walker(tables, int(identifier.nb_ptc.shape[0]))
    except (AttributeError, TypeError, ValueError):
        return None


def classify_many(identifier: Any, samples: list[str], tables: WalkTables | None = None) -> list[str]:
    """``identifier.classify(sample)[0]`` for each of ``samples``, computed together (the
    verified model's DFA walk in numpy, over ``tables`` when given — the model cache's, made once
    — else over tables made from the identifier; any other model: py3langid's own, one by one).
    The pages of the mapped model py3langid's own classification read are given back afterwards
    (``release_pages``)."""
    try:
        return _classify_together(identifier, samples, tables)
    except (AttributeError, ImportError, TypeError, ValueError):
        # another py3langid's internals (the model's fingerprint matched, its code changed):
        # its own classification, one by one
        return [identifier.classify(sample)[0] for sample in samples]
    finally:
        release_pages(identifier)


def _classify_together(identifier: Any, samples: list[str], tables: WalkTables | None) -> list[str]:
    """``classify_many`` through the batch walker; py3langid one by one for another model.
    Raises AttributeError, ImportError or TypeError when py3langid's internals differ from 0.4's."""
    plain = not getattr(identifier, "_norm_probs", True) and getattr(identifier, "min_confidence", 0) is None
    walker = _walker(identifier, tables) if plain else None
    if walker is None or not samples:
        return [identifier.classify(sample)[0] for sample in samples]
    from py3langid.langid import RAW_FLOOR

    encoded = [identifier._encode(sample) for sample in samples]
    visits = walker.visits(encoded)
    languages = []
    rows = None if tables is None else tables.rows
    for sample, scores in zip(samples, _scores(identifier, visits, rows)):
        if scores is None:  # no feature at all: py3langid's own floor scores
            languages.append(identifier.classify(sample)[0])
            continue
        for i, j in identifier._alias_pairs:  # py3langid's _decide without norm_probs
            scores[i] = max(scores[i], scores[j])
            scores[j] = RAW_FLOOR
        languages.append(identifier.nb_classes[int(scores.argmax())])
    return languages


def _scores(
    identifier: Any, visits: list[tuple[np.ndarray, np.ndarray] | None], rows: RowFile | None = None
) -> list[np.ndarray | None]:
    """py3langid's naive-Bayes scores (``_sparse_score``: ``log1p(counts) @ nb_ptc[features] +
    nb_pc``) of each text's ``visits`` (None for a text without features), equal to its own bit for
    bit. Its table is float16 (100,053 features × 142 languages); the product casts the rows it
    gathers to float32 first, and gathering them from 28 MB for each text is most of the cost (a
    cache miss a row). So the rows of the batch's distinct features are gathered and cast once,
    a third of the rows for 64 documents, and each text's product takes its rows from that small
    float32 table: the same float32 operands, in the same order, hence the same scores. With
    ``rows`` (the table's file, ``RowFile``) the rows are read from the file, not the map."""
    present = [v[0] for v in visits if v is not None]
    if not present:
        return [None] * len(visits)
    used = np.unique(np.concatenate(present))
    table = (identifier.nb_ptc[used] if rows is None else rows.rows(used)).astype(np.float32)
    return [
        None if v is None else np.log1p(v[1]) @ table[np.searchsorted(used, v[0])] + identifier.nb_pc for v in visits
    ]
