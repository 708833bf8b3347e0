"""design §13 (design §13): kb behind a real PgBouncer in transaction mode (Debian's ``pgbouncer``).

Before the fix every worker job and every concurrent writer failed with
``DuplicatePreparedStatement: prepared statement "_pg3_0" already exists`` (psycopg prepares
statements on server connections that the pooler hands to other clients), and the index lock was a
session lock a pooled connection cannot hold. With ``KB_DATABASE_POOLER=transaction`` the core flow,
a polling worker and concurrent writers all work through the pooler.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.core_flow import WORKSPACE, assert_converged, run_core_flow
from support.network import free_port

from kb.db import database
from kb.jobs import tasks as jobs
from kb.settings import Settings

POOL_SIZE = 3  # few server connections, so clients share them all the time


def _run_as(host: str) -> str | None:
    """PgBouncer refuses to run as root: run it as the owner of the server's socket directory (so
    it may use the socket), or ``nobody`` for a TCP server; None when not root."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        return pwd.getpwuid(Path(host).stat().st_uid).pw_name
    return "nobody"


@pytest.fixture
def pgbouncer(database_url: str) -> Iterator[str]:
    """A PgBouncer (pool_mode=transaction) in front of the test's database; yields its URL."""
    binary = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)
    if binary is None:
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer; .ci/run installs it)")
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    host, port, user = info.get("host", "127.0.0.1"), info.get("port", "5432"), info.get("user", "postgres")
    work = Path(tempfile.mkdtemp(prefix="kbbouncer-"))
    work.chmod(0o777)
    listen = free_port()
    (work / "users.txt").write_text(f'"{user}" ""\n')
    (work / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={host} port={port}\n\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {work / 'users.txt'}\npool_mode = transaction\n"
        f"default_pool_size = {POOL_SIZE}\nmax_client_conn = 200\n"
        f"logfile = {work / 'pgbouncer.log'}\npidfile = {work / 'pgbouncer.pid'}\n"
        "ignore_startup_parameters = extra_float_digits\n"
    )
    run_as = _run_as(host)
    process = subprocess.Popen(
        [binary, *(["-u", run_as] if run_as else []), str(work / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = psycopg.conninfo.make_conninfo(host="127.0.0.1", port=listen, user=user, dbname=info["dbname"])
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                psycopg.connect(url, prepare_threshold=None).close()
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = (work / "pgbouncer.log").read_text() if (work / "pgbouncer.log").exists() else ""
                    raise AssertionError(f"pgbouncer did not start: {process.stderr.read()} {log}") from None
                time.sleep(0.1)
        yield url
    finally:
        database.close_pools()
        process.terminate()
        process.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def test_core_flow_through_transaction_pooler(pgbouncer: str, tmp_path) -> None:
    settings = Settings(
        database_url=pgbouncer,
        database_pooler="transaction",
        storage_root=tmp_path / "storage",
        embedding_model="hashing",
    )
    kb = run_core_flow(settings, tmp_path / "notes")
    assert not jobs.worker_listens(kb)  # no direct URL: the worker polls through the pooler

    # Concurrent writers through the pooler (xact advisory locks serialize them), then a worker.
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(3):
                with kb.transaction(WORKSPACE, f"writer {n} note {i}") as tx:
                    tx.write(f"/documents/Concurrent/w{n}-{i}.md", f"# Writer {n} note {i}\n\nbody {n} {i}\n")
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    kb.run_worker(until_idle=True)
    ws = assert_converged(kb)
    assert ws["documents"] == 3 + 12
    paths = kb.list_paths(WORKSPACE)
    assert all(f"/documents/Concurrent/w{n}-{i}.md" in paths for n in range(4) for i in range(3))
    hits = kb.search(WORKSPACE, "Writer 2 note 1")
    assert hits and hits[0].path == "/documents/Concurrent/w2-1.md"


def test_direct_url_gives_the_worker_a_session(pgbouncer: str, database_url: str, tmp_path) -> None:
    settings = Settings(
        database_url=pgbouncer,
        database_pooler="transaction",
        direct_database_url=database_url,
        storage_root=tmp_path / "storage",
        embedding_model="hashing",
    )
    kb = run_core_flow(settings, tmp_path / "notes")
    assert jobs.worker_listens(kb)
    assert database.session_database_url(settings, kb.database_url) == database_url
