"""Projection and indexing of one workspace running at the same time (design §4, §6, §7).

The projection job and an index run touch the same rows: documents, their chunks and the BM25
statistics the chunk and document-term triggers keep. These tests force the interleavings that
used to go wrong with the database itself — a side connection holds a row lock, the test waits
until Postgres reports a run blocked on it, then lets go — rather than with sleeps:

- a projection that changes one document and deletes another while an index run writes the first
  one's chunks deadlocked ("deadlock detected"); both now take the workspace's chunk lock
  (``kb.db.locks.CHUNK_LOCK_NAMESPACE``) before any document or chunk row;
- a document deleted by a projection after an index run read it made the run's chunk insert fail
  on the foreign key; the run now settles it as gone;
- other writers of document and chunk rows (dropping an artifact's rows, the store's catch-up,
  workspace deletion, the span fill, the sweep's quarantine retry) deadlocked the same way with a
  running projection; they take the chunk lock too, in the order written in ``kb.db.locks``.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from support.named_queries import queries

from kb.db import database
from kb.index.embedding import HashingEmbedder
from kb.knowledge_base import KnowledgeBase

WAIT_SECONDS = 30.0


def _paragraphs(prefix: str, n: int) -> str:
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "kappa",
        "omega",
        "sigma",
        "refund",
        "policy",
        "annual",
        "plan",
        "invoice",
    ]
    return "\n\n".join(f"{prefix} {i}: " + " ".join(words[(i + j) % len(words)] for j in range(30)) for i in range(n))


class _Run(threading.Thread):
    """``fn()`` in a thread of its own (its own connections); ``result()`` re-raises its error."""

    def __init__(self, fn) -> None:
        super().__init__(daemon=True)
        self.fn, self.value, self.error = fn, None, None
        self.start()

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # handed to the test by result()
            self.error = exc

    def result(self):
        self.join(WAIT_SECONDS)
        assert not self.is_alive(), "the run did not finish"
        if self.error is not None:
            raise self.error
        return self.value


def _row(kb: KnowledgeBase, query: str, **params) -> dict | None:
    with database.connect(kb.database_url, autocommit=True) as conn:
        return conn.execute(queries[query], params).fetchone()


def _wait_blocked_by(kb: KnowledgeBase, pids: list[int], run: _Run) -> int:
    """Wait until Postgres reports a backend waiting for a lock one of ``pids`` holds; its pid."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        found = _row(kb, "test_backends_blocked_by", pids=pids)
        if found is not None:
            return found["pid"]
        if not run.is_alive():
            run.result()
            pytest.fail("the run finished without waiting for the held lock")
        time.sleep(0.02)
    pytest.fail(f"no backend waited for a lock of {pids}")


def _side_connection(kb: KnowledgeBase) -> tuple[psycopg.Connection, int]:
    conn = database.connect(kb.database_url)
    return conn, conn.execute(queries["test_backend_pid"]).fetchone()["pid"]


def _assert_converged(kb: KnowledgeBase, ws: int = 1) -> None:
    report = kb.index(ws)
    assert report.documents_failed == 0 and not report.failures
    workspace = next(w for w in kb.workspaces() if w["id"] == ws)
    assert workspace["last_projected_revision"] == workspace["last_indexed_revision"] == kb.head(ws)
    with database.connect(kb.database_url, autocommit=True) as conn:
        states = conn.execute(queries["test_document_states"], {"workspace_id": ws}).fetchall()
    assert states and all(s["status"] == "indexed" and s["indexed_content_id"] == s["content_id"] for s in states)


@pytest.fixture
def indexed(kb: KnowledgeBase) -> KnowledgeBase:
    """Workspace 1 with two indexed documents sharing their vocabulary."""
    kb.use_embedder(HashingEmbedder())
    kb.create_workspace(1)
    with kb.transaction(1, "two documents", "t") as tx:
        tx.write("/documents/d.md", "# D\n\n" + _paragraphs("first", 3) + "\n")
        tx.write("/documents/e.md", "# E\n\n" + _paragraphs("other", 3) + "\n")
    kb.index(1)
    return kb


def test_projection_and_index_run_take_their_locks_in_one_order(indexed):
    """An index run writes document d's chunks (locking statistics rows) while a projection updates
    d's row and deletes e (whose cascaded chunk delete needs those statistics rows); the index run
    then marks d indexed, which needs d's row. Before the chunk lock, that was a cycle Postgres broke
    with "deadlock detected" in one of them."""
    kb = indexed
    with kb.transaction(1, "edit d", "t") as tx:
        tx.write("/documents/d.md", "# D\n\n" + _paragraphs("second", 4) + "\n")
    d = _row(kb, "test_document_id", workspace_id=1, path="/documents/d.md")["id"]
    side, side_pid = _side_connection(kb)
    with side:
        assert side.execute(queries["test_hold_document_terms"], {"document_id": d}).fetchone()
        index_run = _Run(lambda: kb.index(1))  # writes d's chunks, then waits at d's terms
        indexer_pid = _wait_blocked_by(kb, [side_pid], index_run)
        with kb.transaction(1, "edit d again, remove e", "t") as tx:
            tx.write("/documents/d.md", "# D\n\n" + _paragraphs("third", 2) + "\n")
            tx.remove("/documents/e.md")
        projection = _Run(lambda: kb.project(1))  # changes d's row, deletes e
        _wait_blocked_by(kb, [indexer_pid], projection)
        side.commit()
    projected = projection.result()
    report = index_run.result()
    assert not report.failures, report.failures  # a deadlock here failed document d
    assert report.documents_failed == 0
    assert projected.revision == kb.head(1) and len(projected.deleted) == 1
    _assert_converged(kb)


def test_an_index_run_waits_for_a_projection_that_deleted_before_it_moves(indexed):
    """The projection replays a move of d onto e: it deletes e (its cascaded chunk delete locks
    kb.text_stats), then moves d's row. An index run writing d's new content meanwhile must not
    lock d's row before it has the chunk lock, or the two wait for each other (the run for
    text_stats, the projection for d's row)."""
    kb = indexed
    with kb.transaction(1, "edit d", "t") as tx:
        tx.write("/documents/d.md", "# D\n\n" + _paragraphs("second", 4) + "\n")
    left = _row(kb, "test_left_running_index_run", workspace_id=1)["id"]
    side, side_pid = _side_connection(kb)
    stats, stats_pid = _side_connection(kb)
    with side, stats:
        assert side.execute(queries["test_hold_index_run"], {"id": left}).fetchone()
        index_run = _Run(lambda: kb.index(1))  # reads d, then waits to interrupt the left run
        indexer_pid = _wait_blocked_by(kb, [side_pid], index_run)
        with kb.transaction(1, "move d onto e", "t") as tx:
            tx.move("/documents/d.md", "/documents/e.md", overwrite=True)
        assert stats.execute(queries["test_hold_document_text_stats"], {"workspace_id": 1}).fetchone()
        projection = _Run(lambda: kb.project(1))  # deletes e, then waits at the held statistics
        projection_pid = _wait_blocked_by(kb, [stats_pid], projection)
        side.commit()  # the index run goes on to write d
        # on its writer connection (design §7: a run writes batches on a connection of its own
        # while it cuts the next), so the backend that waits is the run's, not the one that read
        writer_pid = _wait_blocked_by(kb, [projection_pid], index_run)
        assert writer_pid not in (indexer_pid, side_pid, stats_pid, projection_pid) and index_run.is_alive()
        stats.commit()  # the projection goes on to move d
    projected = projection.result()
    report = index_run.result()
    assert not report.failures, report.failures
    assert projected.moved and len(projected.deleted) == 1
    _assert_converged(kb)


def test_a_document_deleted_while_an_index_run_holds_it_is_settled_not_failed(indexed):
    """An index run reads document d, a projection deletes d (its file removed) and commits, then
    the run writes d: the document is settled as gone — no foreign-key violation, no failure."""
    kb = indexed
    with kb.transaction(1, "edit d", "t") as tx:
        tx.write("/documents/d.md", "# D\n\n" + _paragraphs("second", 4) + "\n")
    left = _row(kb, "test_left_running_index_run", workspace_id=1)["id"]
    side, side_pid = _side_connection(kb)
    with side:
        assert side.execute(queries["test_hold_index_run"], {"id": left}).fetchone()
        index_run = _Run(lambda: kb.index(1))  # reads d, then waits to interrupt the left run
        _wait_blocked_by(kb, [side_pid], index_run)
        with kb.transaction(1, "remove d", "t") as tx:
            tx.remove("/documents/d.md")
        assert len(kb.project(1).deleted) == 1
        side.commit()
    report = index_run.result()
    assert not report.failures, report.failures
    assert report.documents_failed == 0 and report.documents_indexed == 0
    assert _row(kb, "test_document_id", workspace_id=1, path="/documents/d.md") is None
    _assert_converged(kb)


# ---- other writers of documents and chunks take the chunk lock too (kb.locks) -------------------
#
# Each test below holds a projection of workspace 1 in the middle of its run: replaying the move of
# x onto y it has deleted y (y's cascaded chunk delete locked kb.text_stats) and waits at y's
# whole-document statistics, held by a side connection. The test starts another writer, waits
# until Postgres reports it waiting for the projection, then lets the projection go on: it moves x,
# updates the revised artifact's row and deletes f. Before the writer took the chunk lock it held
# a row the projection then needed (the artifact's row, a chunk of f, the workspace row) while it
# waited for one the projection held: "deadlock detected".


@pytest.fixture
def projecting(kb: KnowledgeBase):
    """Workspace 1 with indexed documents x, y, f, keep and an indexed artifact; then revisions
    that revise the artifact, move x onto y and remove f. Yields ``(kb, artifact, hold)``:
    ``hold()`` starts the projection of those revisions and returns ``(projection run, its pid,
    release)``, the projection waiting inside y's delete until ``release()``."""
    kb.use_embedder(HashingEmbedder())
    kb.create_workspace(1)
    with kb.transaction(1, "x, y, f, keep", "t") as tx:
        for name in ("x", "y", "f", "keep"):
            tx.write(f"/documents/{name}.md", f"# {name.upper()}\n\n" + _paragraphs(name, 2) + "\n")
    artifact = kb.artifacts(1).save("Report", "# Report\n\n" + _paragraphs("report", 2) + "\n")
    kb.index(1)
    kb.artifacts(1).revise(artifact.id, artifact.generation, markdown="# Report\n\n" + _paragraphs("revised", 2) + "\n")
    with kb.transaction(1, "move x onto y, remove f", "t") as tx:
        tx.move("/documents/x.md", "/documents/y.md", overwrite=True)
        tx.remove("/documents/f.md")
    stats, stats_pid = _side_connection(kb)

    def hold():
        assert stats.execute(queries["test_hold_document_text_stats"], {"workspace_id": 1}).fetchone()
        projection = _Run(lambda: kb.project(1))  # deletes y, then waits at the held statistics
        return projection, _wait_blocked_by(kb, [stats_pid], projection), stats.commit

    with stats:
        yield kb, artifact, hold


@pytest.mark.parametrize("how", ["delete", "revert"])
def test_dropping_an_artifact_s_rows_waits_for_a_running_projection(projecting, how):
    """An artifact's rows are dropped in a store revision (``delete``: the artifact layer's hook;
    ``revert`` of its save: the artifact rule, kb.artifact_rows.guard). It locked the artifact's
    row and waited for kb.text_stats in the cascaded chunk delete; the projection then waited for
    the artifact's row to record its revised content."""
    kb, artifact, hold = projecting
    projection, projection_pid, release = hold()
    if how == "delete":
        writer = _Run(lambda: kb.artifacts(1).delete(artifact.id))
    else:
        writer = _Run(lambda: kb.revert(1, artifact.revision, "t"))
    _wait_blocked_by(kb, [projection_pid], writer)
    release()
    projected = projection.result()
    assert artifact.id in projected.updated and len(projected.deleted) == 2
    assert writer.result() is not None
    assert _row(kb, "test_document_id", workspace_id=1, path=artifact.path) is None
    _assert_converged(kb)


def test_catching_up_waits_for_a_projection_before_it_records_the_workspace_row(projecting, monkeypatch):
    """An artifact delete whose writer died after git's ref moved and before Postgres committed:
    the store's catch-up records the missing revision (locking the workspace row) and completes
    the delete (the artifact's row, then kb.text_stats, held by the projection of git's HEAD),
    while that projection goes on to delete the artifact's row and to record its revision in the
    workspace row."""
    kb, artifact, hold = projecting
    import kb.store.knowledge_store as store_module

    def die_before_postgres(name: str) -> None:
        if name == "ref_advanced":
            raise RuntimeError("killed between the ref update and the Postgres commit")

    with monkeypatch.context() as patched:
        patched.setattr(store_module, "fault_point", die_before_postgres)
        with pytest.raises(RuntimeError):
            kb.artifacts(1).delete(artifact.id)
    assert _row(kb, "test_document_id", workspace_id=1, path=artifact.path) is not None
    projection, projection_pid, release = hold()
    catching_up = _Run(lambda: kb.reconcile(1))
    _wait_blocked_by(kb, [projection_pid], catching_up)
    release()
    assert len(projection.result().deleted) == 3  # y, f and the artifact
    assert len(catching_up.result()) == 1
    assert _row(kb, "test_document_id", workspace_id=1, path=artifact.path) is None
    _assert_converged(kb)


def test_deleting_a_workspace_waits_for_its_running_projection(projecting):
    """Deleting the workspace row cascades to its documents: it waited for y's row, which the
    projection held, and the projection then for the workspace row to record its revision."""
    kb, _, hold = projecting
    projection, projection_pid, release = hold()
    deleting = _Run(lambda: kb.delete_workspace(1, force=True))
    _wait_blocked_by(kb, [projection_pid], deleting)
    release()
    assert len(projection.result().deleted) == 2
    assert deleting.result().documents == 3  # y (x moved there), keep and the artifact
    assert not _row(kb, "test_workspace_exists", workspace_id=1)["present"]


def test_a_span_fill_batch_waits_for_a_running_projection(projecting):
    """A span-fill batch of a flipped workspace fills f's chunk spans (locking f's chunk rows) and
    records y as stale (a key-share lock on y's row, which the projection deleted): it waited for
    the projection, which then waited for f's chunks in f's cascaded delete."""
    kb, _, hold = projecting
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(
            queries["record_seed"],
            {
                "workspace_id": 1,
                "source": "test",
                "legacy_workspace": 1,
                "legacy_model": "hashing",
                "seed_revision": kb.head(1),
                "documents": 4,
                "parity_ok": True,
            },
        )
        conn.execute(queries["flip_seed"], {"workspace_id": 1})
        for path in ("/documents/y.md", "/documents/f.md"):
            conn.execute(queries["test_null_chunk_spans"], {"workspace_id": 1, "path": path})
        conn.execute(queries["test_stale_chunk_texts"], {"workspace_id": 1, "path": "/documents/y.md"})
    projection, projection_pid, release = hold()
    filling = _Run(lambda: kb.span_fill().run(1))
    _wait_blocked_by(kb, [projection_pid], filling)
    release()
    assert len(projection.result().deleted) == 2
    report = filling.result()
    assert report.batches == 1 and report.chunks_filled == 0  # f's chunks went with f
    _assert_converged(kb)


def test_retrying_quarantined_documents_waits_for_a_running_projection(projecting):
    """The sweep's quarantine retry requeues several document rows in one statement (f before y:
    y was quarantined last, so its row version lies after f's): it locked f's row and waited for
    y's, which the projection held (it had deleted y); the projection then waited for f's row to
    delete it."""
    kb, _, hold = projecting
    from kb.jobs.sweep import retry_quarantined

    with database.connect(kb.database_url, autocommit=True) as conn:
        for path in ("/documents/f.md", "/documents/y.md"):
            conn.execute(queries["test_quarantine_document"], {"workspace_id": 1, "path": path})
    projection, projection_pid, release = hold()
    retrying = _Run(lambda: retry_quarantined(kb.stores, lambda: kb.embedder, 1, []))
    _wait_blocked_by(kb, [projection_pid], retrying)
    release()
    assert len(projection.result().deleted) == 2
    assert retrying.result() is False  # y and f went with the projection: nothing left to retry
    _assert_converged(kb)
