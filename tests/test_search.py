"""design §8 search rules beyond the vertical slice's acceptance test."""

from __future__ import annotations

from kb.db import database
from kb.db.sql import queries
from kb.index.embedding import HashingEmbedder


class OtherSpace(HashingEmbedder):
    """A 384-d embedder whose vectors live in another space than the hashing model's."""

    def __init__(self) -> None:
        super().__init__(384)
        self.model = "another-model-384"


def test_vector_leg_only_compares_vectors_of_the_active_model(kb, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    for i in range(5):
        (notes / f"n{i}.md").write_text(f"# Note {i}\nplain words about gardening {i}\n")
    kb.import_folder(notes, 1)
    kb.index(1)
    # no lexical match, so only the vector leg can answer
    assert len(kb.search(1, "zyxwvut", k=3)) == 3
    # the workspace's recorded model is now another space (as a switch would leave it, design §7)
    other = OtherSpace()
    kb.models.add("other-space", other)
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["finish_model_switch"], {"workspace_id": 1, "embedder": "other-space"})
    assert kb.embedder_for(1) is other
    assert kb.search(1, "zyxwvut", k=3) == []
    # the full-text leg still answers in any model's space
    assert [e.path for e in kb.search(1, "gardening 3", k=1)] == ["/documents/n3.md"]


def test_indexed_workspace_returns_k_when_few_rows_are_left_and_the_connection_comes_back_idle(kb, monkeypatch):
    import psycopg

    from kb.db import database
    from kb.index import vector_index
    from kb.search.hybrid import search

    embedder = kb.use_embedder(HashingEmbedder())
    kb.create_workspace(1)
    with kb.transaction(1, "docs", "t") as tx:
        for i in range(60):
            tx.write(f"/documents/p{i}.md", f"plain note {i} about topic{i % 7} and words w{i}\n")
    kb.index(1)
    monkeypatch.setattr(vector_index, "HNSW_MIN_CHUNKS", 40)
    assert vector_index.maintain(kb.database_url, 1, embedder.model, embedder.dim).action == "built"
    # more rows asked of the index than it holds (k = 50: leg limit 200), then most rows deleted
    # under it (dead index entries): every search still returns k documents
    assert len(kb.search(1, "zyxwvut", k=50)) == 50
    with kb.transaction(1, "shrink", "t") as tx:
        for i in range(48):
            tx.remove(f"/documents/p{i}.md")
    kb.index(1)
    vector_index.forget_cached()
    found = kb.search(1, "zyxwvut", k=12)
    assert sorted(e.path for e in found) == sorted(f"/documents/p{i}.md" for i in range(48, 60))
    # the search runs in a transaction of its own, so the pooled connection comes back idle (no
    # COMMIT left for the pool to send, nothing held open)
    with database.pooled_connection(kb.database_url) as conn:
        assert len(search(conn, kb.store(1).repository, embedder, 1, "topic3 words", k=5)) == 5
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_blob_lines_are_cached_by_blob_id_within_a_character_budget():
    from kb.search.hybrid import BlobLines

    class Repo:
        path = "/repo"
        reads = 0

        def blob(self, blob_id: str) -> bytes:
            self.reads += 1
            return (blob_id * 10 + "\n").encode() * 3  # three lines of 10 characters: 33 in all

    repo, cache = Repo(), BlobLines(max_chars=100)
    assert cache.get(repo, "a") == ["a" * 10] * 3 and cache.get(repo, "a") == ["a" * 10] * 3
    assert repo.reads == 1
    cache.get(repo, "b")
    cache.get(repo, "a")  # a is now the most recently used
    cache.get(repo, "c")
    cache.get(repo, "d")  # over budget: the least recently used (b) goes
    reads = repo.reads
    cache.get(repo, "a")
    cache.get(repo, "d")
    assert repo.reads == reads
    cache.get(repo, "b")
    assert repo.reads == reads + 1


def test_excerpts_of_a_document_come_from_one_indexed_version(kb):
    """An excerpt chunk read after the legs (``excerpt_chunks``) sees another snapshot; when a
    document was re-indexed between them, its rows name two blobs. The envelope keeps the spans of
    its first row's blob only, so no line number of one version is rendered from the other."""
    from kb.search.hybrid import envelopes

    kb.create_workspace(1)
    with kb.transaction(1, "v1", "t") as tx:
        tx.write("/documents/a.md", "one\ntwo\nthree\n")
    first = tx.revision.id
    with kb.transaction(1, "v2", "t") as tx:
        tx.write("/documents/a.md", "ONE\nTWO\nTHREE\nFOUR\n")
    repo = kb.store(1).repository
    v1 = repo.lookup(repo.tree_id(first), "documents/a.md")
    v2 = repo.lookup(repo.tree_id(tx.revision.id), "documents/a.md")
    row = {"document_id": 7, "path": "/documents/a.md", "title": "a", "text": None}
    rows = [
        {
            **row,
            "chunk_id": chunk,
            "start_line": line,
            "end_line": line,
            "indexed_content_id": blob,
            "indexed_revision": revision,
        }
        for chunk, line, blob, revision in (
            (1, 1, v1, first),
            (2, 2, v2, tx.revision.id),
            (3, 3, v1, first),
            (4, 2, v1, first),
            (5, 3, v2, tx.revision.id),
        )
    ]
    with database.connect(kb.database_url) as conn:
        [envelope] = envelopes(conn, repo, rows, [(7, 0.9)], [(c, 1 - c / 10) for c in range(1, 6)], 5, "one")
    # three excerpts, all of the first row's version: the other version's rows are skipped, not
    # counted among the three
    assert envelope.lines == [(1, "one"), (2, "two"), (3, "three")]
    assert envelope.content_id == v1 and envelope.revision == first


def test_a_document_only_the_document_leg_found_shows_its_chunk_holding_most_query_terms(kb):
    """No chunk leg returned a chunk of the document: its envelope shows the chunk holding the most
    distinct query terms (``excerpt_chunks``), with the document's true lines at the indexed
    revision."""
    from kb.db.sql import queries
    from kb.index.languages import lexical_text
    from kb.search.hybrid import envelopes

    kb.use_embedder(HashingEmbedder())
    kb.create_workspace(1)
    page = "# Guide\n\n" + "\n".join(
        f"## Part {j}\n\n" + " ".join([f"word{j} filler text"] * 80) + "\n" for j in range(4)
    )
    with kb.transaction(1, "page", "t") as tx:
        tx.write("/documents/guide.md", page)
    kb.index(1)
    repo = kb.store(1).repository
    with database.connect(kb.database_url) as conn:
        document = conn.execute(
            queries["document_by_path"], {"workspace_id": 1, "path": "/documents/guide.md"}
        ).fetchone()
        rows = [{"chunk_id": None, "document_id": document["id"], "document_rank": 1}]
        [envelope] = envelopes(conn, repo, rows, [(document["id"], 0.5)], [], 5, lexical_text("word2 filler"))
    text = [line for _, line in envelope.lines]
    assert any("word2" in line for line in text) and not any("word1" in line or "word3" in line for line in text)
    true_lines = kb.read(1, "/documents/guide.md", envelope.revision).decode().split("\n")
    assert all(true_lines[number - 1] == line for number, line in envelope.lines)


def test_k_envelopes_when_the_legs_first_chunks_come_from_fewer_documents(kb):
    """Long documents whose every chunk matches the query fill the legs' first 4 k chunks from two
    documents; the search asks again for more and still returns k envelopes."""
    kb.use_embedder(HashingEmbedder())
    kb.create_workspace(1)

    def page(word: str) -> str:
        return "# Page\n\n" + "\n".join(
            f"## Part {j}\n\n" + " ".join([f"{word} {word} marker text"] * 70) + "\n" for j in range(12)
        )

    with kb.transaction(1, "docs", "t") as tx:
        tx.write("/documents/a.md", page("alpha"))
        tx.write("/documents/b.md", page("beta"))
        for i in range(8):
            tx.write(f"/documents/other{i}.md", f"# Other {i}\n\nunrelated words number{i}\n")
    kb.index(1)
    found = kb.search(1, "alpha beta", k=5)
    assert len(found) == 5
    assert {e.path for e in found[:2]} == {"/documents/a.md", "/documents/b.md"}


class _ModelWithoutTheWord(HashingEmbedder):
    """A model that has never seen one word: it embeds every text without it (the hashing embedder
    over the rest), as a real model embeds a new product name as noise."""

    def __init__(self, word: str) -> None:
        super().__init__()
        self.word = word

    def embed(self, texts: list[str]):
        return super().embed([t.replace(self.word, " ") for t in texts])


def test_a_word_found_in_one_document_puts_it_first_whatever_the_model_makes_of_it(kb):
    """Both full-text legs rank the only page holding a rare word first; the vector leg, blind to
    the word, embeds the query as the zero vector, whose cosine distance to every chunk is NaN, so
    it ranks the pages in id order, this page (written last) last. The page still comes first: the
    two full-text legs together weigh as much as the vector leg (kb/search/hybrid.py; at 0.25 each it
    came 4th)."""
    kb.use_embedder(_ModelWithoutTheWord("Zorblaxian"))
    kb.create_workspace(1)
    with kb.transaction(1, "docs", "t") as tx:
        for i in range(20):
            tx.write(
                f"/documents/p{i}.md",
                f"# Page {i}\n\nCustomers ask about refunds, plans number {i} and please read the billing notes {i}.\n",
            )
        tx.write("/documents/zz-home.md", "# Home\n\nZorblaxian customers get an extended refund window.\n")
    kb.index(1)
    assert kb.search(1, "Zorblaxian", k=5)[0].path == "/documents/zz-home.md"
