"""design §9: the span fill converges adopted legacy chunks to true spans — all or nothing
per document, repeated paragraphs by order, pausable with psql within one batch, and a killed
worker converges."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import psycopg
import pytest
from support.legacy import LegacyHashEmbedder, drop_legacy, english_pages, make_legacy
from support.named_queries import queries

from kb.citations.envelope import document_lines
from kb.db.database import embedded_bin_dir
from kb.legacy.span_fill import align_chunks


@pytest.fixture(scope="module")
def english_legacy(pg_server):
    made = make_legacy(pg_server, english_pages(), workspace=3)
    yield made
    drop_legacy(pg_server, made[0])


@pytest.fixture
def seeded(kb, english_legacy):
    """Workspace 5 seeded from the legacy set of the test corpus's English pages and flipped."""
    embedder = LegacyHashEmbedder()
    kb.use_embedder(embedder)
    dsn, summary = english_legacy
    report = kb.seed(dsn, 3, 5, yes=True, flip=True)
    assert report.flipped and embedder.texts == []
    return kb, embedder, summary, {e.legacy_id: e for e in report.entries}


def chunk_rows(kb, path: str) -> list[dict]:
    with psycopg.connect(kb.database_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(queries["test_chunk_rows_of"], {"workspace_id": 5, "path": path}).fetchall()


def scalar(kb, query: str, **params):
    with psycopg.connect(kb.database_url) as conn:
        return conn.execute(query, params).fetchone()[0]


def psql(url: str, statement: str) -> None:
    """Run one statement with the real psql client (the DBA's tool), psycopg if none is installed."""
    binary = embedded_bin_dir() / "psql"
    executable = str(binary) if binary.exists() else shutil.which("psql")
    if executable is None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement)
        return
    subprocess.run([executable, url, "-v", "ON_ERROR_STOP=1", "-c", statement], check=True, capture_output=True)


def test_align_chunks_cursor_scan_picks_repeated_text_by_order():
    text = "# T\n\npara\n\nother\n\npara\n\npara\n"
    spans = align_chunks(text, ["# T", "para", "other", "para", "para"])
    assert [s.start_line for s in spans] == [1, 3, 5, 7, 9]
    assert all(text[s.start_char : s.end_char] for s in spans)
    assert align_chunks(text, ["other", "# T"]) is None  # out of order: all or nothing
    assert align_chunks(text, ["para", "gone"]) is None
    crlf = "a\r\n\r\nb\r\n"
    assert [(s.start_line, s.end_line) for s in align_chunks(crlf, ["a", "b\r\n"])] == [(1, 1), (3, 3)]


def test_span_fill_gives_true_spans_keeps_stale_documents_null_and_search_numbers_lines(seeded):
    kb, embedder, summary, by_id = seeded
    quirks = summary["quirks"]
    before = kb.search(5, "keyboard shortcuts hotkeys", k=5)
    assert before and all(not e.numbered for e in before)

    report = kb.span_fill().run()
    stale_ids = set(quirks["stale_chunks"])
    assert report.documents_stale == len([i for i in stale_ids if by_id[i].outcome == "seeded"])
    assert (
        report.documents_filled
        == len(by_id) - len([e for e in by_id.values() if e.outcome == "skipped"]) - report.documents_stale
    )
    store = kb.store(5)
    for legacy_id, entry in by_id.items():
        if entry.outcome != "seeded":
            continue
        text = store.read(entry.path).decode()
        rows = chunk_rows(kb, entry.path)
        assert rows, entry.path
        if legacy_id in stale_ids:
            assert all(r["start_line"] is None and r["start_char"] is None for r in rows), entry.path
            continue
        previous_end = 0
        for row in rows:
            assert text[row["start_char"] : row["end_char"]] == row["text"]
            assert row["start_char"] >= previous_end  # in order, never overlapping
            previous_end = row["end_char"]
            first = row["start_char"] + len(row["text"]) - len(row["text"].lstrip())
            last = first + len(row["text"].strip()) - 1
            assert row["start_line"] == text.count("\n", 0, first) + 1
            assert row["end_line"] == text.count("\n", 0, last) + 1
    # repeated paragraphs: the body ends with the paragraph twice more; the last chunk is the last
    # occurrence, so it ends on the file's last line
    for legacy_id in quirks["repeated_para"]:
        entry = by_id[legacy_id]
        rows = chunk_rows(kb, entry.path)
        lines = document_lines(store.read(entry.path))
        assert rows[-1]["end_line"] == len(lines)
    # stale documents are recorded and not retried
    assert scalar(kb, queries["test_count_span_fill_skips"], workspace_id=5) == report.documents_stale
    again = kb.span_fill().run()
    assert again.documents_filled == again.documents_stale == 0
    backlog = kb.span_fill().status(5)["backlog"][0]
    assert backlog["documents_stale"] == report.documents_stale
    assert backlog["chunks_without_spans"] == scalar(kb, queries["test_count_skipped_chunks"])

    # the same search now shows true line numbers equal to the file
    after = kb.search(5, "keyboard shortcuts hotkeys", k=5)
    assert [e.path for e in after] == [e.path for e in before]
    numbered = [e for e in after if e.numbered]
    assert numbered
    for envelope in numbered:
        lines = document_lines(store.read(envelope.path))
        for number, line in envelope.lines:
            assert lines[number - 1] == line
    assert embedder.texts == ["keyboard shortcuts hotkeys"] * 2  # queries only, nothing re-embedded


def test_pause_with_psql_stops_within_one_batch_and_resume_finishes(seeded):
    kb, *_ = seeded
    psql(kb.database_url, queries["test_span_fill_batches_of_4_every_150ms"])
    fill = kb.span_fill()
    seen: list[int] = []
    at_pause: list[int] = []

    def progress(report):
        seen.append(report.batches)
        if report.batches == 3 and not at_pause:
            psql(kb.database_url, queries["test_span_fill_pause"])
            at_pause.append(report.batches)

    result: list = []
    runner = threading.Thread(target=lambda: result.append(fill.run(progress=progress)))
    runner.start()
    runner.join(timeout=120)
    report = result[0]
    assert report.paused and at_pause == [3]
    assert report.batches <= at_pause[0] + 1  # the batch in flight at most
    backlog = fill.status(5)["backlog"][0]
    assert backlog["last_run_status"] == "paused" and backlog["documents_without_spans"] > 0
    assert fill.run().batches == 0  # still paused: nothing runs

    # batches of 5: the test corpus's English pages leave a dozen or so documents after the pause,
    # enough for a budgeted run that yields and a last one that finishes
    psql(kb.database_url, queries["test_span_fill_resume_in_batches_of_5"])
    partial = fill.run(max_batches=1)  # a budget spent with work left: the job queues its continuation
    assert partial.yielded and partial.batches == 1 and not partial.paused
    assert fill.status(5)["backlog"][0]["last_run_status"] == "yielded"
    finished = fill.run()
    assert not finished.paused and finished.documents_filled > 0
    assert fill.status(5)["backlog"][0]["last_run_status"] == "finished"
    assert scalar(kb, queries["test_count_fillable_chunks_without_spans"], workspace_id=5) == 0


def test_kill_9_of_a_worker_mid_fill_converges(seeded, kb_env):
    kb, *_ = seeded
    psql(kb.database_url, queries["test_span_fill_batches_of_3_every_300ms"])
    with psycopg.connect(kb.database_url) as conn:
        conn.execute(queries["delete_todo_jobs_for_tests"])
    job_id = kb.span_fill().defer()
    assert job_id is not None
    env = {
        **kb_env,
        "KB_STALLED_JOB_SECONDS": "2",
        "KB_MAINTENANCE_CRON": "* * * * * *",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    # stderr to a file, not a pipe nobody reads: a worker whose progress lines fill a pipe's
    # buffer blocks on its next line (a slow run prints a line per periodic job every second)
    log = tempfile.TemporaryFile()
    worker = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "worker"], env=env, stdout=subprocess.DEVNULL, stderr=log
    )
    try:
        deadline = time.monotonic() + 120
        while scalar(kb, queries["test_span_fill_most_batches"]) < 3:
            assert time.monotonic() < deadline and worker.poll() is None, "the worker never filled 3 batches"
            time.sleep(0.1)
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    assert scalar(kb, queries["test_job_status"], id=job_id) == "doing"
    left = scalar(kb, queries["test_count_chunks_without_spans"], workspace_id=5)
    assert left > 0

    psql(kb.database_url, queries["test_span_fill_batches_of_50"])
    worker = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "worker"], env=env, stdout=subprocess.DEVNULL, stderr=log
    )
    try:
        deadline = time.monotonic() + 120
        while (status := scalar(kb, queries["test_job_status"], id=job_id)) != "succeeded":
            if time.monotonic() >= deadline or worker.poll() is not None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=60)
                log.seek(0)
                jobs = psycopg.connect(kb.database_url).execute(queries["test_job_list"]).fetchall()
                raise AssertionError(
                    f"the stalled span fill never finished: job {job_id} is {status}; jobs {jobs}; "
                    f"worker stderr (last 3000 characters): {log.read().decode()[-3000:]}"
                )
            time.sleep(0.2)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
    runs = [r[0] for r in psycopg.connect(kb.database_url).execute(queries["test_span_fill_run_statuses"]).fetchall()]
    assert runs[0] == "interrupted" and runs[-1] == "finished"
    assert scalar(kb, queries["test_count_fillable_chunks_without_spans"], workspace_id=5) == 0
