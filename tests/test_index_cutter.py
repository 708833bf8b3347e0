"""design §7: an index run may cut its documents in a cutter process of its own (kb.index.cutting,
``KB_INDEX_CUTTER``). What the child cuts equals what the run's process cuts, the stored index is
the same either way, a dead child costs no document, and no child outlives its run — nor a worker
stopped by SIGTERM or killed by SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support.generated_documents import generated_corpus, named_rows, write_all
from support.named_queries import queries
from support.waiting import wait_until

from kb.db import database
from kb.index.chunking import Chunker, LazyChunker
from kb.index.cutting import CutterProcess, cut_document, settle_languages
from kb.index.embedding import model_cache
from kb.index.indexer import DOCUMENT_BATCH, Indexer, _Cuts
from kb.knowledge_base import KnowledgeBase

TESTS = Path(__file__).resolve().parent

ODD = {
    "/documents/odd/binary.md": "# Binary\n\nhas a \x00 byte\n",
    "/documents/odd/german.md": "# Rückgabe\n\nDie Rückgabe ist innerhalb von dreißig Tagen möglich, wenn die Ware unbenutzt ist.\n",
    "/documents/odd/fenced.md": "# Code\n\n```\n# not a heading\n\n\nstill code\n```\n\n## After\n\ntext after the fence\n",
    "/documents/odd/empty.md": "",
}


def _processes() -> dict[int, tuple[int, str, str]]:
    """``{pid: (parent pid, state, command line)}`` of the machine's processes (/proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            found[int(entry.name)] = (int(fields[1]), fields[0], cmdline)
    return found


def _cutters(pid: int | None = None) -> list[int]:
    """The live (not zombie) cutter processes descending from ``pid`` (this process when None)."""
    processes, ancestors = _processes(), {pid or os.getpid()}
    grew = True
    while grew:
        grew = False
        for child, (parent, _, _) in processes.items():
            if parent in ancestors and child not in ancestors:
                ancestors.add(child)
                grew = True
    return [
        child
        for child, (_, state, cmdline) in processes.items()
        if child in ancestors and state != "Z" and "kb.index.cutting" in cmdline
    ]


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (exited, even if not yet reaped)."""
    return pid not in _processes() or _processes()[pid][1] == "Z"


def _documents(settings) -> list[tuple[str, bytes | str]]:
    docs = {**generated_corpus(40), **ODD}
    items: list[tuple[str, bytes | str]] = [(path, text.encode()) for path, text in docs.items()]
    items.append(("unreadable.md", "OSError: the blob could not be read"))
    items.append(("latin1.md", "caf\xe9".encode("latin-1")))
    return items


def _started(cutter: CutterProcess) -> CutterProcess:
    wait_until(cutter.ready, 60, "the cutter process started")
    return cutter


def test_the_cutter_process_cuts_what_this_process_cuts(settings):
    """Every document — plain, fenced, German, empty, with a NUL byte, not UTF-8, unreadable — comes
    back from the child as ``cut_document`` + ``settle_languages`` cut it here; the child is gone
    once closed."""
    items = _documents(settings)
    chunker = Chunker(settings.chunk_size)
    here = [
        cut_document(chunker, settings.max_index_bytes, title, data) if isinstance(data, bytes) else None
        for title, data in items
    ]
    settle_languages(settings.fts_config, [c for c in here if c is not None])
    with CutterProcess(
        settings.chunk_size, settings.max_index_bytes, settings.fts_config, model_cache(settings)
    ) as cut:
        cut.send(items[:20])
        cut.send(items[20:])
        there = cut.receive() + cut.receive()
        pid = cut.pid
    assert pid is not None and _gone(pid) and not _cutters()
    for (title, data), mine, theirs in zip(items, here, there, strict=True):
        if mine is None:
            assert theirs.error == data, title
        else:
            assert theirs == mine, title
    assert {c.text_config for c in there if c.writable} >= {"english", "german"}, {c.text_config for c in there}
    assert any(c.unindexable for c in there) and not any(c.text for c in there)


def test_a_dead_cutter_costs_no_document(kb, settings):
    """The child dies before the run hands it anything (SIGKILL): every batch is cut in the run's
    process, equal to what a run without a cutter cuts, and the dead child is reaped."""
    write_all(kb, 1, generated_corpus(3 * DOCUMENT_BATCH))
    kb.project(1)
    rows = named_rows(kb, "test_documents_in_id_order", workspace_id=1)
    for row in rows:
        row["title"] = row["path"]
    batches = [rows[i : i + DOCUMENT_BATCH] for i in range(0, len(rows), DOCUMENT_BATCH)]
    repo = kb.store(1).repository
    indexer = Indexer(settings, kb.database_url, kb.embedder)
    cutter = _started(
        CutterProcess(settings.chunk_size, settings.max_index_bytes, settings.fts_config, model_cache(settings))
    )
    assert cutter.pid is not None
    os.kill(cutter.pid, signal.SIGKILL)
    with _Cuts(indexer, batches, lambda row: repo.blob(row["content_id"]), cutter) as cuts:
        cut = [p for _ in batches for p in cuts.next()]
    with _Cuts(indexer, batches, lambda row: repo.blob(row["content_id"]), None) as cuts:
        inline = [p for _ in batches for p in cuts.next()]
    assert [(p.row["id"], p.hashes) for p in cut] == [(p.row["id"], p.hashes) for p in inline]
    assert all(p.writable and p.hashes for p in cut)
    assert _gone(cutter) and not _cutters()


def test_a_run_waiting_for_its_cutter_cuts_here_when_the_child_dies_before_it_starts(kb, settings):
    """A run whose process has no chunker built waits for its child to start instead of cutting
    here meanwhile (design §7); a child killed before it says it is ready makes the run cut every
    batch in its own process, as a run without a cutter cuts them."""
    write_all(kb, 1, generated_corpus(2 * DOCUMENT_BATCH))
    kb.project(1)
    rows = named_rows(kb, "test_documents_in_id_order", workspace_id=1)
    batches = [rows[i : i + DOCUMENT_BATCH] for i in range(0, len(rows), DOCUMENT_BATCH)]
    repo = kb.store(1).repository
    indexer = Indexer(settings, kb.database_url, kb.embedder, LazyChunker(settings.chunk_size))
    cutter = CutterProcess(settings.chunk_size, settings.max_index_bytes, settings.fts_config, model_cache(settings))
    pid = cutter.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with _Cuts(indexer, batches, lambda row: repo.blob(row["content_id"]), cutter) as cuts:
        cut = [p for _ in batches for p in cuts.next()]
    with _Cuts(indexer, batches, lambda row: repo.blob(row["content_id"]), None) as cuts:
        inline = [p for _ in batches for p in cuts.next()]
    assert [(p.row["id"], p.hashes) for p in cut] == [(p.row["id"], p.hashes) for p in inline]
    assert len(cut) == len(rows) and all(p.writable and p.hashes for p in cut)
    assert _gone(pid) and not _cutters()


def test_a_run_stores_the_same_index_with_and_without_a_cutter_process(settings):
    """The same documents indexed with ``KB_INDEX_CUTTER=process`` (workspace 1) and ``inline``
    (workspace 2) store the same index, part by part (bin/index_fingerprint.py's parts: chunks
    with their vectors and tsvectors, documents, terms, statistics); no child is left."""
    docs = {**generated_corpus(4 * DOCUMENT_BATCH), **ODD}
    for ws, cutter in ((1, "process"), (2, "inline")):
        kb = KnowledgeBase.open(settings.model_copy(update={"index_cutter": cutter}))
        write_all(kb, ws, docs)
        report = kb.index(ws)
        assert report.documents_failed == 0 and report.documents_unindexable == 1
        assert report.documents_indexed == len(docs) - 1 and not _cutters()
    with database.connect(settings.database_url, autocommit=True) as conn:
        parts = [
            {
                row["part"]: (row["rows"], row["md5"])
                for row in conn.execute(queries["bench_index_fingerprint"], {"workspace_id": ws})
            }
            for ws in (1, 2)
        ]
    assert parts[0] == parts[1] and parts[0]["chunks"][0] > len(docs)


def _worker(kb, kb_env, documents: int) -> subprocess.Popen:
    """A slow real worker reindexing ``documents`` documents with a cutter process, once the
    cutter is running."""
    write_all(kb, 1, generated_corpus(documents))
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["delete_todo_jobs_for_tests"])
    kb.defer_reindex(1)
    env = {**kb_env, "KB_INDEX_CUTTER": "process", "KB_EMBED_BATCH_SIZE": "8", "PYTHONPATH": os.pathsep.join(sys.path)}
    worker = subprocess.Popen(
        [sys.executable, str(TESTS / "support" / "slow_worker.py"), "0.2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_until(lambda: _cutters(worker.pid), 120, "the worker's cutter process started")
    return worker


def test_a_worker_stopped_by_sigterm_leaves_no_cutter_process(kb, kb_env):
    worker = _worker(kb, kb_env, 3 * DOCUMENT_BATCH)
    [cutter] = _cutters(worker.pid)
    try:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=300) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    wait_until(lambda: _gone(cutter), 30, "the cutter process ended")


def test_a_worker_killed_by_sigkill_leaves_no_cutter_process(kb, kb_env):
    """The child reads its work from the worker: when the worker dies its stdin ends and it exits."""
    worker = _worker(kb, kb_env, 3 * DOCUMENT_BATCH)
    [cutter] = _cutters(worker.pid)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    wait_until(lambda: _gone(cutter), 30, "the cutter process ended")


def test_only_a_big_run_gets_a_cutter_process_by_default(settings):
    """``auto``: a cutter for ``CUTTER_RUN_DOCUMENTS`` documents or more (this machine has two
    cores), none below; ``process`` always; ``inline`` never."""
    from kb.index.indexer import CUTTER_RUN_DOCUMENTS

    def cutter(mode: str, documents: int) -> bool:
        indexer = Indexer(settings.model_copy(update={"index_cutter": mode}), settings.database_url, None)  # type: ignore[arg-type]
        made = indexer._cutter_for(documents)
        if made is not None:
            made.close()
        return made is not None

    assert not cutter("auto", CUTTER_RUN_DOCUMENTS - 1) and cutter("auto", CUTTER_RUN_DOCUMENTS)
    assert cutter("process", 1) and not cutter("inline", 10 * CUTTER_RUN_DOCUMENTS)
    assert not _cutters()
