"""Languages of the full-text leg (design §7, §8): per-document language detection, the matching
Postgres text-search configuration, and CJK segmentation.

- ``detect_language(text)``: ISO 639-1 code from py3langid (a compact, offline n-gram classifier
  covering 97 languages) over the document's first ``DETECT_CHARS`` characters.
- ``language_share(text, languages)``: the probability that ``text`` is in one of ``languages``
  (search uses it to weigh the vector leg by what the embedding model covers).
- ``text_config(language)``: the Postgres configuration with that language's stemmer and stop
  words (``german``, ``russian``, ``kb.arabic``, …), ``kb.simple_unaccent`` (``simple`` with accents
  folded, migration 0014) for every other language.
- ``lexical_text(text)``: text as the full-text parser should see it. First in Unicode
  normalization form C: "ü" typed as one character and as "u" + a combining diaeresis (text from
  macOS file names or PDFs) is one word to a reader but two to Postgres' parser and stemmers
  (german: "Brücken" → 'bruck', its decomposed form → 'brück'), so a query in one form missed a
  page in the other. Then Chinese and Japanese, which have no spaces (Postgres would take a whole
  sentence as one token): every run of CJK characters is replaced by its overlapping character
  bigrams and its single characters (东京都 → 东京 京都 东 京 都), the segmentation of Lucene's
  CJKBigramFilter with ``outputUnigrams``, so a query's bigrams meet the document's and a query of
  one character (猫, 書) finds the pages holding it inside a longer run (with bigrams alone it
  found only pages where the character stood alone).
- ``lexical_query(text)``: a query as the full-text parser should see it: ``lexical_text`` with the
  bigrams of every CJK run, and its single characters too when the query is Chinese (where one
  character is often a word: 書, 貓, 用) or the run is one character long. A Japanese query keeps
  bigrams only: its single kana are mostly particles (の, を, は) that match every page.
  bin/eval_search.py, tune split, use-m3: Chinese recall@5 .664 → .674 with the unigrams in
  query and pages; Japanese .573 unchanged (.565 had its queries' unigrams been kept too).
- The classifier's model ships LZMA-compressed (68 MB unpacked); unpacking it took 0.6 s, most of
  a cold ``kb search`` with MiniLM, whose vector leg asks ``language_share``. ``cache_in(folder)``
  (the model cache, ``KB_MODEL_CACHE``) makes the first load keep it there unpacked, one ``.npy``
  file per array; later processes map those files (about 20 ms) and get the same arrays, hence the
  same answers (design §7, §14). The first process too unpacks into the files (an array at a time)
  and maps them, and so does a process without a writable cache (into a folder of its own): the
  arrays are read-only maps in every process, pages of the file cache shared by an index run's
  processes, never a private copy of 68 MB in each.
- ``lexically_stable(*texts)``: whether ``lexical_text`` leaves the texts' words as an earlier kb
  (before normalization) indexed them, i.e. they are already in form C; the indexer re-derives the
  chunks of a document that is not, so a reindex brings such pages to the normalized form. Chunk
  rows an earlier kb wrote with CJK bigrams alone are found by ``chunks_of_documents``
  (``cjk_current``) and written again the same way.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
import unicodedata
from pathlib import Path
from typing import BinaryIO

DETECT_CHARS = 4000
"""Characters of a document given to the language classifier (its start is representative)."""

POSTGRES_CONFIGS = {
    "ar": "kb.arabic",
    "hy": "armenian",
    "eu": "basque",
    "ca": "catalan",
    "da": "danish",
    "nl": "dutch",
    "en": "english",
    "et": "estonian",
    "fi": "finnish",
    "fr": "french",
    "de": "german",
    "el": "greek",
    "hi": "hindi",
    "hu": "hungarian",
    "id": "indonesian",
    "ga": "irish",
    "it": "italian",
    "lt": "lithuanian",
    "ne": "nepali",
    "no": "norwegian",
    "nb": "norwegian",
    "pt": "portuguese",
    "ro": "romanian",
    "ru": "russian",
    "sr": "serbian",
    "es": "spanish",
    "sv": "swedish",
    "ta": "tamil",
    "tr": "turkish",
    "yi": "yiddish",
}
"""ISO 639-1 code → Postgres' built-in text-search configuration (PostgreSQL 15+ ship them all),
but Arabic → ``kb.arabic`` (migration 0033): ``arabic`` with words in Latin letters stemmed as
English, as Postgres' ``russian`` and ``hindi`` have them (``arabic`` left them as written, so an
Arabic page's "plugins" missed a query's "plugin"; design §8)."""

FALLBACK_CONFIG = "kb.simple_unaccent"

# Han (incl. extension A and compatibility ideographs), Hiragana, Katakana (incl. the prolonged
# sound mark), Hangul syllables.
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
_MARKUP = re.compile(r"```.*?```|`[^`]*`|\[\[[^\]]*\]\]|\]\([^)]*\)|<[^>]+>|https?://\S+", re.DOTALL)


_LOADED = threading.Lock()
_cache_root: Path | None = None
_MODEL_ARRAYS = ("ptc", "pc", "nextmove", "nextmove_row", "out_feat")
_ROWBASE = "rowbase"
"""The derived table py3langid's tokenizer indexes its transitions by (``nextmove_row`` << 8, int64),
kept beside the model's arrays so that it too is mapped rather than a list in every process."""
_WALK_ARRAYS = ("walk_base", "walk_check", "walk_output")
"""The double array of the DFA's trie the batch classification walks (``langid_batch.walk_tables``,
made once from the model's arrays), kept beside them: its pages, not the 39 MB transition table's,
are what classifying a batch maps (design §7)."""
_DIGEST = "sha256.txt"
"""The digest of the unpacked arrays' bytes (``langid_batch.digest_tables``), written with them and
checked by every process that maps them."""
PIECE = 1 << 20
"""Bytes copied at a time while the model is unpacked: what the unpacking process holds of it."""


def cache_in(folder: Path) -> None:
    """Keep the classifier's unpacked model under ``folder`` (the model cache): a process that
    loads it later maps the files instead of unpacking the compressed model (0.6 s)."""
    global _cache_root
    _cache_root = folder


def _model_folder(root: Path) -> Path:
    """``{root}/py3langid-{12 hex}``: the hex of the package version and the compressed model's
    path, size and mtime, so an upgraded or changed model is unpacked again."""
    import py3langid
    from py3langid.langid import MODEL_DIR, MODEL_FILE

    source = (MODEL_DIR / MODEL_FILE).resolve()
    stat = source.stat()
    key = f"{py3langid.__version__}\0{source}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return root / f"py3langid-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _map_npy(handle: BinaryIO):
    """The array of the ``.npy`` file open as ``handle``, mapped read-only from that very file
    (``numpy.load`` maps a path, which another process may replace between two opens). Raises
    ValueError (EOFError) for a header it cannot read or an array of Python objects."""
    import numpy as np
    from numpy.lib import format as npy

    version = npy.read_magic(handle)
    readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
    if version not in readers:
        raise ValueError(f"an .npy file of version {version}")
    shape, fortran, dtype = readers[version](handle)
    if dtype.hasobject:
        raise ValueError("an .npy file of Python objects")
    return np.memmap(handle, dtype=dtype, mode="r", offset=handle.tell(), shape=shape, order="F" if fortran else "C")


def _read_unpacked(folder: Path) -> tuple | None:
    """The model's arrays mapped read-only from ``folder`` as ``LanguageIdentifier`` takes them,
    its row table (``_ROWBASE``) and the walk's tables (``_WALK_ARRAYS``, with the naive-Bayes
    table's file kept open to read its rows from: ``langid_batch.WalkTables``): ``(ptc, pc,
    classes, nextmove, output, row, rowbase, tables)``; None when the folder is missing or
    inconsistent (then the compressed model is unpacked)."""
    handles: dict[str, BinaryIO] = {}
    try:
        for name in (*_MODEL_ARRAYS, _ROWBASE, *_WALK_ARRAYS):
            handles[name] = open(folder / f"{name}.npy", "rb")  # ptc's stays open (below)
        arrays = {name: _map_npy(handle) for name, handle in handles.items()}
        classes = json.loads((folder / "classes.json").read_text())
        found = _checked(folder, arrays, classes, handles["ptc"])
    except (OSError, ValueError, EOFError):  # missing, or a file cut short
        found = None
    for name, handle in handles.items():
        if name != "ptc" or found is None:
            handle.close()  # the maps stay
    return found


def _checked(folder: Path, arrays: dict, classes: object, ptc_file: BinaryIO) -> tuple | None:
    """``_read_unpacked``'s answer from the mapped ``arrays`` when they and ``classes`` are
    consistent and their digest is the one written with them, else None."""
    import numpy as np

    from kb.index.langid_batch import RowFile, WalkTables, digest_tables

    ptc, pc, nextmove, row, out, rowbase = (arrays[name] for name in (*_MODEL_ARRAYS, _ROWBASE))
    base, check, states = (arrays[name] for name in _WALK_ARRAYS)
    # Whole files of the wrong kind or size (another writer's layout, a damaged header) would make
    # every classification raise, not fall back: their kinds, shapes and the indexes the tokenizer
    # follows into the other arrays are checked (the small ones scanned, about 1 ms).
    if not (
        isinstance(classes, list)
        and all(isinstance(name, str) for name in classes)
        and ptc.ndim == 2
        and pc.ndim == nextmove.ndim == row.ndim == out.ndim == 1
        and ptc.dtype.kind == pc.dtype.kind == "f"
        and {nextmove.dtype.kind, row.dtype.kind, out.dtype.kind} <= {"i", "u"}
        and ptc.shape[1] == len(classes) == pc.shape[0]
        and nextmove.size % 256 == 0
        and row.shape == out.shape == rowbase.shape
        and row.size > 0
        and row.min() >= 0
        and row.max() < nextmove.size // 256
        and out.max() < ptc.shape[0]
        and rowbase.dtype == np.int64
        and np.array_equal(rowbase, row.astype(np.int64) << 8)
        and base.dtype == check.dtype == states.dtype == np.int32
        and base.ndim == 1
        and base.shape == check.shape == states.shape
        and base.size > 256
        and states.max() < ptc.shape[0]
        and ptc.flags.c_contiguous
    ):
        return None
    # Files of the right layout whose bytes changed (a disk fault, another program) were used as
    # they were: a transition to a state past the table's end made every classification raise
    # IndexError, in py3langid's own fallback too, and changed scores answered other languages.
    # Their digest is checked against the one written with them (the maps' pages given back as read).
    recorded = (folder / _DIGEST).read_text().strip()
    if digest_tables(arrays[name] for name in (*_MODEL_ARRAYS, _ROWBASE, *_WALK_ARRAYS)) != recorded:
        return None
    # the naive-Bayes table's rows a batch's scores take are read from its file, not its map
    rows = RowFile(ptc_file, int(ptc.offset), (int(ptc.shape[0]), int(ptc.shape[1])), ptc.dtype)
    # memoryviews index to Python ints like the array('H'/'I') and lists py3langid builds
    return (
        np.asarray(ptc),  # plain arrays still on the map (read-only), without memmap's per-call overhead
        np.asarray(pc),
        classes,
        memoryview(nextmove),
        memoryview(out),
        memoryview(row),
        memoryview(rowbase),
        WalkTables(np.asarray(base), np.asarray(check), np.asarray(states), rows),
    )


def _unpack_into(folder: Path) -> None:
    """Unpack py3langid's compressed model into ``folder`` (an existing, empty folder): one
    ``.npy`` file per array, ``classes.json`` and the row table (``_ROWBASE``). The model is an
    LZMA-compressed npz whose members are ``.npy`` files stored as they are: it is decompressed
    into a temporary file there, and each member copied out ``PIECE`` bytes at a time, so this
    process never holds the model (py3langid's own loader held every array, 120 MB at its peak).
    Raises OSError (no room, a read-only folder) or ValueError (another layout of the model)."""
    import lzma
    import zipfile

    import numpy as np
    from py3langid.langid import MODEL_DIR, MODEL_FILE

    try:
        with tempfile.TemporaryFile(dir=folder, suffix=".npz") as npz:
            with lzma.open(MODEL_DIR / MODEL_FILE) as packed:
                shutil.copyfileobj(packed, npz, PIECE)
            npz.seek(0)
            with zipfile.ZipFile(npz) as archive:
                for name in _MODEL_ARRAYS:
                    with archive.open(f"{name}.npy") as source, open(folder / f"{name}.npy", "wb") as target:
                        shutil.copyfileobj(source, target, PIECE)
                classes = np.load(io.BytesIO(archive.read("classes.npy")), allow_pickle=False).tolist()
    except (lzma.LZMAError, zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(f"py3langid's model has another layout: {exc}") from exc
    row = np.load(folder / "nextmove_row.npy", mmap_mode="r", allow_pickle=False)
    np.save(folder / f"{_ROWBASE}.npy", row.astype(np.int64) << 8)
    (folder / "classes.json").write_text(json.dumps(classes))
    from kb.index.langid_batch import digest_tables, walk_tables

    nextmove, rowbase, output = (
        np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        for name in ("nextmove", _ROWBASE, "out_feat")
    )
    walk = walk_tables(nextmove, rowbase, output)  # raises ValueError for another kind of model
    for name, array in zip(_WALK_ARRAYS, (walk.base, walk.check, walk.output)):
        np.save(folder / f"{name}.npy", array)
    del nextmove, rowbase, output, walk
    names = (*_MODEL_ARRAYS, _ROWBASE, *_WALK_ARRAYS)
    tables = [np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False) for name in names]
    (folder / _DIGEST).write_text(digest_tables(tables) + "\n")  # last: a folder without it is not read
    del tables
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


def _write_unpacked(folder: Path) -> None:
    """Unpack the model into ``folder`` at once (``_unpack_into``): a temporary folder renamed into
    place, so a reader sees all the files or none; a concurrent writer's folder wins. Nothing when
    the cache cannot be written (read-only, no room)."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        temporary = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".tmp-py3langid-"))
        # mkdtemp makes it 0700: as open as the cache folder, so another user sharing the cache
        # (kb serve's, a person's kb search) reads it rather than replacing it as damaged
        os.chmod(temporary, folder.parent.stat().st_mode & 0o777)
    except OSError:
        return  # a read-only cache: every process unpacks the model
    try:
        _unpack_into(temporary)
        try:
            os.rename(temporary, folder)
        except OSError:
            if _read_unpacked(folder) is not None:  # another process wrote it meanwhile
                raise
            # a damaged folder (a disk fault) or an earlier layout (without the row table): moved
            # aside whole, so no reader sees it half deleted (a reader mapping its files keeps them)
            stale = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".stale-py3langid-"))
            os.rename(folder, stale / "model")
            shutil.rmtree(stale, ignore_errors=True)
            os.rename(temporary, folder)
    except (OSError, ValueError):
        shutil.rmtree(temporary, ignore_errors=True)  # another process's folder, or no room: a cache only
        return
    # Temporary folders of writers killed mid-write (68 MB each) were never removed. With the model
    # in place, a writer still at work cannot put its own there and would remove its folder anyway.
    for leftover in folder.parent.glob(".tmp-py3langid-*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _unpacked_privately() -> tuple | None:
    """The model unpacked into a temporary folder of this process's own and mapped from there
    (``_read_unpacked``); the folder is removed at once (the maps keep its files until the process
    ends). None when no temporary folder can be written."""
    try:
        private = Path(tempfile.mkdtemp(prefix="kb-py3langid-"))
    except OSError:
        return None
    try:
        _unpack_into(private)
        return _read_unpacked(private)
    except (OSError, ValueError):
        return None
    finally:
        shutil.rmtree(private, ignore_errors=True)


@functools.cache
def _model() -> tuple:
    """The classifier's arrays (``LanguageIdentifier``'s constructor arguments) and its row table,
    loaded once per process, as ``_read_unpacked`` gives them: read-only maps of the model
    cache's files when ``cache_in`` named one (the first process unpacks the model into it, then
    maps it like the others), else of a temporary unpacking of this process's own. Only when
    neither can be written are they py3langid's own, unpacked in memory (row table None).
    Each process holding its own unpacked copy cost 68 MB of private memory a process (an index
    run's and its cutter's); mapped, they share the pages of one copy, and the pages a process no
    longer reads can be given back (design §7)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    folder = _model_folder(_cache_root) if _cache_root is not None else None
    if folder is not None:
        found = _read_unpacked(folder)
        if found is None:
            _write_unpacked(folder)
            found = _read_unpacked(folder)
        if found is not None:
            return found
    found = _unpacked_privately()  # no cache, or a read-only one
    if found is not None:
        return found
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE)
    return (
        identifier.nb_ptc,
        identifier.nb_pc,
        identifier.nb_classes,
        identifier.tk_nextmove,
        identifier.tk_output,
        identifier.tk_row,
        None,
        None,
    )


def _share_rowbase(identifier, rowbase) -> None:
    """Give ``identifier`` the mapped row table in place of the list its constructor derived
    (``_rowbase``: 105,000 Python ints, 4 MB a classifier), once they are checked equal."""
    import numpy as np

    own = getattr(identifier, "_rowbase", None)
    if own is None or len(own) != len(rowbase):
        return  # another py3langid: its own table stays
    if np.array_equal(np.fromiter(own, dtype=np.int64, count=len(own)), np.asarray(rowbase)):
        identifier._rowbase = rowbase


@functools.cache
def _classifier(norm_probs: bool):
    """py3langid's ``LanguageIdentifier`` over the model (``_model``), shared by every thread;
    ``norm_probs=False`` is the one ``py3langid.classify`` uses."""
    from py3langid.langid import LanguageIdentifier

    with _LOADED:  # one load for every thread
        ptc, pc, classes, nextmove, output, row, rowbase, _tables = _model()
    identifier = LanguageIdentifier(ptc, pc, classes, nextmove, output, norm_probs=norm_probs, tk_row=row)
    if rowbase is not None:
        _share_rowbase(identifier, rowbase)
    return identifier


def _identifier():
    return _classifier(False)


MACROLANGUAGES = {
    "ary": "ar",
    "arz": "ar",
    "yue": "zh",
    "wuu": "zh",
    "uzs": "uz",
    "sdh": "ku",
    "gug": "gn",
    "fuv": "ff",
    "kik": "ki",
    "ltg": "lv",
    "zxx": "und",
}
"""ISO 639-3 codes the classifier may answer (py3langid 0.4's model has varieties besides its ISO
639-1 languages) → the ISO 639-1 code of their macrolanguage, which kb's text configurations,
the embedders' language lists and the fusion rows are keyed by (design §8). Without it a
Traditional Chinese sentence that the model calls Cantonese (``yue``: 71 of 302 held-out Chinese
queries of bin/eval_search.py) missed Chinese's fusion row, and an Arabic document called
Egyptian (``arz``) lost Arabic's stemmer. ``zxx`` is "no linguistic content"."""


def iso_639_1(code: str) -> str:
    """The code kb keys languages by for the classifier's ``code``: its macrolanguage's ISO 639-1
    code (``MACROLANGUAGES``), else ``code`` itself."""
    return MACROLANGUAGES.get(code, code)


def _sample(text: str) -> str:
    """What the classifier reads of ``text``: its start without code blocks, links and URLs."""
    return _MARKUP.sub(" ", text[: DETECT_CHARS * 2])[:DETECT_CHARS]


def detect_language(text: str) -> str:
    """ISO 639-1 code of the language ``text`` is mostly written in (e.g. ``"de"``; a variety
    such as Cantonese counts as its macrolanguage, ``"zh"``: ``iso_639_1``); ``"und"`` for text
    with no letters. Code blocks, links and URLs are ignored."""
    sample = _sample(text)
    if not any(ch.isalpha() for ch in sample):
        return "und"
    language, _score = _identifier().classify(sample)
    return iso_639_1(language)


def detect_languages(texts: list[str]) -> list[str]:
    """``detect_language`` of each of ``texts``, classified together (kb.index.langid_batch: the
    same answers at a fraction of the cost, what an index run detects its documents' languages
    with, design §7)."""
    from kb.index.langid_batch import classify_many

    samples = [_sample(text) for text in texts]
    lettered = [i for i, sample in enumerate(samples) if any(ch.isalpha() for ch in sample)]
    identifier = _identifier()
    with _LOADED:
        tables = _model()[-1]
    found = classify_many(identifier, [samples[i] for i in lettered], tables)
    languages = ["und"] * len(texts)
    for i, language in zip(lettered, found):
        languages[i] = iso_639_1(language)
    return languages


def _probabilities():
    return _classifier(True)


def language_share(text: str, languages: frozenset[str]) -> float:
    """Probability (0–1, py3langid's normalised estimate) that ``text`` is written in one of
    ``languages`` (ISO 639-1 codes; a variety's probability counts for its macrolanguage); 1.0 for
    text with no letters. Unlike ``detect_language``,
    this stays informative on a few words: "A Python code linter" is classified as Latin, yet
    keeps an English share of about 0.1, while German, Russian, Japanese or Chinese sentences
    keep an English share below 0.01."""
    sample = _sample(text)
    if not any(ch.isalpha() for ch in sample):
        return 1.0
    return float(sum(p for language, p in _probabilities().rank(sample) if iso_639_1(language) in languages))


def text_config(language: str) -> str:
    """The Postgres text-search configuration for an ISO 639-1 code (``simple`` when Postgres has
    no stemmer for it, e.g. Japanese and Chinese, whose text ``lexical_text`` segments)."""
    return POSTGRES_CONFIGS.get(language, FALLBACK_CONFIG)


def _segments(run: str, unigrams: bool) -> str:
    """A CJK run as space-separated units: its overlapping bigrams, then (``unigrams``, or a run of
    one character) its characters."""
    units = [run[i : i + 2] for i in range(len(run) - 1)]
    if unigrams or len(run) == 1:
        units += list(run)
    return " " + " ".join(units) + " "


def _with_unigrams(match: re.Match) -> str:
    return _segments(match.group(0), True)


def _bigrams_only(match: re.Match) -> str:
    return _segments(match.group(0), False)


def lexical_text(text: str) -> str:
    """``text`` (a document's title, heading path or chunk) in Unicode normalization form C with
    every CJK run replaced by its space-separated character bigrams and characters; other text is
    unchanged."""
    return _CJK_RUN.sub(_with_unigrams, unicodedata.normalize("NFC", text))


def lexical_query(text: str) -> str:
    """A search query in Unicode normalization form C with every CJK run replaced by its
    space-separated character bigrams, and its characters too when the query's detected language
    is Chinese (``detect_language``) or the run is a single character; other text is unchanged.
    What it yields is always among what ``lexical_text`` makes of the same words, so every unit of
    the query can meet a page's."""
    text = unicodedata.normalize("NFC", text)
    if not _CJK_RUN.search(text):
        return text
    return _CJK_RUN.sub(_with_unigrams if detect_language(text) == "zh" else _bigrams_only, text)


def lexically_stable(*texts: str) -> bool:
    """True when every text is already in normalization form C (``lexical_text`` changes only its
    CJK runs; rows segmented by an earlier kb are told by ``chunks_of_documents``' ``cjk_current``)."""
    return all(unicodedata.is_normalized("NFC", text) for text in texts)
