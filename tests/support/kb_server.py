"""A real ``kb serve`` subprocess for the tests of its pages (design §13, §17): started on a free
port with the test's environment, waited for until ``/ready``, stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from support.network import free_port
from support.waiting import wait_until


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_server(env: dict[str, str], log: Path, *extra: str) -> Iterator[str]:
    """``kb serve --with-worker`` (plus ``extra`` arguments) for the block; yields its base URL.
    Its output goes to ``log`` (an unread pipe could fill up). Raises AssertionError with the log
    when it does not become ready within 120 s, or does not stop cleanly on SIGTERM."""
    port = free_port()
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "kb.adapters.cli", "serve", "--with-worker", "--port", str(port), *extra],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url) or process.poll() is not None, 120, "kb serve to be ready")
        assert process.poll() is None, log.read_text()
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    assert "Traceback" not in log.read_text(), log.read_text()
