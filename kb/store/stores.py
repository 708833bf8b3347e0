"""``Stores``: the workspaces' stores over one database and one storage root (design §3, §6) —
the small context the layers below the facade take instead of the whole ``KnowledgeBase``
(the sweep, the legacy seed, span fill and drift check, workspace listing and deletion)."""

from __future__ import annotations

import threading

from kb.db import database
from kb.settings import Settings
from kb.store.knowledge_store import KnowledgeStore, check_workspace_id
from kb.store.projection import ProjectionResult, project


class Stores:
    """``settings``, ``database_url`` and one cached ``KnowledgeStore`` per workspace."""

    def __init__(self, settings: Settings, database_url: str) -> None:
        self.settings = settings
        self.database_url = database_url
        self._stores: dict[int, KnowledgeStore] = {}
        self._lock = threading.Lock()  # threads share one KnowledgeBase (docs/python-api.md "Threads")

    def store(self, workspace_id: int) -> KnowledgeStore:
        """The store of one workspace, opened on first use (raises InvalidWorkspace for a
        non-positive id)."""
        check_workspace_id(workspace_id)
        store = self._stores.get(workspace_id)
        if store is None:
            with self._lock:  # one store per workspace, whichever thread asks first
                store = self._stores.get(workspace_id)
                if store is None:
                    store = self._stores[workspace_id] = KnowledgeStore(self.settings, self.database_url, workspace_id)
        return store

    def forget(self, workspace_id: int) -> None:
        """Drop the cached store of a workspace (deleted): the next use opens it anew. Not closed
        here: another thread may be using it (its repository closes when it is collected)."""
        self._stores.pop(workspace_id, None)

    def project(self, workspace_id: int, *, force: bool = False) -> ProjectionResult:
        """Converge documents/folders rows to HEAD in one transaction, sending ``kb_events`` on
        commit (design §6); ``force`` re-derives them even if HEAD is already projected. Raises
        WorkspaceNotFound."""
        store = self.store(workspace_id)
        with database.transaction(self.database_url) as conn:
            return project(conn, store.repository, workspace_id, force=force, database_url=self.database_url)

    def close(self) -> None:
        """Close the stores' git repositories; a later use reopens them. Idempotent."""
        with self._lock:
            stores = list(self._stores.values())
            self._stores.clear()
        for store in stores:
            store.close()
