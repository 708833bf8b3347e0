"""kb's tasks take their knowledge base from the job's context, and importing them reads no
settings (design §7): the periodic schedules that are settings are made when a worker starts."""

from __future__ import annotations

import os
import subprocess
import sys

from kb.jobs import tasks as jobs


def test_importing_the_tasks_reads_no_settings():
    env = {**os.environ, "KB_CHUNK_SIZE": "not a number"}  # Settings() would refuse it
    result = subprocess.run([sys.executable, "-c", "import kb.jobs.tasks"], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_worker_schedules_periodic_tasks_from_its_settings(settings, kb):
    try:
        jobs.schedule_periodic(
            settings.model_copy(update={"maintenance_cron": "*/7 * * * *", "drift_cron": "5 4 * * *"})
        )
        crons = {key: t.cron for key, t in jobs.app.periodic_registry.periodic_tasks.items()}
        sweep = f"sweep@{settings.node}"  # the sweep is the node's own (design §15)
        assert crons[("kb.sweep", sweep)] == crons[("kb.retry_stalled_jobs", "")] == "*/7 * * * *"
        node_queue = jobs.app.periodic_registry.periodic_tasks[("kb.sweep", sweep)].configure_kwargs["queue"]
        assert node_queue == f"maintenance@{settings.node}"
        assert crons[("kb.drift_check", "drift-check")] == "5 4 * * *"
        assert crons[("kb.span_fill", "span-fill")] == settings.span_fill_cron
    finally:
        jobs.schedule_periodic(settings)
    assert {t.name for t in jobs.periodic_tasks()} >= {
        "kb.sweep",
        "kb.retry_stalled_jobs",
        "kb.span_fill",
        "kb.drift_check",
        "kb.sweep_worktrees",
    }


def test_a_job_finds_its_knowledge_base_in_the_worker_context(kb):
    """A job deferred from outside and run by kb's worker gets the kb from additional_context."""
    with jobs.app.replace_connector(jobs.connector_for(kb)) as bound, bound.open():
        job = jobs.expire_citations.defer(timestamp=0)
    report = kb.run_worker(until_idle=True)
    assert job is not None and report.jobs_run >= 1 and report.jobs_failed == 0
