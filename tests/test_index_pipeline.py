"""design §7: an index run writes one batch on a writer connection while it cuts and embeds the
next. A failing document in a pipelined run still fails alone, and a run interrupted while a batch
is being written leaves that batch committed (never half written), checkpoints nothing it has not
committed, outlives no write, and the next run converges."""

from __future__ import annotations

import threading

import pytest
from support.embedders import CountingEmbedder, StoppingEmbedder, WorkerStopped
from support.generated_documents import generated_corpus, named_rows, write_all
from support.named_queries import queries

from kb.db import database
from kb.index.indexer import DOCUMENT_BATCH, Indexer, sha256_text


def _documents(kb, ws: int = 1) -> list[dict]:
    return named_rows(kb, "test_documents_in_id_order", workspace_id=ws)


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kb-index-writer")]


def test_a_document_postgres_refuses_fails_alone_in_a_pipelined_run(kb):
    """Three batches, written while the next is embedded; Postgres refuses one document of the
    second: that batch is written again document by document, only that document fails, and the
    run's counts and checkpoint say so."""
    docs = generated_corpus(2 * DOCUMENT_BATCH + 20)
    write_all(kb, 1, docs)
    kb.project(1)
    refused = _documents(kb)[DOCUMENT_BATCH + 5]["path"]  # in the second batch
    with kb.transaction(1, "refused", "t") as tx:
        tx.write(refused, "# Refused\n\nthis text is REFUSED BY POSTGRES\n")
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["test_create_chunk_refusal"])
        conn.execute(queries["test_install_chunk_refusal"])
    report = kb.index(1)
    assert report.documents_indexed == len(docs) - 1 and report.documents_failed == 1
    assert list(report.failures) == [refused] and "refused by a test trigger" in report.failures[refused]
    states = {d["path"]: d["status"] for d in _documents(kb)}
    assert states.pop(refused) == "failed" and set(states.values()) == {"indexed"}
    [run] = [r for r in named_rows(kb, "test_index_runs", workspace_id=1) if r["id"] == report.run_id]
    assert run["documents_done"] == len(docs) and run["documents_failed"] == 1
    assert run["chunks_written"] == report.chunks_written > 0
    assert not _writer_threads()


def test_a_run_stopped_while_a_batch_is_written_resumes_and_converges(kb):
    """A reindex stops (the embedder raises what a stopping worker raises) while it embeds the third
    batch: the second batch, already handed to the writer, is committed whole and checkpointed
    before the run lets go of the workspace; the third has nothing written. The next reindex
    resumes after the checkpoint and the index converges to what an uninterrupted run writes."""
    docs = generated_corpus(3 * DOCUMENT_BATCH)
    write_all(kb, 1, docs)
    kb.project(1)
    marked = _documents(kb)[2 * DOCUMENT_BATCH + 3]["path"]  # in the third batch
    with kb.transaction(1, "mark", "t") as tx:
        tx.write(marked, docs[marked] + "\nSTOP HERE\n")
    embedder = kb.use_embedder(StoppingEmbedder("STOP HERE"))
    with pytest.raises(WorkerStopped):
        kb.reindex(1)
    assert embedder.stopped and not _writer_threads()  # no write outlives the run
    [run] = named_rows(kb, "test_index_runs", workspace_id=1)
    documents = _documents(kb)
    assert run["status"] == "running" and run["documents_done"] == 2 * DOCUMENT_BATCH
    assert run["cursor_document_id"] == documents[2 * DOCUMENT_BATCH - 1]["id"]
    indexed = [d["status"] == "indexed" and d["indexed_content_id"] == d["content_id"] for d in documents]
    assert indexed == [True] * (2 * DOCUMENT_BATCH) + [False] * DOCUMENT_BATCH

    report = kb.reindex(1)
    assert report.resumed and report.documents_failed == 0 and not report.failures
    assert report.documents_done == 3 * DOCUMENT_BATCH and report.chunks_reused == 0  # after the cursor
    assert all(d["status"] == "indexed" and d["indexed_content_id"] == d["content_id"] for d in _documents(kb))
    workspace = next(w for w in kb.workspaces() if w["id"] == 1)
    assert workspace["last_indexed_revision"] == kb.head(1)
    chunks = named_rows(kb, "test_chunk_set", workspace_id=1)
    write_all(
        kb, 2, {path: text for path, text in docs.items() if path != marked} | {marked: docs[marked] + "\nSTOP HERE\n"}
    )
    kb.index(2)
    fresh = named_rows(kb, "test_chunk_set", workspace_id=2)
    key = ("path", "position", "text_sha256", "start_char", "end_char", "start_line", "end_line")
    assert [tuple(r[k] for k in key) for r in chunks] == [tuple(r[k] for k in key) for r in fresh]


def test_languages_detected_by_the_writer_or_the_run_agree(kb):
    """A new document's language is detected by the writer thread as it builds the rows; a
    document with chunk rows has it detected before embedding, since reusing a row depends on it.
    Both give the same configuration: a reindex reuses every row, and a document whose language
    changed gets its rows rebuilt in the new one."""
    de = "# Häuser\n\nIn diesem Kapitel werden die Häuser der Stadt und ihre Gärten beschrieben.\n"
    en = "# Houses\n\nThis chapter describes the houses of the town and their gardens.\n"
    ru = "# Заметки\n\nЭта страница описывает, как создавать заметки и хранить их в хранилище.\n"
    write_all(kb, 1, {"/documents/de.md": de, "/documents/en.md": en, "/documents/ru.md": ru})
    first = kb.index(1)
    assert first.documents_indexed == 3 and first.chunks_reused == 0
    configs = {r["path"]: r["text_config"] for r in named_rows(kb, "test_chunk_configs", workspace_id=1)}
    assert configs == {"/documents/de.md": "german", "/documents/en.md": "english", "/documents/ru.md": "russian"}

    again = kb.reindex(1)
    assert again.chunks_written == 0 and again.chunks_reused == first.chunks_written
    with kb.transaction(1, "now in German", "t") as tx:
        tx.write("/documents/en.md", de.replace("Häuser", "Gärten", 1))
    changed = kb.index(1)
    assert changed.documents_indexed == 1 and changed.chunks_written > 0
    configs = {r["path"]: r["text_config"] for r in named_rows(kb, "test_chunk_configs", workspace_id=1)}
    assert configs["/documents/en.md"] == "german"


def test_a_stopped_run_keeps_every_vector_it_embedded_in_the_cache(kb):
    """The writer thread caches each embedder batch's vectors, queued ahead of the batch's write;
    a run stopped in its third batch has cached every text it embedded before the stop, and the
    next run embeds none of them again."""
    docs = generated_corpus(3 * DOCUMENT_BATCH)
    write_all(kb, 1, docs)
    kb.project(1)
    marked = _documents(kb)[2 * DOCUMENT_BATCH + 3]["path"]  # in the third batch
    with kb.transaction(1, "mark", "t") as tx:
        tx.write(marked, docs[marked] + "\nSTOP HERE\n")
    embedder = kb.use_embedder(StoppingEmbedder("STOP HERE"))
    with pytest.raises(WorkerStopped):
        kb.index(1)
    embedded = {sha256_text(t) for t in embedder.texts}
    assert embedded
    with database.connect(kb.database_url, autocommit=True) as conn:
        cached = conn.execute(
            queries["cached_embeddings"], {"model": embedder.model, "dim": embedder.dim, "hashes": list(embedded)}
        ).fetchall()
    assert {r["text_sha256"] for r in cached} == embedded
    again = kb.use_embedder(CountingEmbedder())
    kb.index(1)
    assert not embedded & {sha256_text(t) for t in again.texts}


def test_a_run_reads_its_documents_in_bulk_and_a_missing_blob_fails_its_document_alone(kb, monkeypatch):
    """A run of at least BULK_READ_MIN documents reads their bytes through one ``git cat-file``
    stream, not one object-store lookup each; a document whose blob is missing from the repository
    stops the stream there, fails alone as damage (StorageError naming the blob, as the stream and a
    lookup both say), and the rest are read one by one."""
    from kb.git.repository import BULK_READ_MIN, Repository

    docs = generated_corpus(BULK_READ_MIN + 10)
    write_all(kb, 1, docs)
    looked_up = []
    lookup = Repository.blob
    monkeypatch.setattr(Repository, "blob", lambda self, blob_id: looked_up.append(blob_id) or lookup(self, blob_id))
    first = kb.index(1)
    assert first.documents_indexed == len(docs) and first.documents_failed == 0
    assert looked_up == []

    write_all(kb, 2, docs)
    kb.project(2)
    documents = _documents(kb, 2)
    gone = documents[20]
    objects = kb.settings.knowledge_store / "2" / ".git" / "objects"
    loose = objects / gone["content_id"][:2] / gone["content_id"][2:]
    assert loose.exists(), "the test needs the blob loose to take it away"
    loose.unlink()
    report = kb.index(2)
    assert report.documents_failed == 1 and list(report.failures) == [gone["path"]]
    assert f"StorageError: object {gone['content_id']} is missing" in report.failures[gone["path"]]
    assert report.documents_indexed == len(docs) - 1
    assert looked_up == [d["content_id"] for d in documents[20:]]


def test_a_batch_stamps_its_documents_in_one_statement_as_one_by_one(kb):
    """A batch's documents are stamped by one statement (``mark_documents_indexed``, arrays) that
    sets what ``mark_document_indexed`` sets document by document: status, content, path,
    revision, error and attempts, for indexed and unindexable documents alike, and leaves a
    document whose content or path differs from the run's untouched."""
    write_all(kb, 1, generated_corpus(5))
    kb.project(1)
    docs = named_rows(kb, "test_documents_in_id_order", workspace_id=1)
    paths = {d["id"]: d["path"] for d in docs}
    entries = [
        (docs[0], "indexed", None),
        (docs[1], "unindexable", "UnindexableDocument: NUL bytes"),
        (docs[2], "indexed", None),
        ({**docs[3], "content_id": "0" * 40}, "indexed", None),  # changed since the run read it
        ({**docs[4], "path": "/elsewhere.md"}, "indexed", None),  # moved since the run read it
    ]
    stamps = []
    with database.connect(kb.database_url, autocommit=True) as conn:
        for one_by_one in (True, False):
            with conn.transaction(force_rollback=True):
                conn.execute(queries["test_set_index_attempts"], {"document_id": docs[2]["id"], "attempts": 2})
                if one_by_one:
                    for row, status, error in entries:
                        conn.execute(
                            queries["mark_document_indexed"],
                            {
                                "document_id": row["id"],
                                "content_id": row["content_id"],
                                "path": row["path"],
                                "revision_id": "f" * 40,
                                "status": status,
                                "error": error,
                            },
                        )
                else:
                    conn.execute(
                        queries["mark_documents_indexed"],
                        {
                            "document_ids": [row["id"] for row, _, _ in entries],
                            "content_ids": [row["content_id"] for row, _, _ in entries],
                            "paths": [row["path"] for row, _, _ in entries],
                            "statuses": [status for _, status, _ in entries],
                            "errors": [error for _, _, error in entries],
                            "revision_id": "f" * 40,
                        },
                    )
                stamps.append(conn.execute(queries["test_document_stamps"], {"workspace_id": 1}).fetchall())
    assert stamps[0] == stamps[1]
    by_id = {s["id"]: s for s in stamps[1]}
    assert [by_id[d["id"]]["status"] for d in docs] == ["indexed", "unindexable", "indexed", "pending", "pending"]
    assert by_id[docs[2]["id"]]["index_attempts"] == 0 and by_id[docs[2]["id"]]["index_error"] is None
    assert by_id[docs[1]["id"]]["index_error"] == "UnindexableDocument: NUL bytes"
    assert by_id[docs[0]["id"]]["indexed_path"] == paths[docs[0]["id"]] and by_id[docs[0]["id"]]["indexed_revision"]


def test_a_batchs_chunk_rows_are_read_by_the_writer_while_the_run_cuts_it(kb, monkeypatch):
    """Each batch's chunk rows are read on the writer thread, queued ahead of the previous batch's
    write, not on the thread that cuts and embeds; every batch still gets its own documents' rows,
    so a reindex of an indexed workspace reuses every row, batch after batch."""
    docs = generated_corpus(2 * DOCUMENT_BATCH + 5)
    write_all(kb, 1, docs)
    first = kb.index(1)
    assert first.chunks_written > 0
    readers: list[tuple[str, int]] = []
    read = Indexer._chunk_rows

    def spied(conn, batch):
        readers.append((threading.current_thread().name, len(batch)))
        return read(conn, batch)

    monkeypatch.setattr(Indexer, "_chunk_rows", staticmethod(spied))
    again = kb.reindex(1)
    assert again.chunks_written == 0 and again.chunks_reused == first.chunks_written
    assert [n for _, n in readers] == [DOCUMENT_BATCH, DOCUMENT_BATCH, 5]
    assert all(name.startswith("kb-index-writer") for name, _ in readers)


def test_a_batchs_chunk_rows_hold_their_texts_and_spans_exactly(kb):
    """A batch's chunk rows travel to Postgres as JSON columns (insert_chunks): texts with quotes,
    backslashes, braces, commas, escapes, tabs, non-ASCII, CJK and astral characters are stored as
    cut, each row at its position and span, in the documents' order."""
    awkward = "He said \"{a,b}\" \\ back\\slash, \\u0041 not an escape, tab\there, naïve Ωμέγα 日本語 😀 'quoted'\n"
    docs = {
        f"/documents/p{i:02d}.md": f"# Page {i}\n\n{awkward * (i % 3 + 1)}\n## More {i}\n\n{awkward}" for i in range(20)
    }
    write_all(kb, 1, docs)
    report = kb.index(1)
    assert report.documents_indexed == len(docs) and report.chunks_written > 0
    rows = named_rows(kb, "test_chunk_set", workspace_id=1)
    assert len(rows) == report.chunks_written
    for row in rows:
        text = docs[row["path"]]
        assert text[row["start_char"] : row["end_char"]] == row["text"]
        assert row["start_line"] == text.count("\n", 0, row["start_char"]) + 1
    assert [(r["path"], r["position"]) for r in rows] == sorted((r["path"], r["position"]) for r in rows)
    assert sorted(r["id"] for r in rows) == [r["id"] for r in sorted(rows, key=lambda r: (r["path"], r["position"]))]


def test_a_run_stops_when_its_workspace_is_deleted_under_it(kb, settings):
    """`kb workspace delete --force` while a big index run ran: the run went on cutting and
    embedding every remaining batch (minutes for 25,000 documents, holding the worker other
    workspaces wait for), each batch's documents settled as gone. After a batch whose every
    document is gone, the run now checks its workspace and stops with WorkspaceNotFound."""
    from kb.errors import WorkspaceNotFound
    from kb.knowledge_base import KnowledgeBase

    write_all(kb, 1, generated_corpus(6 * DOCUMENT_BATCH))
    kb.use_embedder(CountingEmbedder())
    deleted: list[object] = []
    seen: list[int] = []

    def delete_after_the_first_batch(done: int, total: int, report) -> None:
        seen.append(done)
        if done and not deleted:  # the writer is idle here: the deletion takes its locks at once
            other = KnowledgeBase.open(settings)
            worker = threading.Thread(target=lambda: deleted.append(other.delete_workspace(1, force=True)))
            worker.start()
            worker.join(60)
            other.close()

    from kb.index.indexer import Indexer

    indexer = Indexer(kb.settings, kb.database_url, kb.embedder, kb.chunker, delete_after_the_first_batch)
    with pytest.raises(WorkspaceNotFound, match="deleted while it was being indexed"):
        indexer.converge(1)
    assert deleted and not _writer_threads()
    assert max(seen) <= 3 * DOCUMENT_BATCH, f"the run went on through the deleted workspace: {seen}"
