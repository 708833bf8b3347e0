"""design §7: an index run detects its documents' languages a batch at a time
(``kb.index.languages.detect_languages``, kb.index.langid_batch), with py3langid's answers."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from kb.index.langid_batch import MODEL_FINGERPRINT, fingerprint

TEXTS = [
    "",
    "   ",
    "a",
    "1234 5678 !!!",
    "```\ncode only\n```",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Der schnelle braune Fuchs springt über den faulen Hund, während die Brücken stürzen.",
    "Le renard brun rapide saute par-dessus le chien paresseux; où est l'élève ?",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول",
    "واش نتا بخير؟ شنو درتي اليوم؟ بغيت نمشي للسوق",
    "素早い茶色の狐がのろまな犬を飛び越える。東京都に住んでいます。",
    "敏捷的棕色狐狸跳过了懒狗。我們在這裡等你。",
    "佢哋喺度等緊你，你快啲嚟啦",
    "빠른 갈색 여우가 게으른 개를 뛰어넘습니다.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "LOUD UPPER CASE TITLE WITH WORDS",
    "e\u0301le\u0300ve decomposed accents",
    "# Heading\n\nSome text with a [link](https://example.com/x) and `inline code`.\n\n- item\n",
    "x" * 9000,
]


def _random_texts(count: int, seed: int) -> list[str]:
    alphabets = [
        "abcdefghijklmnopqrstuvwxyz     .,\n",
        "äöüßéèàçñ abcdefghij ",
        "абвгдеёжзийклмнопрстуфхцчшщъыьэюя ",
        "ابتثجحخدذرزسشصضطظعغفقكلمنهوي ",
        "あいうえおかきくけこアイウエオ東京都日本語中文字 ",
        "🙂🎉✓ \u0301\u0300 \t",
    ]
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = [rng.choice(alphabets) for _ in range(rng.randint(1, 3))]
        texts.append("".join(rng.choice(rng.choice(parts)) for _ in range(rng.randint(0, 700))))
    return texts


def test_the_batch_detection_answers_what_detection_one_by_one_answers():
    from kb.index.languages import detect_language, detect_languages

    texts = TEXTS + _random_texts(300, seed=7)
    assert detect_languages(texts) == [detect_language(t) for t in texts]
    assert detect_languages([]) == []
    # a batch of one, and the batch split anywhere, give the same answers
    assert [detect_languages([t])[0] for t in TEXTS] == [detect_language(t) for t in TEXTS]


def test_the_vectorised_walk_counts_the_features_py3langid_counts_in_its_order():
    import py3langid.langid as langid

    from kb.index.langid_batch import _walker

    identifier = langid._get_identifier()
    walker = _walker(identifier)
    assert walker is not None, "py3langid's model is not the one the windowed walk was proved on"
    rng = random.Random(11)
    samples = [identifier._encode(t) for t in TEXTS] + [rng.randbytes(rng.randint(0, 90)) for _ in range(200)]
    for sample, answer in zip(samples, walker.visits(samples)):
        expected = langid.visit_counts(identifier.tk_nextmove, identifier._rowbase, identifier.tk_output, sample)
        if expected is None:
            assert answer is None
        else:
            features, counts = answer
            assert list(expected.items()) == list(zip(features.tolist(), counts.astype(int).tolist()))
            scores = np.log1p(counts) @ identifier.nb_ptc[features] + identifier.nb_pc
            assert np.array_equal(scores, identifier._raw_score(sample))


def test_the_batch_scores_equal_py3langids_bit_for_bit():
    """The scores computed from one float32 table of the batch's distinct features are
    py3langid's own (``_raw_score``), not merely close: the detected language cannot differ on a
    near tie. Texts of six scripts, batched as an index run batches them (64), and one alone."""
    import py3langid.langid as langid

    from kb.index.langid_batch import _scores, _walker
    from kb.index.languages import _sample

    identifier = langid._get_identifier()
    walker = _walker(identifier)
    assert walker is not None
    samples = [identifier._encode(_sample(t)) for t in TEXTS + _random_texts(200, seed=5)]
    compared = 0
    for batch in [samples[:1], *(samples[start : start + 64] for start in range(0, len(samples), 64))]:
        for sample, scores in zip(batch, _scores(identifier, walker.visits(batch))):
            expected = identifier._raw_score(sample) if scores is not None else None
            assert (scores is None) == (
                langid.visit_counts(identifier.tk_nextmove, identifier._rowbase, identifier.tk_output, sample) is None
            )
            if scores is not None:
                assert scores.dtype == expected.dtype and np.array_equal(scores, expected)
                compared += 1
    assert compared > 150


def _classifying_itself(**attributes):
    """An identifier with py3langid's plain settings and ``attributes`` (arrays of its model),
    whose own ``classify`` answers ``"own"``: what the batch path must fall back to."""

    def classify(self, sample):
        return ("own", 1.0)

    kind = type("Identifier", (), {"_norm_probs": False, "min_confidence": None, "classify": classify})
    identifier = kind()
    identifier.__dict__.update(attributes)
    return identifier


def test_another_model_is_classified_by_py3langid_itself(monkeypatch):
    """The walk is exact for the model it was proved on; an identifier whose DFA differs (here:
    one transition changed) gets py3langid's own classification."""
    import py3langid.langid as langid

    from kb.index import langid_batch

    identifier = langid._get_identifier()
    assert fingerprint(identifier) == MODEL_FINGERPRINT

    changed = _classifying_itself(
        tk_nextmove=identifier.tk_nextmove[:], tk_row=identifier.tk_row, tk_output=identifier.tk_output
    )
    changed.tk_nextmove[300] = (changed.tk_nextmove[300] + 1) % 1000
    assert langid_batch._walker(changed) is None
    assert langid_batch.classify_many(changed, ["the text", "der Text"]) == ["own", "own"]


@pytest.mark.parametrize("size", [1, 5, 6, 7, 31, 32, 33, 38, 39, 64, 65])
def test_walk_lanes_meet_text_and_segment_boundaries(size):
    """Texts whose lengths straddle the walk's window and segments, in one batch."""
    import py3langid.langid as langid

    from kb.index.langid_batch import _walker

    identifier = langid._get_identifier()
    rng = random.Random(size)
    samples = [rng.randbytes(size) for _ in range(5)] + [b"", rng.randbytes(size + 1)]
    for sample, answer in zip(samples, _walker(identifier).visits(samples)):
        expected = langid.visit_counts(identifier.tk_nextmove, identifier._rowbase, identifier.tk_output, sample)
        assert (answer is None) == (expected is None)
        if answer is not None:
            assert list(expected.items()) == list(zip(answer[0].tolist(), answer[1].astype(int).tolist()))


def test_a_py3langid_whose_internals_changed_under_the_same_model_is_classified_by_itself():
    """The fingerprint proves the model, not py3langid's code: an identifier with the verified
    DFA but without the internals the walk reads (here: no ``_alias_pairs``, no ``_encode``) is
    classified by its own ``classify``, not failed with AttributeError."""
    import py3langid.langid as langid

    from kb.index import langid_batch

    identifier = langid._get_identifier()

    renamed = _classifying_itself(
        tk_nextmove=identifier.tk_nextmove,
        tk_row=identifier.tk_row,
        tk_output=identifier.tk_output,
        _rowbase=identifier._rowbase,
        nb_ptc=identifier.nb_ptc,
    )
    assert langid_batch.classify_many(renamed, ["the text", "der Text"]) == ["own", "own"]


def _resident_kb(path: Path) -> int | None:
    """kB of the maps of ``path`` resident in this process (/proc/self/smaps); None when this
    process does not map it."""
    resident, inside, mapped = 0, False, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split(maxsplit=1)[0]
        if not first.endswith(":"):  # a mapping's header: address range, ..., path
            inside = line.endswith(" " + str(path))
            mapped = mapped or inside
        elif inside and first == "Rss:":
            resident += int(line.split()[1])
    return resident if mapped else None


@pytest.fixture
def cached_model(tmp_path, monkeypatch):
    """The model as a later process of an index run sees it: unpacked into a model cache
    (``tmp_path``) by an earlier one, mapped from there. Yields ``(identifier, tables, folder)``:
    kb's identifier, the cache's walk tables (``langid_batch.WalkTables``) and the model's folder."""
    from kb.index import languages

    monkeypatch.setattr(languages, "_cache_root", None)
    languages._model.cache_clear()
    languages._classifier.cache_clear()
    try:
        languages.cache_in(tmp_path)
        languages._identifier()  # the model unpacked into the cache
        languages._model.cache_clear()
        languages._classifier.cache_clear()
        identifier = languages._identifier()  # a later process's, mapped from it
        (folder,) = tmp_path.glob("py3langid-*")
        yield identifier, languages._model()[-1], folder
    finally:
        languages._model.cache_clear()
        languages._classifier.cache_clear()


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_the_fingerprint_leaves_little_of_the_mapped_transition_table_resident(cached_model):
    """Checking the model's fingerprint read the 39 MB transition table whole: with the table a map
    of the model cache's file, every page of it stayed resident in every process that checked it
    (the index run's and its cutter's). Read a piece at a time, the pages of each piece are given
    back, and the walker built on the cache's walk tables copies none of them."""
    from kb.index import langid_batch, languages

    identifier, tables, folder = cached_model
    table = folder / "nextmove.npy"
    assert table.stat().st_size > 30 * 2**20
    assert _resident_kb(table) is not None  # mapped
    assert fingerprint(identifier) == MODEL_FINGERPRINT
    assert _resident_kb(table) <= 2 * langid_batch.PIECE // 1024
    walker = langid_batch._walker(identifier, tables)
    assert walker is not None
    assert np.shares_memory(walker.base, np.asarray(tables.base))
    assert np.shares_memory(walker.check, np.asarray(tables.check))
    assert languages.detect_languages(TEXTS) == [languages.detect_language(t) for t in TEXTS]


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_a_batch_classified_leaves_none_of_the_mapped_model_resident(cached_model):
    """One document's walk and scores reach pages all over the two big tables (36 MB, the kernel
    mapping whole folios of the page cache), and every process that classified an index run's
    documents kept them resident on top of its own memory. ``classify_many`` gives them back once a
    batch is classified; the next batch reads them again, with the same answers."""
    from kb.index import languages

    _identifier, _tables, folder = cached_model
    texts = TEXTS + _random_texts(100, seed=3)
    expected = [languages.detect_language(t) for t in texts]
    for _ in range(2):
        assert languages.detect_languages(texts) == expected
        assert _resident_kb(folder / "nextmove.npy") == 0 and _resident_kb(folder / "ptc.npy") == 0


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux's /proc/self/smaps")
def test_classifying_a_batch_maps_no_page_of_the_two_big_tables(cached_model, monkeypatch):
    """A batch's walk visited ~3,000 rows all over the 39 MB transition table and its scores
    ~2,500 rows of the 28 MB naive-Bayes table: the kernel maps the whole page-cache folio a read
    page belongs to, so while a batch was classified the cutter held ~21 MB, then ~15 MB of them
    (its peak, 1.28× the chunker and embedder alone). The walk now follows the cache's double array
    (1.4 MB) and the scores read their rows from the table's file: at every point where pages are
    given back, none of either table's is resident."""
    from kb.index import langid_batch, languages

    _identifier, _tables, folder = cached_model
    # all with features: a text without any ("a") is scored by py3langid itself, whose own walk
    # reads the transition table (its pages given back afterwards)
    texts = [t for t in TEXTS if t != "a"] + _random_texts(200, seed=17)
    languages.detect_languages(texts[:5])  # the walker built, its tables' fingerprint checked
    seen: list[tuple[int | None, int | None]] = []
    release = langid_batch._release

    def observed(table, start=0, stop=None):
        seen.append((_resident_kb(folder / "nextmove.npy"), _resident_kb(folder / "ptc.npy")))
        release(table, start, stop)

    monkeypatch.setattr(langid_batch, "_release", observed)
    for start in range(0, len(texts), 64):
        languages.detect_languages(texts[start : start + 64])
    assert seen and all(resident == (0, 0) for resident in seen), seen


def test_the_walk_over_the_caches_tables_answers_what_py3langid_itself_answers(cached_model):
    """The double array the cache keeps (states renumbered, edges only) and the rows read from the
    naive-Bayes table's file give py3langid's own feature counts, in its order, its scores bit for
    bit and its languages — py3langid's as it unpacks and walks its model itself."""
    import py3langid
    import py3langid.langid as langid

    from kb.index import langid_batch
    from kb.index.languages import _sample

    identifier, tables, _folder = cached_model
    assert tables.rows is not None and tables.fingerprint() == langid_batch.WALK_FINGERPRINT
    own = langid._get_identifier()
    texts = [_sample(t) for t in TEXTS + _random_texts(300, seed=13)]
    walker = langid_batch._walker(identifier, tables)
    assert walker is not None
    samples = [own._encode(t) for t in texts]
    compared = 0
    for start in range(0, len(samples), 64):
        batch = samples[start : start + 64]
        visits = walker.visits(batch)
        for sample, answer, scores in zip(batch, visits, langid_batch._scores(identifier, visits, tables.rows)):
            expected = langid.visit_counts(own.tk_nextmove, own._rowbase, own.tk_output, sample)
            assert (answer is None) == (expected is None) == (scores is None)
            if answer is not None:
                assert list(expected.items()) == list(zip(answer[0].tolist(), answer[1].astype(int).tolist()))
                assert np.array_equal(scores, own._raw_score(sample))
                compared += 1
    assert compared > 250
    assert langid_batch.classify_many(identifier, texts, tables) == [py3langid.classify(t)[0] for t in texts]


def test_the_walk_tables_made_from_py3langids_model_are_the_verified_ones():
    """Made again from py3langid's own model (as every model cache makes them), the double array
    is byte for byte the one ``bin/verify_langid_dfa.py`` checked against the DFA: every state has
    one slot, and the start state's is 0."""
    import py3langid.langid as langid

    from kb.index import langid_batch

    identifier = langid._get_identifier()
    tables = langid_batch.walk_tables(identifier.tk_nextmove, identifier._rowbase, identifier.tk_output)
    assert tables.fingerprint() == langid_batch.WALK_FINGERPRINT
    used = np.flatnonzero(tables.check >= 0)
    assert used.size + 1 == len(identifier._rowbase)  # every state but the start state is a child once
    assert tables.check[0] == -1 and tables.output[0] == identifier.tk_output[0]


@pytest.mark.parametrize("preadv", [True, False], ids=["preadv", "pread"])
def test_rows_read_from_the_tables_file_are_the_tables_rows(cached_model, tmp_path, monkeypatch, preadv):
    """``RowFile`` reads the rows a batch wants a piece of the table at a time: the same rows as
    indexing the mapped table, at its ends and across pieces (with ``os.preadv``, and with
    ``os.pread`` where there is none); a file cut short since it was checked is refused
    (ValueError: the batch is classified by py3langid itself), not read as zeros."""
    import os
    import shutil

    from kb.index.langid_batch import PIECE, RowFile

    if not preadv:
        monkeypatch.delattr(os, "preadv", raising=False)
    identifier, tables, folder = cached_model
    table = np.asarray(identifier.nb_ptc)
    rows = tables.rows
    assert rows is not None
    last = table.shape[0] - 1
    edge = PIECE // (table.shape[1] * table.dtype.itemsize)  # the first row starting in the second piece
    rng = np.random.default_rng(5)
    for wanted in (
        [0],
        [last],
        [0, 1, 2, last - 1, last],
        [edge - 1, edge, edge + 1, 3 * edge - 1, 3 * edge],
        np.unique(rng.integers(0, last + 1, 3000)).tolist(),
    ):
        indexes = np.array(wanted, dtype=np.intp)
        assert np.array_equal(rows.rows(indexes), table[indexes])
    copy = tmp_path / "ptc-copy.npy"
    shutil.copyfile(folder / "ptc.npy", copy)
    with open(copy, "rb") as handle:
        short = RowFile(handle, rows.offset, rows.shape, rows.dtype)
        with open(copy, "r+b") as writer:
            writer.truncate(copy.stat().st_size - 1000)
        assert np.array_equal(short.rows(np.array([0, 5])), table[[0, 5]])
        with pytest.raises(ValueError, match="shorter"):
            short.rows(np.array([3, last]))
