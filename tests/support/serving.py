"""Real ``kb serve`` processes for tests: start one on a free port and wait until it is ready, stop
it with SIGTERM, and JSON calls over HTTP (standard library)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from support.network import free_port
from support.waiting import wait_until


def call(url: str, method: str = "GET", body: dict | None = None, headers: dict | None = None) -> tuple[int, object]:
    """``(status, decoded JSON body)`` of one request; HTTP errors are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json", **(headers or {})}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _ready(url: str) -> bool:
    try:
        return call(f"{url}/ready")[0] == 200
    except OSError:
        return False


def start_serve(env: dict[str, str], log: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """``kb serve ARGS --port <free>`` with ``env``, its output in ``log``; returns the process and
    its base URL once ``/ready`` answers 200."""
    return start_serves([(env, log, args)])[0]


def start_serves(servers: list[tuple[dict[str, str], Path, tuple[str, ...]]]) -> list[tuple[subprocess.Popen, str]]:
    """Start several ``kb serve`` processes at once (``(env, log, args)`` each, as ``start_serve``)
    and wait until every one is ready; returns ``(process, url)`` in order."""
    started = []
    for env, log, args in servers:
        port = free_port()
        with log.open("w") as output:
            process = subprocess.Popen(
                [sys.executable, "-m", "kb.adapters.cli", "serve", *args, "--port", str(port)],
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
            )
        started.append((process, f"http://127.0.0.1:{port}", log))
    try:
        for process, url, log in started:
            wait_until(lambda: _ready(url) or process.poll() is not None, 120, "kb serve to be ready")
            assert process.poll() is None, log.read_text()
    except AssertionError:
        for process, _, _ in started:
            process.kill()
        raise
    return [(process, url) for process, url, _ in started]


def stop_serve(process: subprocess.Popen, log: Path) -> str:
    """SIGTERM and wait (a graceful shutdown); returns the server's output."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    return log.read_text()


def turn_locks_held(pid: int) -> int:
    """How many turn worktree locks (``kb-turn.lock`` descriptors) process ``pid`` holds open,
    read from /proc; a descriptor closed while this reads is skipped."""
    import os
    from pathlib import Path

    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:  # a descriptor the server closes while this looks is gone by the time it is read
            held += os.readlink(fd).endswith("kb-turn.lock")
        except FileNotFoundError:
            continue
    return held
