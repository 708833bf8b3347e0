"""design §13: the embedded Postgres under a running kb process. ``kb db-stop`` refuses while other
processes are connected (naming them, by the ``application_name`` kb's connections carry) unless
``--force``; a ``kb serve`` whose server was stopped answers at once with what to do and leaves it
stopped, and restarts a server that went away otherwise; psycopg's warnings stay off a command's
stderr."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.commands import halted_cli, run_cli
from support.named_queries import queries
from support.serving import call, start_serve, stop_serve
from support.waiting import wait_until

from kb.db import database
from kb.db.database import running_server, stop_embedded
from kb.db.embedded_server import postmaster_alive, stopped_on_purpose


def test_psycopg_warnings_stay_off_a_commands_stderr(kb, kb_env, settings, tmp_path):
    """A command whose pooled connections ended under it (the server restarted, a Ctrl-C in
    mid-statement) printed psycopg's and psycopg_pool's warnings ("error ignored terminating
    <psycopg.Pipeline [BAD]>", "discarding closed connection …") on stderr beside its own
    outcome. kb reports the outcome; the pool's bookkeeping is not the user's."""
    kb.create_workspace(1)
    source = tmp_path / "notes"
    source.mkdir()
    (source / "a.md").write_text("# A\n\nfirst\n")
    run_cli(kb_env, "import", str(source), "--workspace", "1")
    (source / "a.md").write_text("# A\n\nsecond\n")
    # halted just before Postgres commits, its pooled sessions open
    with halted_cli(kb_env, "before_pg_commit", "import", str(source), "--workspace", "1") as importer:
        with database.connect(settings.database_url, autocommit=True) as admin:
            ended = admin.execute(queries["test_terminate_application"], {"name": f"kb import pid {importer.pid}"})
            assert ended.fetchone()["terminated"] >= 1  # its sessions carry its name
        importer.send_signal(signal.SIGCONT)
        _, err = importer.communicate(timeout=300)
    assert "psycopg" not in err and "connection:" not in err, err
    assert err == "" or err.startswith("kb: ") and err.count("\n") == 1, err


@pytest.fixture
def storage_root():
    """A storage root outside pytest's tmp_path (see tests/test_embedded_server.py), its embedded
    server stopped after the test."""
    root = Path(tempfile.mkdtemp(prefix="kbstop-"))
    yield root / "storage"
    stop_embedded(root / "storage" / "postgres")
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.postgres  # starts its own embedded Postgres
def test_db_stop_under_kb_serve(storage_root: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(KB_STORAGE_ROOT=str(storage_root), KB_EMBEDDING_MODEL="hashing")
    pgdata = storage_root / "postgres"
    source = tmp_path / "notes"
    source.mkdir()
    (source / "a.md").write_text("# A\n\nrefunds\n")
    run_cli(env, "import", str(source), "--workspace", "1")
    log = tmp_path / "serve.log"
    serve, url = start_serve(env, log, "--insecure-no-auth")
    search = f"{url}/v1/workspaces/1/search?q=refunds"
    try:
        # refused while kb serve is connected, naming it and --force; the server keeps running
        refused = run_cli(env, "db-stop", check=False)
        assert refused.returncode == 1, refused
        assert f"kb serve pid {serve.pid} (" in refused.stderr and "--force" in refused.stderr, refused.stderr
        assert running_server(pgdata) is not None
        assert call(search)[0] == 200

        forced = run_cli(env, "db-stop", "--force")
        assert f"embedded Postgres stopped; cut off kb serve pid {serve.pid} (" in forced.stdout, forced.stdout

        # kb serve says what happened and what to do, at once (not after KB_POOL_TIMEOUT), and
        # leaves the server stopped: from threads that had a KnowledgeBase and new ones alike
        with ThreadPoolExecutor(8) as requests:
            answers = list(requests.map(lambda _: call(search), range(16)))
        for status, body in answers:
            assert status == 503 and body["error"] == "DatabaseUnavailable", body
            assert "`kb db-stop` stopped it" in body["message"] and "`kb db-start`" in body["message"], body
            assert "KB_DATABASE_URL" not in body["message"], body
        status, body = call(f"{url}/ready")
        assert status == 503 and body["error"] == "DatabaseUnavailable", body
        assert not postmaster_alive(pgdata)

        assert "embedded Postgres running" in run_cli(env, "db-start").stdout
        assert call(search)[0] == 200

        # stopped by something else than kb db-stop (a crash, pg_ctl): kb serve starts it again
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGINT)  # Postgres' fast shutdown
        wait_until(lambda: not postmaster_alive(pgdata), 60, "the postmaster to stop")
        status, body = call(search)
        assert status == 200, body
        assert postmaster_alive(pgdata)
    finally:
        output = stop_serve(serve, log)
    assert "Traceback" not in output, output


def test_a_killed_postmaster_awaiting_its_reaper_counts_as_gone(tmp_path: Path) -> None:
    """A killed postmaster stays a zombie until its new parent reaps it: a container's init may do
    that late, kb serve running as PID 1 never. Signal 0 still reaches a zombie, so kb serve took
    the server for running: each request waited KB_POOL_TIMEOUT (30 s) for a 503 and nobody
    started the server again."""
    exited = subprocess.Popen(["true"])  # not waited for: a zombie once it exits
    try:
        wait_until(lambda: Path(f"/proc/{exited.pid}/stat").read_text().split(") ")[1][0] == "Z", 30, "a zombie")
        (tmp_path / "postmaster.pid").write_text(
            f"{exited.pid}\n{tmp_path}\n1700000000\n5432\n{tmp_path}\n\n  1 2\nready   \n"
        )
        assert not postmaster_alive(tmp_path)
    finally:
        exited.wait()


@pytest.mark.postgres  # starts its own embedded Postgres
def test_a_stop_marker_outlived_by_its_server_does_not_hold_off_a_restart(storage_root: Path) -> None:
    """A `kb db-stop` killed after it recorded the stop but before the server stopped (or whose
    stop failed) left kb_stopped.json beside a running server, and the quick start path never
    removes it. When that server later crashed, kb serve refused to start it again, telling of a
    `kb db-stop` that had not stopped anything. Only a clean stop removes postmaster.pid."""
    pgdata = storage_root / "postgres"
    database.start_embedded(pgdata)
    (pgdata / "kb_stopped.json").write_text('{"at": "2026-01-01 00:00:00 UTC", "pid": 1}')  # the killed db-stop's
    postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)  # a crash
    wait_until(lambda: not postmaster_alive(pgdata), 60, "the postmaster to go")
    assert stopped_on_purpose(pgdata) is None
    wait_until(lambda: running_server(pgdata) is None, 60, "the killed postmaster to be reaped")
