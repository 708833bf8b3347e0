"""design §7: the derived index converges to HEAD, re-embeds only changed chunks, isolates
failures per document, and tells the operator where it stands."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.embedders import CountingEmbedder, NaNEmbedder, OverflowEmbedder, PoisonEmbedder
from support.generated_documents import generated_corpus, generated_paragraphs, named_rows, write_all
from support.named_queries import queries

from kb.db import database
from kb.errors import EmbeddingError
from kb.index.chunk_context import context_line, embedded_text, heading_paths
from kb.index.chunking import Chunker
from kb.index.embedding import HashingEmbedder
from kb.index.indexer import sha256_text
from kb.knowledge_base import KnowledgeBase


def _chunk_set(kb, ws):
    return named_rows(kb, "test_chunk_set", workspace_id=ws)


def _embedded(kb, ws, row, text: str) -> str:
    """The text the indexer embeds for a chunk row: context line (title, heading path) + text."""
    title = named_rows(kb, "document_by_path", workspace_id=ws, path=row["path"])[0]["title"]
    [path] = heading_paths(text, [SimpleNamespace(start_char=row["start_char"])])
    return embedded_text(context_line(title, path), row["text"])


def _assert_spans_match(kb, ws, path_to_text: dict[str, str]) -> None:
    for row in _chunk_set(kb, ws):
        text = path_to_text[row["path"]]
        assert text[row["start_char"] : row["end_char"]] == row["text"]
        lines = text.split("\n")
        assert row["text"].split("\n")[0] in lines[row["start_line"] - 1]
        assert row["text"].split("\n")[-1] in lines[row["end_line"] - 1]
        # the cache key is the hash of exactly the text embedded (design §7)
        assert sha256_text(_embedded(kb, ws, row, text)) == row["text_sha256"]


@pytest.fixture
def small_chunks(settings):
    """A KnowledgeBase cutting 64-token chunks, so a modest document has 100+ chunks."""
    return KnowledgeBase.open(settings.model_copy(update={"chunk_size": 64}))


def test_one_line_edit_embeds_exactly_the_changed_chunks(small_chunks):
    kb = small_chunks
    embedder = kb.use_embedder(CountingEmbedder())
    paragraphs = generated_paragraphs(150)
    text = "\n\n".join(paragraphs) + "\n"
    kb.create_workspace(1)
    with kb.transaction(1, "big doc", "t") as tx:
        tx.write("/documents/Big.md", text)
    kb.index(1)
    before = {r["id"]: r for r in _chunk_set(kb, 1)}
    assert len(before) >= 100
    assert len(embedder.texts) == len({r["text_sha256"] for r in before.values()})

    # 1. change one word in one line in the middle: only that chunk's text is new
    embedder.texts.clear()
    edited = list(paragraphs)
    edited[75] = edited[75].replace("Section 75:", "Section 75 (edited):")
    text2 = "\n\n".join(edited) + "\n"
    with kb.transaction(1, "edit", "t") as tx:
        tx.write("/documents/Big.md", text2)
    report = kb.index(1)
    after = {r["id"]: r for r in _chunk_set(kb, 1)}
    old_hashes = {r["text_sha256"] for r in before.values()}
    new_hashes = {r["text_sha256"] for r in after.values()}
    assert {sha256_text(t) for t in embedder.texts} == new_hashes - old_hashes
    assert len(embedder.texts) == 1 and report.embeddings_computed == 1
    kept = [i for i, r in after.items() if r["text_sha256"] in old_hashes]
    assert len(kept) == len(after) - 1
    assert all(i in before and before[i]["text_sha256"] == after[i]["text_sha256"] for i in kept)
    _assert_spans_match(kb, 1, {"/documents/Big.md": text2})

    # 2. a line inserted at the top moves every span: rows keep their ids, spans follow the text
    # (a plain line: a heading would enclose every chunk and so change what each one embeds)
    embedder.texts.clear()
    text3 = "Intro line added.\n\n" + text2
    with kb.transaction(1, "insert at top", "t") as tx:
        tx.write("/documents/Big.md", text3)
    kb.index(1)
    moved = {r["id"]: r for r in _chunk_set(kb, 1)}
    assert len(embedder.texts) == len({r["text_sha256"] for r in moved.values()} - new_hashes) <= 2
    survivors = set(moved) & set(after)
    assert len(survivors) >= len(after) - 1
    assert all(moved[i]["start_line"] == after[i]["start_line"] + 2 for i in survivors)
    _assert_spans_match(kb, 1, {"/documents/Big.md": text3})


def _snapshot(kb, ws):
    return [
        (
            r["path"],
            r["id"],
            r["position"],
            r["text_sha256"],
            r["start_char"],
            r["end_char"],
            r["start_line"],
            r["end_line"],
        )
        for r in _chunk_set(kb, ws)
    ]


def test_reindex_twice_embeds_nothing_and_rebuilds_from_cache(kb):
    embedder = kb.use_embedder(CountingEmbedder())
    docs = generated_corpus(40)
    write_all(kb, 1, docs)
    first = kb.reindex(1)
    assert first.documents_indexed == 40 and first.embeddings_computed > 0
    snapshot = _snapshot(kb, 1)
    calls = embedder.calls

    second = kb.reindex(1)
    assert embedder.calls == calls and second.embeddings_computed == 0
    assert second.cache_hit_ratio == 1.0 and second.chunks_written == 0
    assert _snapshot(kb, 1) == snapshot  # identical rows, same ids

    # derived tables are disposable: wipe the chunks, reindex from the cache alone
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["bench_delete_workspace_chunks"], {"workspace_id": 1})
    third = kb.reindex(1)
    assert embedder.calls == calls and third.embeddings_cached == third.chunks_written > 0
    rebuilt = _snapshot(kb, 1)
    assert [r[:1] + r[2:] for r in rebuilt] == [r[:1] + r[2:] for r in snapshot]
    _assert_spans_match(kb, 1, docs)
    runs = named_rows(kb, "test_index_runs", workspace_id=1)
    assert [r["status"] for r in runs] == ["finished"] * 3
    assert runs[-1]["documents_done"] == runs[-1]["documents_total"] == 40


def test_reindex_prunes_and_upserts_rows_that_drifted_from_git(kb):
    docs = generated_corpus(5)
    write_all(kb, 1, docs)
    kb.index(1)
    with kb.transaction(1, "remove one", "t") as tx:
        tx.remove("/documents/Folder 0/Doc 0.md")
    report = kb.reindex(1)
    assert report.revision == kb.head(1)
    paths = {r["path"] for r in _chunk_set(kb, 1)}
    assert "/documents/Folder 0/Doc 0.md" not in paths and len(paths) == 4


def test_poison_document_is_quarantined_and_the_workspace_converges(kb):
    embedder = kb.use_embedder(PoisonEmbedder())
    docs = generated_corpus(100)
    poison = "/documents/Folder 1/Doc 13.md"
    docs[poison] = "# Bad\n\nthis text is POISON for the model\n"
    write_all(kb, 1, docs)

    first = kb.index(1)
    assert first.documents_indexed == 99 and first.documents_failed == 1
    assert list(first.failures) == [poison] and "rejected" in first.failures[poison]
    assert first.documents_still_failed == 1
    head = kb.head(1)
    lag = named_rows(kb, "test_index_lag", workspace_id=1)[0]
    assert lag["stamp"] == head and lag["revisions_behind"] == 0  # the stamp advanced past successes
    assert lag["documents_failed"] == 1 and lag["documents_quarantined"] == 0
    swept = kb.sweep()  # failed documents get a delayed retry, not an immediate job
    assert swept.index_deferred == [] and swept.retry_deferred == [1]

    for _ in range(2):
        kb.index(1)
    states = {r["path"]: r for r in named_rows(kb, "test_document_states", workspace_id=1)}
    assert states[poison]["status"] == "quarantined" and states[poison]["index_attempts"] == 3
    assert "rejected" in states[poison]["index_error"]
    assert sum(1 for r in states.values() if r["status"] == "indexed") == 99
    status = kb.status(1)["workspace"]
    assert status["index_stamp"] == head and status["quarantined"] == 1
    assert [d["path"] for d in status["quarantined_documents"]] == [poison]
    lag = named_rows(kb, "test_index_lag", workspace_id=1)[0]
    assert lag["documents_failed"] == 0 and lag["documents_quarantined"] == 1
    # quarantined: no more attempts from index_changes, and the sweep has nothing to do
    calls = embedder.calls
    assert kb.index(1).documents_total == 0 and embedder.calls == calls
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["delete_finished_jobs_for_tests"])
    swept = kb.sweep()
    assert swept.index_deferred == [] and swept.retry_deferred == []
    # a new version of the document gets a fresh start
    with kb.transaction(1, "fix", "t") as tx:
        tx.write(poison, "# Fixed\n\nfine now\n")
    kb.index(1)
    states = {r["path"]: r for r in named_rows(kb, "test_document_states", workspace_id=1)}
    assert states[poison]["status"] == "indexed" and states[poison]["index_attempts"] == 0


def test_nan_vector_fails_only_its_document(kb):
    kb.use_embedder(NaNEmbedder())
    write_all(kb, 1, {"/documents/a.md": "fine words\n", "/documents/b.md": "has NANTEXT inside\n"})
    report = kb.index(1)
    assert report.documents_indexed == 1 and report.documents_failed == 1
    assert "NaN" in report.failures["/documents/b.md"]
    assert {r["path"] for r in _chunk_set(kb, 1)} == {"/documents/a.md"}


def test_a_float64_vector_beyond_float4s_range_fails_only_its_document(kb):
    """A float64 value finite as float64 (1e39) is inf as the float4 pgvector stores: that text is
    refused as NaN/inf is, and the others of the batch are indexed (design §7)."""
    kb.use_embedder(OverflowEmbedder())
    write_all(kb, 1, {"/documents/a.md": "fine words\n", "/documents/b.md": "has HUGETEXT inside\n"})
    report = kb.index(1)
    assert report.documents_indexed == 1 and report.documents_failed == 1
    assert "inf" in report.failures["/documents/b.md"]
    assert {r["path"] for r in _chunk_set(kb, 1)} == {"/documents/a.md"}


@pytest.mark.parametrize("embedder", [NaNEmbedder("QUERYMARK"), OverflowEmbedder("QUERYMARK")])
def test_a_query_vector_with_nan_or_beyond_float4_is_refused_as_an_embedding_error(kb, embedder):
    """A search whose query embeds to NaN, inf or a float64 beyond float4's range answers
    EmbeddingError (a KbError), not the psycopg error of the statement Postgres refuses."""
    write_all(kb, 1, {"/documents/a.md": "fine words\n"})
    kb.index(1)
    kb.use_embedder(embedder)
    assert [e.path for e in kb.search(1, "fine words", k=1)] == ["/documents/a.md"]
    with pytest.raises(EmbeddingError):
        kb.search(1, "fine QUERYMARK", k=1)


def test_unindexable_documents_stay_in_git_and_do_not_fail_the_job(kb):
    nul = b"before\x00after\n"
    latin1 = "caf\xe9\n".encode("latin-1")
    kb.create_workspace(1)
    with kb.transaction(1, "odd bytes", "t") as tx:
        tx.write("/documents/nul-byte.md", nul)
        tx.write("/documents/latin1.md", latin1)
        tx.write("/documents/ok.md", b"ok\n")
    report = kb.index(1)
    assert report.documents_unindexable == 2 and report.documents_failed == 0
    states = {r["path"]: r for r in named_rows(kb, "test_document_states", workspace_id=1)}
    assert states["/documents/nul-byte.md"]["status"] == "unindexable"
    assert "NUL" in states["/documents/nul-byte.md"]["index_error"]
    assert "UTF-8" in states["/documents/latin1.md"]["index_error"]
    assert kb.read(1, "/documents/nul-byte.md") == nul and kb.read(1, "/documents/latin1.md") == latin1
    assert kb.status(1)["workspace"]["index_stamp"] == kb.head(1)
    assert kb.index(1).documents_total == 0  # not retried until the content changes


def test_workspaces_keep_vectors_of_their_own_dimension_side_by_side(kb):
    """design §7: kb.chunks.embedding is untyped (migration 0024): a workspace indexed with 384-d
    vectors keeps them while another is indexed with a 256-d model, and both answer searches."""
    write_all(kb, 1, generated_corpus(2))
    kb.index(1)
    kb.use_embedder(HashingEmbedder(256))  # no DimensionMismatch: the column declares no dimension
    write_all(kb, 2, generated_corpus(2))
    kb.index(2)
    dims = {r["workspace_id"]: (r["low"], r["high"]) for r in named_rows(kb, "test_workspace_vector_dims")}
    assert dims == {1: (384, 384), 2: (256, 256)}
    assert kb.search(1, "zyxwvut", k=1) and kb.search(2, "zyxwvut", k=1)


def test_index_lag_and_job_health_views(kb):
    write_all(kb, 1, generated_corpus(3))
    lag = named_rows(kb, "test_index_lag", workspace_id=1)[0]
    assert lag["head"] == kb.head(1) and lag["stamp"] is None and lag["revisions_behind"] == 1
    health = {r["queue"].split("@")[0]: r for r in named_rows(kb, "test_job_health")}  # index@<node>
    assert health["index"]["todo"] == 1 and health["projection"]["todo"] == 1
    assert health["index"]["oldest_waiting"] is not None
    kb.run_worker(until_idle=True)
    lag = named_rows(kb, "test_index_lag", workspace_id=1)[0]
    assert lag["stamp"] == lag["head"] and lag["revisions_behind"] == 0
    assert lag["documents_pending"] == 0 and lag["last_run_status"] == "finished"
    health = {r["queue"].split("@")[0]: r for r in named_rows(kb, "test_job_health")}  # index@<node>
    assert health["index"]["todo"] == 0 and health["index"]["failed"] == 0


def test_sweep_defers_work_for_workspaces_behind_git_head(kb):
    write_all(kb, 1, generated_corpus(2))
    kb.run_worker(until_idle=True)
    assert kb.sweep().index_deferred == []
    # a revision whose jobs were never deferred (e.g. the queue rows were lost): the sweep finds it
    write_all(kb, 1, {"/documents/new.md": "new text\n"}, "second")
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["delete_todo_jobs_for_tests"])
    report = kb.sweep()
    assert report.index_deferred == [1] and report.projection_deferred == [1]
    assert kb.sweep().index_deferred == [1]  # coalesced: still one waiting job
    jobs = [j for j in named_rows(kb, "test_jobs") if j["status"] == "todo"]
    assert sorted(j["task_name"] for j in jobs) == ["kb.index_changes", "kb.project_changes"]
    kb.run_worker(until_idle=True)
    assert kb.status(1)["workspace"]["index_stamp"] == kb.head(1)


def test_markdown_tables_and_fenced_code_stay_whole():
    chunker = Chunker(60)
    table = "| a | b |\n|---|---|\n" + "".join(f"| row {i} | value {i} |\n" for i in range(5))
    code = "```python\n" + "\n\n".join(f"def f{i}():\n    return {i}" for i in range(4)) + "\n```"
    text = "\n\n".join(
        [f"Paragraph {i} with some words in it to fill tokens." for i in range(6)]
        + [table, "More text here.", code, "end"]
    )
    chunks = chunker.chunk(text)
    holding_table = [c for c in chunks if "| row" in c.text]
    holding_code = [c for c in chunks if "def f" in c.text]
    assert len(holding_table) == 1 and "| a | b |" in holding_table[0].text and "row 4" in holding_table[0].text
    assert len(holding_code) == 1 and "```python" in holding_code[0].text
    assert holding_code[0].text.count("```") == 2
    for chunk in chunks:
        assert text[chunk.start_char : chunk.end_char] == chunk.text
        assert chunk.token_count <= 60
    # an oversized table is cut between rows, never inside one
    big = "| a | b |\n|---|---|\n" + "".join(f"| row {i} | value {i} |\n" for i in range(60))
    for chunk in Chunker(60).chunk(big):
        assert all(line.startswith("|") and line.endswith("|") for line in chunk.text.split("\n"))


def test_vector_leg_returns_k_exact_rows_in_a_small_workspace_beside_a_big_one(kb):
    embedder = kb.use_embedder(HashingEmbedder())
    write_all(kb, 1, generated_corpus(80))
    write_all(kb, 2, {f"/documents/s{i}.md": p for i, p in enumerate(generated_paragraphs(12, seed=11))})
    kb.index(1)
    kb.index(2)
    small = _chunk_set(kb, 2)
    assert len(small) == 12
    texts = {f"/documents/s{i}.md": p for i, p in enumerate(generated_paragraphs(12, seed=11))}
    vector = embedder.embed(["refund policy annual plan"])[0]
    from kb.index.embedding import vector_literal

    leg = [r["id"] for r in named_rows(kb, "bench_vector_leg", workspace_id=2, embedding=vector_literal(vector), k=10)]
    assert len(leg) == 10
    scores = {r["id"]: float(embedder.embed([_embedded(kb, 2, r, texts[r["path"]])])[0] @ vector) for r in small}
    exact = sorted(scores, key=lambda i: (-scores[i], i))[:10]
    assert leg == exact


def test_index_job_with_failed_documents_defers_a_delayed_retry(kb):
    kb.use_embedder(PoisonEmbedder())
    write_all(kb, 1, {"/documents/ok.md": "fine\n", "/documents/bad.md": "POISON here\n"})
    kb.run_worker(until_idle=True)
    jobs = named_rows(kb, "test_jobs")
    assert any(j["task_name"] == "kb.index_changes" and j["status"] == "succeeded" for j in jobs)
    waiting = [j for j in jobs if j["status"] == "todo"]
    assert len(waiting) == 1 and waiting[0]["task_name"] == "kb.defer_when_due"
    assert waiting[0]["queueing_lock"] == "index-retry:1" and waiting[0]["scheduled_later"]
    assert kb.sweep().retry_deferred == [1]  # coalesced with the waiting retry
    assert len([j for j in named_rows(kb, "test_jobs") if j["status"] == "todo"]) == 1
    # a new revision's immediate job is not blocked by the waiting retry
    write_all(kb, 1, {"/documents/more.md": "more\n"}, "more")
    locks = sorted(j["queueing_lock"] for j in named_rows(kb, "test_jobs") if j["status"] == "todo")
    assert locks == ["index-retry:1", "index:1", "projection:1"]


def test_a_document_moved_while_it_is_indexed_is_stamped_where_it_is(kb, monkeypatch):
    """A projection can move a document between the indexer reading its row and marking it
    indexed. The mark applies only at the path the indexer read, so the document stays lagging
    instead of being stamped with a revision at which its new path did not exist, and the next run
    stamps it where it is: the search envelope's (path, revision) reads back (design §8)."""
    from kb.index.indexer import Indexer

    kb.use_embedder(HashingEmbedder())
    kb.create_workspace(1)
    with kb.transaction(1, "first", "t") as tx:
        tx.write("/documents/a.md", "alpha beta gamma\n")
    original = Indexer._write_document
    moved = []

    def move_first(self, conn, workspace_id, head, p, vectors, report):
        if not moved:
            with kb.transaction(1, "move", "t") as move:
                move.move("/documents/a.md", "/documents/b.md")
            kb.project(1)
            moved.append(move.revision.id)
        return original(self, conn, workspace_id, head, p, vectors, report)

    monkeypatch.setattr(Indexer, "_write_document", move_first)
    kb.index(1)
    monkeypatch.setattr(Indexer, "_write_document", original)
    kb.index(1)
    [envelope] = kb.search(1, "alpha beta", k=1)
    assert envelope.path == "/documents/b.md"
    assert envelope.revision == moved[0]
    assert kb.read(1, envelope.path, envelope.revision) == b"alpha beta gamma\n"


def test_a_document_postgres_refuses_fails_alone_in_its_batch(kb):
    """design §7: a batch is written in one transaction; when Postgres refuses one document's
    chunks, the batch is written again document by document and only that document fails."""
    docs = generated_corpus(12)
    refused = sorted(docs)[5]
    docs[refused] = "# Refused\n\nthis text is REFUSED BY POSTGRES\n"
    write_all(kb, 1, docs)
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["test_create_chunk_refusal"])
        conn.execute(queries["test_install_chunk_refusal"])
    report = kb.index(1)
    assert report.documents_indexed == 11 and report.documents_failed == 1
    assert list(report.failures) == [refused] and "refused by a test trigger" in report.failures[refused]
    states = {r["path"]: r["status"] for r in named_rows(kb, "test_document_states", workspace_id=1)}
    assert states[refused] == "failed" and sum(s == "indexed" for s in states.values()) == 11
