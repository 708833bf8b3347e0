"""The language classifier's model kept unpacked in the model cache (kb.index.languages, design §7):
a later process maps it instead of unpacking py3langid's compressed file, and answers the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from kb.index import languages

TEXTS = (
    "refund invoice",
    "A Python code linter",
    "Rückerstattung für ein Jahresabonnement",
    "佢哋喺度等緊你，你快啲嚟啦",
    "日本語のテキストと中文文本",
    "واش نتا بخير؟ شنو درتي اليوم؟ بغيت نمشي للسوق",
    "word " * 900,
)


@pytest.fixture
def fresh_model(monkeypatch):
    """The module as a new process sees it: nothing loaded, no cache named."""

    def forget() -> None:
        languages._model.cache_clear()
        languages._classifier.cache_clear()

    monkeypatch.setattr(languages, "_cache_root", None)
    forget()
    yield forget
    forget()


def test_the_unpacked_model_is_kept_in_the_cache_and_read_back_with_the_same_answers(tmp_path, fresh_model):
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    packed = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    languages.cache_in(tmp_path)
    first = [languages._probabilities().rank(text) for text in TEXTS]
    (folder,) = tmp_path.glob("py3langid-*")
    assert {p.name for p in folder.iterdir()} == {
        f"{name}.npy" for name in (*languages._MODEL_ARRAYS, languages._ROWBASE, *languages._WALK_ARRAYS)
    } | {"classes.json", languages._DIGEST}
    assert not list(tmp_path.glob(".tmp-*"))  # written into place at once

    fresh_model()  # a later process: the arrays come from the cache's files
    assert languages._read_unpacked(folder) is not None
    again = [languages._probabilities().rank(text) for text in TEXTS]
    assert again == first == [packed.rank(text) for text in TEXTS]
    for text in TEXTS:  # detect_language's classifier is py3langid.classify's
        assert languages._identifier().classify(text) == LanguageIdentifier.from_model_file(MODEL_FILE).classify(text)
    assert languages.language_share("refund invoice", frozenset({"en"})) == pytest.approx(
        sum(p for language, p in packed.rank("refund invoice") if language == "en")
    )


def test_a_damaged_cache_is_not_used_and_is_written_again(tmp_path, fresh_model):
    languages.cache_in(tmp_path)
    expected = languages._probabilities().rank("refund invoice")
    (folder,) = tmp_path.glob("py3langid-*")
    damaged = folder / "ptc.npy"
    damaged.write_bytes(damaged.read_bytes()[:1000])  # truncated
    assert languages._read_unpacked(folder) is None

    fresh_model()
    languages.cache_in(tmp_path)
    assert languages._probabilities().rank("refund invoice") == expected  # from the compressed model
    assert languages._read_unpacked(folder) is not None  # and kept whole again for the next process
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda np, load: {"pc": np.float32(1.0)}, id="a scalar"),
        pytest.param(lambda np, load: {"nextmove": load("nextmove").astype(np.float32)}, id="floats for indexes"),
        pytest.param(lambda np, load: {"ptc": load("ptc")[:10]}, id="fewer features"),
        pytest.param(lambda np, load: {"nextmove": load("nextmove")[: 256 * 10]}, id="fewer tokenizer states"),
        pytest.param(
            lambda np, load: {name: load(name).reshape(-1, 1) for name in ("out_feat", "nextmove_row")}, id="2-d rows"
        ),
        pytest.param(lambda np, load: {"walk_base": load("walk_base").astype(np.int64)}, id="a wider walk table"),
        pytest.param(lambda np, load: {"walk_check": load("walk_check")[:-10]}, id="walk tables of two lengths"),
        pytest.param(
            lambda np, load: {"walk_output": np.full_like(load("walk_output"), load("ptc").shape[0])},
            id="walk outputs past the features",
        ),
    ],
)
def test_whole_files_of_the_wrong_shape_or_kind_are_not_used(tmp_path, fresh_model, damage):
    """Files complete but of another layout (another writer, a damaged header) made every
    classification raise (IndexError, TypeError) in every later process instead of falling back."""
    import numpy as np

    languages.cache_in(tmp_path)
    expected = languages._identifier().classify("refund invoice")
    (folder,) = tmp_path.glob("py3langid-*")
    for name, array in damage(np, lambda name: np.load(folder / f"{name}.npy")).items():
        np.save(folder / f"{name}.npy", array)
    assert languages._read_unpacked(folder) is None

    fresh_model()
    languages.cache_in(tmp_path)
    assert languages._identifier().classify("refund invoice") == expected  # from the compressed model
    assert languages._read_unpacked(folder) is not None  # and kept whole again


def test_the_temporary_folder_of_a_writer_killed_mid_write_is_removed_by_the_next_writer(tmp_path, fresh_model):
    """A process killed while it wrote the model (SIGKILL during a first cold search) left its
    ``.tmp-py3langid-*`` folder, up to 68 MB, in the cache for good."""
    import subprocess
    import sys

    killed = tmp_path / ".tmp-py3langid-killed"
    killed.mkdir()
    (killed / "ptc.npy").write_bytes(b"\x93NUMPY" + b"\0" * 1000)  # cut short by the kill
    # the next process (this one) writes the model and removes what the killed one left
    languages.cache_in(tmp_path)
    expected = languages._identifier().classify("refund invoice")
    (folder,) = tmp_path.glob("py3langid-*")
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]

    probe = (
        "import sys; from pathlib import Path; from kb.index import languages;"
        "languages.cache_in(Path(sys.argv[1])); print(languages._identifier().classify('refund invoice')[0])"
    )
    answer = subprocess.run([sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, check=True)
    assert answer.stdout.strip() == expected[0]  # a later process reads the model in place


def test_the_cached_model_is_as_open_as_the_cache_folder(tmp_path, fresh_model):
    """mkdtemp made the kept folder 0700: another user sharing the cache (kb serve's account, a
    person's kb search) could not read it, took it for damaged and replaced it, each in turn."""
    cache = tmp_path / "models"
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    languages.cache_in(cache)
    languages.detect_language("a sentence in English, to load the model")
    (kept,) = [p for p in cache.rglob("*") if p.is_dir() and p.name.startswith("py3langid")]
    assert kept.stat().st_mode & 0o777 == 0o755


def _mapped_file(array) -> Path | None:
    """The file ``array`` (an ndarray or a memoryview of one) is a read-only map of, else None."""
    import numpy as np

    owner = array.obj if isinstance(array, memoryview) else array
    if isinstance(array, memoryview) and not array.readonly:
        return None
    while isinstance(owner, np.ndarray) and not isinstance(owner, np.memmap):
        owner = owner.base
    if not isinstance(owner, np.memmap) or owner.flags.writeable or owner.filename is None:
        return None
    return Path(owner.filename)


def _model_files(identifier) -> dict[str, Path | None]:
    return {
        "ptc": _mapped_file(identifier.nb_ptc),
        "pc": _mapped_file(identifier.nb_pc),
        "nextmove": _mapped_file(identifier.tk_nextmove),
        "nextmove_row": _mapped_file(identifier.tk_row),
        "out_feat": _mapped_file(identifier.tk_output),
        "rowbase": _mapped_file(identifier._rowbase),
    }


def test_every_process_classifies_with_read_only_maps_of_the_cache_files(tmp_path, fresh_model):
    """The process that unpacked the model into the cache kept its own unpacked copy (68 MB of
    private memory, and 4 MB lists for the tokenizer's rows and outputs in each classifier): an
    index run's process and its cutter process each held one. Now the first process too maps the
    files it wrote, and both classifiers use the one mapped row table."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    languages.cache_in(tmp_path)
    for process in ("the first, which unpacks", "a later one"):
        fresh_model()
        identifiers = (languages._identifier(), languages._probabilities())
        (folder,) = tmp_path.glob("py3langid-*")
        for identifier in identifiers:
            assert _model_files(identifier) == {
                name: folder / f"{name}.npy" for name in (*languages._MODEL_ARRAYS, languages._ROWBASE)
            }, process
        assert identifiers[0]._rowbase.obj is identifiers[1]._rowbase.obj  # one table for both
    packed = LanguageIdentifier.from_model_file(MODEL_FILE)
    assert list(identifiers[0]._rowbase) == packed._rowbase
    for text in TEXTS:
        assert languages._identifier().classify(text) == packed.classify(text)


def test_without_a_writable_cache_each_process_maps_a_copy_of_its_own(tmp_path, fresh_model):
    """A cache that cannot be written (here its folder's parent is a file: refused even to root)
    made the process unpack the model into its memory; it still answers, from a temporary unpacking
    of its own that it maps and removes at once."""
    import tempfile

    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    blocked = tmp_path / "a file"
    blocked.write_text("not a folder")
    before = set(Path(tempfile.gettempdir()).glob("kb-py3langid-*"))
    languages.cache_in(blocked / "models")
    identifier = languages._identifier()
    files = _model_files(identifier)
    assert all(path is not None and path.name.endswith(".npy") for path in files.values()), files
    assert not any(path.exists() for path in files.values() if path is not None)  # removed, still mapped
    assert set(Path(tempfile.gettempdir()).glob("kb-py3langid-*")) == before
    assert [p.name for p in tmp_path.iterdir()] == ["a file"]
    packed = LanguageIdentifier.from_model_file(MODEL_FILE)
    for text in TEXTS:
        assert identifier.classify(text) == packed.classify(text)
    assert languages.detect_languages(list(TEXTS)) == [languages.detect_language(text) for text in TEXTS]


@pytest.mark.parametrize("missing", [languages._ROWBASE, *languages._WALK_ARRAYS])
def test_a_cache_of_an_earlier_layout_is_unpacked_again_whole(tmp_path, fresh_model, missing):
    """A cache written before the row table was kept (no ``rowbase.npy``), or the walk's double
    array (no ``walk_*.npy``), is replaced whole."""
    languages.cache_in(tmp_path)
    expected = languages._identifier().classify("refund invoice")
    (folder,) = tmp_path.glob("py3langid-*")
    (folder / f"{missing}.npy").unlink()
    assert languages._read_unpacked(folder) is None

    fresh_model()
    languages.cache_in(tmp_path)
    assert languages._identifier().classify("refund invoice") == expected
    assert languages._read_unpacked(folder) is not None
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]


def test_a_cache_file_whose_bytes_changed_is_not_used(tmp_path, fresh_model):
    """A file of the right size and layout whose bytes changed (a disk fault, another program
    writing it) was mapped as it was: transitions past the table's end made every classification
    in every later process raise a raw IndexError, py3langid's own fallback too. Its digest no
    longer matches the one written with it: the model is unpacked again."""
    import numpy as np

    languages.cache_in(tmp_path)
    expected = [languages._identifier().classify(text) for text in TEXTS]
    (folder,) = tmp_path.glob("py3langid-*")
    nextmove = np.load(folder / "nextmove.npy", mmap_mode="r+")
    nextmove[:] = nextmove.max() + 5000
    nextmove.flush()
    del nextmove
    assert languages._read_unpacked(folder) is None

    fresh_model()
    languages.cache_in(tmp_path)
    assert [languages._identifier().classify(text) for text in TEXTS] == expected
    assert languages.detect_languages(list(TEXTS)) == [languages.detect_language(text) for text in TEXTS]
    assert languages._read_unpacked(folder) is not None  # and kept whole again
