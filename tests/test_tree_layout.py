"""design §14 (design §2.1): trees built by splicing changed entries (``kb.git.tree_layout``) are exactly the
trees git would write, whatever mix of additions, deletions and file/folder swaps a revision makes.

Each revision's tree id is compared with a tree serialized from scratch by dulwich (which sorts every
entry), and the repository is checked with ``git fsck --strict`` and ``git ls-tree``.
"""

from __future__ import annotations

import random
import subprocess

import pytest
from dulwich.objects import Tree

from kb.git import tree_layout
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
