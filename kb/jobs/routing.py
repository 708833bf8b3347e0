"""Jobs on their workspace's home node (design §15).

Every deferral routes a workspace's job to its home node's queue (``kb.node_queue`` in SQL), and a
node's worker consumes its own queues plus the node-free ones (``kb.db.nodes.worker_queues``). A job
can still reach the wrong node: one deferred before nodes existed or before the workspace was
adopted (node-free queue), or one deferred just before ``kb workspace move`` flipped the home. Such
a job must not fail there, so before touching the repository a workspace task asks ``placement``:

- the home is this node, or a node sharing this node's storage (a shared file system) → run here;
- the workspace has no home node and its repository is here → adopt it (``kb.store.homes``), run;
- the home is another node → re-defer the same task to the home's queue and succeed;
- no home, and the repository is not here → succeed doing nothing (the node that holds it adopts
  the workspace when it starts or sweeps, and its sweep defers the work).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kb.db import database, nodes
from kb.db.sql import queries
from kb.store.homes import home_of
from kb.store.job_deferral import defer_job

if TYPE_CHECKING:
    from kb.store.stores import Stores

log = logging.getLogger(__name__)


def placement(
    stores: Stores, workspace_id: int, queue: str, task: str, queueing_lock: str | None = None
) -> dict | None:
    """None when the job for ``workspace_id`` should run on this node; otherwise it was handed on
    (or cannot run anywhere yet) and the returned dict is the job's result:
    ``{"redeferred_to": node, "job": id or None}`` or ``{"skipped": reason}``.

    ``queue``/``task``/``queueing_lock``: how to defer the same job again (as ``defer_job``;
    ``queue="push"`` re-defers through ``defer_push_if_remote``). A workspace that does not exist
    in Postgres runs here (the task reports WorkspaceNotFound as before)."""
    settings = stores.settings
    home = home_of(settings, stores.database_url, workspace_id)
    if home is None or nodes.same_storage(home, settings):
        return None
    if home.node is None:
        reason = (
            f"workspace {workspace_id} has no home node and its repository is not under this node's "
            f"({settings.node}) storage root; the node holding it adopts it and runs its jobs"
        )
        log.warning("%s: %s", task, reason)
        return {"skipped": reason}
    with database.transaction(stores.database_url) as conn:
        if queue == "push":
            row = conn.execute(queries["defer_push_if_remote"], {"workspace_id": workspace_id}).fetchone()
            job = row["id"] if row else None
        else:
            job = defer_job(conn, queue, task, workspace_id, queueing_lock=queueing_lock)
    log.info(
        "%s for workspace %s ran on node %s; re-deferred to its home node %s",
        task,
        workspace_id,
        settings.node,
        home.node,
    )
    return {"redeferred_to": home.node, "job": job}
