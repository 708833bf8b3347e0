"""A real PgBouncer in transaction mode (Debian's ``pgbouncer``) in front of a test's database
(design §13): the pooler tests and the two-node test through it (design §15)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from kb.db import database
from support.network import free_port

POOL_SIZE = 3  # few server connections, so clients share them all the time


def _run_as(host: str) -> str | None:
    """PgBouncer refuses to run as root: run it as the owner of the server's socket directory (so
    it may use the socket), or ``nobody`` for a TCP server; None when not root."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        return pwd.getpwuid(Path(host).stat().st_uid).pw_name
    return "nobody"


def run_pgbouncer(database_url: str) -> Iterator[str]:
    """A PgBouncer (pool_mode=transaction) in front of ``database_url``'s server; yields its URL to
    the same database (a generator for a fixture). Skips the test when pgbouncer is not installed."""
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
