"""design §10: seeding a workspace from a legacy knowledge base, asserted per planted row
of the legacy generator's summary (tests/support/legacy_source.py: the test corpus's English pages,
and the first 30 pages of the whole corpus)."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from support.commands import git
from support.legacy import LegacyHashEmbedder, all_pages, drop_legacy, english_pages, make_legacy
from support.named_queries import queries

from kb.db.locks import index_lock
from kb.errors import LegacySourceError, LockTimeout, SeedRefused
from kb.paths import blob_id, name_key, safe_filename


@pytest.fixture(scope="module")
def english_legacy(pg_server):
    made = make_legacy(pg_server, english_pages(), workspace=3)
    yield made
    drop_legacy(pg_server, made[0])


@pytest.fixture(scope="module", params=["english pages", "corpus subset"])
def any_legacy(request, pg_server, english_legacy):
    """The quirk test runs on two legacy sets: the English pages, and the first 30 pages of the
    whole corpus (German, Japanese and Arabic titles and folders among them)."""
    if request.param == "english pages":
        yield english_legacy
        return
    made = make_legacy(pg_server, all_pages(), workspace=3, subset=30)
    yield made
    drop_legacy(pg_server, made[0])


@pytest.fixture
def legacy_kb(kb):
    embedder = LegacyHashEmbedder()
    kb.use_embedder(embedder)
    return kb, embedder


def legacy_rows(dsn: str, workspace: int) -> dict[int, dict]:
    with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row) as conn:
        return {r["id"]: r for r in conn.execute(queries["test_legacy_documents"], {"workspace_id": workspace})}


def kb_documents(kb, workspace: int) -> dict[str, dict]:
    with psycopg.connect(kb.database_url, row_factory=psycopg.rows.dict_row) as conn:
        return {r["path"]: r for r in conn.execute(queries["test_seeded_documents"], {"workspace_id": workspace})}


def expected_rank(by_id, legacy, legacy_id) -> int:
    """1 + the number of seeded documents derived into the same folder whose names share the
    collision key, created before ``legacy_id`` (created_at, then id): its expected suffix."""
    entry = by_id[legacy_id]
    folder, key = entry.path.rsplit("/", 1)[0], name_key(safe_filename(entry.title))
    earlier = [
        e
        for e in by_id.values()
        if e.outcome == "seeded"
        and e.legacy_path is None
        and e.path.rsplit("/", 1)[0] == folder
        and name_key(safe_filename(e.title)) == key
        and (legacy[e.legacy_id]["created_at"], e.legacy_id) < (legacy[legacy_id]["created_at"], legacy_id)
    ]
    return 1 + len(earlier)


def test_dry_run_writes_nothing_and_reports_the_plan(legacy_kb, english_legacy):
    kb, _ = legacy_kb
    dsn, summary = english_legacy
    report = kb.seed(dsn, 3, 5)
    assert report.dry_run and report.revision is None
    assert not kb.store(5).exists()
    by_id = {e.legacy_id: e for e in report.entries}
    assert len(by_id) == summary["documents"]
    assert by_id[summary["quirks"]["blank"][0]].reason == "blank"
    assert by_id[summary["quirks"]["pending"][0]].reason == "pending"
    assert report.folders == summary["folders"]
    assert report.bytes > 0 and report.collisions


def test_seed_quirks_parity_identity_and_zero_embedding(legacy_kb, any_legacy):
    kb, embedder = legacy_kb
    dsn, summary = any_legacy
    quirks = summary["quirks"]
    legacy = legacy_rows(dsn, 3)
    report = kb.seed(dsn, 3, 5, yes=True)
    assert embedder.texts == []  # adopted, never re-embedded (C7)
    assert report.parity.ok and report.parity.checked == len(report.seeded)
    assert report.revision is not None and report.models_match
    by_id = {e.legacy_id: e for e in report.entries}
    docs = kb_documents(kb, 5)
    by_legacy = {d["legacy_id"]: d for d in docs.values()}
    store = kb.store(5)

    # one revision, authored by the migration identity, git clean
    repo = store.path
    assert git(repo, "rev-list", "--count", "HEAD").strip() == "1"
    assert git(repo, "log", "-1", "--format=%an").strip() == "kb-migration"
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain") == ""

    # blank and pending skipped
    for key in ("blank", "pending"):
        for legacy_id in quirks[key]:
            assert by_id[legacy_id].outcome == "skipped" and by_id[legacy_id].reason == key
            assert legacy_id not in by_legacy
    # every seeded row: bytes exact (source_markdown, else content)
    for legacy_id, entry in by_id.items():
        if entry.outcome != "seeded":
            continue
        row = legacy[legacy_id]
        body = (row["source_markdown"] or row["content"]).encode()
        assert store.read(entry.path) == body
        doc = by_legacy[legacy_id]
        assert doc["path"] == entry.path and doc["content_id"] == blob_id(body)
        assert (doc["title"], doc["document_type"]) == (row["title"], row["document_type"])
        assert doc["metadata"] == row["document_metadata"]
    # content-only falls back to content
    for legacy_id in quirks["content_only"]:
        assert legacy[legacy_id]["source_markdown"] is None
        assert by_id[legacy_id].body_source == "content"
        assert store.read(by_id[legacy_id].path) == legacy[legacy_id]["content"].encode()
    # CRLF bytes survive
    for legacy_id in quirks["crlf"]:
        assert b"\r\n" in store.read(by_id[legacy_id].path)
    # duplicate and case-only titles: " (2)" for the later created_at
    for first, second in quirks["dup_title"] + quirks["case_dup"]:
        older, newer = sorted((first, second), key=lambda i: (legacy[i]["created_at"], i))
        rank = expected_rank(by_id, legacy, newer)
        assert rank >= 2 and by_id[newer].path.endswith(f" ({rank}).md"), by_id[newer].path
        assert by_id[older].path != by_id[newer].path
    for first, second in quirks["dup_title"]:
        older, newer = sorted((first, second), key=lambda i: (legacy[i]["created_at"], i))
        assert expected_rank(by_id, legacy, older) == 1 and not by_id[older].renamed
    # equal created_at: ordered by id
    for a1, a2 in quirks["same_created_at"]:
        assert legacy[a1]["created_at"] == legacy[a2]["created_at"] and a1 < a2
        assert by_id[a1].path == "/documents/Twin.md" and by_id[a2].path == "/documents/Twin (2).md"
    # unsafe titles sanitized, title kept as typed
    for legacy_id in quirks["unsafe_title"]:
        name = by_id[legacy_id].path.rsplit("/", 1)[1]
        assert not set(name) & set(':?"\\') and by_legacy[legacy_id]["title"] == legacy[legacy_id]["title"]
    for folder in quirks["unsafe_folder"]:
        assert any(f"/{folder.replace('/', '_')}/" in p for p in docs)
    # legacy markers honoured: "/documents/X (<id>).xml" → "/documents/X.md" (or its collision name)
    for legacy_id, marker in quirks["legacy_marker"]:
        stem = marker[len("/documents/") :].rsplit(" (", 1)[0]
        assert by_id[legacy_id].legacy_path == marker
        assert by_id[legacy_id].path in (f"/documents/{stem}.md", f"/documents/{stem} (2).md")
    # FILE and ARTIFACT kept, with metadata
    for legacy_id in quirks["non_note"]:
        assert by_legacy[legacy_id]["document_type"] == legacy[legacy_id]["document_type"] in ("FILE", "ARTIFACT")
        assert by_legacy[legacy_id]["metadata"] == legacy[legacy_id]["document_metadata"]

    # chunks adopted: legacy vectors, NULL spans, documents indexed, stamp = seed revision, cache cold
    with psycopg.connect(kb.database_url, row_factory=psycopg.rows.dict_row) as conn:
        chunks = conn.execute(queries["test_adopted_chunk_summary"], {"workspace_id": 5}).fetchone()
        assert chunks["n"] == report.chunks_adopted > 0 and chunks["spanned"] == chunks["chars"] == 0
        assert chunks["model"] == "legacy-hash-384"
        # the adopted vectors are the legacy model's: the registered embedder reproduces them, so
        # a query embedded by it lives in the same space (computed here on a copy, not counted)
        sample = conn.execute(queries["test_first_chunk_vectors"], {"workspace_id": 5, "n": 3}).fetchall()
        for row in sample:
            stored = np.array(json.loads(row["e"]), dtype=np.float32)
            assert np.allclose(LegacyHashEmbedder()._vector(row["text"]), stored, atol=2e-6)
        assert conn.execute(queries["test_count_cached_embeddings"]).fetchone()["n"] == 0
        workspace = conn.execute(queries["get_workspace"], {"workspace_id": 5}).fetchone()
        assert workspace["last_indexed_revision"] == report.revision
        assert conn.execute(queries["get_seed"], {"workspace_id": 5}).fetchone()["parity_ok"]
    assert {d["status"] for d in docs.values()} == {"indexed"}

    # an index run right after converges with nothing to embed
    index = kb.index(5)
    assert index.embeddings_computed == 0 and embedder.texts == []

    # search right after seeding returns adopted chunks, un-numbered
    query = next(e.title for e in report.seeded if e.document_type == "NOTE" and not e.renamed)
    envelopes = kb.search(5, query, k=3)
    assert envelopes and all(not e.numbered for e in envelopes)
    assert embedder.texts == [query]  # the query only


def test_reseed_is_idempotent_then_converges_and_flip_guards(legacy_kb, english_legacy, pg_server):
    kb, embedder = legacy_kb
    dsn, _ = english_legacy
    first = kb.seed(dsn, 3, 6, yes=True)
    again = kb.seed(dsn, 3, 6, yes=True)
    assert again.revision is None and again.parity.ok and again.chunks_adopted == 0
    # a changed legacy row converges with one new revision
    with psycopg.connect(dsn) as conn:
        doc_id = conn.execute(queries["test_legacy_first_ready_note"], {"workspace_id": 3}).fetchone()[0]
        original = conn.execute(queries["test_legacy_markdown"], {"id": doc_id}).fetchone()[0]
        conn.execute(queries["test_legacy_append_edit"], {"id": doc_id})
        retitled = conn.execute(
            queries["test_legacy_last_ready_note_in_a_folder"], {"workspace_id": 3, "other_id": doc_id}
        ).fetchone()
        conn.execute(queries["test_legacy_set_title"], {"title": "Retitled in legacy", "id": retitled[0]})
        empty_folder = conn.execute(queries["test_legacy_insert_empty_folder"], {"workspace_id": 3}).fetchone()[0]
    before = {d["legacy_id"]: d for d in kb_documents(kb, 6).values()}
    try:
        changed = kb.seed(dsn, 3, 6, yes=True, flip=True)
        assert changed.revision and changed.revision != first.revision and changed.parity.ok and changed.flipped
        assert git(kb.store(6).path, "rev-list", "--count", "HEAD").strip() == "2"
        after = {d["legacy_id"]: d for d in kb_documents(kb, 6).values()}
        # the retitled document moved: same kb id, new path and title; history follows the move
        assert after[retitled[0]]["id"] == before[retitled[0]]["id"]
        assert after[retitled[0]]["path"].endswith("/Retitled in legacy.md")
        assert after[retitled[0]]["title"] == "Retitled in legacy"
        moved = [c for c in kb.list_changes(6, changed.revision) if c.change == "moved"]
        assert [(c.old_path, c.path) for c in moved] == [(before[retitled[0]]["path"], after[retitled[0]]["path"])]
        # the edited document changed in place and got its legacy chunks again; the empty folder kept
        assert after[doc_id]["id"] == before[doc_id]["id"] and after[doc_id]["status"] == "indexed"
        assert "/documents/Empty_ folder/.keep" in kb.list_paths(6) and changed.keeps == [
            "/documents/Empty_ folder/.keep"
        ]
        assert kb.status(6)["workspace"]["migration"]["flipped"] is True
        with pytest.raises(SeedRefused, match="force=True"):
            kb.seed(dsn, 3, 6, yes=True)
        assert kb.set_authority(6, flipped=False) is True
        assert kb.status(6)["workspace"]["migration"]["flipped"] is False
    finally:
        with psycopg.connect(dsn) as conn:
            conn.execute(queries["test_legacy_set_markdown"], {"source_markdown": original, "id": doc_id})
            conn.execute(queries["test_legacy_set_title"], {"title": retitled[1], "id": retitled[0]})
            conn.execute(queries["test_legacy_delete_folder"], {"id": empty_folder})
    assert embedder.texts == []


def test_flip_needs_yes_and_source_errors_are_clear(legacy_kb, english_legacy, pg_server):
    kb, _ = legacy_kb
    dsn, _ = english_legacy
    with pytest.raises(SeedRefused, match="yes=True"):
        kb.seed(dsn, 3, 7, flip=True)
    with pytest.raises(LegacySourceError, match="no documents"):
        kb.seed(dsn, 999, 7)
    with pytest.raises(LegacySourceError, match="no legacy.documents"):
        kb.seed(kb.database_url, 3, 7)
    with pytest.raises(SeedRefused, match="never seeded"):
        kb.set_authority(7, flipped=True)
    kb.create_workspace(7)
    with kb.transaction(7, "a note written in kb", "alice") as tx:
        tx.write("/documents/mine.md", b"mine\n")
    with pytest.raises(SeedRefused, match="no seed wrote"):
        kb.seed(dsn, 3, 7, yes=True)
    assert kb.list_paths(7) == {"/documents/mine.md": kb.list_paths(7)["/documents/mine.md"]}
    assert kb.seed(dsn, 3, 7).dry_run  # a dry run is always allowed


def test_a_writer_removing_documents_during_the_seed_fails_cleanly_and_a_rerun_converges(legacy_kb, english_legacy):
    """A writer removing seeded documents between the seed revision and identity adoption (a
    KeyError that left a seed revision without its kb.seeds row, so seeding again was refused)."""
    kb, _ = legacy_kb
    dsn, _summary = english_legacy
    victims = sorted(e.path for e in kb.seed(dsn, 3, 5).seeded[:3])

    def racing_writer(message: str) -> None:
        if message.startswith("parity:"):
            with kb.transaction(5, "remove while seeding", "racer") as tx:
                for path in victims:
                    tx.remove(path)

    with pytest.raises(SeedRefused, match="removed or moved by another writer"):
        kb.seed(dsn, 3, 5, yes=True, flip=True, progress=racing_writer)
    with psycopg.connect(kb.database_url, row_factory=psycopg.rows.dict_row) as conn:
        seed = conn.execute(queries["get_seed"], {"workspace_id": 5}).fetchone()
    assert seed is not None and not seed["parity_ok"] and not seed["flipped"]
    again = kb.seed(dsn, 3, 5, yes=True, flip=True)  # a re-seed, not refused as foreign documents
    assert again.parity.ok and again.not_adopted == [] and again.flipped
    assert all(kb.store(5).read(path) for path in victims)  # the legacy documents are back


def test_seed_while_an_index_run_holds_the_lock_raises_lock_timeout(legacy_kb, english_legacy):
    """The seed waits lock_timeout seconds for a running index run, then says which lock it waited
    for (it raised a TypeError from LockTimeout's constructor before)."""
    kb, _ = legacy_kb
    dsn, _ = english_legacy
    kb.settings.lock_timeout = 0.3
    with index_lock(kb.database_url, 8) as held:
        assert held
        with pytest.raises(LockTimeout, match="index lock .* an index run holds the index lock"):
            kb.seed(dsn, 3, 8, yes=True)
