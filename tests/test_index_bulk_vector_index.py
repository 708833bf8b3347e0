"""design §7, §8: an index run that writes most of a workspace drops the workspace's HNSW index
first and builds it again when it finishes (inserting into HNSW costs far more than building it
after the load). Searches answer meanwhile (exact scans); a run that dies leaves no index and no
record, and the maintenance job builds it again."""

from __future__ import annotations

import pytest
from support.embedders import CountingEmbedder, StoppingEmbedder, WorkerStopped
from support.generated_documents import generated_corpus, named_rows, write_all

from kb.index import vector_index
from kb.index.indexer import BULK_RUN_DOCUMENTS


def _indexed_workspace_with_hnsw(kb, monkeypatch) -> CountingEmbedder:
    monkeypatch.setattr(vector_index, "HNSW_MIN_CHUNKS", 40)
    embedder = kb.use_embedder(CountingEmbedder())
    write_all(kb, 1, generated_corpus(BULK_RUN_DOCUMENTS))
    kb.index(1)
    assert vector_index.maintain(kb.database_url, 1, embedder.model, embedder.dim).action == "built"
    return embedder


def _bulk_import(kb, marker: str = "") -> dict[str, str]:
    """More new documents than the workspace holds: the next run indexes most of it."""
    more = {
        path.replace("/documents/", "/documents/more/"): text + marker
        for path, text in generated_corpus(2 * BULK_RUN_DOCUMENTS).items()
    }
    with kb.transaction(1, "more", "t") as tx:
        for path, text in more.items():
            tx.write(path, text)
    return more


def _index_present(kb, model: str) -> tuple[bool, bool]:
    """(recorded in kb.vector_indexes, present in the catalog) for workspace 1's index of ``model``."""
    vector_index.forget_cached()
    with_record = named_rows(kb, "recorded_vector_index", workspace_id=1, model=model)
    in_catalog = named_rows(kb, "test_vector_index_exists", name=vector_index.index_name(1, model))
    return bool(with_record), bool(in_catalog)


def test_a_bulk_run_drops_the_hnsw_index_searches_meanwhile_and_builds_it_again(kb, monkeypatch):
    embedder = _indexed_workspace_with_hnsw(kb, monkeypatch)
    more = _bulk_import(kb)
    during: list[tuple[tuple[bool, bool], int]] = []

    def progress(done: int, total: int, report) -> None:
        if 0 < done < total and not during:  # a batch written, the others not yet
            during.append((_index_present(kb, embedder.model), len(kb.search(1, "the", k=5))))

    report = kb.index(1, progress=progress)
    assert report.documents_indexed == len(more) and report.documents_failed == 0
    assert during == [((False, False), 5)]  # no index while the run loads; the search answers
    assert _index_present(kb, embedder.model) == (True, True)
    [valid] = named_rows(kb, "vector_index_valid", name=vector_index.index_name(1, embedder.model))
    assert valid["valid"]
    assert len(kb.search(1, "the", k=5)) == 5


def test_a_small_run_keeps_the_hnsw_index(kb, monkeypatch):
    embedder = _indexed_workspace_with_hnsw(kb, monkeypatch)
    with kb.transaction(1, "one more", "t") as tx:
        tx.write("/documents/one more.md", "# One more\n\na page written after the index was built\n")
    seen: list[tuple[bool, bool]] = []
    kb.index(1, progress=lambda done, total, report: seen.append(_index_present(kb, embedder.model)))
    assert seen and all(s == (True, True) for s in seen)


def test_a_bulk_run_that_dies_leaves_the_index_to_the_maintenance_job(kb, monkeypatch):
    embedder = _indexed_workspace_with_hnsw(kb, monkeypatch)
    _bulk_import(kb, marker="\nSTOP HERE\n")
    kb.use_embedder(StoppingEmbedder("STOP HERE"))
    with pytest.raises(WorkerStopped):
        kb.index(1)
    assert _index_present(kb, embedder.model) == (False, False)
    assert len(kb.search(1, "the", k=5)) == 5  # exact scans answer
    assert vector_index.maintain(kb.database_url, 1, embedder.model, embedder.dim).action == "built"
    assert _index_present(kb, embedder.model) == (True, True)


def test_the_next_run_after_a_bulk_run_that_died_builds_the_index_again(kb, monkeypatch):
    """A ``kb index`` killed in a bulk run leaves no index and no worker job to build it (only a
    worker's index job defers kb.maintain_vector_index): the workspace's next run, which finds the
    dead run's deferral, builds it when it has finished (design §7, §8)."""
    embedder = _indexed_workspace_with_hnsw(kb, monkeypatch)
    _bulk_import(kb, marker="\nSTOP HERE\n")
    kb.use_embedder(StoppingEmbedder("STOP HERE"))
    with pytest.raises(WorkerStopped):
        kb.index(1)
    assert _index_present(kb, embedder.model) == (False, False)
    kb.use_embedder(CountingEmbedder())
    kb.index(1)
    assert _index_present(kb, embedder.model) == (True, True)


def test_the_sweep_that_ends_a_dead_bulk_runs_deferral_queues_the_index_build(kb, monkeypatch):
    """The sweep recounts what a dead bulk run left deferred; the run had dropped the HNSW index
    too, so the sweep queues kb.maintain_vector_index for the workspace (design §7, §8): the next
    index run finds no deferral and would not build it."""
    _indexed_workspace_with_hnsw(kb, monkeypatch)
    _bulk_import(kb, marker="\nSTOP HERE\n")
    kb.use_embedder(StoppingEmbedder("STOP HERE"))
    with pytest.raises(WorkerStopped):
        kb.index(1)
    kb.use_embedder(CountingEmbedder())
    assert kb.sweep().term_stats_recounted == [1]
    queued = [j for j in named_rows(kb, "test_jobs") if j["task_name"] == "kb.maintain_vector_index"]
    assert [(j["status"], j["args"]) for j in queued] == [("todo", {"workspace_id": 1})]
