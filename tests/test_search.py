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
