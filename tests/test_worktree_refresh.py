"""design §14 (design §2.1, §3): the working tree after a folder rename, refreshed in O(changed entries).

A folder whose every file moves renames on disk as one folder (its inode is kept); the index entries
keep the files' stat data, so plumbing that trusts the index without refreshing it
(``git diff-files``) sees nothing changed, and ``git status`` is clean. When the old folder holds
anything else, or the new one exists, files move one by one, with the same end state.
"""

from __future__ import annotations

import os

from support.commands import git

WS = 1


def clean(repo) -> None:
    assert git(repo, "diff-files", "--name-only") == ""  # index stat data describes the files as they are
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def seed(kb, files: dict[str, str]) -> None:
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "t") as tx:
        for path, text in files.items():
            tx.write(path, text)


def test_folder_rename_moves_the_folder_once_and_keeps_the_index_exact(kb):
    files = {f"/documents/Flat/note {i}.md": f"note {i}\n" for i in range(40)}
    files |= {f"/documents/Flat/Sub/deep {i}.md": f"deep {i}\n" for i in range(5)}
    files |= {f"/documents/Outer/Inner/i{i}.md": f"i{i}\n" for i in range(3)}  # a folder of folders only
    files["/documents/Other/x.md"] = "x\n"
    seed(kb, files)
    repo = kb.store(WS).path
    clean(repo)
    flat_inode = os.stat(repo / "documents" / "Flat").st_ino
    sub_inode = os.stat(repo / "documents" / "Flat" / "Sub").st_ino
    inner_inode = os.stat(repo / "documents" / "Outer" / "Inner").st_ino
    with kb.transaction(WS, "rename", "t") as tx:
        tx.move("/documents/Flat", "/documents/Renamed/Flat 2")
        tx.move("/documents/Outer", "/documents/Outer 2")
    assert not (repo / "documents" / "Flat").exists()
    assert os.stat(repo / "documents" / "Renamed" / "Flat 2").st_ino == flat_inode  # one rename
    assert os.stat(repo / "documents" / "Renamed" / "Flat 2" / "Sub").st_ino == sub_inode
    assert os.stat(repo / "documents" / "Outer 2" / "Inner").st_ino == inner_inode
    assert not (repo / "documents" / "Outer").exists()  # left empty: removed

    def moved_path(path: str) -> str:
        return path.replace("/documents/Flat/", "/documents/Renamed/Flat 2/").replace("/Outer/", "/Outer 2/")

    for path, text in files.items():
        moved = moved_path(path)
        assert (repo / moved.lstrip("/")).read_text() == text
    clean(repo)
    assert sorted(kb.list_paths(WS)) == sorted(moved_path(p) for p in files)


def test_folder_moves_file_by_file_when_it_holds_more_or_the_target_exists(kb):
    files = {f"/documents/A/n{i}.md": f"a{i}\n" for i in range(6)}
    files |= {f"/documents/B/m{i}.md": f"b{i}\n" for i in range(6)}
    files["/documents/Target/keep.md"] = "keep\n"
    seed(kb, files)
    repo = kb.store(WS).path
    (repo / "documents" / "A" / "stray.txt").write_text("not kb's")  # an untracked file stays put
    git(repo, "update-index", "--refresh")  # (status would list it as untracked; the index is unaffected)
    with kb.transaction(WS, "moves", "t") as tx:
        tx.move("/documents/A", "/documents/A2")  # A keeps the stray file: moved file by file
        tx.move("/documents/B", "/documents/Target", overwrite=True)  # into the existing folder: file by file
        tx.write("/documents/Target/m0.md", "b0 edited\n")  # moved and edited: written from its blob
    assert (repo / "documents" / "A" / "stray.txt").read_text() == "not kb's"
    for i in range(6):
        assert (repo / "documents" / "A2" / f"n{i}.md").read_text() == f"a{i}\n"
        assert (repo / "documents" / "Target" / f"m{i}.md").read_text() == ("b0 edited\n" if i == 0 else f"b{i}\n")
    assert not (repo / "documents" / "B").exists()
    (repo / "documents" / "A" / "stray.txt").unlink()
    clean(repo)


def test_index_written_by_git_round_trips(tmp_path):
    """The index updater parses what git writes (v3, an extended intent-to-add entry, a long name)
    and writes it back unchanged."""
    from kb.git.gitindex import IndexFile

    repo = tmp_path / "r"
    git(tmp_path, "init", "-q", str(repo))
    for i in range(20):
        (repo / f"f{i}.md").write_text(str(i))
    (repo / ("n" * 200)).write_text("long")
    git(repo, "add", "-A")
    git(repo, "update-index", "--index-version", "3")
    (repo / "new.md").write_text("n")
    git(repo, "add", "-N", "new.md")  # intent-to-add: an extended entry
    before = (repo / ".git" / "index").read_bytes()
    index = IndexFile(repo / ".git" / "index")
    index.load()
    assert len(index.names) == 22 and index.version == 3 and b"n" * 200 in index.names
    index.write()
    assert (repo / ".git" / "index").read_bytes() == before


def test_writers_taking_turns_in_a_big_folder_keep_the_checkout_exact(kb, settings, database_url):
    """Two KnowledgeBases (two processes, each with its own caches) take turns writing, editing
    and deleting documents in one big folder: each reads the other's index and folder tree by the
    entries that changed (kb.git.gitindex, kb.git.tree_layout.derive), and the checkout, the index
    and the objects stay exactly what git expects."""
    from kb.knowledge_base import KnowledgeBase

    seed(kb, {f"/documents/Flat/note {i}.md": f"note {i}\n" for i in range(400)})
    other = KnowledgeBase(settings, database_url)
    repo = kb.store(WS).path
    try:
        for step in range(6):
            writer = (kb, other)[step % 2]
            turn = writer.turn(WS, f"t{step}", "agent")
            turn.write(f"/documents/Flat/note {step}.md", f"edited {step}\n")
            turn.write(f"/documents/Flat/new é {step}.md", f"new {step}\n")
            turn.remove(f"/documents/Flat/note {200 + step}.md")
            assert turn.commit() is not None
            clean(repo)
        derived = [writer.store(WS).repository._deltas for writer in (kb, other)]
        assert all(derived), "each writer read the other's folder by its changes"
        git(repo, "fsck", "--strict", "--no-dangling")
        assert len(git(repo, "ls-files").splitlines()) == 400
    finally:
        other.close()
