"""design §7, §14: kill -9 a real Procrastinate worker in the middle of a reindex; the
stalled-job task retries the job, the reindex resumes from its recorded cursor, and the index ends
identical to an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from support.commands import run_cli
from support.generated_documents import generated_corpus, named_rows, write_all
from support.named_queries import queries
from support.waiting import wait_until

from kb.db import database

TESTS = Path(__file__).resolve().parent


def _job(kb, task: str) -> dict | None:
    return next((j for j in named_rows(kb, "test_jobs") if j["task_name"] == task), None)


def _comparable(kb, ws):
    return [
        (r["path"], r["position"], r["text_sha256"], r["start_char"], r["end_char"], r["start_line"], r["end_line"])
        for r in named_rows(kb, "test_chunk_set", workspace_id=ws)
    ]


def _kill_a_worker_mid_reindex(kb, kb_env, documents: int, done: int) -> dict:
    """Write ``documents`` documents, defer one reindex, run a slow real worker until ``done``
    documents are indexed, kill -9 it; returns the worker environment (stalled after 2 s)."""
    write_all(kb, 1, generated_corpus(documents))
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["delete_todo_jobs_for_tests"])  # only the reindex below runs
    kb.defer_reindex(1)
    env = {
        **kb_env,
        "KB_STALLED_JOB_SECONDS": "2",
        "KB_MAINTENANCE_CRON": "* * * * * *",
        "KB_EMBED_BATCH_SIZE": "8",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    slow = subprocess.Popen(
        [sys.executable, str(TESTS / "support" / "slow_worker.py"), "0.3"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: next(
                (r for r in named_rows(kb, "test_index_runs", workspace_id=1) if r["documents_done"] >= done), None
            ),
            120,
            f"{done} documents indexed",
        )
    finally:
        os.kill(slow.pid, signal.SIGKILL)
        slow.wait()
    return env


def test_kill_9_mid_reindex_is_retried_and_resumes_to_the_same_index(kb, kb_env):
    docs = generated_corpus(200)
    env = _kill_a_worker_mid_reindex(kb, kb_env, 200, 64)
    runs = named_rows(kb, "test_index_runs", workspace_id=1)
    assert len(runs) == 1 and runs[0]["status"] == "running" and runs[0]["documents_done"] < 200
    assert runs[0]["cursor_document_id"] is not None
    assert _job(kb, "kb.reindex")["status"] == "doing"  # its worker is dead

    worker = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _job(kb, "kb.reindex")["status"] == "succeeded", 120, "the retried reindex")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    retried = [
        j
        for j in named_rows(kb, "test_jobs")
        if j["task_name"] == "kb.retry_stalled_jobs" and j["status"] == "succeeded"
    ]
    assert retried, "the stalled-job task ran"
    assert _job(kb, "kb.reindex")["attempts"] == 2
    runs = named_rows(kb, "test_index_runs", workspace_id=1)
    reindex_runs = [r for r in runs if r["kind"] == "reindex"]
    assert len(reindex_runs) == 1 and reindex_runs[0]["status"] == "finished"
    assert reindex_runs[0]["resumed_count"] == 1 and reindex_runs[0]["documents_done"] == 200
    lag = named_rows(kb, "test_index_lag", workspace_id=1)[0]
    assert lag["stamp"] == kb.head(1) and lag["documents_pending"] == 0 and lag["documents_failed"] == 0

    # the same documents indexed without interruption give the same chunk set
    write_all(kb, 2, docs)
    kb.index(2)
    assert _comparable(kb, 1) == _comparable(kb, 2)
    assert len(_comparable(kb, 1)) == len({(p, pos) for p, pos, *_ in _comparable(kb, 1)})


def test_stalled_job_covered_by_a_waiting_one_is_aborted_and_the_waiting_one_converges(kb, kb_env):
    """A killed worker's job cannot go back to todo while an identical job (same queueing lock)
    waits; the stalled one must stop holding the workspace lock, and the waiting job converges
    the index (found by an adversarial test: the workspace stayed unindexed forever). It was
    marked failed, and stayed so: `kb status` showed "index@…/failed=1" beside an index with no
    failed document, a failure nobody could act on. It is recorded aborted (design §7)."""
    env = _kill_a_worker_mid_reindex(kb, kb_env, 120, 16)
    stalled = _job(kb, "kb.reindex")
    assert stalled["status"] == "doing"
    assert kb.defer_reindex(1) is not None  # a second one waits with the same queueing lock

    worker = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(
            lambda: any(
                j["task_name"] == "kb.reindex" and j["status"] == "succeeded" for j in named_rows(kb, "test_jobs")
            ),
            120,
            "the waiting reindex",
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    by_id = {j["id"]: j for j in named_rows(kb, "test_jobs")}
    assert by_id[stalled["id"]]["status"] == "aborted"
    assert not [j for j in by_id.values() if j["status"] == "failed"], by_id
    lag = named_rows(kb, "test_index_lag", workspace_id=1)[0]
    assert lag["stamp"] == kb.head(1) and lag["documents_pending"] == 0 and lag["documents_failed"] == 0
    status = run_cli(env, "status", "-w", "1").stdout
    assert "failed=" not in status and ", 0 failed," in status, status
