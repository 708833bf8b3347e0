"""Two (or more) real kb nodes on this machine: each a `kb serve --with-worker` subprocess with
its own storage root and port, all on one Postgres (design §15)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kb.db import nodes
from kb.settings import Settings
from support.network import free_port
from support.waiting import wait_until


@dataclass
class Node:
    """One running node: its name, storage root, URL, environment (for the CLI as this node) and process."""

    name: str
    root: Path
    url: str
    env: dict[str, str]
    process: subprocess.Popen | None = None
    log: Path | None = None


def node_env(database_url: str, name: str, root: Path, url: str) -> dict[str, str]:
    """The environment of a kb process running as node ``name``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(
        KB_DATABASE_URL=database_url,
        KB_STORAGE_ROOT=str(root),
        KB_EMBEDDING_MODEL="hashing",
        KB_NODE=name,
        KB_NODE_URL=url,
    )
    return env


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def start(node: Node, worker: bool = True) -> None:
    """Start ``node``'s `kb serve` (``--with-worker`` unless not ``worker``; output to ``{root}.log``)
    and wait until it is ready."""
    node.log = node.root.with_suffix(".log")
    port = node.url.rsplit(":", 1)[1]
    with node.log.open("a") as output:
        node.process = subprocess.Popen(
            [sys.executable, "-m", "kb.adapters.cli", "serve", *(["--with-worker"] if worker else []), "--port", port],
            env=node.env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    process = node.process
    wait_until(lambda: _ready(node.url) or process.poll() is not None, 120, f"node {node.name} to be ready")
    assert process.poll() is None, node.log.read_text()
    # the URL other nodes reach it at, in kb.nodes (what `kb serve` advertises from KB_NODE_URL)
    settings = Settings(database_url=node.env["KB_DATABASE_URL"], storage_root=node.root, node=node.name)
    nodes.register(node.env["KB_DATABASE_URL"], settings, node.url)


def stop(node: Node) -> None:
    """SIGTERM the node's server and wait for it."""
    if node.process is not None and node.process.poll() is None:
        node.process.send_signal(signal.SIGTERM)
        try:
            node.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()


@contextlib.contextmanager
def two_nodes(database_url: str, folder: Path, names: tuple[str, ...] = ("a", "b")) -> Iterator[list[Node]]:
    """Nodes ``names`` (default a and b), each serving with a worker from ``folder/<name>``; stopped on exit."""
    nodes = []
    for name in names:
        url = f"http://127.0.0.1:{free_port()}"
        nodes.append(Node(name, folder / name, url, node_env(database_url, name, folder / name, url)))
    try:
        for node in nodes:
            start(node)
        yield nodes
    finally:
        for node in nodes:
            stop(node)
