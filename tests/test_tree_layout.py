"""design §14 (design §2.1): trees built by splicing changed entries (``kb.git.tree_layout``) are exactly the
trees git would write, whatever mix of additions, deletions and file/folder swaps a revision makes.

Each revision's tree id is compared with a tree serialized from scratch by dulwich (which sorts every
entry), and the repository is checked with ``git fsck --strict`` and ``git ls-tree``.
"""

from __future__ import annotations

import random
import subprocess
import zlib

import pytest
from dulwich.objects import Tree
from hypothesis import given, settings
from hypothesis import strategies as st

from kb.git import loose_zlib, tree_layout
from kb.git.repository import FILE_MODE, LOOSE_COMPRESSION, Repository
from kb.git.tree_layout import TreeLayout

# Names whose git order differs from plain name order once some of them are folders:
# "a.md" < "a/" < "a0", "a-b" < "a/" (git sorts a folder as "name/").
NAMES = ["a", "a.md", "a-b", "a0", "b", "b.md", "Ä.md", "z"]


def reference_tree(store, files: dict[str, str]) -> bytes | None:
    """The tree id of ``files`` ({path: blob hex}) serialized from scratch by dulwich."""
    nested: dict = {}
    for path, blob in files.items():
        *folders, name = path.split("/")
        node = nested
        for folder in folders:
            node = node.setdefault(folder, {})
        node[name] = blob

    def build(node: dict) -> bytes:
        tree = Tree()
        for name, child in node.items():
            if isinstance(child, dict):
                tree.add(name.encode(), 0o040000, build(child))
            else:
                tree.add(name.encode(), FILE_MODE, child.encode())
        store.add_object(tree)
        return tree.id

    return build(nested) if nested else None


def git(repo, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def random_change(
    rng: random.Random, files: dict[str, str], blobs: list[str]
) -> tuple[list[tuple[str, str | None]], dict[str, str]]:
    """A change set of 1–6 paths: writes (files or, by writing below a name, folders) and deletions;
    a write replaces whatever document or folder stood in its way, as the store allows."""
    changes: dict[str, str | None] = {}
    for _ in range(rng.randint(1, 6)):
        depth = rng.choice([1, 1, 2, 3])
        path = "/".join(rng.choice(NAMES) for _ in range(depth))
        if rng.random() < 0.3 and files:
            path = rng.choice(sorted(files))
            changes[path] = None
            continue
        changes[path] = rng.choice(blobs)
    final = dict(files)
    for path, blob in sorted(changes.items(), key=lambda change: change[1] is not None):
        if blob is None:
            final.pop(path, None)
            continue
        parts = path.split("/")
        for i in range(1, len(parts)):  # a document in the way of a folder goes
            if "/".join(parts[:i]) in final:
                changes["/".join(parts[:i])] = None
                final.pop("/".join(parts[:i]))
        for other in [p for p in final if p.startswith(path + "/")]:  # a folder in the way of a document
            changes[other] = None
            final.pop(other)
        changes[path] = blob  # (again: a later write may have undone it as "in the way")
        final[path] = blob
    return list(changes.items()), final


@pytest.mark.parametrize("bulk", [False, True], ids=["spliced", "sorted-in-bulk"])
def test_spliced_trees_equal_trees_serialized_whole(tmp_path, monkeypatch, bulk):
    if bulk:  # every change set takes the bulk path (one sort), as a folder rename does
        monkeypatch.setattr(tree_layout, "BULK_CHANGES", 0)
    rng = random.Random(9)
    repo = Repository.create(tmp_path / "repo")
    store = repo._repo.object_store
    blobs = [repo.add_blob(f"blob {i}\n".encode()) for i in range(5)]
    files: dict[str, str] = {}
    tree, parent = None, None
    for step in range(300):
        changes, files = random_change(rng, files, blobs)
        if step % 50 == 49:  # a fresh Repository has no layouts cached: built from the raw trees
            repo.close()
            repo = Repository.open(tmp_path / "repo")
            store = repo._repo.object_store
        tree = repo.build_tree(tree, changes)
        expected = reference_tree(store, files)
        if expected is None:
            assert len(store[tree]) == 0, step
        else:
            assert tree == expected, (step, changes)
        commit = repo.make_commit(tree, parent, f"step {step}", "t", "t")
        assert repo.advance(parent, commit.id.decode())
        parent = commit.id.decode()
    listed = git(
        tmp_path / "repo", "-c", "core.quotePath=false", "ls-tree", "-r", "-z", "--format=%(objectname) %(path)", "HEAD"
    )
    assert dict(reversed(line.split(" ", 1)) for line in listed.split("\0") if line) == files
    git(tmp_path / "repo", "fsck", "--strict", "--no-dangling")
    repo.close()


def test_base_tree_out_of_git_order_is_rebuilt_sorted(tmp_path):
    repo = Repository.create(tmp_path / "repo")
    store = repo._repo.object_store
    blob = repo.add_blob(b"x\n").encode()
    raw = b"".join(b"100644 %s\0%s" % (name, bytes.fromhex(blob.decode())) for name in (b"b.md", b"a.md"))
    unsorted = Tree.from_raw_string(Tree.type_num, raw)
    store.add_object(unsorted)
    assert TreeLayout.of(unsorted) is None
    tree = repo.build_tree(unsorted.id, [("c.md", blob.decode())])
    assert tree == reference_tree(store, {"a.md": blob.decode(), "b.md": blob.decode(), "c.md": blob.decode()})
    repo.close()


def test_loose_objects_use_gits_compression_unless_configured(tmp_path):
    repo = Repository.create(tmp_path / "default")
    assert repo._repo.object_store.loose_compression_level == LOOSE_COMPRESSION == 1
    repo.close()
    git(tmp_path / "default", "config", "core.compression", "9")
    repo = Repository.open(tmp_path / "default")
    assert repo._repo.object_store.loose_compression_level == 9
    repo.close()


def test_another_writers_revision_of_a_folder_is_keyed_and_laid_out_from_the_last_one(tmp_path):
    """Two Repository objects on one repository (two processes): each derives the collision keys
    and the layout of the other's new version of a folder from its own last one; the result equals
    keying and serializing that version from scratch."""
    ours, theirs = Repository.create(tmp_path / "repo"), Repository.open(tmp_path / "repo")
    blob = ours.add_blob(b"x\n")
    tree = ours.build_tree(None, [(f"documents/Flat/note {i}.md", blob) for i in range(300)])
    assert ours.folder_keys(tree, "documents/Flat")["note 7.md"] == (("note 7.md", "file"),)
    for step, changes in enumerate(
        [
            [("documents/Flat/NOTE 7.md", blob), ("documents/Flat/note 8.md", None)],
            [("documents/Flat/Café.md", blob), ("documents/Flat/sub/x.md", blob)],
            [("documents/Flat/note 7.md", None), ("documents/Flat/sub/x.md", None)],
        ]
    ):
        tree = theirs.build_tree(tree, changes)
        fresh = Repository.open(tmp_path / "repo")

        def keyed(repo):  # {key: set of (name, kind)}: the order within a key carries no meaning
            return {key: set(names) for key, names in repo.folder_keys(tree, "documents/Flat").items()}

        assert keyed(ours) == keyed(fresh), step
        fresh.close()
        tree = ours.build_tree(tree, [(f"documents/Flat/ours {step}.md", blob)])
        files = dict(ours.walk(tree))
        assert tree == reference_tree(ours._repo.object_store, files), step
    ours.close()
    theirs.close()


# -- reading another process's version of a big folder (tree_layout.derive) ----------------------
# Names that sort differently once some are folders, are prefixes of others, hold spaces or
# non-ASCII letters: the same bytes git would write are the test, dulwich's parse the reference.
_NAME = st.text(alphabet="ab -.0_Äé", min_size=1, max_size=5).map(str.encode)
_ENTRY = st.tuples(st.booleans(), st.integers(0, 3))  # (folder?, which object)


def _tree(entries: dict[bytes, tuple[bool, int]]) -> Tree:
    tree = Tree()
    for name, (folder, which) in entries.items():
        tree.add(name, 0o040000 if folder else FILE_MODE, (b"%040x" % (which + 1)))
    return tree


@settings(max_examples=300, deadline=None)
@given(
    base=st.dictionaries(_NAME, _ENTRY, max_size=60),
    edits=st.lists(st.tuples(_NAME, st.none() | _ENTRY), max_size=5),
)
def test_derived_tree_equals_dulwichs_parse_of_the_same_text(base, edits):
    """A revision of a tree read by parsing only the span that differs from a base is the tree
    dulwich parses from the whole text: same entries, text, id and layout; the changed names are
    exactly the entries that differ."""
    new = dict(base)
    for name, entry in edits:
        if entry is None:
            new.pop(name, None)
        else:
            new[name] = entry
    base_tree = Tree.from_raw_string(Tree.type_num, _tree(base).as_raw_string())
    reference = Tree.from_raw_string(Tree.type_num, _tree(new).as_raw_string())
    layout = TreeLayout.of(base_tree)
    assert layout is not None
    derived = tree_layout.derive(base_tree, layout, reference.as_raw_string(), reference.id)
    assert derived is not None  # a few entries changed: never left to the whole parse
    tree, new_layout, changed = derived
    assert tree._entries == reference._entries
    assert tree.as_raw_string() == reference.as_raw_string() and tree.id == reference.id
    expected_layout = TreeLayout.of(reference)
    assert (new_layout.keys, new_layout.chunks) == (expected_layout.keys, expected_layout.chunks)
    assert changed == {name for name, _ in base_tree._entries.items() ^ reference._entries.items()}


def test_derive_leaves_big_changes_and_malformed_text_to_dulwich():
    base = Tree.from_raw_string(Tree.type_num, _tree({b"n%03d" % i: (False, 0) for i in range(200)}).as_raw_string())
    layout = TreeLayout.of(base)
    rewritten = _tree({b"n%03d" % i: (False, 1) for i in range(200)})  # every entry changed
    assert tree_layout.derive(base, layout, rewritten.as_raw_string(), rewritten.id) is None
    raw = base.as_raw_string()
    unsorted = raw.replace(b"n100", b"n500", 1)  # out of git order: no layout describes it
    assert tree_layout.derive(base, layout, unsorted, b"0" * 40) is None
    truncated = raw[: len(raw) // 2] + b"100644 broken"
    assert tree_layout.derive(base, layout, truncated, b"0" * 40) is None


def test_another_writers_big_folder_is_read_from_the_last_version_laid_out(tmp_path):
    """A Repository reads another process's version of a big folder by splicing the span that
    differs into the version it last laid out (no whole parse); lookups, the layout and a tree
    built on it equal what a fresh Repository computes, and git fsck agrees."""
    ours, theirs = Repository.create(tmp_path / "repo"), Repository.open(tmp_path / "repo")
    blob = ours.add_blob(b"x\n")
    blobs = ours.add_blobs([f"note {i}\n".encode() for i in range(300)])  # a folder's text is mostly ids
    tree = ours.build_tree(None, [(f"documents/Flat/note {i}.md", blobs[i]) for i in range(300)])
    parent = None
    for step, changes in enumerate(
        [
            [("documents/Flat/note 150 b.md", blob)],
            [("documents/Flat/note 150.md", None), ("documents/Flat/note 15/x.md", blob)],
            [("documents/Flat/Ä é.md", blob), ("documents/Flat/note 0.md", None)],  # the first entry goes
            [("documents/Flat/note 2.md", ours.add_blob(b"y\n"))],
            [("documents/Flat/note 1.md", ours.add_blob(b"z\n"))],  # the first entry changes
        ]
    ):
        previous = tree
        tree = theirs.build_tree(tree, changes)
        assert ours.lookup(tree, "documents/Flat/note 7.md") == blobs[7]
        folder = ours._folder_tree(tree, "documents/Flat")
        before = ours._folder_tree(previous, "documents/Flat")
        derived = (before.id, folder.id) in ours._deltas
        assert derived == (step != 2), step  # when the first entry goes, no cached tree starts as it does
        tree = ours.build_tree(tree, [(f"documents/Flat/ours {step}.md", blob)])
        assert tree == reference_tree(ours._repo.object_store, dict(ours.walk(tree))), step
        commit = ours.make_commit(tree, parent, f"step {step}", "t", "t")
        assert ours.advance(parent, commit.id.decode())
        parent = commit.id.decode()
    git(tmp_path / "repo", "fsck", "--strict", "--no-dangling")
    ours.close()
    theirs.close()


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.binary(max_size=3000).map(lambda b: b.replace(b"\1", b"\0")), min_size=1, max_size=4),
    level=st.sampled_from([-1, 0, 1, 9]),
)
def test_segmented_streams_decompress_to_the_text(texts, level):
    """A stream built from remembered segments is one zlib stream of exactly header + text,
    whatever the text (cuts anywhere, runs of NULs, empty), at any level, segments reused or not."""
    compressor, reader = loose_zlib.SegmentedCompressor(level, size=8), loose_zlib.SegmentedCompressor(level)
    reader.compress(b"tree 0\0", texts[0])  # the reader remembers some segments, not all
    for text in texts * 2:
        header = b"tree %d\0" % len(text)
        stream = compressor.compress(header, text)
        assert zlib.decompress(stream) == header + text
        assert reader.decompress(stream, 1 << 20) in (None, header + text)
        assert reader.decompress(zlib.compress(header + text, level), 1 << 20) is None  # not segmented
        assert reader.decompress(stream[: len(stream) // 2], 1 << 20) is None


def test_big_trees_are_written_from_remembered_segments_that_git_reads(tmp_path):
    """A big folder's revisions are loose objects compressed segment by segment; git reads them
    (fsck, ls-tree) and the next revision recompresses only the segments its change touched."""
    repo = Repository.create(tmp_path / "repo")
    blobs = repo.add_blobs([f"note {i}\n".encode() for i in range(1500)])
    tree = repo.build_tree(None, [(f"Flat/note {i}.md", blobs[i]) for i in range(1500)])
    compressor = repo._compressor
    assert compressor is not None and len(compressor._segments) > 1
    remembered = set(compressor._segments)
    tree = repo.build_tree(tree, [("Flat/note 750 b.md", blobs[0])])
    assert len(set(compressor._segments) - remembered) <= 2  # the touched segment (perhaps cut in two)
    flat = repo._referenced(tree)[b"Flat"][1]
    stream = (tmp_path / "repo" / ".git" / "objects" / flat[:2].decode() / flat[2:].decode()).read_bytes()
    assert compressor.decompress(stream, 1 << 24) == zlib.decompress(stream)  # remembered segments, not inflated
    commit = repo.make_commit(tree, None, "big", "t", "t")
    assert repo.advance(None, commit.id.decode())
    git(tmp_path / "repo", "fsck", "--strict", "--no-dangling")
    assert len(git(tmp_path / "repo", "ls-tree", "HEAD:Flat").splitlines()) == 1501
    fresh = Repository.open(tmp_path / "repo")  # read back through dulwich too
    assert fresh.lookup(fresh.tree_id(commit.id.decode()), "Flat/note 750 b.md") == blobs[0]
    fresh.close()
    repo.close()


def test_the_remembered_segments_are_bounded_per_process_not_per_repository(tmp_path, monkeypatch):
    """A process writing big folders in many repositories (workspaces) remembers at most
    PROCESS_SEGMENTS compressed segments in all, not CACHE_SEGMENTS more per repository; what each
    writes is still read by git (design §2.1)."""
    monkeypatch.setattr(loose_zlib, "PROCESS_SEGMENTS", 24)
    loose_zlib.reset()
    try:
        repos = []
        for k in range(6):
            repo = Repository.create(tmp_path / f"repo{k}")
            blobs = repo.add_blobs([f"note {k} {i}\n".encode() for i in range(1500)])
            tree = repo.build_tree(None, [(f"Flat/note {k} {i}.md", blobs[i]) for i in range(1500)])
            commit = repo.make_commit(tree, None, "big", "t", "t")
            assert repo.advance(None, commit.id.decode())
            repos.append(repo)
        compressors = {id(r._compressor): r._compressor for r in repos if r._compressor is not None}
        assert compressors and sum(len(c._segments) for c in compressors.values()) <= 24
        for k in range(6):
            git(tmp_path / f"repo{k}", "fsck", "--strict", "--no-dangling")
            repos[k].close()
    finally:
        loose_zlib.reset()
