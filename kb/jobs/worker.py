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
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TextIO

from kb import errors
from kb.db import database, nodes
from kb.db.sql import queries
from kb.store.homes import adopt_homeless

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from kb.knowledge_base import KnowledgeBase

IDLE_POLL_SECONDS = 0.5

log = logging.getLogger(__name__)


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
    interrupted: bool = False
    """Stopped by SIGINT/SIGTERM before it was idle (``--until-idle``): the jobs in hand finished."""
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


def _duration(seconds: float) -> str:
    """``2m05s`` for 125.3 seconds (a progress line's ETA)."""
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


class ProgressDisplay:
    """Per-job progress of a worker: a live line (rich) on a terminal, plain lines otherwise.

    Thread-safe: index jobs report progress from their worker thread. Lines look like
    ``index ws 2: 57/173 documents, 312 chunks stored, 4.1 chunks/s, embedded 290 (4.0/s), 116
    documents left, ETA 2m05s`` (``312 chunks stored (270 unchanged)`` when rows of unchanged chunks were kept: the
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

    def notice(self, text: str) -> None:
        """A line said at once and kept (e.g. the worker stopping on a signal)."""
        self._line(text, permanent=True)

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
        """``index ws 2: 57/173 documents, 312 chunks stored, …`` from an index run's report as it is now."""
        started = self._runs.setdefault(workspace_id, time.monotonic())
        elapsed = max(time.monotonic() - started, 1e-6)
        chunks = report.chunks_written + report.chunks_reused
        embedded = report.embeddings_computed
        eta = ""
        due = getattr(report, "embeddings_due", 0)
        if 0 < done < total:
            eta = f", ETA {_duration(elapsed / done * (total - done))}"
        elif done == 0 and 0 < embedded < due:
            # no batch of documents stored yet (a first run embeds a batch's every chunk before it
            # stores one): the ETA of the texts in hand, by the embedder's pace so far
            eta = f", ETA of this batch {_duration((due - embedded) / (embedded / elapsed))}"
        unchanged = f" ({report.chunks_reused} unchanged)" if report.chunks_reused else ""
        remaining = f", {total - done} documents left" if done < total else ""
        # "stored": chunk rows written or kept; "embedded" runs ahead of it within a batch
        stored = f"{chunks} chunk{'' if chunks == 1 else 's'} stored"
        return (
            f"{kind} ws {workspace_id}: {done}/{total} documents, {stored}{unchanged}, "
            f"{chunks / elapsed:.1f} chunks/s, embedded {embedded}{f' of {due}' if due > embedded else ''}"
            f" ({embedded / elapsed:.1f}/s)"
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

    def _ended(self, job_id: int, workspace_id: int | None) -> float:
        """Forget a job that ended; returns how long it ran."""
        with self._lock:
            seconds = time.monotonic() - self._started.pop(job_id, time.monotonic())
            self._jobs.pop(job_id, None)
            if workspace_id is not None:
                self._latest.pop(workspace_id, None)
        return seconds

    def job_finished(self, job_id: int, task: str, workspace_id: int | None, ok: bool, detail: str) -> None:
        """A job ended; one permanent line with its outcome and time."""
        seconds = self._ended(job_id, workspace_id)
        outcome = "done" if ok else "FAILED"
        self._line(
            f"job {job_id} {task}{_ws(workspace_id)} {outcome} in {seconds:.1f} s{': ' + detail if detail else ''}",
            permanent=True,
        )

    def job_stopped(self, job_id: int, task: str, workspace_id: int | None, outcome: str) -> None:
        """A job stopped now by a second Ctrl-C (``StopNow``); one permanent line saying where its
        work went (``outcome``)."""
        seconds = self._ended(job_id, workspace_id)
        self._line(f"job {job_id} {task}{_ws(workspace_id)} stopped after {seconds:.1f} s: {outcome}", permanent=True)

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


class StopNow:
    """What a second SIGINT/SIGTERM does to a worker (design §7): the Procrastinate workers that ran
    jobs here (``job_middleware`` adds them) are asked to abort their jobs in hand for a shutdown;
    an index run stops at its next checkpoint (after an embedder call or a batch, ``PutBack``) and
    goes back to the queue, a job a waiting job covers is recorded ``aborted``."""

    def __init__(self) -> None:
        import weakref

        self.workers: weakref.WeakSet = weakref.WeakSet()
        self.requested = False

    def __call__(self) -> None:
        from procrastinate.job_context import AbortReason

        self.requested = True
        for worker in list(self.workers):
            # Procrastinate's own shutdown abort (what its ``shutdown_graceful_timeout`` does once
            # the timeout is over), asked for now; private API of the pinned Procrastinate 3.10
            for task, context in list(worker._running_jobs.items()):
                worker._abort_job(task, context, AbortReason.SHUTDOWN)


def _stopped_now(context, exc: BaseException) -> bool:
    """Whether ``exc`` ended a job because its worker is stopping now (``StopNow``)."""
    import procrastinate.exceptions
    from procrastinate.job_context import AbortReason

    aborted = isinstance(exc, procrastinate.exceptions.JobAborted | asyncio.CancelledError)
    return aborted and context.abort_reason() == AbortReason.SHUTDOWN


async def _covering_job(context) -> int | None:
    """The waiting job that does the work of ``context``'s job (same queueing lock), if any."""
    job = context.job
    if job.queueing_lock is None:
        return None

    def find() -> int | None:
        with database.connect(context.additional_context["kb"].database_url, autocommit=True) as conn:
            row = conn.execute(queries["covering_job"], {"queueing_lock": job.queueing_lock, "job_id": job.id})
            found = row.fetchone()
        return found["id"] if found else None

    return await asyncio.to_thread(find)


def job_middleware(
    report: WorkerReport,
    display: ProgressDisplay | None,
    worker_ids: set[int] | None = None,
    stop_now: StopNow | None = None,
):
    """A Procrastinate worker middleware counting every job into ``report`` and showing it, and
    adding the id of the Procrastinate worker that runs it to ``worker_ids`` and the worker to
    ``stop_now`` (when given). A job stopped now (``StopNow``) is not a failure: it ends in
    ``PutBack`` (retried at once) or, when a waiting job covers it, ``StoppedCovered``."""
    from kb.jobs.tasks import PutBack, StoppedCovered

    async def middleware(call_next, context, worker):
        job = context.job
        if worker_ids is not None and worker.worker_id is not None:
            worker_ids.add(worker.worker_id)
        if stop_now is not None:
            stop_now.workers.add(worker)
        workspace_id = job.task_kwargs.get("workspace_id")
        if display:
            display.job_started(job.id, job.task_name, workspace_id)
        try:
            result = await call_next()
        except BaseException as exc:
            if _stopped_now(context, exc):
                covering = await _covering_job(context)
                outcome = (
                    f"job {covering}, waiting, does its work"
                    if covering
                    else "put back to the queue for the next worker"
                )
                if display:
                    display.job_stopped(job.id, job.task_name, workspace_id, outcome)
                else:
                    log.warning("job %s %s%s stopped now: %s", job.id, job.task_name, _ws(workspace_id), outcome)
                raise (StoppedCovered if covering else PutBack)(outcome) from exc
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
    ``report.blocked``. A database lost meanwhile raises DatabaseUnavailable (a script waiting
    for convergence is told; the CLI exits non-zero). Without it, run until SIGINT/SIGTERM,
    finishing the jobs in hand first, and survive a database outage: the worker is restarted
    with a capped backoff (``WorkerSupervisor``, design §7), as a job queue's worker reconnects.
    Checks the embedder against the database first (DimensionMismatch is a startup error).
    """
    kb.embedder  # noqa: B018  (startup check: database vector dimension vs model dimension (design §7))
    report = WorkerReport()
    try:
        if until_idle:
            _quiet_side_task_tracebacks()  # an outage is told in lines here too (design §7)
            try:
                asyncio.run(_until_idle_or_signal(kb, report, concurrency, display))
            except errors.KbError:
                raise
            except Exception as exc:  # procrastinate's or psycopg's: the database went away
                raise as_worker_error(exc) from exc
        else:
            asyncio.run(
                _supervised_until_signal(WorkerSupervisor(kb, report, concurrency=concurrency, display=display))
            )
    finally:
        if display:
            display.close()
    return report


STOPPING_NOTICE = (
    "stopping: the jobs in hand finish first (Ctrl-C again stops them now and puts them back in the queue)"
)
"""What a worker says at once when SIGINT/SIGTERM asks it to stop (design §7)."""

STOPPING_NOW_NOTICE = (
    "stopping now: the jobs in hand go back to the queue at their next checkpoint "
    "(Ctrl-C again quits at once, leaving them to the stalled-job check)"
)
"""What a worker says at once on a second SIGINT/SIGTERM (``StopNow``, design §7)."""

QUIT_NOTICE = (
    "quitting at once: a job still in hand stays `doing` until a live worker's stalled-job check "
    "puts it back (KB_STALLED_JOB_SECONDS after this worker's last heartbeat)"
)
"""What a worker says on a third SIGINT/SIGTERM, just before it exits with 130."""


def _say(display: ProgressDisplay | None, text: str) -> None:
    """A notice on stderr at once: through the display when there is one (its live line stays
    whole), else as a ``kb:`` line."""
    if display is not None:
        display.notice(text)
    else:
        print(f"kb: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stop_signals(
    display: ProgressDisplay | None, stop: Callable[[], None], stop_now: Callable[[], None]
) -> Iterator[None]:
    """While the block runs on the event loop of the main thread, SIGINT/SIGTERM stop the worker in
    three steps, each said at once (design §7): the first calls ``stop`` (nothing more is fetched,
    the jobs in hand finish), the second ``stop_now`` (they go back to the queue at their next
    checkpoint), the third exits with 130 at once. Elsewhere, nothing is installed. A second Ctrl-C
    used to raise KeyboardInterrupt inside the event loop: asyncio cancelled the job's task while
    its thread ran on, the job stayed ``doing`` and the exit printed tracebacks."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            _say(display, STOPPING_NOTICE)
            stop()
        elif signals == 2:
            _say(display, STOPPING_NOW_NOTICE)
            stop_now()
        else:
            _say(display, QUIT_NOTICE)
            os._exit(130)

    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(number, on_signal)
            installed.append(number)
    try:
        yield
    finally:
        for number in installed:
            loop.remove_signal_handler(number)


async def _until_idle_or_signal(
    kb: KnowledgeBase, report: WorkerReport, concurrency: int, display: ProgressDisplay | None
) -> None:
    """``run_worker_async`` until idle, or until SIGINT/SIGTERM (``_stop_signals``): the first
    stops fetching, lets the jobs in hand finish and returns with ``report.interrupted`` (the
    caller prints the summary). A Ctrl-C used to be silent while the job in hand ran on, then end
    in click's bare "Aborted!" with no summary."""
    stop_now = StopNow()
    task = asyncio.ensure_future(
        run_worker_async(kb, report, until_idle=True, concurrency=concurrency, display=display, stop_now=stop_now)
    )

    def stop() -> None:
        report.interrupted = True
        task.cancel()  # graceful: nothing more is fetched, the jobs in hand finish

    with _stop_signals(display, stop, stop_now):
        try:
            await task
        except asyncio.CancelledError:
            if not report.interrupted:
                raise


async def _supervised_until_signal(supervisor: WorkerSupervisor) -> None:
    """Run ``supervisor`` until SIGINT/SIGTERM (``_stop_signals``: the first stops it gracefully,
    the second puts the jobs in hand back, the third exits at once)."""
    with _stop_signals(supervisor.display, supervisor.stop, supervisor.stop_now):
        await supervisor.run()


def as_worker_error(exc: BaseException) -> errors.KbError:
    """What ended a worker's loop as kb's error: a KbError as it is; Procrastinate's connector
    errors and psycopg's as DatabaseUnavailable; anything else as WorkerFailed."""
    if isinstance(exc, errors.KbError):
        return exc
    import procrastinate.exceptions
    import psycopg

    if isinstance(exc, procrastinate.exceptions.ConnectorException | psycopg.Error | OSError):
        cause = exc.__cause__ or exc.__context__
        detail = _one_line(str(exc)).strip(" .") or type(exc).__name__  # Procrastinate's is indented
        if cause is not None and str(cause).strip():
            detail = f"{detail}: {_one_line(str(cause))}"
        return errors.DatabaseUnavailable(f"the job queue lost its database connection ({detail})")
    return errors.WorkerFailed(f"the worker's loop failed: {type(exc).__name__}: {exc}")


def _one_line(text: str) -> str:
    """``text`` with its runs of whitespace (newlines, indentation) as single spaces."""
    return " ".join(text.split())


class _NoTracebackForLostDatabase(logging.Filter):
    """Procrastinate logs a side task that lost the database (its LISTEN connection, its
    heartbeat) with a traceback, twice: when it fails and when the worker shuts down; and a job
    that lost it (kb's DatabaseUnavailable) with another. The messages say what failed (kb's own
    line for a job: ``job 4 … FAILED in 0.0 s: DatabaseUnavailable: …``) and ``WorkerSupervisor``
    says what happens next in one line; the traceback of a connection refused says nothing more,
    so it is dropped (design §7)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from procrastinate.exceptions import ConnectorException

        error = record.exc_info[1] if record.exc_info else None
        lost = (ConnectorException, errors.DatabaseUnavailable)
        if getattr(record, "action", None) == "side_task_failed" or isinstance(error, lost):
            record.exc_info = None
            record.exc_text = None
        return True


def _quiet_side_task_tracebacks() -> None:
    from procrastinate import utils, worker

    # a worker logs on its name's child of procrastinate.worker (kb's workers keep the default name);
    # asyncio logs a job's task whose end could not be recorded ("Task exception was never retrieved")
    loggers = (worker.logger, worker.logger.getChild(worker.WORKER_NAME), utils.logger, logging.getLogger("asyncio"))
    for logger in loggers:
        if not any(isinstance(f, _NoTracebackForLostDatabase) for f in logger.filters):
            logger.addFilter(_NoTracebackForLostDatabase())


class _StoppedOnItsOwn(Exception):
    """Procrastinate's worker returned though nobody stopped it (a side task — its LISTEN
    connection, its heartbeat — failed; Procrastinate logs which)."""


class WorkerSupervisor:
    """Runs ``run_worker_async`` for as long as it is not stopped, restarting it whenever its loop
    ends (an error, or Procrastinate stopping itself when a side task — the LISTEN connection, the
    heartbeat — loses the database) after a capped backoff: ``first_delay`` seconds doubling up to
    ``max_delay``, back to ``first_delay`` once a run lasted ``settled_seconds`` (design §7).

    ``state``: ``"starting"`` (setting up, before the first job fetch), ``"running"`` or
    ``"restarting"`` (waiting out the backoff), ``"stopped"``. ``last_error`` (a KbError) and
    ``last_error_at`` (UTC) tell what ended the last run; ``restarts`` counts them. Each failure is
    logged as one line: what failed, that it restarts, in how long. Used by ``kb serve
    --with-worker`` (its ``/ready`` reports it) and ``kb worker``.
    """

    def __init__(
        self,
        kb: KnowledgeBase,
        report: WorkerReport,
        *,
        concurrency: int = 1,
        display: ProgressDisplay | None = None,
        first_delay: float = 1.0,
        max_delay: float = 30.0,
        settled_seconds: float = 60.0,
    ) -> None:
        self.kb = kb
        self.report = report
        self.concurrency = concurrency
        self.display = display
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.settled_seconds = settled_seconds
        self.state = "starting"
        self.last_error: errors.KbError | None = None
        self.last_error_at: datetime | None = None
        self.restarts = 0
        self._stopping = False
        self._wake: asyncio.Event | None = None
        self._attempt: asyncio.Task | None = None
        self._workers: set[int] = set()  # Procrastinate workers of its runs that held jobs
        self.stop_now = StopNow()
        """Call after ``stop`` to put the jobs in hand back at their next checkpoint (design §7)."""

    def stop(self) -> None:
        """Stop: the running worker fetches nothing more and finishes the jobs in hand; a backoff
        wait ends at once. ``run`` then returns (call it on the supervisor's event loop)."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._attempt is not None and not self._attempt.done():
            self._attempt.cancel()  # Procrastinate: stop fetching, finish the jobs in hand

    def _running(self) -> None:
        self.state = "running"

    async def run(self) -> None:
        """Run and restart the worker until ``stop``; returns once it stopped. Never raises what
        ended a run (it is logged and kept in ``last_error``); an error while stopping is logged."""
        self._wake = asyncio.Event()
        _quiet_side_task_tracebacks()
        delay = self.first_delay
        try:
            while not self._stopping:
                self.state = "starting"
                began = time.monotonic()
                self._attempt = asyncio.create_task(
                    run_worker_async(
                        self.kb,
                        self.report,
                        concurrency=self.concurrency,
                        display=self.display,
                        on_running=self._running,
                        earlier_workers=self._workers,
                        stop_now=self.stop_now,
                    )
                )
                try:
                    await self._attempt
                    failure: BaseException = _StoppedOnItsOwn()
                except asyncio.CancelledError:
                    if not self._stopping:
                        raise  # run() itself was cancelled
                    return
                except Exception as exc:
                    failure = exc
                if self._stopping:
                    if not isinstance(failure, _StoppedOnItsOwn):
                        log.warning("worker: stopping ended with an error: %s", as_worker_error(failure))
                    return
                if time.monotonic() - began >= self.settled_seconds:
                    delay = self.first_delay  # it had run a while: a new outage starts the backoff over
                error = (
                    errors.WorkerFailed("the worker stopped on its own (a side task lost the database; see above)")
                    if isinstance(failure, _StoppedOnItsOwn)
                    else as_worker_error(failure)
                )
                self.last_error, self.last_error_at = error, datetime.now(UTC)
                self.restarts += 1
                self.state = "restarting"
                log.error("worker stopped: %s: %s; restarting it in %.0f s", type(error).__name__, error, delay)
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=delay)
                except TimeoutError:
                    pass
                delay = min(delay * 2, self.max_delay)
        finally:
            self.state = "stopped"

    def describe(self, shown: Callable[[str], str] = str) -> dict:
        """What ``/ready`` tells of the worker: ``{"worker": state}`` plus, after a failure,
        ``worker_error`` (``type``, ``message`` passed through ``shown`` — deployment facts hidden
        by the caller, design §16 —, ``at`` ISO 8601 UTC) and ``worker_restarts``."""
        body: dict[str, object] = {"worker": self.state}
        if self.last_error is not None and self.last_error_at is not None:
            body["worker_error"] = {
                "type": type(self.last_error).__name__,
                "message": shown(str(self.last_error)),
                "at": self.last_error_at.isoformat(timespec="seconds"),
            }
            body["worker_restarts"] = self.restarts
        return body


async def run_worker_async(
    kb: KnowledgeBase,
    report: WorkerReport,
    *,
    until_idle: bool = False,
    concurrency: int = 1,
    display: ProgressDisplay | None = None,
    install_signal_handlers: bool = False,
    on_running: Callable[[], None] | None = None,
    earlier_workers: set[int] | None = None,
    stop_now: StopNow | None = None,
) -> None:
    """The worker loop of ``run_worker`` on the running event loop, filling ``report`` (also when
    ``kb serve --with-worker`` runs it beside the HTTP API, through ``WorkerSupervisor``).
    Cancelling the task stops the worker gracefully: it fetches nothing more and waits for the
    jobs it holds to finish. ``on_running`` is called once the job queue is open, before the
    first fetch. ``earlier_workers``: ids of Procrastinate workers of this process's earlier runs
    (``WorkerSupervisor``'s): the jobs they left ``doing`` — an outage cut the run before it
    recorded their end, and their locks hold back the workspace's later jobs — are put back first
    and their ids dropped; this run's worker is added once it runs a job (design §7). ``stop_now``
    learns the Procrastinate workers that run jobs, to stop them now when asked. Raises what
    loses the database (DatabaseUnavailable, Procrastinate's ConnectorException); returns without
    error when Procrastinate stops on its own."""
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
                if earlier_workers:
                    await jobs.put_back_jobs_of(bound.job_manager, earlier_workers, stalled)
                    earlier_workers.clear()
                if on_running is not None:
                    on_running()
                while True:
                    await bound.run_worker_async(
                        queues=queues,
                        wait=not until_idle,
                        concurrency=concurrency,
                        listen_notify=listens,
                        fetch_job_polling_interval=5.0 if listens else jobs.POLL_SECONDS,
                        install_signal_handlers=install_signal_handlers,
                        update_heartbeat_interval=kb.settings.worker_heartbeat_seconds,
                        stalled_worker_timeout=stalled,
                        worker_middleware=[job_middleware(report, display, earlier_workers, stop_now)],
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
