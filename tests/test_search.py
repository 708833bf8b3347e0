"""SPEC §8 search rules beyond the vertical slice's acceptance test."""

from __future__ import annotations

from kb.embedding import HashingEmbedder


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
    kb.use_embedder(OtherSpace())
    assert kb.search(1, "zyxwvut", k=3) == []
    # the full-text leg still answers in any model's space
    assert [e.path for e in kb.search(1, "gardening 3", k=1)] == ["/documents/n3.md"]


def test_indexed_workspace_returns_k_when_few_rows_are_left_and_the_connection_comes_back_idle(kb, monkeypatch):
    import psycopg

    from kb import database, vector_index
    from kb.search import search

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
    from kb.search import BlobLines

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
