"""Home nodes of workspaces (design §15): which node's storage holds a workspace's repository, and
adoption of workspaces made before nodes existed.

A workspace created by kb is homed on the creating node (``ensure_workspace``). One made before
nodes existed has no home node (``kb.workspaces.home_node`` NULL) until a node *adopts* it: the
first node that opens it and finds its repository under its own storage root — with the recorded
repository identity, or none recorded — records itself as home, compare-and-swap on NULL, so two
nodes racing cannot both win. A node that does not hold the repository never adopts, and nothing
already homed is ever re-homed here (only ``kb workspace move`` flips a home, design §15).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kb.db import database, nodes
from kb.db.nodes import WorkspaceHome
from kb.db.sql import queries
from kb.git.repository import Repository

if TYPE_CHECKING:
    from kb.settings import Settings

log = logging.getLogger(__name__)


def holds_repository(settings: Settings, workspace_id: int, repository_id: str | None) -> bool:
    """True when this node's storage root holds the workspace's repository: it exists and carries
    ``repository_id`` (any identity when None is recorded)."""
    path = settings.knowledge_store / str(workspace_id)
    if not (path / ".git" / "HEAD").is_file():
        return False
    if repository_id is None:
        return True
    try:
        repository = Repository.open(path)
    except FileNotFoundError:
        return False
    try:
        return repository.identity() in (None, repository_id)
    finally:
        repository.close()


def home_of(settings: Settings, database_url: str, workspace_id: int) -> WorkspaceHome | None:
    """The workspace's home (``kb.db.nodes.WorkspaceHome``), adopting it first when it has none and
    this node holds its repository (the caller's node is then the home). None when the workspace
    does not exist in Postgres."""
    home = nodes.workspace_home(database_url, workspace_id)
    if home is None or home.node is not None:
        return home
    if adopt(settings, database_url, workspace_id, home.repository_id):
        return nodes.workspace_home(database_url, workspace_id)
    return home


def adopt(settings: Settings, database_url: str, workspace_id: int, repository_id: str | None) -> bool:
    """Home a workspace without a home node on this node when its repository is here; True when
    this node adopted it (False when absent here, or another node adopted it first)."""
    if not holds_repository(settings, workspace_id, repository_id):
        return False
    params = nodes.node_params(settings)
    with database.pooled_transaction(database_url) as conn:
        conn.execute(
            queries["register_node"],
            {
                "name": params["node"],
                "storage_root": params["storage_root"],
                "storage_id": params["storage_id"],
                "url": None,
            },
        )
        adopted = nodes.set_home(conn, workspace_id, settings.node, None)
    if adopted:
        log.info(
            "workspace %s: adopted by node %s (its repository is under %s)",
            workspace_id,
            settings.node,
            settings.storage_root,
        )
    return adopted


def adopt_homeless(settings: Settings, database_url: str) -> list[int]:
    """Adopt every workspace without a home node whose repository this node holds (a node's
    serve or worker does this when it starts: the upgrade path, design §15). Returns their ids."""
    with database.pooled_connection(database_url) as conn:
        rows = conn.execute(queries["homeless_workspaces"]).fetchall()
    return [r["id"] for r in rows if adopt(settings, database_url, r["id"], r["repository_id"])]


def own_workspace_ids(settings: Settings, database_url: str) -> list[int]:
    """The workspaces homed on this node (its sweep covers only these)."""
    with database.pooled_connection(database_url) as conn:
        return [r["id"] for r in conn.execute(queries["node_workspace_ids"], {"node": settings.node}).fetchall()]
