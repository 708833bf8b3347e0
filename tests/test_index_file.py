"""design §2.1: the checkout's index file (``kb.git.gitindex``) is read again after another process
rewrote it by parsing only the entries in the span that differs from the version this process
holds; the result is exactly what a whole parse of the file gives, and what git's own reader sees.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.commands import git

from kb.git import byte_diff
from kb.git.gitindex import IndexFile, UnsupportedIndex


class CountingIndex(IndexFile):
    """An IndexFile that counts the entries it parses (the work a re-read costs)."""

    parsed = 0

    @staticmethod
    def _parse(data, offset, count, names, entries):
        CountingIndex.parsed += count
        return IndexFile._parse(data, offset, count, names, entries)


def whole(path: Path) -> IndexFile:
    """The index at ``path`` parsed from scratch."""
    index = IndexFile(path)
    index.load()
    return index


_PATH = st.lists(st.text(alphabet="ab -.0_Äé", min_size=1, max_size=4), min_size=1, max_size=3).map(
    lambda parts: "/".join(parts).encode()
)


@settings(max_examples=150, deadline=None)
@given(
    paths=st.lists(_PATH, max_size=80, unique=True),
    edits=st.lists(st.tuples(_PATH, st.booleans(), st.integers(0, 3)), max_size=6),
    long_name=st.booleans(),
)
def test_a_reread_after_another_writer_equals_a_whole_parse(paths, edits, long_name):
    """One IndexFile writes; another (another process) sets and removes entries — names that are
    prefixes of others, ``a-b`` beside ``a/b``, spaces, non-ASCII, a name past the 12-bit length
    field — and writes; the first reads the file again: the same entries as a whole parse."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "f").write_bytes(b"x")
        stats = [os.stat(root / "f"), os.stat(root)]
        ours, theirs = CountingIndex(root / "index"), IndexFile(root / "index")
        for i, path in enumerate([*paths, *([b"n" * 5000] if long_name else [])]):
            ours.update(path, stats[i % 2], f"{i:040x}")
        ours.write()
        theirs.load()
        for path, keep, which in edits:
            theirs.update(path, stats[which % 2] if keep else None, None if not keep else f"{which + 7:040x}")
        theirs.write()
        CountingIndex.parsed = 0
        ours.load()
        reference = whole(root / "index")
        assert (ours.names, ours.entries, ours.version) == (reference.names, reference.entries, reference.version)
        # the changed entries and one entry per unchanged run: not every entry again
        assert min(1, len(reference.names)) <= CountingIndex.parsed <= 2 * len(edits) + 1


def test_a_reread_after_git_rewrote_the_index_equals_a_whole_parse(tmp_path):
    """git's own rewrites (a cache-tree extension, version 3 with an intent-to-add entry) are read
    as a whole parse reads them; a version 4 or split index is still refused."""
    repo = tmp_path / "r"
    git(tmp_path, "init", "-q", str(repo))
    for i in range(300):
        (repo / f"note {i}.md").write_text(str(i))
    git(repo, "add", "-A")
    index = CountingIndex(repo / ".git" / "index")
    index.load()
    CountingIndex.parsed = 0
    (repo / "note 7.md").write_text("edited")
    git(repo, "add", "note 7.md")
    index.load()
    reference = whole(repo / ".git" / "index")
    assert (index.names, index.entries) == (reference.names, reference.entries)
    assert 0 < CountingIndex.parsed < 10  # of 300 entries
    git(repo, "write-tree")  # adds the TREE extension
    git(repo, "update-index", "--index-version", "3")
    (repo / "new.md").write_text("n")
    git(repo, "add", "-N", "new.md")
    index.load()
    reference = whole(repo / ".git" / "index")
    assert (index.names, index.entries, index.version) == (reference.names, reference.entries, 3)
    index.update(b"note 8.md", os.stat(repo / "note 8.md"), f"{8:040x}")
    index.write()
    assert "note 8.md" in git(repo, "ls-files", "--stage", "note 8.md")
    git(repo, "update-index", "--index-version", "4")
    with pytest.raises(UnsupportedIndex):
        index.load()
    git(repo, "update-index", "--index-version", "2")
    index.load()
    git(repo, "update-index", "--split-index")
    with pytest.raises(UnsupportedIndex):
        index.load()


@settings(max_examples=300, deadline=None)
@given(
    common=st.binary(max_size=40000),
    tails=st.tuples(st.binary(max_size=3), st.binary(max_size=3)),
    starts=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    limit=st.integers(0, 400000),
    size=st.sampled_from([0, 100, 20000, 300000]),
)
def test_same_bytes_finds_the_first_difference(common, tails, starts, limit, size):
    """byte_diff.same_bytes counts the shared leading bytes of two slices, however long the run
    (the blocks it compares grow) and wherever the first difference falls."""
    run = (common * (size // max(len(common), 1) + 1))[: size + len(common)]
    a, b = b"\1" * starts[0] + run + tails[0], b"\2" * starts[1] + run + tails[1]
    shared_tail = len(os.path.commonprefix([tails[0], tails[1]]))
    expected = min(limit, len(a) - starts[0], len(b) - starts[1], len(run) + shared_tail)
    assert byte_diff.same_bytes(a, starts[0], b, starts[1], limit) == expected
