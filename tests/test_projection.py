"""design §6 (design §1, §6): projection keeps ids across moves and folder renames, preserves rows
clients own, announces changes on kb_events with real row ids, and rebuilds without wiping."""

from __future__ import annotations

import json

import psycopg
from psycopg.rows import dict_row
from support.commands import run_cli
from support.events import received_events
from support.named_queries import queries

from kb.db import database
from kb.store.history import json_column
from kb.store.projection import event_payload, renamed_folder_candidates


def _docs(url: str, ws: int = 1) -> dict[str, dict]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(queries["test_document_rows"], {"workspace_id": ws}).fetchall()
    return {r["path"]: r for r in rows}


def _folders(url: str, ws: int = 1) -> dict[str, dict]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(queries["test_folder_rows"], {"workspace_id": ws}).fetchall()
    return {r["path"]: r for r in rows}


def test_folder_candidates_from_a_move():
    assert renamed_folder_candidates("/documents/a/b/x.md", "/documents/c/b/x.md") == [
        ("/documents/a/b", "/documents/c/b"),
        ("/documents/a", "/documents/c"),
    ]
    assert renamed_folder_candidates("/documents/a/x.md", "/documents/a/y.md") == []
    assert renamed_folder_candidates("/documents/a/x.md", "/documents/x.md") == []


def test_event_payload_fits_notify_limit():
    small = {"event": "document_created", "workspace_id": 1, "revision": "r", "id": 7, "path": "/documents/a.md"}
    assert json.loads(event_payload(small)) == small
    deep = {**small, "path": "/documents/" + "/".join(["é" * 120] * 40) + "/x.md"}
    payload = event_payload(deep)
    assert len(payload.encode()) < 8000 and json.loads(payload) == {k: v for k, v in small.items() if k != "path"}


def test_moves_keep_ids_folder_rename_keeps_folder_ids(kb, settings, listener):
    kb.create_workspace(1)
    with kb.transaction(1, "seed") as tx:
        tx.write("/documents/A/x.md", "x\n")
        tx.write("/documents/A/B/y.md", "y\n")
        tx.write("/documents/A/B/C/w.md", "w\n")
        tx.write("/documents/C/z.md", "z\n")
        tx.write("/documents/p.md", "p\n")
        tx.write("/documents/q.md", "q\n")
    first = kb.project(1)
    url = settings.database_url
    docs, folders = _docs(url), _folders(url)
    assert sorted(folders) == ["/documents/A", "/documents/A/B", "/documents/A/B/C", "/documents/C"]
    assert folders["/documents/A/B"]["parent_path"] == "/documents/A"
    assert folders["/documents/A"]["parent_path"] is None
    created = received_events(listener)
    assert {e["id"] for e in created if e["event"] == "document_created"} == {d["id"] for d in docs.values()}
    assert all(e["revision"] == first.revision and e["workspace_id"] == 1 for e in created)

    # a document move keeps its id
    with kb.transaction(1) as tx:
        tx.move("/documents/A/x.md", "/documents/C/x.md")
    kb.project(1)
    assert _docs(url)["/documents/C/x.md"]["id"] == docs["/documents/A/x.md"]["id"]
    assert _folders(url)["/documents/A"]["id"] == folders["/documents/A"]["id"]  # still holds B

    # a folder rename keeps the folder ids of it and its descendants; documents follow
    with kb.transaction(1) as tx:
        tx.move("/documents/A", "/documents/R")
    moved = kb.project(1)
    after = _folders(url)
    assert sorted(after) == ["/documents/C", "/documents/R", "/documents/R/B", "/documents/R/B/C"]
    for old, new in (("A", "R"), ("A/B", "R/B"), ("A/B/C", "R/B/C")):
        assert after[f"/documents/{new}"]["id"] == folders[f"/documents/{old}"]["id"]
    assert after["/documents/R/B"]["parent_path"] == "/documents/R"
    assert after["/documents/R/B/C"]["name"] == "C"
    assert _docs(url)["/documents/R/B/y.md"]["id"] == docs["/documents/A/B/y.md"]["id"]
    assert sorted(moved.folders_moved) == sorted(
        f["id"] for f in folders.values() if f["path"].startswith("/documents/A")
    )
    assert not moved.folders_deleted and not moved.folders_created and not moved.deleted
    received_events(listener)

    # chained moves over two revisions projected at once, and a swap inside one revision
    with kb.transaction(1) as tx:
        tx.move("/documents/R/B/C/w.md", "/documents/S/w.md")
    with kb.transaction(1) as tx:
        tx.move("/documents/S/w.md", "/documents/T/w.md")
    with kb.transaction(1) as tx:
        tx.move("/documents/p.md", "/documents/tmp.md")
        tx.move("/documents/q.md", "/documents/p.md")
        tx.move("/documents/tmp.md", "/documents/q.md")
    result = kb.project(1)
    now = _docs(url)
    assert now["/documents/T/w.md"]["id"] == docs["/documents/A/B/C/w.md"]["id"]
    # the store records the swap as two moves, so each document keeps its id at its new path
    assert {(c.path, c.change, c.old_path) for c in kb.list_changes(1, kb.head(1))} == {
        ("/documents/p.md", "moved", "/documents/q.md"),
        ("/documents/q.md", "moved", "/documents/p.md"),
    }
    assert now["/documents/p.md"]["id"] == docs["/documents/q.md"]["id"]
    assert now["/documents/q.md"]["id"] == docs["/documents/p.md"]["id"]
    assert now["/documents/p.md"]["content_id"] == docs["/documents/q.md"]["content_id"]
    assert not result.deleted and not result.created
    # moving a folder's every file into a new folder is, to git, that folder's rename
    assert _folders(url)["/documents/T"]["id"] == folders["/documents/A/B/C"]["id"]
    assert "/documents/S" not in _folders(url)
    events = received_events(listener)
    assert {e["event"] for e in events} == {"document_updated", "folder_updated"}
    assert {
        "event": "folder_updated",
        "workspace_id": 1,
        "revision": result.revision,
        "id": folders["/documents/A/B/C"]["id"],
        "path": "/documents/T",
    } in events


def test_last_document_of_folder_removes_folder_unless_keep(kb, settings, listener):
    kb.create_workspace(1)
    with kb.transaction(1) as tx:
        tx.write("/documents/Old/only.md", "bye\n")
        tx.write("/documents/Kept/only.md", "stay\n")
        tx.write("/documents/Kept/.keep", b"", allow_keep=True)
    kb.project(1)
    folders = _folders(settings.database_url)
    doc_id = _docs(settings.database_url)["/documents/Old/only.md"]["id"]
    received_events(listener)
    with kb.transaction(1) as tx:
        tx.remove("/documents/Old/only.md")
        tx.remove("/documents/Kept/only.md")
    result = kb.project(1)
    assert sorted(_folders(settings.database_url)) == ["/documents/Kept"]
    assert result.folders_deleted == [folders["/documents/Old"]["id"]]
    events = received_events(listener)
    assert {
        "event": "folder_deleted",
        "workspace_id": 1,
        "revision": result.revision,
        "id": folders["/documents/Old"]["id"],
        "path": "/documents/Old",
    } in events
    assert any(e["event"] == "document_deleted" and e["id"] == doc_id for e in events)
    assert kb.project(1).events == []  # converged: a second run changes and announces nothing


def test_events_are_sent_only_when_the_projection_commits(kb, settings, listener):
    kb.create_workspace(1)
    with kb.transaction(1) as tx:
        tx.write("/documents/a.md", "a\n")
    from kb.db import database
    from kb.store.projection import project

    with database.connect(settings.database_url) as conn:
        result = project(conn, kb.store(1).repository, 1)
        assert result.events and received_events(listener) == []  # not yet committed
        conn.rollback()
    assert _docs(settings.database_url) == {}
    kb.project(1)
    assert [e["event"] for e in received_events(listener)] == ["document_created"]


def test_client_row_first_keeps_type_metadata_and_title(kb, settings):
    url = settings.database_url
    kb.create_workspace(1)
    with psycopg.connect(url) as conn:
        conn.execute(queries["test_insert_uploaded_file_row"])
    with kb.transaction(1) as tx:  # an unrelated revision projected before the file arrives
        tx.write("/documents/other.md", "other\n")
    kb.project(1)
    claim = _docs(url)["/documents/Uploads/report.md"]
    assert claim["content_id"] is None  # a claim waits for its file, it is not pruned
    with kb.transaction(1) as tx:
        tx.write("/documents/Uploads/report.md", "# Q3\n")
    kb.project(1)
    kb.rebuild_projection(1)
    row = _docs(url)["/documents/Uploads/report.md"]
    assert (row["id"], row["document_type"], row["metadata"], row["title"]) == (
        claim["id"],
        "FILE",
        {"source": "upload"},
        "Q3 report",
    )
    assert row["content_id"] == kb.list_paths(1)["/documents/Uploads/report.md"]
    assert _docs(url)["/documents/other.md"]["document_type"] == "NOTE"
    assert _docs(url)["/documents/other.md"]["title"] == "other"


def test_wiped_chunks_and_folders_come_back(kb, kb_env, settings, tmp_path):
    notes = tmp_path / "notes"
    for i, folder in enumerate(["Guides", "Guides/Deep", "Reference", "Reference/API/v2"]):
        (notes / folder).mkdir(parents=True, exist_ok=True)
        body = "\n\n".join(f"## Section {j}\n" + f"Paragraph {i}.{j} about topic {j} " * 30 for j in range(6))
        (notes / folder / f"doc {i}.md").write_text(f"# Doc {i}\n\n{body}\n")
    kb.import_folder(notes, 1)
    kb.index(1)
    url = settings.database_url
    with psycopg.connect(url) as conn:
        conn.execute(queries["test_make_guide_a_file"])
        chunks_before = conn.execute(queries["test_chunk_spans_in_path_order"], {"workspace_id": 1}).fetchall()
    docs_before, folders_before = _docs(url), _folders(url)
    assert len(chunks_before) > len(docs_before) and len(folders_before) == 5

    with psycopg.connect(url) as conn:
        conn.execute(queries["test_wipe_workspace_chunks"], {"workspace_id": 1})
        conn.execute(queries["test_wipe_workspace_folders"], {"workspace_id": 1})
    out = run_cli(kb_env, "rebuild-projection", "--workspace", "1").stdout
    assert "folders 5 created" in out and "0 deleted" in out
    report = kb.reindex(1)
    assert report.documents_indexed == len(docs_before) and report.embeddings_computed == 0

    with psycopg.connect(url) as conn:
        assert conn.execute(queries["test_chunk_spans_in_path_order"], {"workspace_id": 1}).fetchall() == chunks_before
    assert _docs(url) == docs_before  # same ids, types, metadata, titles
    assert {p: (f["name"], f["parent_path"]) for p, f in _folders(url).items()} == {
        p: (f["name"], f["parent_path"]) for p, f in folders_before.items()
    }


def test_incremental_runs_agree_with_a_full_rebuild(kb, settings):
    """Random writes, moves and removals (files and folders), projected incrementally every few
    revisions: a full rebuild afterwards finds nothing to change, and rows mirror git exactly."""
    import random

    rng = random.Random(5)
    kb.create_workspace(1)
    names = ["a", "b", "c"]
    for step in range(40):
        paths = sorted(kb.list_paths(1)) if kb.head(1) else []
        docs = [p for p in paths if not p.endswith("/.keep")]
        folders = sorted({p.rsplit("/", 1)[0] for p in paths} - {"/documents"})
        target = "/documents/" + "/".join(rng.choice(names) for _ in range(rng.randint(0, 2)))
        with kb.transaction(1) as tx:
            op = rng.random()
            if op < 0.4 or not docs:
                tx.write(f"{target.rstrip('/')}/n{step}.md", f"note {step}\n")
            elif op < 0.55:
                tx.write(rng.choice(docs), f"edit {step}\n")
            elif op < 0.7:
                src = rng.choice(docs)
                if not tx.exists(f"{target.rstrip('/')}/m{step}.md"):
                    tx.move(src, f"{target.rstrip('/')}/m{step}.md")
            elif op < 0.8 and folders:
                src = rng.choice(folders)
                dst = f"/documents/f{step}"
                tx.move(src, dst)
            elif op < 0.9:
                tx.remove(rng.choice(docs))
            elif folders:
                tx.write(f"{rng.choice(folders)}/.keep", b"", allow_keep=True)
        if step % 3 == 0:
            kb.project(1)
    kb.project(1)
    rebuilt = kb.rebuild_projection(1)
    assert rebuilt.events == [], rebuilt.events
    paths = kb.list_paths(1)
    docs = _docs(settings.database_url)
    assert {p: d["content_id"] for p, d in docs.items()} == {p: c for p, c in paths.items() if not p.endswith("/.keep")}
    from kb.store.projection import folders_of

    assert set(_folders(settings.database_url)) == folders_of(list(paths))


def test_a_document_moved_then_removed_before_one_projection_loses_its_row(kb):
    """Found by the citation fuzz (design §8): the replayed move put the row at a path the
    base-to-HEAD diff does not name, so the removal never reached it and search kept showing a
    deleted document."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "alice") as tx:
        tx.write("/documents/keep.md", "kept\n")
        tx.write("/documents/gone.md", "moved then removed\n")
    kb.index(1)
    with kb.transaction(1, "move", "alice") as tx:
        tx.move("/documents/gone.md", "/documents/Later/gone.md")
    with kb.transaction(1, "remove", "alice") as tx:
        tx.remove("/documents/Later/gone.md")
    kb.index(1)
    assert list(_docs(kb.database_url)) == ["/documents/keep.md"]
    assert "/documents/Later" not in _folders(kb.database_url)


def test_a_projection_upserts_its_changed_files_in_one_statement(kb):
    """``upsert_documents`` writes every changed file of a projection in one statement, in the
    arrays' order: new rows are inserted (ids in that order), a changed row takes the new content
    and starts indexing afresh, and a row whose content is unchanged is left alone (no row back)."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed") as tx:
        tx.write("/documents/a.md", "# A\n\nalpha\n")
        tx.write("/documents/b.md", "# B\n\nbeta\n")
    kb.project(1)
    before = _docs(kb.database_url)
    with database.connect(kb.database_url, autocommit=True) as conn, conn.transaction(force_rollback=True):
        rows = conn.execute(
            queries["upsert_documents"],
            {
                "workspace_id": 1,
                "revision_id": kb.head(1),
                "paths": json_column(["/documents/z.md", "/documents/a.md", "/documents/b.md", "/documents/c.md"]),
                "titles": json_column(["z", "a", "b", "c"]),
                "uid_hashes": json_column(["hz", "ha", "hb", "hc"]),
                "content_ids": json_column(["1" * 40, "2" * 40, before["/documents/b.md"]["content_id"], "3" * 40]),
            },
        ).fetchall()
        assert [(r["path"], r["inserted"]) for r in rows] == [
            ("/documents/z.md", True),
            ("/documents/a.md", False),
            ("/documents/c.md", True),
        ]
        ids = {r["path"]: r["id"] for r in rows}
        assert (
            ids["/documents/z.md"] < ids["/documents/c.md"]
            and ids["/documents/a.md"] == before["/documents/a.md"]["id"]
        )
        after = {
            r["path"]: r for r in conn.execute(queries["test_document_stamps_by_path"], {"workspace_id": 1}).fetchall()
        }
    assert after["/documents/a.md"]["content_id"] == "2" * 40 and after["/documents/a.md"]["status"] == "pending"
    assert (
        after["/documents/z.md"]["title"] == "z"
        and after["/documents/b.md"]["content_id"] == before["/documents/b.md"]["content_id"]
    )


def test_a_projections_events_go_out_in_one_statement_in_order(kb, listener, monkeypatch):
    """A projection sends its events with one ``notify_events`` statement (a 1,500-file import sent
    1,500 before), and listeners get each of them, in the projection's order, with payloads that
    hold apostrophes, ampersands and non-ASCII intact (a double quote, which JSON escapes, is one
    of the characters a new name may not hold: design §2.3)."""
    kb.create_workspace(1)
    paths = sorted(f"/documents/n{i:02d} 'q' & Ωμέγα.md" for i in range(30))
    with kb.transaction(1, "seed") as tx:
        for path in paths:
            tx.write(path, f"# n\n\ntext {path}\n")
    sent: list[str] = []
    execute = psycopg.Connection.execute

    def counted(self, query, *args, **kwargs):
        sent.append(query)
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    result = kb.project(1)
    monkeypatch.undo()
    assert sent.count(queries["notify_events"]) == 1 and queries["notify_event"] not in sent
    received = received_events(listener)
    assert received == [json.loads(event_payload(e)) for e in result.events]
    assert [e["path"] for e in received if e["event"] == "document_created"] == paths


def test_a_revision_over_the_statement_limit_lands_whole_in_statements_of_the_limit(kb, listener, monkeypatch):
    """A revision of tens of thousands of paths was upserted and announced by one statement each,
    whose parameter lists (every path, title, hash and payload) the process built whole. Now every
    statement carries at most ``STATEMENT_ROWS`` rows; a revision of twice the limit and one more
    lands whole: every row, with its content, in the files' order (ids ascending), every event sent
    in order, and a second revision changing all of them updates every row in place."""
    from kb.store import projection

    count = 2 * projection.STATEMENT_ROWS + 1
    paths = sorted(f"/documents/d{i // 100:02d}/n{i:05d}.md" for i in range(count))
    kb.create_workspace(1)
    with kb.transaction(1, "seed") as tx:
        for path in paths:
            tx.write(path, f"# n\n\ntext of {path}\n")
    sizes: dict[str, list[int]] = {"upsert_documents": [], "notify_events": []}
    execute = psycopg.Connection.execute

    def counted(self, query, params=None, *args, **kwargs):
        for name, sizes_of in sizes.items():
            if query == queries[name]:
                column = params["paths" if name == "upsert_documents" else "payloads"]
                sizes_of.append(len(json.loads(column)))
        return execute(self, query, params, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    result = kb.project(1)
    monkeypatch.undo()
    limit = projection.STATEMENT_ROWS
    assert sizes["upsert_documents"] == [limit, limit, 1]
    events = len(result.events)
    assert sizes["notify_events"] == [limit] * (events // limit) + [events % limit]
    docs = _docs(kb.database_url)
    assert sorted(docs) == paths and len(result.created) == count
    repo = kb.store(1).repository
    head = repo.tree_id(kb.head(1))
    assert all(docs[p]["content_id"] == repo.lookup(head, p[1:]) for p in paths)
    assert [docs[p]["id"] for p in paths] == sorted(docs[p]["id"] for p in paths)
    received = received_events(listener)
    assert received == [json.loads(event_payload(e)) for e in result.events]
    assert [e["path"] for e in received if e["event"] == "document_created"] == paths

    with kb.transaction(1, "all changed") as tx:
        for path in paths:
            tx.write(path, f"# n\n\nnew text of {path}\n")
    again = kb.project(1)
    changed = _docs(kb.database_url)
    assert {p: changed[p]["id"] for p in paths} == {p: docs[p]["id"] for p in paths}
    assert sorted(again.updated) == sorted(docs[p]["id"] for p in paths) and not again.created
    assert all(changed[p]["content_id"] != docs[p]["content_id"] for p in paths)
    assert [e["path"] for e in received_events(listener) if e["event"] == "document_updated"] == paths
