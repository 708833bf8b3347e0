"""Nodes (design §15): many hosts, one Postgres.

A node is a group of kb processes (``kb serve``, ``kb worker``) with a name (``KB_NODE``, default
the host name), a storage root and, for ``kb serve``, an advertised URL (``KB_NODE_URL``). Each
registers in ``kb.nodes`` when it starts and heartbeats every quarter of ``KB_NODE_STALE_SECONDS``;
a node whose heartbeat is older than that is *down*. Ages are computed by Postgres' clock, so
hosts' clocks may differ.

Every workspace has a home node (``kb.workspaces.home_node``): the node whose storage root holds its
repository. Jobs that touch the repository are deferred to the home node's queues
(``node_queue``), and ``kb serve`` forwards requests for it there.

**Storage id.** A random id kept in ``{storage_root}/node-storage-id`` (created once, ``O_EXCL``).
Nodes that see the same file — one storage root on a shared file system — have the same storage
id and serve each other's workspaces directly (``same_storage``); nodes with their own volumes
never do, even when the volumes are mounted at the same path.

This module knows Postgres and the settings only; adoption of workspaces made before nodes
existed (it must look for their repository) is ``kb.store.homes``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kb.db import database
from kb.db.sql import queries
from kb.errors import ConfigurationError, InvalidInput, KbError, NodeInUse, StorageError

if TYPE_CHECKING:
    from kb.db.database import Connection
    from kb.settings import Settings

log = logging.getLogger(__name__)

NODE_QUEUES = ("projection", "index", "push", "maintenance")
"""Base queues that exist once per node (``{queue}@{node}``): the jobs that touch a repository."""

NODE_FREE_QUEUES = ("projection", "index", "push", "maintenance", "span_fill")
"""Queues every node's worker consumes: node-free jobs (citation expiry, old-job removal, the
stalled-job retry, span fill) and jobs of workspaces without a home node yet."""

STORAGE_ID_FILE = "node-storage-id"


def node_queue(queue: str, node: str | None) -> str:
    """The Procrastinate queue of ``queue`` on ``node``: ``"index@a"``; the node-free ``queue``
    when ``node`` is None. SQL forms the same name with ``kb.node_queue(queue, workspace)``."""
    return f"{queue}@{node}" if node else queue


def worker_queues(node: str) -> list[str]:
    """The queues ``node``'s worker consumes: its own (``{queue}@{node}``) and the node-free ones."""
    return [node_queue(q, node) for q in NODE_QUEUES] + list(NODE_FREE_QUEUES)


_storage_ids: dict[Path, str] = {}


def storage_id(storage_root: Path) -> str:
    """The storage root's id (``{storage_root}/node-storage-id``), created on first use and
    remembered by the process. Raises StorageError when the storage root cannot hold it."""
    known = _storage_ids.get(Path(storage_root))
    if known is None:
        known = _storage_ids[Path(storage_root)] = _read_or_create_storage_id(Path(storage_root))
    return known


def _read_or_create_storage_id(storage_root: Path) -> str:
    path = storage_root / STORAGE_ID_FILE
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StorageError(f"cannot read {path} ({exc.strerror}); fix its permissions") from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:  # another process created it first: take theirs
        return path.read_text(encoding="ascii").strip()
    except OSError as exc:
        raise StorageError(f"cannot create {path} ({exc.strerror}); fix the storage root's permissions") from None
    new = uuid.uuid4().hex
    with os.fdopen(fd, "w", encoding="ascii") as file:
        file.write(new + "\n")
        file.flush()
        os.fsync(file.fileno())
    return new


def node_params(settings: Settings) -> dict[str, str]:
    """``{node, storage_root, storage_id}`` of this process's node, the parameters of
    ``ensure_workspace`` (a new workspace is homed here)."""
    return {
        "node": settings.node,
        "storage_root": str(settings.storage_root),
        "storage_id": storage_id(settings.storage_root),
    }


@dataclass(frozen=True)
class Node:
    """A row of ``kb.nodes``: ``heartbeat_age`` in seconds by Postgres' clock."""

    name: str
    storage_root: str
    storage_id: str | None
    url: str | None
    heartbeat_age: float
    workspaces: int = 0

    def is_up(self, stale_seconds: float) -> bool:
        """True when the node heartbeat within ``stale_seconds``."""
        return self.heartbeat_age <= stale_seconds


@dataclass(frozen=True)
class WorkspaceHome:
    """Where a workspace lives: ``node`` (None while it has no home node) with that node's ``url``,
    ``storage_id`` and ``heartbeat_age`` (seconds; None without a node)."""

    workspace_id: int
    node: str | None
    url: str | None
    storage_id: str | None
    heartbeat_age: float | None
    repository_id: str | None = None

    def is_up(self, stale_seconds: float) -> bool:
        """True when the home node heartbeat within ``stale_seconds``."""
        return self.heartbeat_age is not None and self.heartbeat_age <= stale_seconds


def register(database_url: str, settings: Settings, url: str | None = None) -> Node:
    """Register this process's node (``KB_NODE``) with its storage root and, for ``kb serve``,
    ``url``; refresh its heartbeat. Returns the row.

    Raises ConfigurationError when the name is registered with another storage (another storage
    id: two hosts with one name would take each other's jobs): set ``KB_NODE`` to a name of its
    own. The same storage mounted at a new path updates the recorded path.
    """
    sid = storage_id(settings.storage_root)
    with database.pooled_transaction(database_url) as conn:
        row = conn.execute(
            queries["register_node"],
            {"name": settings.node, "storage_root": str(settings.storage_root), "storage_id": sid, "url": url},
        ).fetchone()
    if row["storage_id"] not in (None, sid):
        raise ConfigurationError(
            f"node {settings.node!r} is registered with the storage root {row['storage_root']} "
            f"(storage id {row['storage_id']}), not this process's {settings.storage_root} ({sid}); "
            "give this host a node name of its own (KB_NODE), or point KB_STORAGE_ROOT at the node's storage"
        )
    return Node(row["name"], row["storage_root"], row["storage_id"], row["url"], 0.0)


def heartbeat(database_url: str, node: str) -> bool:
    """Record that ``node`` is alive; False when its row is gone."""
    with database.pooled_transaction(database_url) as conn:
        return conn.execute(queries["node_heartbeat"], {"name": node}).fetchone() is not None


def list_nodes(database_url: str) -> list[Node]:
    """Every registered node, by name, with its heartbeat age and workspace count."""
    with database.pooled_connection(database_url) as conn:
        rows = conn.execute(queries["list_nodes"]).fetchall()
    return [
        Node(r["name"], r["storage_root"], r["storage_id"], r["url"], r["heartbeat_age"], r["workspaces"]) for r in rows
    ]


def get_node(database_url: str, name: str) -> Node | None:
    """The node called ``name``, or None."""
    with database.pooled_connection(database_url) as conn:
        r = conn.execute(queries["get_node"], {"name": name}).fetchone()
    return None if r is None else Node(r["name"], r["storage_root"], r["storage_id"], r["url"], r["heartbeat_age"])


def forget_node(database_url: str, name: str, stale_seconds: float) -> None:
    """Remove the row of node ``name`` (``kb nodes forget``, design §15): a node renamed or retired
    leaves it behind, shown as down for good. Refused — nothing removed — with NodeInUse while
    workspaces are homed on it (move them first) or it heartbeat within ``stale_seconds`` (stop
    it first); InvalidInput when no node has that name. A process of that node that starts again
    registers it anew."""
    with database.pooled_transaction(database_url) as conn:
        row = conn.execute(queries["forget_node"], {"name": name, "stale_seconds": stale_seconds}).fetchone()
    if row is None:
        raise InvalidInput(f"no node is called {name!r}; `kb nodes` lists them")
    if row["forgotten"]:
        return
    if row["workspaces"]:
        raise NodeInUse(
            f"node {name!r} is home to {row['workspaces']} workspace(s): move each to another node first "
            f"(`kb workspace move N --to OTHER`; nothing is copied when the two share their storage)",
            node=name,
        )
    raise NodeInUse(
        f"node {name!r} is up (heartbeat {row['heartbeat_age']:.0f} s ago): stop its `kb serve` and "
        f"`kb worker` and wait KB_NODE_STALE_SECONDS ({stale_seconds:g} s) before forgetting it",
        node=name,
    )


def read_home(conn: Connection, workspace_id: int) -> WorkspaceHome | None:
    """The workspace's home as recorded (in ``conn``'s transaction); None when it does not exist."""
    r = conn.execute(queries["workspace_home"], {"workspace_id": workspace_id}).fetchone()
    if r is None:
        return None
    return WorkspaceHome(
        workspace_id, r["home_node"], r["url"], r["storage_id"], r["heartbeat_age"], r["repository_id"]
    )


def workspace_home(database_url: str, workspace_id: int) -> WorkspaceHome | None:
    """The workspace's home node with its URL and heartbeat age (one pooled read); None when the
    workspace does not exist. Does not adopt (``kb.store.homes.home_of`` does)."""
    with database.pooled_connection(database_url) as conn:
        return read_home(conn, workspace_id)


def set_home(conn: Connection, workspace_id: int, node: str, expected: str | None) -> bool:
    """Flip the workspace's home node to ``node`` if it is still ``expected`` (compare-and-swap, in
    ``conn``'s transaction); True when it flipped. The one way a home changes (adoption, moves)."""
    row = conn.execute(
        queries["set_workspace_home"], {"workspace_id": workspace_id, "node": node, "expected": expected}
    ).fetchone()
    return row is not None


def same_storage(home: WorkspaceHome, settings: Settings) -> bool:
    """True when this process sees the home node's storage (same storage id: this node, or a node
    sharing its storage root on a shared file system), so it may use the repository directly."""
    if home.node is None:
        return False
    if home.node == settings.node:
        return True
    if not settings.storage_root.exists():  # holds no node's storage; asking would create it (design §2.1)
        return False
    return home.storage_id is not None and home.storage_id == storage_id(settings.storage_root)


class Heartbeat:
    """A daemon thread that heartbeats this node every quarter of ``KB_NODE_STALE_SECONDS`` until
    stopped (``with Heartbeat(...)``, or ``start``/``stop``). A failed beat is logged and retried at
    the next interval: a node whose database is away is down anyway."""

    def __init__(self, database_url: str, settings: Settings) -> None:
        self.database_url = database_url
        self.node = settings.node
        self.interval = settings.node_stale_seconds / 4
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Heartbeat:
        """Start beating (idempotent); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"kb-node-heartbeat-{self.node}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and wait for the thread (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                heartbeat(self.database_url, self.node)
            except KbError as exc:
                log.warning("node %s: heartbeat failed (%s); retrying in %.0f s", self.node, exc, self.interval)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_node(database_url: str, settings: Settings, url: str | None = None) -> Iterator[Node]:
    """Register this node (``register``) and heartbeat while the block runs; yields its row."""
    node = register(database_url, settings, url)
    with Heartbeat(database_url, settings):
        yield node
