"""design §13: ``kb serve --with-worker`` runs the worker in its event loop and logs a line per job
on stderr, as ``kb worker`` does off a terminal, so an operator reading the server's log sees the
projection and index jobs a write caused (it logged nothing per job before)."""

from __future__ import annotations

import contextlib
import os
import re

import psycopg
import pytest
from support.database import fresh_database
from support.kb_server import running_server
from support.named_queries import queries
from support.waiting import wait_until

from kb.knowledge_base import KnowledgeBase
from kb.settings import Settings

pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")


def test_serve_with_worker_logs_each_job(pg_server, template_url, tmp_path, shared_model_cache):
    template = psycopg.conninfo.conninfo_to_dict(template_url)["dbname"]
    with fresh_database(pg_server, template) as url:
        settings = Settings(
            database_url=url,
            storage_root=tmp_path / "storage",
            embedding_model="hashing",
            model_cache=shared_model_cache,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
        env.update(
            KB_DATABASE_URL=url,
            KB_STORAGE_ROOT=str(settings.storage_root),
            KB_EMBEDDING_MODEL="hashing",
            KB_MODEL_CACHE=str(settings.model_cache),
        )
        log = tmp_path / "serve.log"
        with running_server(env, log, "--insecure-no-auth"):
            with KnowledgeBase.open(settings) as kb:
                kb.create_workspace(1)
                with kb.transaction(1, "a note", "tester") as tx:
                    tx.write("/documents/note.md", "# Note\n\nsomething to index\n")
                wait_until(
                    lambda: re.search(r"job \d+ kb\.index\S* \(workspace 1\) done", log.read_text()),
                    120,
                    "the server's log to show the index job",
                )
        text = log.read_text()
        assert re.search(r"job \d+ kb\.project\S* \(workspace 1\) done", text), text


_QUIET_CRONS = {"KB_MAINTENANCE_CRON": "0 0 1 1 *", "KB_DRIFT_CRON": "0 0 1 1 *"}
_SHORT_POOL_WAIT = {"KB_POOL_TIMEOUT": "5"}  # a lost connection is given up on in 5 s, not 30


@contextlib.contextmanager
def _relayed_database(pg_server, template_url, tmp_path, shared_model_cache):
    """A fresh test database reached through a TCP relay the test can close and reopen (an
    outage): yields ``(relay, the database's conninfo dict, Settings for the test's own direct
    connections, the environment of a kb process connecting through the relay)``. Skips on a
    Unix-socket server (the relay is TCP). Periodic jobs are put off: one cut by the outage would
    log its traceback."""
    from support.network import Relay

    template = psycopg.conninfo.conninfo_to_dict(template_url)["dbname"]
    with fresh_database(pg_server, template) as url:
        info = psycopg.conninfo.conninfo_to_dict(url)
        if str(info.get("host", "")).startswith("/"):
            pytest.skip("the test database listens on a Unix socket; the relay is TCP")
        relay = Relay(info.get("host") or "127.0.0.1", int(info.get("port") or 5432))
        relayed = psycopg.conninfo.make_conninfo(url, host="127.0.0.1", port=str(relay.port))
        settings = Settings(
            database_url=url,
            storage_root=tmp_path / "storage",
            embedding_model="hashing",
            model_cache=shared_model_cache,
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
        env.update(
            KB_DATABASE_URL=relayed,
            KB_STORAGE_ROOT=str(settings.storage_root),
            KB_EMBEDDING_MODEL="hashing",
            KB_MODEL_CACHE=str(settings.model_cache),
        )
        env.update(_QUIET_CRONS, **_SHORT_POOL_WAIT)
        yield relay, info, settings, env


def _wait_for_index_job(log, before: int, worker=None) -> None:
    """Wait (120 s) until the log shows more than ``before`` index jobs done (or ``worker``, a
    process, exited); the failure message carries the log."""
    try:
        wait_until(
            lambda: _index_jobs_done(log) > before or (worker is not None and worker.poll() is not None),
            120,
            "an index job after the outage",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- log ---\n{log.read_text()}") from None


def _wait_for_the_loss(log) -> None:
    """Wait (120 s) until the worker whose output goes to ``log`` stops for the lost database;
    the failure message carries the log."""
    try:
        # Procrastinate's "stopping worker" when its own side task lost the database first; kb's
        # "worker stopped: … restarting it" alone when kb's pool timed out first (CI met both)
        wait_until(
            lambda: "stopping worker" in (text := log.read_text()) or "restarting it in" in text,
            120,
            "the worker to lose the database",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- log ---\n{log.read_text()}") from None


def _first_write_indexed(kb, log) -> int:
    """Create workspace 1, write one document and wait (120 s) for the worker whose output goes
    to ``log`` to index it; returns the index jobs done so far."""
    kb.create_workspace(1)
    with kb.transaction(1, "one", "tester") as tx:
        tx.write("/documents/one.md", "# One\n\nindexed before the outage\n")
    wait_until(lambda: _index_jobs_done(log) >= 1, 120, "the first index job")
    return _index_jobs_done(log)


def _jobs_done(log, kind: str) -> int:
    return len(re.findall(rf"job \d+ kb\.{kind}\S* \(workspace 1\) done", log.read_text()))


def _index_jobs_done(log) -> int:
    return _jobs_done(log, "index")


def test_the_worker_in_serve_outlives_a_database_outage(pg_server, template_url, tmp_path, shared_model_cache):
    """design §7: Postgres away for a moment (a relay the test closes and reopens) made
    Procrastinate's worker stop for good inside ``kb serve --with-worker`` while ``/ready`` still
    said ``"worker": true``, and the shutdown failed on it. The worker is restarted after a
    backoff, later writes are indexed, ``/ready`` tells what happened without the database's
    address (answered to anybody, design §16), and the server stops cleanly."""
    import httpx

    with _relayed_database(pg_server, template_url, tmp_path, shared_model_cache) as (relay, info, settings, env):
        log = tmp_path / "serve.log"
        try:
            with running_server(env, log) as server, KnowledgeBase.open(settings) as kb:
                before = _first_write_indexed(kb, log)

                relay.close()  # the database goes away: the worker's LISTEN connection is cut
                _wait_for_the_loss(log)
                relay.reopen()  # and comes back

                with kb.transaction(1, "two", "tester") as tx:
                    tx.write("/documents/two.md", "# Two\n\nindexed after the outage\n")
                _wait_for_index_job(log, before)
                ready = httpx.get(f"{server}/ready", timeout=30)
                assert ready.status_code == 200, ready.text
                body = ready.json()
                assert body["worker"] == "running", body
                assert body["worker_error"]["type"] in ("DatabaseUnavailable", "WorkerFailed"), body
                assert body["worker_restarts"] >= 1 and body["worker_error"]["at"], body
                assert str(relay.port) not in ready.text and info["dbname"] not in ready.text, ready.text
        finally:
            relay.close()
        text = log.read_text()
        # one line (rich may wrap it in the log): what failed, that it restarts, in how long
        assert re.search(
            r"worker stopped: (DatabaseUnavailable|WorkerFailed): .*restarting\s+it\s+in\s+\d+\s+s", text, re.S
        ), text
        assert "Application shutdown failed" not in text, text


def test_kb_worker_outlives_a_database_outage(pg_server, template_url, tmp_path, shared_model_cache):
    """design §7: standalone ``kb worker`` survives a moment without Postgres the same way (it
    stopped, or exited 0 as if asked to): the outage is logged with the restart, later writes
    are indexed, and SIGTERM still stops it cleanly with its summary."""
    import signal
    import subprocess
    import sys

    with _relayed_database(pg_server, template_url, tmp_path, shared_model_cache) as (relay, info, settings, env):
        log, out = tmp_path / "worker.log", tmp_path / "worker.out"
        with log.open("w") as errors_to, out.open("w") as output_to:
            worker = subprocess.Popen(
                [sys.executable, "-m", "kb.adapters.cli", "worker"], env=env, stdout=output_to, stderr=errors_to
            )
        try:
            with KnowledgeBase.open(settings) as kb:
                before = _first_write_indexed(kb, log)
                relay.close()
                _wait_for_the_loss(log)
                relay.reopen()
                with kb.transaction(1, "two", "tester") as tx:
                    tx.write("/documents/two.md", "# Two\n\nindexed after the outage\n")
                _wait_for_index_job(log, before, worker)
                assert worker.poll() is None, log.read_text()
                assert _index_jobs_done(log) > before, log.read_text()
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0, log.read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
            relay.close()
        text = log.read_text()
        assert re.search(r"worker stopped: (DatabaseUnavailable|WorkerFailed): .*restarting it in \d+ s", text), text
        assert "Traceback" not in text, text  # the outage is told in lines, not tracebacks
        assert "worker stopped after" in out.read_text(), out.read_text()


def test_serve_stops_cleanly_while_the_database_is_away(pg_server, template_url, tmp_path, shared_model_cache):
    """design §7: SIGTERM while Postgres is still away (the worker just stopped by it) stopped
    the server with ``Application shutdown failed`` (the worker's ConnectorException); it stops
    cleanly in every state of the worker."""
    with _relayed_database(pg_server, template_url, tmp_path, shared_model_cache) as (relay, info, settings, env):
        log = tmp_path / "serve.log"
        try:
            with running_server(env, log), KnowledgeBase.open(settings) as kb:
                _first_write_indexed(kb, log)
                relay.close()  # and it stays away until the server stopped
                _wait_for_the_loss(log)
        finally:
            relay.close()
        assert "Application shutdown failed" not in log.read_text(), log.read_text()
        assert "Application shutdown complete" in log.read_text(), log.read_text()


def test_a_job_the_outage_cut_is_put_back_when_the_worker_restarts(
    pg_server, template_url, tmp_path, shared_model_cache
):
    """design §7: a job running when Postgres went away could not record its end and stayed
    ``doing``; its lock (``projection:N``) then held back every later job of the workspace until
    the maintenance cron's stalled-job retry, minutes later (the worker had only stopped, not
    died). The restarted worker puts back the jobs its own earlier run left ``doing`` at once."""
    from kb.store.projection import PROJECTION_LOCK_NAMESPACE

    with _relayed_database(pg_server, template_url, tmp_path, shared_model_cache) as (relay, info, settings, env):
        log = tmp_path / "serve.log"
        try:
            with running_server(env, log), KnowledgeBase.open(settings) as kb:
                before = _first_write_indexed(kb, log)
                with psycopg.connect(settings.database_url) as holder:
                    # the projection job of the next write waits for this lock: it is running
                    # (``doing``) when the database goes away
                    holder.execute(
                        queries["test_hold_advisory_lock"], {"namespace": PROJECTION_LOCK_NAMESPACE, "workspace_id": 1}
                    )
                    with kb.transaction(1, "two", "tester") as tx:
                        tx.write("/documents/two.md", "# Two\n\ncut while projected\n")
                    wait_until(
                        lambda: any(
                            row[1].startswith("kb.project")
                            for row in holder.execute(queries["test_jobs_doing"]).fetchall()
                        ),
                        120,
                        "the projection job to wait for the held lock",
                    )
                    relay.close()
                    # away until the job's end could not be recorded (Procrastinate's attempt fails
                    # after its pool's 30 s timeout; asyncio logs the task it failed in)
                    wait_until(
                        lambda: re.search(r"Task\s+exception\s+was\s+never", log.read_text()),
                        120,
                        "the job's end to be lost",
                    )
                    relay.reopen()
                    holder.rollback()  # the lock is free again
                    projected = _jobs_done(log, "project")
                    with kb.transaction(1, "three", "tester") as tx:
                        tx.write("/documents/three.md", "# Three\n\nwritten after the outage\n")
                wait_until(lambda: _jobs_done(log, "project") > projected, 120, "a projection job after the outage")
                _wait_for_index_job(log, before)
                assert re.search(r"retrying\s+left\s+running\s+by\s+the\s+worker's", log.read_text()), log.read_text()
        finally:
            relay.close()


def test_kb_worker_until_idle_tells_an_outage_in_lines(pg_server, template_url, tmp_path, shared_model_cache):
    """design §7: ``kb worker --until-idle`` losing Postgres exits non-zero with
    DatabaseUnavailable, and says so in lines: Procrastinate's tracebacks of the lost side tasks
    and of the job whose end could not be recorded were printed (the supervised worker already
    dropped them)."""
    import subprocess
    import sys

    from kb.store.projection import PROJECTION_LOCK_NAMESPACE

    with _relayed_database(pg_server, template_url, tmp_path, shared_model_cache) as (relay, info, settings, env):
        try:
            with KnowledgeBase.open(settings) as kb, psycopg.connect(settings.database_url) as holder:
                kb.create_workspace(1)
                holder.execute(
                    queries["test_hold_advisory_lock"], {"namespace": PROJECTION_LOCK_NAMESPACE, "workspace_id": 1}
                )
                with kb.transaction(1, "one", "tester") as tx:
                    tx.write("/documents/one.md", "# One\n\ncut while projected\n")
                worker = subprocess.Popen(
                    [sys.executable, "-m", "kb.adapters.cli", "worker", "--until-idle"],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                try:
                    wait_until(
                        lambda: any(r[1].startswith("kb.project") for r in holder.execute(queries["test_jobs_doing"])),
                        120,
                        "the projection job to wait for the held lock",
                    )
                    relay.close()
                    out, err = worker.communicate(timeout=300)
                finally:
                    if worker.poll() is None:
                        worker.kill()
                        worker.communicate()
                holder.rollback()
        finally:
            relay.close()
    assert worker.returncode == 1, (out, err)
    # the last line says what failed, on one line (Procrastinate's message is indented over three)
    assert re.search(r"^kb: error: the job queue lost its database connection \(Database error: .+\)$", err, re.M), err
    assert "Traceback" not in err, err
