"""Approximate vector indexes per workspace (design §8): exact scans for small workspaces, a partial
HNSW index for each large one.

The exact scan is right and fast enough while a workspace is small; past ``HNSW_MIN_CHUNKS``
chunks of one model, the job ``kb.maintain_vector_index`` builds a partial HNSW index holding only
that workspace's vectors of that model::

    CREATE INDEX CONCURRENTLY kb_chunks_hnsw_<ws>_<model hash> ON kb.chunks
    USING hnsw ((embedding::halfvec(<dim>)) halfvec_cosine_ops)
    WHERE workspace_id = <ws> AND embedding_model = '<model>'

Because the index holds nothing but the rows the search wants, no filter can starve it (the
failure of one HNSW index over all workspaces, where a filter discards most of what it returns);
pgvector ≥ 0.8's iterative scan (``hnsw.iterative_scan = strict_order``) keeps scanning until the
limit is met, and the search still falls back to the exact scan whenever fewer rows come back than
it asked for and the workspace has more. Vectors are compared as ``halfvec`` (16-bit floats: half
the bytes, ordering all but identical, recall measured by bin/bench_search.py). The index is
recorded in ``kb.vector_indexes`` once built and valid; only recorded indexes are used. Below
``HNSW_MIN_CHUNKS // 2`` chunks the index is dropped again (the gap stops a workspace at the
threshold from flapping).
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from psycopg import sql

from kb.db.sql import composable, queries

if TYPE_CHECKING:
    from kb.db.database import Connection

log = logging.getLogger(__name__)

HNSW_MIN_CHUNKS = 5000
"""Chunks of one model in a workspace from which an HNSW index is built."""
HNSW_EF_SEARCH = 100
"""Candidates an HNSW scan keeps (at least the leg limit; pgvector's iterative scan extends it).
Measured on the 10,000-chunk workspace of bin/bench_search.py, limit 100: ef 40 → 4.1 ms, recall@10
0.992; ef 100 → 3.1 ms, 0.998; ef 200 → 8.5 ms, 1.000."""
HNSW_MAX_EF_SEARCH = 1000
"""pgvector's upper bound of ``hnsw.ef_search`` (a larger value is an error, "outside the valid
range"). A search that widens its limit past it (kb.search: k documents from long documents)
keeps this many candidates and lets the iterative scan go on to the limit."""
MIN_PGVECTOR = (0, 8)


def ef_search(limit: int) -> int:
    """``hnsw.ef_search`` for a scan that must return ``limit`` rows: ``limit``, at least
    HNSW_EF_SEARCH and at most HNSW_MAX_EF_SEARCH (the iterative scan returns the rest)."""
    return min(max(HNSW_EF_SEARCH, limit), HNSW_MAX_EF_SEARCH)


@dataclass
class VectorIndexChange:
    """What ``maintain`` did: ``action`` is built | dropped | kept | none."""

    workspace_id: int
    model: str
    chunks: int
    action: str
    index_name: str | None = None


def index_name(workspace_id: int, model: str) -> str:
    """``kb_chunks_hnsw_<ws>_<8 hex of sha1(model)>`` (identifiers stay short and safe)."""
    return f"kb_chunks_hnsw_{workspace_id}_{hashlib.sha1(model.encode()).hexdigest()[:8]}"


def pgvector_version(conn: Connection) -> tuple[int, ...]:
    """The installed pgvector version as integers, e.g. ``(0, 8, 1)``."""
    row = conn.execute(queries["pgvector_version"]).fetchone()
    return tuple(int(p) for p in row["extversion"].split(".")[:3] if p.isdigit())


_recorded: dict[tuple[str, int, str], tuple[float, dict | None]] = {}
RECORD_CACHE_SECONDS = 30.0
"""How long a process trusts what it read of kb.vector_indexes. A stale answer is harmless: a
dropped index makes the approximate statement an exact one, a new index is used a little later."""


_database_keys: weakref.WeakKeyDictionary[Connection, str] = weakref.WeakKeyDictionary()


def _database_key(conn: Connection) -> str:
    """``conn.info.dsn``, remembered per connection (psycopg parses the connection's parameters on
    every read of it: 0.8 ms of every search)."""
    key = _database_keys.get(conn)
    if key is None:
        key = _database_keys[conn] = conn.info.dsn
    return key


def recorded_index(conn: Connection, workspace_id: int, model: str) -> dict | None:
    """The recorded HNSW index of a workspace's vectors of ``model`` (``{index_name, dim}``) or
    None; cached per process for ``RECORD_CACHE_SECONDS`` (searches skip a round trip)."""
    key = (_database_key(conn), workspace_id, model)
    now = time.monotonic()
    cached = _recorded.get(key)
    if cached is not None and now - cached[0] < RECORD_CACHE_SECONDS:
        return cached[1]
    with conn.transaction():  # leaves a pooled connection idle (a savepoint inside an open transaction)
        row = conn.execute(queries["recorded_vector_index"], {"workspace_id": workspace_id, "model": model}).fetchone()
    _recorded[key] = (now, row)
    return row


def forget_cached(workspace_id: int | None = None) -> None:
    """Drop this process' cached answers (all, or one workspace's)."""
    for key in [k for k in _recorded if workspace_id is None or k[1] == workspace_id]:
        _recorded.pop(key, None)


def approximate_statement(index: dict, workspace_id: int, model: str) -> sql.Composed:
    """The approximate vector leg through the recorded ``index`` (parameters: embedding, limit)."""
    # the workspace and model are literals, so the planner can match the partial index's predicate
    return composable("vector_leg_approximate").format(
        workspace_id=sql.Literal(workspace_id),
        model=sql.Literal(model),
        dim=sql.Literal(index["dim"]),
    )


def scan_settings(conn: Connection, limit: int) -> None:
    """Set the HNSW scan settings for ``conn``'s current transaction (pgvector ≥ 0.8)."""
    conn.execute(queries["hnsw_scan_settings"], {"ef_search": str(ef_search(limit))})


_session_ef_search: weakref.WeakKeyDictionary[Connection, int] = weakref.WeakKeyDictionary()


def session_scan_settings(conn: Connection, limit: int) -> bool:
    """Give ``conn``'s session the HNSW scan settings for ``limit`` (pgvector ≥ 0.8), so its
    searches need no transaction to set them: one round trip the first time per connection and
    ef_search value, none after (the value is remembered per connection object; a replaced
    connection is a new object). ``conn`` must be idle in autocommit mode.

    Returns False, setting nothing, where a session setting would not stay with the connection:
    behind a transaction-mode pooler (kb opens those connections with ``prepare_threshold=None``,
    kb.database.connection_kwargs); the caller then uses ``scan_settings`` in a transaction.
    Only HNSW scans read these settings, and every one kb runs sets them first."""
    if conn.prepare_threshold is None:
        return False
    value = ef_search(limit)
    if _session_ef_search.get(conn) != value:
        conn.execute(queries["hnsw_session_settings"], {"ef_search": str(value)})
        _session_ef_search[conn] = value
    return True


def maintain(database_url: str, workspace_id: int, model: str, dim: int) -> VectorIndexChange:
    """Build, keep or drop the workspace's HNSW index for ``model`` by its chunk count (what the job
    ``kb.maintain_vector_index`` runs). ``CREATE/DROP INDEX CONCURRENTLY`` need an autocommit
    connection and never block writers. Without pgvector ≥ 0.8 nothing is built (exact scans)."""
    from kb.db import database

    name = index_name(workspace_id, model)
    with database.connect(database_url, autocommit=True) as conn:
        chunks = conn.execute(
            queries["workspace_model_chunks"], {"workspace_id": workspace_id, "model": model}
        ).fetchone()["n"]
        recorded = recorded_index(conn, workspace_id, model)
        change = VectorIndexChange(workspace_id, model, chunks, "none", name)
        if chunks >= HNSW_MIN_CHUNKS and pgvector_version(conn) >= MIN_PGVECTOR:
            if recorded is not None and recorded["dim"] == dim:
                change.action = "kept"
                return change
            # an invalid leftover of a killed build must go first (IF NOT EXISTS would keep it)
            conn.execute(sql.SQL(queries["drop_vector_index"]).format(name=sql.Identifier("kb", name)))
            conn.execute(
                sql.SQL(queries["create_vector_index"]).format(
                    name=sql.Identifier(name),
                    dim=sql.Literal(dim),
                    workspace_id=sql.Literal(workspace_id),
                    model=sql.Literal(model),
                )
            )
            if not conn.execute(queries["vector_index_valid"], {"name": name}).fetchone()["valid"]:
                return change
            conn.execute(
                queries["record_vector_index"],
                {"workspace_id": workspace_id, "model": model, "index_name": name, "dim": dim},
            )
            change.action = "built"
            forget_cached(workspace_id)
        elif recorded is not None and chunks < HNSW_MIN_CHUNKS // 2:
            conn.execute(queries["forget_vector_index"], {"workspace_id": workspace_id, "model": model})
            conn.execute(sql.SQL(queries["drop_vector_index"]).format(name=sql.Identifier("kb", name)))
            change.action = "dropped"
            forget_cached(workspace_id)
        elif recorded is not None:
            change.action = "kept"
    log.info("vector index of workspace %s (%s, %s chunks): %s", workspace_id, model, chunks, change.action)
    return change


def suspend_for_bulk_load(database_url: str, workspace_id: int, model: str) -> bool:
    """Forget and drop the workspace's HNSW index of ``model`` before an index run writes most of
    the workspace (design §7, §8): inserting into an HNSW index costs far more than building it
    after the load (2,927 chunks: 2.2 s of inserts into the index against 0.05 s without it and a
    0.5 s build), which is what pgvector's documentation advises. Searches meanwhile scan the
    workspace's vectors exactly: the record goes first, so a search of this process stops
    choosing the index at once and one of another process within ``RECORD_CACHE_SECONDS``, and
    an approximate statement that still runs matches no index and scans exactly (still correct).
    ``DROP INDEX CONCURRENTLY`` never blocks writers. The run rebuilds it at its end (``maintain``);
    a run that dies leaves it to the job ``kb.maintain_vector_index``, deferred after every index
    job of a large workspace. Returns whether an index was recorded (and so dropped)."""
    from kb.db import database

    with database.connect(database_url, autocommit=True) as conn:
        params = {"workspace_id": workspace_id, "model": model}
        if conn.execute(queries["recorded_vector_index"], params).fetchone() is None:
            return False
        conn.execute(queries["forget_vector_index"], params)
        forget_cached(workspace_id)
        conn.execute(
            sql.SQL(queries["drop_vector_index"]).format(name=sql.Identifier("kb", index_name(workspace_id, model)))
        )
    log.info("vector index of workspace %s (%s) dropped for a bulk index run", workspace_id, model)
    return True
