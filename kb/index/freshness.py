"""How far a workspace's search index lags its head (design §7, §8).

Search answers from the index, which a worker brings up to HEAD after each revision. When the
stamp lags, ``kb search`` (and the HTTP API) still return what the index has, and say how far
behind it is so that "no results" is never mistaken for "nothing matches".
"""

from __future__ import annotations

from dataclasses import dataclass

from kb.db import database
from kb.db.sql import queries


@dataclass(frozen=True)
class IndexFreshness:
    """``revisions_behind``: recorded revisions not yet indexed; ``documents_pending``: paths those
    revisions touch plus projected documents still waiting for the indexer."""

    workspace_id: int
    revisions_behind: int
    documents_pending: int

    @property
    def current(self) -> bool:
        """True when the index is at the head and nothing waits."""
        return self.revisions_behind == 0 and self.documents_pending == 0

    def hint(self) -> str | None:
        """``index is 1 revision behind HEAD: 173 documents pending — run kb worker`` (None when
        current)."""
        if self.current:
            return None
        revisions = f"{self.revisions_behind} revision{'' if self.revisions_behind == 1 else 's'}"
        documents = f"{self.documents_pending} document{'' if self.documents_pending == 1 else 's'}"
        return (
            f"index is {revisions} behind HEAD: {documents} pending — run `kb worker --until-idle` "
            f"(or `kb index -w {self.workspace_id}`); results may be missing or stale"
        )


def index_freshness(database_url: str, workspace_id: int) -> IndexFreshness:
    """How far ``workspace_id``'s index lags its recorded head (zeros for an unknown workspace).

    Asked on a pooled connection: it follows a search, whose pool is open (a connection of its own
    cost a search through ``kb serve`` two thirds of its time, bin/bench_cli_startup.py)."""
    with database.pooled_connection(database_url) as conn:
        row = conn.execute(queries["index_freshness"], {"workspace_id": workspace_id}).fetchone()
    if row is None:
        return IndexFreshness(workspace_id, 0, 0)
    return IndexFreshness(workspace_id, row["revisions_behind"], row["documents_pending"])
