"""Search envelopes cite what was indexed while commits, projections and index runs interleave
(design §7, §8).

An envelope is ``(path, revision)`` plus numbered lines, and ``git show REVISION:PATH`` must give
those lines. These tests force the interleavings that broke that, deterministically: the index
run's embedder runs a commit and its projection in the middle of the run (where a slow model gives
a real projection job all the time it needs), or a search runs between a projection and the index
run that follows it:

- an index run that embedded a document a projection then moved wrote its chunks but could not
  mark it indexed: a new document's envelope crashed the search (no indexed blob), an edited
  one's showed the old blob's lines for the new chunks; the run now checks the row under the
  chunk lock and leaves a superseded document to the next run;
- the run stamped every document with the revision it projected itself, even rows a later
  projection brought in (the path did not exist at that revision);
- after a commit that moved and edited a document, envelopes paired the new path with the old
  revision until the next index run (or, swapping two files, showed one file's lines under the
  other's name); they now cite ``indexed_path`` (migration 0019).
"""

from __future__ import annotations

import pytest
from support.citation_stress import git_lines

from kb.index.embedding import HashingEmbedder
from kb.knowledge_base import KnowledgeBase


class _EmbedderWithHook(HashingEmbedder):
    """The hashing embedder that runs ``hook()`` once, the first time it is asked to embed a text
    holding ``marker`` (the index run is then between reading its rows and writing them)."""

    def __init__(self, marker: str, hook) -> None:
        super().__init__()
        self.marker, self.hook = marker, hook

    def embed(self, texts):
        if self.hook is not None and any(self.marker in t for t in texts):
            hook, self.hook = self.hook, None
            hook()
        return super().embed(texts)


def _committing(kb: KnowledgeBase, message: str, change):
    """A hook that commits ``change(tx)`` to workspace 1 and projects it, as the projection job
    does right after a commit."""

    def hook() -> None:
        with kb.transaction(1, message, "t") as tx:
            change(tx)
        kb.project(1)

    return hook


def _assert_cited_lines_are_git_s(kb: KnowledgeBase, envelopes) -> None:
    assert envelopes
    repo, shown = str(kb.settings.knowledge_store / "1"), {}
    for envelope in envelopes:
        lines = git_lines(repo, envelope.revision, envelope.path, shown)
        assert lines is not None, f"{envelope.path} is not in {envelope.revision}"
        assert envelope.lines, envelope
        for number, text in envelope.lines:
            assert lines[number - 1] == text, (envelope.path, envelope.revision, number)


@pytest.fixture
def ws(kb: KnowledgeBase) -> KnowledgeBase:
    kb.use_embedder(HashingEmbedder())
    kb.create_workspace(1)
    with kb.transaction(1, "init", "t") as tx:
        tx.write("/documents/other.md", "# Other\nunrelated text\n")
        tx.write("/documents/edited.md", "# Edited\nold zorblax line one\nold line two\n")
    kb.index(1)
    return kb


def test_documents_moved_while_an_index_run_embeds_them_are_left_to_the_next_run(ws):
    kb = ws
    with kb.transaction(1, "add new, edit edited", "t") as tx:
        tx.write("/documents/new.md", "# New\nzorblax alpha\nzorblax beta\n")
        tx.write("/documents/edited.md", "# Edited\nnew first line\nnew zorblax line\nmore\n")
    kb.project(1)

    move_both = _committing(
        kb,
        "move both",
        lambda tx: (
            tx.move("/documents/new.md", "/documents/new-moved.md"),
            tx.move("/documents/edited.md", "/documents/edited-moved.md"),
        ),
    )
    kb.use_embedder(_EmbedderWithHook("zorblax", move_both))
    report = kb.index(1)
    assert report.documents_superseded == 2 and report.documents_indexed == 0 and not report.failures
    found = kb.search(1, "zorblax", k=2)  # the new document has nothing indexed: left out, no crash
    assert [e.path for e in found] == ["/documents/edited.md", "/documents/other.md"]
    assert found[0].lines[1] == (2, "old zorblax line one")
    _assert_cited_lines_are_git_s(kb, found)

    report = kb.index(1)  # the next run indexes what they hold now, where they are
    assert report.documents_indexed == 2 and report.documents_superseded == 0
    found = kb.search(1, "zorblax", k=2)
    assert {e.path for e in found} == {"/documents/new-moved.md", "/documents/edited-moved.md"}
    _assert_cited_lines_are_git_s(kb, found)


def test_a_document_a_later_projection_brought_in_is_stamped_where_it_exists(ws):
    kb = ws
    with kb.transaction(1, "touch edited", "t") as tx:
        tx.write("/documents/edited.md", "# Edited\nslowmarker text\n")

    later_commit = _committing(
        kb,
        "R2",
        lambda tx: (
            tx.write("/documents/other.md", "# Other\nnew line\nzorblax in other\n"),
            tx.write("/documents/c.md", "# C\nzorblax in c\n"),
        ),
    )
    kb.use_embedder(_EmbedderWithHook("slowmarker", later_commit))
    kb.reindex(1)  # projects, embeds edited.md (R2 lands), then indexes what R2 brought in
    found = kb.search(1, "zorblax", k=2)
    assert {e.path for e in found} == {"/documents/c.md", "/documents/other.md"}
    _assert_cited_lines_are_git_s(kb, found)


@pytest.mark.parametrize("change", ["move and edit", "swap and edit one"])
def test_after_a_move_and_an_edit_envelopes_cite_the_indexed_path_until_the_index_catches_up(ws, change):
    kb = ws
    with kb.transaction(1, change, "t") as tx:
        if change == "move and edit":
            tx.move("/documents/edited.md", "/documents/b.md")
            tx.write("/documents/b.md", "# Edited\nzorblax, edited\n")
        else:
            tx.move("/documents/edited.md", "/documents/tmp.md")
            tx.move("/documents/other.md", "/documents/edited.md")
            tx.move("/documents/tmp.md", "/documents/other.md")
            tx.write("/documents/other.md", "# Edited\nzorblax, edited\n")
    kb.project(1)  # the index run has not followed yet
    found = kb.search(1, "zorblax", k=2)
    assert found[0].lines[1] == (2, "old zorblax line one")
    _assert_cited_lines_are_git_s(kb, found)
    kb.index(1)
    found = kb.search(1, "zorblax", k=2)
    assert found[0].lines[1] == (2, "zorblax, edited") and found[0].revision == kb.head(1)
    _assert_cited_lines_are_git_s(kb, found)


class _RefusingEmbedder(HashingEmbedder):
    """The hashing embedder that fails every batch holding "poison" (an embedding service that
    keeps refusing one document)."""

    def embed(self, texts):
        if any("poison" in t for t in texts):
            raise RuntimeError("the embedding service refused the batch")
        return super().embed(texts)


def test_two_documents_citing_one_path_give_one_envelope(ws):
    """edited.md moves to b.md with an edit its index run fails on, and a new page takes
    edited.md and is indexed: both cite /documents/edited.md (the moved one at its last indexed
    revision, the new one at HEAD). A search shows that path once, the better ranked."""
    kb = ws
    with kb.transaction(1, "move, edit, take the name", "t") as tx:
        tx.move("/documents/edited.md", "/documents/b.md")
        tx.write("/documents/b.md", "# Edited\npoison zorblax\n")
        tx.write("/documents/edited.md", "# Taken\nzorblax in the new page\n")
    kb.use_embedder(_RefusingEmbedder())
    report = kb.index(1)
    assert report.documents_indexed == 1 and list(report.failures) == ["/documents/b.md"]
    found = kb.search(1, "zorblax", k=3)
    assert [e.path for e in found].count("/documents/edited.md") == 1
    assert len({e.path for e in found}) == len(found) == 2  # other.md and edited.md
    _assert_cited_lines_are_git_s(kb, found)
