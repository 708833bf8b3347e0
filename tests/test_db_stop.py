"""design §13: the embedded Postgres under a running kb process. ``kb db-stop`` refuses while other
processes are connected (naming them, by the ``application_name`` kb's connections carry) unless
``--force``; a ``kb serve`` whose server was stopped answers at once with what to do and leaves it
stopped, and restarts a server that went away otherwise; psycopg's warnings stay off a command's
stderr."""

from __future__ import annotations

import os
import shutil
import signal
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
from kb.db.embedded_server import postmaster_alive


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
