"""py3langid's classification of many texts at once, with numpy instead of its per-byte loop
(design §7: an index run detects every document's language).

py3langid counts a text's features by walking a DFA over its UTF-8 bytes in a Python loop (~0.1 ms
for a 650-character page): 40 % of what detection costs the indexer, which detects every document
it writes. The DFA of py3langid 0.4's model is an Aho-Corasick automaton whose states spell at
most ``WINDOW`` (6) bytes: the state after a byte is the longest suffix of the text read so far
that some state spells, so it depends on the last ``WINDOW`` bytes alone. Starting from the start
state ``WINDOW`` bytes back (or at the text's start) and stepping to each position reaches the
state the walk reaches there, which numpy computes for every position of a batch of texts at once
in ``WINDOW`` vectorised steps. The feature counts come out equal to py3langid's, in its order
(first occurrence), and are scored as its ``_sparse_score`` scores them, with the rows of its
table gathered once per batch (``_scores``), so the scores and languages are its own, bit for bit.

That holds for the model it was proved on: ``bin/verify_langid_dfa.py`` checks every transition
of the DFA against the Aho-Corasick rule and prints the model's fingerprint (``MODEL_FINGERPRINT``).
Another model (another py3langid) has another fingerprint, and its texts are classified by
py3langid itself, one by one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from typing import Any

import numpy as np

WINDOW = 6
"""The longest byte string a state of the verified model's DFA spells."""
SEGMENT = 32
"""Bytes each lane of the vectorised walk reads (after its ``WINDOW`` bytes of lead-in)."""
MODEL_FINGERPRINT = "2e5413ca69d6fd46d48d685d91df48fb"
"""sha256 (first 32 hex digits) of the verified model's DFA (``fingerprint``), as
``bin/verify_langid_dfa.py`` prints it."""


PIECE = 1 << 20
"""Bytes of the DFA's tables ``fingerprint`` reads at a time."""


def fingerprint(identifier: Any) -> str:
    """sha256 (first 32 hex digits) of a py3langid identifier's DFA: its transitions, row table
    and outputs. Read ``PIECE`` bytes at a time; where a table is a read-only map of a file (the
    model cache, kb.index.languages) the pages of each piece are given back once it is read
    (``_release``), so the 39 MB transition table does not stay resident in every process that
    checks it (only the few pages the walk reaches do)."""
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
    batch is classified. Even one document's walk and scores reach pages all over both (the
    kernel maps the whole folio of the page cache a read page belongs to): 36 MB resident, kept
    for good in every process that classifies an index run's documents — the run's process among
    them, which classifies the batches it cuts before its cutter process is up — on top of its own
    memory. Released (the transition table's as soon as the walk is done, ``_classify_together``),
    a process holds one table's pages at a time and only while it classifies; reading them again
    costs minor faults from the page cache, not disk reads (design §7)."""
    for table in (getattr(identifier, "nb_ptc", None), getattr(identifier, "tk_nextmove", None)):
        if table is not None:
            with contextlib.suppress(TypeError, ValueError, OSError):
                _release(table)


class _Walker:
    """The verified DFA as numpy arrays (views where the model's arrays allow: no copy of its
    39 MB transition table)."""

    def __init__(self, identifier: Any) -> None:
        dtypes = {2: np.uint16, 4: np.uint32, 8: np.uint64}
        self.nextmove = np.frombuffer(identifier.tk_nextmove, dtype=dtypes[identifier.tk_nextmove.itemsize])
        # the model cache's maps (kb.index.languages) as they are: int64 rows, int32 outputs
        self.rowbase = np.asarray(identifier._rowbase, dtype=np.intp)
        self.output = np.asarray(identifier.tk_output)
        if self.output.dtype.kind not in "iu":
            raise TypeError(f"the DFA's outputs are {self.output.dtype}, not integers")
        self.features = int(identifier.nb_ptc.shape[0])

    def visits(self, samples: list[bytes]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """For each sample (UTF-8 bytes), ``py3langid.langid.visit_counts``' answer as ``(features,
        counts)`` arrays in order of first occurrence; None when the sample has no feature.

        The samples' bytes are walked as one array cut into segments of ``SEGMENT`` bytes, all
        segments a step at a time: each starts ``WINDOW`` bytes early at the start state (the
        exact state once those bytes are read), and the state returns to the start state at the
        first byte of each sample."""
        lengths = np.fromiter((len(s) for s in samples), dtype=np.intp, count=len(samples))
        data = np.frombuffer(b"".join(samples), dtype=np.uint8)
        total = data.size
        if total == 0:
            return [None] * len(samples)
        first_byte = np.zeros(total, dtype=bool)
        first_byte[(np.cumsum(lengths) - lengths)[lengths > 0]] = True
        states = np.empty(total, dtype=np.intp)
        starts = np.arange(0, total, SEGMENT, dtype=np.intp)
        ends = np.minimum(starts + SEGMENT, total)
        position = np.maximum(starts - WINDOW, 0)
        state = np.zeros(starts.size, dtype=np.intp)
        for _ in range(SEGMENT + WINDOW):
            live = position < ends
            if not live.all():
                position, state, starts, ends = position[live], state[live], starts[live], ends[live]
                if not position.size:
                    break
            state[first_byte[position]] = 0
            state = self.nextmove[self.rowbase[state] + data[position]].astype(np.intp)
            kept = position >= starts
            states[position[kept]] = state[kept]
            position = position + 1
        found = self.output[states]
        hit = found >= 0
        owner = np.repeat(np.arange(len(samples), dtype=np.intp), lengths)
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
def _walker(identifier: Any) -> _Walker | None:
    """The batch walker for ``identifier`` when its DFA is the verified one, else None."""
    try:
        verified = fingerprint(identifier) == MODEL_FINGERPRINT
    except (AttributeError, TypeError, ValueError):
        return None
    return _Walker(identifier) if verified else None


def classify_many(identifier: Any, samples: list[str]) -> list[str]:
    """``identifier.classify(sample)[0]`` for each of ``samples``, computed together (the
    verified model's DFA walk in numpy; any other model: py3langid's own, one by one). The
    pages of the mapped model it read are given back afterwards (``release_pages``)."""
    try:
        return _classify_together(identifier, samples)
    except (AttributeError, ImportError, TypeError, ValueError):
        # another py3langid's internals (the model's fingerprint matched, its code changed):
        # its own classification, one by one
        return [identifier.classify(sample)[0] for sample in samples]
    finally:
        release_pages(identifier)


def _classify_together(identifier: Any, samples: list[str]) -> list[str]:
    """``classify_many`` through the batch walker; py3langid one by one for another model.
    Raises AttributeError, ImportError or TypeError when py3langid's internals differ from 0.4's."""
    plain = not getattr(identifier, "_norm_probs", True) and getattr(identifier, "min_confidence", 0) is None
    walker = _walker(identifier) if plain else None
    if walker is None or not samples:
        return [identifier.classify(sample)[0] for sample in samples]
    from py3langid.langid import RAW_FLOOR

    encoded = [identifier._encode(sample) for sample in samples]
    visits = walker.visits(encoded)
    with contextlib.suppress(TypeError, ValueError, OSError):  # not a map: nothing to give back
        _release(identifier.tk_nextmove)  # the walk's pages, before the scores read the other table's
    languages = []
    for sample, scores in zip(samples, _scores(identifier, visits)):
        if scores is None:  # no feature at all: py3langid's own floor scores
            languages.append(identifier.classify(sample)[0])
            continue
        for i, j in identifier._alias_pairs:  # py3langid's _decide without norm_probs
            scores[i] = max(scores[i], scores[j])
            scores[j] = RAW_FLOOR
        languages.append(identifier.nb_classes[int(scores.argmax())])
    return languages


def _scores(identifier: Any, visits: list[tuple[np.ndarray, np.ndarray] | None]) -> list[np.ndarray | None]:
    """py3langid's naive-Bayes scores (``_sparse_score``: ``log1p(counts) @ nb_ptc[features] +
    nb_pc``) of each text's ``visits`` (None for a text without features), equal to its own bit for
    bit. Its table is float16 (100,053 features × 142 languages); the product casts the rows it
    gathers to float32 first, and gathering them from 28 MB for each text is most of the cost (a
    cache miss a row). So the rows of the batch's distinct features are gathered and cast once,
    a third of the rows for 64 documents, and each text's product takes its rows from that small
    float32 table: the same float32 operands, in the same order, hence the same scores."""
    present = [v[0] for v in visits if v is not None]
    if not present:
        return [None] * len(visits)
    used = np.unique(np.concatenate(present))
    table = identifier.nb_ptc[used].astype(np.float32)
    return [
        None if v is None else np.log1p(v[1]) @ table[np.searchsorted(used, v[0])] + identifier.nb_pc for v in visits
    ]
