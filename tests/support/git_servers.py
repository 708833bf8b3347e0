"""Real git servers on loopback for the remote tests (design §13): ``git daemon`` with receive-pack,
and a basic-auth HTTP server in front of ``git http-backend`` (a small WSGI wrapper of the CGI)."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from support.network import free_port


def bare_repository(path: Path) -> Path:
    """``git init --bare`` at ``path``, accepting pushes over http and git://."""
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "config", "http.receivepack", "true"], check=True)
    return path


def _wait_for_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def git_daemon(root: Path) -> Iterator[str]:
    """Serve every repository under ``root`` on git://127.0.0.1:PORT/ with pushes enabled."""
    port = free_port()
    proc = subprocess.Popen(
        [
            shutil.which("git"),
            "daemon",
            "--reuseaddr",
            f"--base-path={root}",
            "--export-all",
            "--enable=receive-pack",
            "--listen=127.0.0.1",
            f"--port={port}",
            "--informative-errors",
            str(root),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port)
        yield f"git://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class GitHttpBackend:
    """WSGI app: basic-auth check, then ``git http-backend`` as a CGI for repositories under ``root``.
    ``refused`` counts requests turned away for bad or missing credentials."""

    def __init__(self, root: Path, username: str, password: str) -> None:
        self.root, self.username = root, username
        self.expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        self.refused = 0
        self.accepted = 0

    def __call__(self, environ, start_response):
        if environ.get("HTTP_AUTHORIZATION") != self.expected:
            self.refused += 1
            start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="kb-test"'), ("Content-Length", "0")])
            return [b""]
        self.accepted += 1
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        env = {
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            "PATH": os.environ["PATH"],
            "PATH_INFO": environ.get("PATH_INFO", ""),
            "REQUEST_METHOD": environ["REQUEST_METHOD"],
            "QUERY_STRING": environ.get("QUERY_STRING", ""),
            "CONTENT_TYPE": environ.get("CONTENT_TYPE", ""),
            "CONTENT_LENGTH": str(len(body)),
            "REMOTE_USER": self.username,
            "REMOTE_ADDR": "127.0.0.1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "HOME": str(self.root),
        }
        for header, variable in (
            ("HTTP_CONTENT_ENCODING", "HTTP_CONTENT_ENCODING"),
            ("HTTP_GIT_PROTOCOL", "GIT_PROTOCOL"),
        ):
            if environ.get(header):
                env[variable] = environ[header]
        out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
        split = min((i for i in (out.find(b"\r\n\r\n"), out.find(b"\n\n")) if i >= 0), default=-1)
        raw_headers, payload = out[:split], out[split:].lstrip(b"\r\n") if split >= 0 else b""
        status, headers = "200 OK", []
        for line in raw_headers.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = value.strip()
            elif name:
                headers.append((name, value.strip()))
        headers.append(("Content-Length", str(len(payload))))
        start_response(status, headers)
        return [payload]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def git_http_server(root: Path, username: str, password: str) -> Iterator[tuple[str, GitHttpBackend]]:
    """Serve ``root`` on http://127.0.0.1:PORT/ behind basic auth; yields (base URL, app)."""
    app = GitHttpBackend(root, username, password)
    server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", app
    finally:
        server.shutdown()
        server.server_close()
