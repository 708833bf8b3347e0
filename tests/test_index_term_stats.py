"""design §7, §8: an index run that writes most of a workspace counts its BM25 term statistics once
at its end (kb.deferred_term_stats, migration 0029), not once per batch. The statistics then equal a
recount; a small run keeps counting per batch; a run that dies leaves the deferral, which the next
run or the sweep ends with a recount; searches answer during and after the run."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from support.embedders import CountingEmbedder, StoppingEmbedder, WorkerStopped
from support.generated_documents import generated_corpus, named_rows, write_all
from support.named_queries import queries

from kb.db import database
from kb.index.indexer import BULK_RUN_DOCUMENTS, DOCUMENT_BATCH


def _deferred(kb) -> list[int]:
    return [r["workspace_id"] for r in named_rows(kb, "deferred_term_stats_workspaces")]


def _kept_equals_recount(kb, ws: int, kept: str, recount: str, count: str) -> None:
    found = [
        {(r["text_config"], r["lexeme"]): r[count] for r in named_rows(kb, q, workspace_id=ws)} for q in (kept, recount)
    ]
    assert found[0] == found[1] and found[0]


def _statistics_exact(kb, ws: int) -> None:
    """Chunk and whole-document statistics equal a recount of the rows (as the triggers keep them)."""
    _kept_equals_recount(kb, ws, "test_lexeme_stats", "test_lexeme_recount", "chunk_count")
    [totals] = named_rows(kb, "test_text_stats_check", workspace_id=ws)
    assert totals["kept_chunks"] == totals["chunks"] > 0 and totals["kept_length"] == totals["length"]
    _kept_equals_recount(kb, ws, "test_document_lexeme_stats", "test_document_lexeme_recount", "document_count")
    [check] = named_rows(kb, "test_document_terms_check", workspace_id=ws)
    assert check["kept_documents"] == check["rows"] == check["documents_with_chunks"]
    assert check["kept_length"] == check["length"]


def test_a_bulk_run_counts_the_statistics_once_and_a_small_run_per_batch(kb):
    """A first index of three batches defers the statistics while it writes (searches still
    answer) and leaves them exact; an edit of one page afterwards is counted by the triggers."""
    docs = generated_corpus(3 * DOCUMENT_BATCH)
    assert len(docs) >= BULK_RUN_DOCUMENTS
    write_all(kb, 1, docs)
    seen: list[tuple[list[int], int]] = []

    def progress(done: int, total: int, report) -> None:
        if 0 < done < total and not seen:  # a batch written, the others not yet
            seen.append((_deferred(kb), len(kb.search(1, "the", k=3))))

    kb.index(1, progress=progress)
    assert seen and seen[0][0] == [1]
    assert _deferred(kb) == []
    _statistics_exact(kb, 1)

    path = next(iter(docs))
    with kb.transaction(1, "edit", "t") as tx:
        tx.write(path, docs[path] + "\nzanzibarquokka appears once\n")
    during: list[list[int]] = []
    kb.index(1, progress=lambda done, total, report: during.append(_deferred(kb)))
    assert during and all(d == [] for d in during)  # one document: counted per batch
    _statistics_exact(kb, 1)
    assert [e.path for e in kb.search(1, "zanzibarquokka", k=1)] == [path]


@pytest.mark.parametrize("repair", ["next run", "sweep"])
def test_a_bulk_run_that_dies_leaves_a_deferral_that_is_repaired(kb, repair):
    """A first index stops in its third batch: two batches are written but not counted, and the
    deferral stays. The next run recounts at its end; so does the sweep when no run holds the
    workspace's index lock."""
    docs = generated_corpus(3 * DOCUMENT_BATCH)
    write_all(kb, 1, docs)
    kb.project(1)
    marked = named_rows(kb, "test_documents_in_id_order", workspace_id=1)[2 * DOCUMENT_BATCH + 3]["path"]
    with kb.transaction(1, "mark", "t") as tx:
        tx.write(marked, docs[marked] + "\nSTOP HERE\n")
    kb.use_embedder(StoppingEmbedder("STOP HERE"))
    with pytest.raises(WorkerStopped):
        kb.index(1)
    assert _deferred(kb) == [1]
    [totals] = named_rows(kb, "test_text_stats_check", workspace_id=1)
    assert totals["chunks"] > 0 and totals["kept_chunks"] == 0  # written, not yet counted
    kb.use_embedder(CountingEmbedder())
    if repair == "sweep":
        report = kb.sweep()
        assert report.term_stats_recounted == [1]
    else:
        kb.index(1)
    assert _deferred(kb) == []
    _statistics_exact(kb, 1)


def test_a_recount_whose_document_half_fails_ends_no_deferral(kb):
    """The end of a bulk run counts the chunk and whole-document statistics at once on two
    connections (migration 0032). When the document half fails, the run fails with it, the chunk
    half rolls back and the deferral stays (the triggers still leave the workspace out, so nothing
    is counted twice); the next run recounts both halves and ends it."""
    docs = generated_corpus(3 * DOCUMENT_BATCH)
    write_all(kb, 1, docs)
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["test_fail_document_stats_inserts"])
    # a schema that refuses its own statistics is a server-side fault, not one kb translates
    with pytest.raises(psycopg.errors.RaiseException, match="document statistics refused"):
        kb.index(1)
    assert _deferred(kb) == [1]
    [totals] = named_rows(kb, "test_text_stats_check", workspace_id=1)
    assert totals["chunks"] > 0 and totals["kept_chunks"] == 0  # the chunk half rolled back too
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["test_allow_document_stats_inserts"])
    kb.index(1)
    assert _deferred(kb) == []
    _statistics_exact(kb, 1)


def test_the_sweep_leaves_a_running_bulk_runs_deferral_alone(kb):
    """While a run holds the workspace's index lock the sweep does not recount: the run does."""
    docs = generated_corpus(BULK_RUN_DOCUMENTS)
    write_all(kb, 1, docs)
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["defer_term_stats"], {"workspace_id": 1})
    swept = []
    kb.index(
        1, progress=lambda done, total, report: swept.append(kb.sweep().term_stats_recounted) if not swept else None
    )
    assert swept == [[]]
    assert _deferred(kb) == []
    _statistics_exact(kb, 1)


def test_a_reindex_of_an_indexed_workspace_keeps_counting_per_batch(kb):
    """A reindex reuses the chunk rows of an indexed workspace: it rewrites few chunks, so it
    keeps the triggers' counting (a recount would cost the whole workspace)."""
    docs = generated_corpus(BULK_RUN_DOCUMENTS)
    write_all(kb, 1, docs)
    kb.index(1)
    path = next(iter(docs))
    with kb.transaction(1, "edit", "t") as tx:
        tx.write(path, docs[path] + "\nzanzibarquokka appears once\n")
    during: list[list[int]] = []
    report = kb.reindex(1, progress=lambda done, total, report: during.append(_deferred(kb)))
    assert report.chunks_reused > 0 and during and all(d == [] for d in during)
    _statistics_exact(kb, 1)


def test_a_bulk_runs_recount_counts_every_text_configuration(kb):
    """The recount at the end of a bulk run counts each text configuration's lexemes on its own
    (ts_stat per configuration, migration 0030): a first index of English, German, Arabic and
    Japanese pages ends with statistics equal to a recount per configuration, none mixed."""
    docs = generated_corpus(BULK_RUN_DOCUMENTS)
    corpus = Path(__file__).parent / "corpus"
    for language in ("de", "ar", "ja", "en"):
        for page in sorted((corpus / language).rglob("*.md")):
            docs[f"/documents/{language}/{page.relative_to(corpus / language)}"] = page.read_text()
    write_all(kb, 1, docs)
    seen: list[list[int]] = []
    kb.index(1, progress=lambda done, total, report: seen.append(_deferred(kb)) if 0 < done < total else None)
    assert [1] in seen  # a bulk run: counted once, at its end
    assert _deferred(kb) == []
    _statistics_exact(kb, 1)
    configs = {r["text_config"] for r in named_rows(kb, "test_lexeme_stats", workspace_id=1)}
    assert {"english", "german"} <= configs and len(configs) >= 3
