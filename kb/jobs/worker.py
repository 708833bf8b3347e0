"""The worker (design §7): run kb's Procrastinate queues until stopped or until idle, showing each
job's progress and ending with a summary (design §13).

``--until-idle`` means *converged*, not "the fetch found nothing" (design §7): after Procrastinate's
worker stops, kb looks at the queue again. Due jobs held back by a job running in another worker
are waited for (stalled ones are put back, as ``kb.retry_stalled_jobs`` does); jobs scheduled for
later (a retry's backoff) are reported with their time, never waited for. kb never gives a delayed
job a lock (``kb.store.defer_job``), so a due job held back by a job scheduled later can only come
from outside kb; it is reported as blocked rather than waited for.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from kb.db import database, nodes
from kb.db.sql import queries
from kb.store.homes import adopt_homeless

if TYPE_CHECKING:
    from kb.knowledge_base import KnowledgeBase

IDLE_POLL_SECONDS = 0.5


@dataclass
class WorkerReport:
    """What one worker run did (``kb worker`` prints it at the end).

    ``scheduled``: waiting jobs due later (``scheduled_jobs`` rows); ``blocked``: due jobs held back
    by a job scheduled later (``due_jobs`` rows) — both as found when the worker stopped.
    """

    jobs_run: int = 0
    jobs_failed: int = 0
    documents_indexed: int = 0
    documents_failed: int = 0
    chunks_written: int = 0
    chunks_embedded: int = 0
    chunks_from_cache: int = 0
    chunk_rows_reused: int = 0
    wall_seconds: float = 0.0
    scheduled: list[dict] = field(default_factory=list)
    blocked: list[dict] = field(default_factory=list)

    def add(self, result: object) -> None:
        """Fold one job's result (the dict an index job returns) into the totals."""
        if not isinstance(result, dict):
            return
        self.documents_indexed += result.get("indexed", 0)
        self.documents_failed += result.get("failed", 0)
        self.chunks_written += result.get("chunks_written", 0)
        self.chunks_embedded += result.get("embedded", 0)
        self.chunks_from_cache += result.get("cached", 0)
        self.chunk_rows_reused += result.get("reused", 0)

    def summary(self) -> str:
        """One line: jobs, documents, chunks embedded vs from the cache, failures, wall time."""
        return (
            f"worker stopped after {self.wall_seconds:.1f} s: {self.jobs_run} job(s) run, "
            f"{self.jobs_failed} failed; {self.documents_indexed} document(s) indexed, "
            f"{self.documents_failed} failed; {self.chunks_written} chunks written "
            f"({self.chunks_embedded} embedded, {self.chunks_from_cache} from the embedding cache), "
            f"{self.chunk_rows_reused} unchanged chunk rows reused"
        )

    def later(self) -> str | None:
        """What is scheduled for later, e.g. ``1 job scheduled for later: kb.index_changes for
        workspace 1 at 16:20:05 UTC (in 9m58s)``; None when nothing is."""
        if not self.scheduled:
            return None
        first = self.scheduled[0]
        what = first["defers_task"] or first["task"]
        seconds = max(0, int(first["due_in"].total_seconds()))
        when = first["scheduled_at"].astimezone(UTC).strftime("%H:%M:%S UTC")
        return (
            f"{len(self.scheduled)} job(s) scheduled for later; next: {what} for workspace "
            f"{first['workspace_id']} at {when} (in {seconds // 60}m{seconds % 60:02d}s)"
        )


def describe_blocked(job: dict) -> str:
    """Why a due job cannot start, e.g. ``job 7 kb.index_changes (workspace 1) waits for job 5
    kb.reindex, running`` (``kb status``, ``kb worker``)."""
    blocker = f"job {job['blocker_id']} {job['blocker_task']}"
    if job["blocked_by_later"]:
        why = f"{blocker}, scheduled for {job['blocker_scheduled_at']:%Y-%m-%d %H:%M:%S %Z}, holds lock {job['lock']}"
    else:
        why = f"{blocker} ({job['blocker_status']}, lock {job['lock']})"
    return f"job {job['id']} {job['task']} (workspace {job['workspace_id']}) waits for {why}"


def describe_scheduled(job: dict) -> str:
    """A job scheduled for later, e.g. ``job 9 kb.index_changes (workspace 1) due at 2026-11-30
    16:20:05 UTC, in 9m58s (queueing lock index-retry:1)``."""
    seconds = max(0, int(job["due_in"].total_seconds()))
    when = job["scheduled_at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"job {job['id']} {job['defers_task'] or job['task']}{_ws(job['workspace_id'])} due at {when}, "
        f"in {seconds // 60}m{seconds % 60:02d}s (queueing lock {job['queueing_lock']})"
    )


def queue_state(database_url: str, queues: list[str] | None) -> tuple[list[dict], list[dict]]:
    """``(due, scheduled)``: waiting jobs due now (each with its blocker, if any) and jobs
    scheduled for later, on ``queues`` (all when None)."""
    with database.connect(database_url, autocommit=True) as conn:
        due = conn.execute(queries["due_jobs"], {"queues": queues}).fetchall()
        scheduled = conn.execute(queries["scheduled_jobs"], {"queues": queues}).fetchall()
    return due, scheduled


def live_workers(database_url: str, seconds: float) -> int:
    """Workers (any process) whose last heartbeat is under ``seconds`` old."""
    with database.connect(database_url, autocommit=True) as conn:
        return conn.execute(queries["live_workers"], {"seconds": seconds}).fetchone()["workers"]


class ProgressDisplay:
    """Per-job progress of a worker: a live line (rich) on a terminal, plain lines otherwise.

    Thread-safe: index jobs report progress from their worker thread. Lines look like
    ``index ws 2: 57/173 documents, 312 chunks, 4.1 chunks/s, embedded 290 (4.0/s), 116 documents
    left, ETA 2m05s`` (``312 chunks (270 unchanged)`` when rows of unchanged chunks were kept: the
    count is not what was embedded). Off a terminal (a script's capture, a service manager's log)
    a line is printed at least every ``every`` seconds (``KB_PROGRESS_INTERVAL``) while a job
    runs, also in the middle of a long batch of documents and before an index run reports its
    first progress (``job 7 kb.index_changes (workspace 2) running for 40 s``), so a log never
    stays silent while work is being done.
    """

    PLAIN_EVERY_SECONDS = 5.0

    def __init__(self, stream: TextIO | None = None, live: bool | None = None, every: float | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live_mode = self.stream.isatty() if live is None else live
        self.every = self.PLAIN_EVERY_SECONDS if every is None else max(float(every), 0.01)
        self._lock = threading.Lock()
        self._started: dict[int, float] = {}
        self._jobs: dict[int, tuple[str, int | None]] = {}  # running: job id -> (task, workspace)
        self._runs: dict[int, float] = {}
        self._latest: dict[int, tuple[str, int, int, object]] = {}  # workspace -> (kind, done, total, report)
        self._last_plain = 0.0
        self._live = None
        self._stopped = threading.Event()
        self._ticker: threading.Thread | None = None
        if self.live_mode:
            from rich.console import Console
            from rich.live import Live

            self._live = Live("", console=Console(file=self.stream), transient=True, refresh_per_second=4)
            self._live.start()
        else:
            self._ticker = threading.Thread(target=self._tick, name="kb-progress", daemon=True)
            self._ticker.start()

    def _print_plain(self, text: str) -> None:
        """One time-stamped line (the lock is held)."""
        self._last_plain = time.monotonic()
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        print(f"{stamp} {text}", file=self.stream, flush=True)

    def _line(self, text: str, *, permanent: bool) -> None:
        with self._lock:
            if self._live is not None:
                from rich.text import Text

                if permanent:
                    self._live.console.print(Text(text))
                    self._live.update(Text(""))
                else:
                    self._live.update(Text(text))
            elif permanent or time.monotonic() - self._last_plain >= self.every:
                self._print_plain(text)

    def _tick(self) -> None:
        """Off a terminal: every ``every`` seconds without a line, one line per running job."""
        while not self._stopped.wait(self.every / 4):
            with self._lock:
                if not self._jobs or time.monotonic() - self._last_plain < self.every:
                    continue
                for job_id, (task, workspace_id) in list(self._jobs.items()):
                    latest = self._latest.get(workspace_id) if workspace_id is not None else None
                    if latest is not None:
                        self._print_plain(self._progress_text(workspace_id, *latest))
                    else:
                        seconds = time.monotonic() - self._started.get(job_id, time.monotonic())
                        self._print_plain(f"job {job_id} {task}{_ws(workspace_id)} running for {seconds:.0f} s")

    def job_started(self, job_id: int, task: str, workspace_id: int | None) -> None:
        """A job began (shown as the live line / one plain line)."""
        with self._lock:  # the ticker reads these
            self._started[job_id] = time.monotonic()
            if workspace_id is not None:
                self._runs[workspace_id] = time.monotonic()  # rates count from the job's start
                self._latest.pop(workspace_id, None)
            self._jobs[job_id] = (task, workspace_id)
        self._line(f"job {job_id} {task}{_ws(workspace_id)} started", permanent=not self.live_mode)

    def _progress_text(self, workspace_id: int, kind: str, done: int, total: int, report) -> str:
        """``index ws 2: 57/173 documents, 312 chunks, …`` from an index run's report as it is now."""
        started = self._runs.setdefault(workspace_id, time.monotonic())
        elapsed = max(time.monotonic() - started, 1e-6)
        chunks = report.chunks_written + report.chunks_reused
        embedded = report.embeddings_computed
        eta = ""
        if 0 < done < total:
            left = elapsed / done * (total - done)
            eta = f", ETA {int(left) // 60}m{int(left) % 60:02d}s"
        unchanged = f" ({report.chunks_reused} unchanged)" if report.chunks_reused else ""
        remaining = f", {total - done} documents left" if done < total else ""
        return (
            f"{kind} ws {workspace_id}: {done}/{total} documents, {chunks} chunks{unchanged}, "
            f"{chunks / elapsed:.1f} chunks/s, embedded {embedded} ({embedded / elapsed:.1f}/s)"
            f"{remaining}{eta}"
        )

    def index_progress(self, kind: str, workspace_id: int, done: int, total: int, report) -> None:
        """Documents ``done`` of ``total`` in an index run; ``report`` is its IndexReport so far
        (called before the first batch of documents, after every batch and every embedder call)."""
        with self._lock:
            self._latest[workspace_id] = (kind, done, total, report)
        self._line(
            self._progress_text(workspace_id, kind, done, total, report), permanent=done >= total and not self.live_mode
        )

    def job_finished(self, job_id: int, task: str, workspace_id: int | None, ok: bool, detail: str) -> None:
        """A job ended; one permanent line with its outcome and time."""
        with self._lock:
            seconds = time.monotonic() - self._started.pop(job_id, time.monotonic())
            self._jobs.pop(job_id, None)
            if workspace_id is not None:
                self._latest.pop(workspace_id, None)
        outcome = "done" if ok else "FAILED"
        self._line(
            f"job {job_id} {task}{_ws(workspace_id)} {outcome} in {seconds:.1f} s{': ' + detail if detail else ''}",
            permanent=True,
        )

    def close(self) -> None:
        """Stop the live line or the periodic lines (idempotent)."""
        self._stopped.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None


def _ws(workspace_id: int | None) -> str:
    return f" (workspace {workspace_id})" if workspace_id is not None else ""


def _detail(result: object) -> str:
    if isinstance(result, dict) and "indexed" in result:
        indexed, embedded = result["indexed"], result.get("embedded", 0)
        return (
            f"{indexed} document{'' if indexed == 1 else 's'}, {embedded} chunk{'' if embedded == 1 else 's'} "
            f"embedded, {result.get('cached', 0)} from cache, {result['failed']} failed"
        )
    return ""


def job_middleware(report: WorkerReport, display: ProgressDisplay | None):
    """A Procrastinate worker middleware counting every job into ``report`` and showing it."""

    async def middleware(call_next, context, worker):
        job = context.job
        workspace_id = job.task_kwargs.get("workspace_id")
        if display:
            display.job_started(job.id, job.task_name, workspace_id)
        try:
            result = await call_next()
        except BaseException as exc:
            report.jobs_run += 1
            report.jobs_failed += 1
            if display:
                display.job_finished(job.id, job.task_name, workspace_id, False, f"{type(exc).__name__}: {exc}")
            raise
        report.jobs_run += 1
        report.add(result)
        if display:
            display.job_finished(job.id, job.task_name, workspace_id, True, _detail(result))
        return result

    return middleware


def run_worker(
    kb: KnowledgeBase,
    until_idle: bool = False,
    concurrency: int = 1,
    display: ProgressDisplay | None = None,
) -> WorkerReport:
    """Run a worker on kb's queues; returns what it did.

    ``until_idle``: return once no job is due or runnable (design §7) — jobs running in another
    worker are waited for; jobs scheduled for later are listed in ``report.scheduled``; due jobs
    held back by a job scheduled later (only possible for jobs kb did not defer) in
    ``report.blocked``. Without it, run until SIGINT/SIGTERM, finishing the jobs in hand first.
    Checks the embedder against the database first (DimensionMismatch is a startup error).
    """
    kb.embedder  # noqa: B018  (startup check: database vector dimension vs model dimension (design §7))
    report = WorkerReport()
    try:
        asyncio.run(
            run_worker_async(
                kb,
                report,
                until_idle=until_idle,
                concurrency=concurrency,
                display=display,
                install_signal_handlers=not until_idle,
            )
        )
    finally:
        if display:
            display.close()
    return report


async def run_worker_async(
    kb: KnowledgeBase,
    report: WorkerReport,
    *,
    until_idle: bool = False,
    concurrency: int = 1,
    display: ProgressDisplay | None = None,
    install_signal_handlers: bool = False,
) -> None:
    """The worker loop of ``run_worker`` on the running event loop, filling ``report`` (also when
    ``kb serve --with-worker`` runs it beside the HTTP API). Cancelling the task stops the worker
    gracefully: it fetches nothing more and waits for the jobs it holds to finish."""
    from kb.jobs import tasks as jobs

    connector = jobs.connector_for(kb)
    jobs.schedule_periodic(kb.settings)
    queues = nodes.worker_queues(kb.settings.node)  # its own node's and the node-free ones (design §15)
    await asyncio.to_thread(nodes.register, kb.database_url, kb.settings)
    await asyncio.to_thread(adopt_homeless, kb.settings, kb.database_url)
    heartbeat = nodes.Heartbeat(kb.database_url, kb.settings).start()
    context = jobs.worker_context(kb, progress=display.index_progress if display else None)
    listens = jobs.worker_listens(kb)  # not behind a transaction pooler without a direct URL
    stalled = kb.settings.stalled_job_seconds
    started = time.monotonic()
    try:
        with jobs.app.replace_connector(connector) as bound:
            async with bound.open_async():
                while True:
                    await bound.run_worker_async(
                        queues=queues,
                        wait=not until_idle,
                        concurrency=concurrency,
                        listen_notify=listens,
                        fetch_job_polling_interval=5.0 if listens else jobs.POLL_SECONDS,
                        install_signal_handlers=install_signal_handlers,
                        update_heartbeat_interval=stalled / 4,
                        stalled_worker_timeout=stalled,
                        worker_middleware=[job_middleware(report, display)],
                        additional_context=context,
                    )
                    if not until_idle:
                        return
                    due, report.scheduled = queue_state(kb.database_url, queues)
                    waiting = [j for j in due if not j["blocked_by_later"]]
                    if not waiting:
                        report.blocked = due
                        return
                    if any(j["blocker_id"] is not None for j in waiting):
                        # held back by a job running elsewhere: put it back if its worker died
                        await jobs.retry_stalled(bound.job_manager, stalled)
                        if all(j["blocker_id"] is not None for j in waiting):
                            await asyncio.sleep(IDLE_POLL_SECONDS)
    finally:
        heartbeat.stop()
        report.wall_seconds = time.monotonic() - started
