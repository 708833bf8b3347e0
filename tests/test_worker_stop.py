"""design §7: how a worker stops, and what a killed one leaves. Real processes throughout: a
`kb worker` on a pseudo-terminal stopped with Ctrl-C typed twice, and workers killed with
SIGKILL beside live ones."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from support.commands import run_cli
from support.generated_documents import named_rows
from support.waiting import wait_until

TESTS = Path(__file__).resolve().parent


class _Terminal:
    """``kb ARGS`` on a pseudo-terminal of its own (its controlling terminal: a typed Ctrl-C is
    a SIGINT from the terminal, as for a user), with what it wrote kept."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # not inherited as SIG_IGN
        try:
            self.pid, self.fd = pty.fork()
            if self.pid == 0:  # the child: the CLI, nothing else
                os.execve(sys.executable, [sys.executable, "-m", "kb.adapters.cli", *args], env)
        finally:
            signal.signal(signal.SIGINT, previous)
        self.text = ""
        self.exit_code: int | None = None

    def read_until(self, pattern: str, timeout: float) -> re.Match | None:
        """Read until ``pattern`` (a regex) appears in what was written since the start, the
        process ends, or ``timeout`` seconds pass; returns the match or None."""
        deadline = time.monotonic() + timeout
        while (found := re.search(pattern, self.shown)) is None and time.monotonic() < deadline:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:  # the child closed the terminal: EIO
                break
            if not chunk:
                break
            self.text += chunk.decode(errors="replace")
        return found

    @property
    def shown(self) -> str:
        """What was written, as read: without the terminal's control sequences, and with rich's
        line wrapping (and any run of whitespace) as one space."""
        return " ".join(re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", " ", self.text).split())

    def type(self, keys: bytes) -> None:
        os.write(self.fd, keys)

    def wait(self, timeout: float) -> int:
        """Read to the end and reap the process (killed after ``timeout``); returns its exit code."""
        self.read_until(r"(?!x)x", timeout)  # never matches: reads until the terminal closes
        for _ in range(int(timeout * 10)):
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_code = os.waitstatus_to_exitcode(status)
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            raise AssertionError(f"the worker did not end within {timeout} s:\n{self.text}")
        os.close(self.fd)
        return self.exit_code


def _many_notes(tmp_path: Path, count: int) -> Path:
    notes = tmp_path / "many"
    notes.mkdir()
    for i in range(count):
        (notes / f"n{i:04}.md").write_text(f"# Note {i}\n\n" + "words about refunds and plans. " * 40 + "\n")
    return notes


def test_ctrl_c_twice_on_a_worker_says_so_at_once_and_puts_its_job_back(kb, kb_env, tmp_path):
    """Ctrl-C on a plain `kb worker` printed nothing until the job in hand ended (the notice was
    the --until-idle path's only); a second one raised KeyboardInterrupt inside the event loop:
    "job 2 … FAILED … CancelledError", tracebacks at asyncio.run()'s shutdown, the job's thread
    running on to its end, and the job left `doing` with no worker. Now the first says at once
    that the jobs in hand finish first, the second stops the index run at its next checkpoint and
    puts the job back in the queue; the next worker converges the workspace."""
    notes = 5000  # an index run of several seconds even against a fast Postgres: Ctrl-C lands in it
    run_cli(kb_env, "import", str(_many_notes(tmp_path, notes)), "-w", "1")
    worker = _Terminal(kb_env, "worker")
    try:
        # the run's live progress line says it is under way (its transient "started" line may be
        # redrawn over before it is read)
        assert worker.read_until(rf"index ws 1: [1-9]\d*/{notes} documents", 120), worker.text
        job_id = next(j["id"] for j in named_rows(kb, "test_jobs") if j["task_name"] == "kb.index_changes")
        worker.type(b"\x03")
        said = worker.read_until(r"stopping: the jobs in hand finish first|kb\.index_changes \(workspace 1\) done", 120)
        assert said and said.group(0).startswith("stopping:"), worker.text  # before the job's end
        assert worker.read_until(r"stopping: [^)]*Ctrl-C again stops them now", 5), worker.text
        worker.type(b"\x03")
        assert worker.read_until(r"stopping now: the jobs in hand go back to the queue", 10), worker.text
        code = worker.wait(120)
    finally:
        if worker.exit_code is None:
            os.kill(worker.pid, signal.SIGKILL)
    text = worker.shown
    assert code == 0, text
    assert re.search(rf"job {job_id} kb\.index_changes \(workspace 1\) stopped after [\d.]+ s: put back", text), text
    for noise in ("FAILED", "CancelledError", "Traceback", "unhandled exception", "Database error"):
        assert noise not in text, text
    assert "worker stopped after" in text, text  # the summary
    job = next(j for j in named_rows(kb, "test_jobs") if j["id"] == job_id)
    assert job["status"] == "todo" and job["attempts"] == 1, job  # back in the queue, for the next worker
    run = named_rows(kb, "test_index_runs", workspace_id=1)[-1]
    assert run["documents_done"] < notes, run  # stopped in the middle, not run to its end
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    lag = named_rows(kb, "test_index_lag", workspace_id=1)[0]
    assert lag["stamp"] == kb.head(1) and lag["documents_pending"] == 0, lag
    assert next(j for j in named_rows(kb, "test_jobs") if j["id"] == job_id)["status"] == "succeeded"


def test_a_killed_worker_is_not_counted_as_running_nor_its_job(kb, kb_env, tmp_path):
    """After SIGKILL of a worker, `kb workspaces` said "a worker is running its job now" until the
    orphaned job was recovered (it counted every `doing` job), and `kb import` counted the killed
    worker as running for KB_STALLED_JOB_SECONDS (60 s by default) since its last heartbeat. Now
    both go by heartbeats: a worker is running while its heartbeat is under three beats old."""
    run_cli(kb_env, "import", str(_many_notes(tmp_path, 600)), "-w", "1")
    env = {**kb_env, "KB_STALLED_JOB_SECONDS": "40", "PYTHONPATH": os.pathsep.join(sys.path)}
    slow = subprocess.Popen(  # holds the index job for minutes
        [sys.executable, str(TESTS / "support" / "slow_worker.py"), "0.5"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    live = None
    try:
        job = wait_until(
            lambda: next(
                (
                    j
                    for j in named_rows(kb, "test_jobs")
                    if j["task_name"] == "kb.index_changes" and j["status"] == "doing"
                ),
                None,
            ),
            120,
            "the slow worker running the index job",
        )
        live = subprocess.Popen(
            [sys.executable, "-m", "kb.adapters.cli", "worker", "--quiet"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        running = run_cli(env, "workspaces").stdout
        assert "a worker is running its job now" in running, running
        os.kill(slow.pid, signal.SIGKILL)
        slow.wait()
        # three heartbeats (5 s each) missed, well within KB_STALLED_JOB_SECONDS: the job is orphaned
        # but not yet put back, and its worker's row is still there
        orphan = wait_until(
            lambda: (r := named_rows(kb, "test_job_heartbeat_age", job_id=job["id"])[0])["heartbeat_age"] > 16 and r,
            60,
            "the killed worker's heartbeat to age",
        )
        assert orphan["status"] == "doing" and orphan["heartbeat_age"] < 40, orphan
        listed = run_cli(env, "workspaces").stdout
        assert "a worker is running its job now" not in listed and "waiting to be indexed" in listed, listed
        (tmp_path / "more").mkdir()
        (tmp_path / "more" / "x.md").write_text("# x\n")
        imported = run_cli(env, "import", str(tmp_path / "more"), "-w", "1").stdout
        assert "1 kb worker(s) running will index it" in imported, imported
    finally:
        for process in (slow, live):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL if process is slow else signal.SIGTERM)
                process.wait(timeout=60)
