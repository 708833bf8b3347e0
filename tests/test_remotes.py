"""design §13 (design §13): push each workspace to a git remote — fast-forward only, as a Procrastinate
job deferred with each revision, against real servers on loopback (a bare repository by path,
``git daemon`` with receive-pack, basic-auth HTTP in front of ``git http-backend``); credentials
never stored or shown."""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import sys

import psycopg
import pytest
from psycopg import sql
from pydantic import SecretStr
from support.commands import git, run_cli
from support.git_servers import bare_repository, git_daemon, git_http_server
from support.named_queries import queries
from support.waiting import wait_until

from kb.db import database
from kb.errors import InvalidInput, PushFailed, RemoteDiverged, RemoteUnreachable

PASSWORD = "s3cr3t-t0ken-Zq9"


def _write(kb, n: int, ws: int = 1) -> str:
    with kb.transaction(ws, f"revision {n}", "tester") as tx:
        tx.write(f"/documents/note-{n}.md", f"# note {n}\n")
    return tx.revision.id


def _remote_branch(bare, branch="main") -> str | None:
    out = subprocess.run(
        ["git", "-C", str(bare), "rev-parse", "--verify", "-q", f"refs/heads/{branch}"], capture_output=True, text=True
    )
    return out.stdout.strip() or None


def _push_jobs(kb) -> list[dict]:
    with database.connect(kb.database_url) as conn:
        return conn.execute(queries["test_push_jobs"]).fetchall()


def test_bare_repository_by_path_push_jobs_are_deferred_coalesced_and_converge(kb, tmp_path):
    kb.create_workspace(1)
    _write(kb, 0)
    bare = bare_repository(tmp_path / "remote.git")
    status = kb.remote(1).add(str(bare))
    assert status.branch == "main" and status.behind and status.last_pushed_revision is None
    for n in range(1, 4):
        _write(kb, n)
    todo = [j for j in _push_jobs(kb) if j["status"] == "todo"]
    assert len(todo) == 1 and todo[0]["lock"] == "push:1" and todo[0]["queue_name"] == f"push@{kb.settings.node}"
    kb.run_worker(until_idle=True)
    head = kb.head(1)
    assert _remote_branch(bare) == head
    git(bare, "fsck", "--strict")
    shown = kb.remote(1).status()
    assert shown.last_pushed_revision == head and shown.last_push_error is None and not shown.behind
    assert kb.remote(1).push().pushed is False  # at HEAD already: nothing to do
    with pytest.raises(InvalidInput):
        kb.remote(2).add("https://user:pw@forge.example/x.git")
    kb.remote(1).remove()
    _write(kb, 9)
    assert [j for j in _push_jobs(kb) if j["status"] == "todo"] == []  # no remote, no job
    kb.remote(1).add(f"file://{bare}")  # the same repository as a file:// URL: HEAD is ahead of it
    assert kb.remote(1).push().pushed and _remote_branch(bare) == kb.head(1)


def test_git_daemon_with_receive_pack(kb, tmp_path):
    kb.create_workspace(1)
    root = tmp_path / "served"
    root.mkdir()
    bare = bare_repository(root / "kb.git")
    with git_daemon(root) as base:
        kb.remote(1).add(f"{base}/kb.git", branch="backup")
        for n in range(3):
            _write(kb, n)
        kb.run_worker(until_idle=True)
        assert _remote_branch(bare, "backup") == kb.head(1)
        assert kb.fsck(1).remote_problem is None
    git(bare, "fsck", "--strict")


def test_http_basic_auth_wrong_password_refused_right_one_used_and_never_stored(kb, kb_env, tmp_path, caplog):
    kb.create_workspace(1)
    _write(kb, 0)
    root = tmp_path / "served"
    root.mkdir()
    bare = bare_repository(root / "kb.git")
    credentials = tmp_path / "git-credentials"
    with git_http_server(root, "alice", PASSWORD) as (base, app):
        url = f"{base}/kb.git"
        kb.settings.remote_username, kb.settings.remote_password = "alice", SecretStr("wrong-password")
        with pytest.raises(RemoteUnreachable) as refused:
            kb.remote(1).add(url)
        assert "wrong-password" not in str(refused.value) and app.refused >= 1
        # the right password, from a git-credentials file named in settings
        kb.settings.remote_username = kb.settings.remote_password = None
        credentials.write_text(f"{base.replace('http://', 'http://alice:' + PASSWORD + '@')}/kb.git\n")
        kb.settings.remote_credentials_file = credentials
        kb.remote(1).add(url)
        caplog.set_level(logging.DEBUG)
        assert kb.remote(1).push().pushed and _remote_branch(bare) == kb.head(1)
        # a wrong password at push time: refused by the server, recorded (redacted) and raised
        _write(kb, 1)
        kb.settings.remote_credentials_file = None
        kb.settings.remote_username, kb.settings.remote_password = "alice", SecretStr("wrong-" + PASSWORD)
        with pytest.raises(PushFailed):
            kb.remote(1).push()
        failed = kb.remote(1).status()
        assert failed.last_push_error and failed.push_failures == 1 and failed.behind
        kb.settings.remote_password = SecretStr(PASSWORD)
        kb.remote(1).push()
        assert _remote_branch(bare) == kb.head(1) and kb.remote(1).status().last_push_error is None
        env = {**kb_env, "KB_REMOTE_USERNAME": "alice", "KB_REMOTE_PASSWORD": PASSWORD}
        status_out = run_cli(env, "status", "-w", "1").stdout + run_cli(env, "remote", "show", "-w", "1").stdout
        status_out += run_cli(env, "status", "-w", "1", "--json").stdout
    assert url in status_out
    repo = kb.settings.knowledge_store / "1"
    places = {
        ".git/config": (repo / ".git" / "config").read_text(),
        "remote url": kb.remote(1).status().url,
        "logs": caplog.text,
        "kb status": status_out,
        "postgres": _all_text_in_postgres(kb),
    }
    basic = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()  # the Authorization header's form
    for place, text in places.items():
        assert PASSWORD not in text and basic not in text, place
    assert "alice" not in places[".git/config"]


def _all_text_in_postgres(kb) -> str:
    """Every row of every table in kb's schema and Procrastinate's, as text."""
    with psycopg.connect(kb.database_url) as conn:
        tables = conn.execute(queries["test_text_tables"]).fetchall()
        return "\n".join(
            str(row)
            for schema, table in tables
            for row in conn.execute(
                sql.SQL(queries["test_table_rows_as_text"]).format(table=sql.Identifier(schema, table))
            )
        )


def test_diverged_remote_refused_at_add_and_recorded_as_an_error_later(kb, tmp_path):
    kb.create_workspace(1)
    _write(kb, 0)
    bare = bare_repository(tmp_path / "remote.git")
    other = tmp_path / "other"
    subprocess.run(["git", "init", "-q", "-b", "main", str(other)], check=True)
    (other / "x.md").write_text("foreign\n")
    git(other, "add", "x.md")
    git(other, "-c", "user.name=o", "-c", "user.email=o@example.com", "commit", "-q", "-m", "foreign")
    git(other, "push", "-q", str(bare), "main")
    with pytest.raises(RemoteDiverged, match="never merges"):
        kb.remote(1).add(str(bare))
    # an empty branch is fine; later someone pushes a commit kb does not have
    kb.remote(1).add(str(bare), branch="kb")
    kb.remote(1).push()
    git(other, "push", "-q", "--force", str(bare), "main:kb")
    _write(kb, 1)
    with pytest.raises(PushFailed, match="not an ancestor"):
        kb.remote(1).push()
    state = kb.remote(1).status()
    assert "not an ancestor" in state.last_push_error and state.behind
    report = kb.fsck(1)
    assert report.remote_problem and not report.ok
    assert _remote_branch(bare, "kb") != kb.head(1)  # never force-pushed


def test_sweep_redefers_a_push_while_the_remote_is_behind(kb, tmp_path):
    kb.create_workspace(1)
    _write(kb, 0)
    bare = bare_repository(tmp_path / "remote.git")
    kb.remote(1).add(str(bare))
    with database.transaction(kb.database_url) as conn:
        conn.execute(queries["delete_todo_jobs_for_tests"])  # as if the job had been lost
    assert kb.sweep().push_deferred == [1]
    assert kb.sweep().push_deferred == []  # one is waiting now
    kb.run_worker(until_idle=True)
    assert _remote_branch(bare) == kb.head(1)


def test_twenty_revisions_then_kill_9_of_the_worker_mid_push_remote_ends_at_head(kb, kb_env, tmp_path):
    kb.create_workspace(1)
    bare = bare_repository(tmp_path / "remote.git")
    kb.remote(1).add(str(bare))
    for n in range(20):
        _write(kb, n)
    head = kb.head(1)
    assert len([j for j in _push_jobs(kb) if j["status"] == "todo"]) == 1  # coalesced
    env = {
        **kb_env,
        "KB_STALLED_JOB_SECONDS": "2",
        "KB_MAINTENANCE_CRON": "* * * * * *",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    crashing = subprocess.run(
        [sys.executable, "-m", "kb.adapters.cli", "worker"],
        env={**env, "KB_FAULT_POINT": "push_sending"},
        capture_output=True,
        timeout=300,
    )
    assert crashing.returncode == -signal.SIGKILL
    assert _remote_branch(bare) is None and [j["status"] for j in _push_jobs(kb)] == ["doing"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: kb.remote(1).status().last_pushed_revision == head, 120, "the retried push")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    assert _remote_branch(bare) == head
    git(bare, "fsck", "--strict")
    assert kb.fsck(1).ok
