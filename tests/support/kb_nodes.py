"""Several real kb nodes on this machine (design §15): each a `kb serve` (with its worker unless
asked otherwise) with its own storage root and port, all on one Postgres; built on
``support.serving``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from support.serving import start_serve, stop_serve


@dataclass
class Node:
    """One node: its name, storage root, environment (for the CLI run as this node) and, once
    started, its URL and server process."""

    name: str
    root: Path
    env: dict[str, str]
    url: str = ""
    process: subprocess.Popen | None = None


def node(database_url: str, name: str, root: Path) -> Node:
    """Node ``name`` storing under ``root`` (not started), with the hashing embedder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(KB_DATABASE_URL=database_url, KB_STORAGE_ROOT=str(root), KB_EMBEDDING_MODEL="hashing", KB_NODE=name)
    return Node(name, root, env)


def start(node: Node, worker: bool = True) -> None:
    """Start the node's `kb serve` (``--with-worker`` unless not ``worker``; output in
    ``{root}.log``); it registers itself and its URL in ``kb.nodes``."""
    node.process, node.url = start_serve(
        node.env, node.root.with_suffix(".log"), *(["--with-worker"] if worker else [])
    )


def stop(node: Node) -> None:
    """Stop the node's server (SIGTERM, graceful)."""
    if node.process is not None:
        stop_serve(node.process, node.root.with_suffix(".log"))


def admin_token(env: dict[str, str], name: str = "nodes-admin") -> str:
    """A new admin token for every workspace (``kb token create``, design §16), as the CLI prints it."""
    created = subprocess.run(
        [sys.executable, "-m", "kb.adapters.cli", "token", "create", "--name", name, "--scope", "admin"]
        + ["--all-workspaces"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return created.stdout.splitlines()[0].strip()


@contextlib.contextmanager
def running_nodes(database_url: str, folder: Path, names: tuple[str, ...] = ("a", "b")) -> Iterator[list[Node]]:
    """Nodes ``names`` storing under ``folder/<name>``, serving with a worker; stopped on exit.
    Every node's environment carries one admin token as ``KB_TOKEN`` (the CLI sends it, and a
    move passes it from node to node); ``bearer(node)`` is the header for direct requests."""
    nodes = [node(database_url, name, folder / name) for name in names]
    token = admin_token(nodes[0].env)
    for each in nodes:
        each.env["KB_TOKEN"] = token
    try:
        with ThreadPoolExecutor(len(nodes)) as pool:  # they start side by side
            list(pool.map(start, nodes))
        yield nodes
    finally:
        for each in nodes:
            stop(each)


def bearer(node: Node) -> dict[str, str]:
    """The ``Authorization`` header of the node's token (``running_nodes`` sets it)."""
    return {"Authorization": f"Bearer {node.env['KB_TOKEN']}"}
