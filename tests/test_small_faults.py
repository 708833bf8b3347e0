"""Faults found by using kb as a library (design §5, §7): a turn renaming a document by letter
case only, and chunk offsets outside their section."""

from __future__ import annotations

import subprocess

import pytest
from support.commands import missing_objects, run_cli

from kb.errors import KbError, PathExists
from kb.index.chunking import check_piece

WS = 1


def _git(repo, *args) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_a_turn_renames_a_document_and_a_folder_by_letter_case_only(kb):
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/ROADMAP.md", "# Roadmap\nship it\n")
        tx.write("/documents/notes/a.md", "alpha\n")
    turn = kb.turn(WS, "case", "agent")
    assert turn.move("/documents/ROADMAP.md", "/documents/Roadmap.md") == [
        ("/documents/ROADMAP.md", "/documents/Roadmap.md")
    ]
    assert turn.move("/documents/notes", "/documents/Notes") == [("/documents/notes/a.md", "/documents/Notes/a.md")]
    assert turn.read("/documents/Roadmap.md").lines == [(1, "# Roadmap"), (2, "ship it")]
    revision = turn.commit()
    assert revision is not None
    repo = kb.store(WS).path
    assert _git(repo, "ls-tree", "-r", "--name-only", "HEAD").split() == [
        "documents/Notes/a.md",
        "documents/Roadmap.md",
    ]
    _git(repo, "fsck", "--strict")


def test_a_case_twin_of_another_document_is_still_refused(kb):
    from kb.errors import PathExists

    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/ROADMAP.md", "a\n")
        tx.write("/documents/other.md", "b\n")
    turn = kb.turn(WS, "twin", "agent")
    with pytest.raises(PathExists, match="differs only in case"):
        turn.move("/documents/other.md", "/documents/Roadmap.md")


@pytest.mark.parametrize(("start", "end"), [(-5, 5), (-3, -1), (3, 2), (0, 0), (0, 99), (2, 2)])
def test_chunk_offsets_outside_their_section_are_refused(start, end):
    section = "hello world"
    with pytest.raises(KbError, match="outside its section"):
        check_piece(section, start, end, section[start:end], offset=100)


def test_chunk_offsets_that_do_not_reproduce_the_text_are_refused():
    with pytest.raises(KbError, match="do not reproduce"):
        check_piece("hello world", 0, 5, "HELLO")
    check_piece("hello world", 6, 11, "world")  # a true piece passes


def _deep_tree(top, segments: int, name: str = "deep.md") -> None:
    """Folders ``segments`` deep under ``top`` (past the OS's PATH_MAX when long), made through
    folder descriptors as a tool writing into a folder could; a markdown file at the bottom."""
    import os

    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(segments):
            part = f"folder_segment_number_{i:03d}"
            os.mkdir(part, dir_fd=fd)
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        file_fd = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(file_fd, b"# deep\n")
        os.close(file_fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("segments", [60, 200])  # past the path law; also past the OS's PATH_MAX
def test_import_of_a_tree_deeper_than_the_path_law_is_refused_whole(kb_env, tmp_path, segments):
    source = tmp_path / "notes"
    source.mkdir()
    (source / "ok.md").write_text("# fine\n")
    _deep_tree(source, segments)
    result = run_cli(kb_env, "import", str(source), "-w", "5", check=False)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("kb: error: invalid path ") and "unexpected" not in result.stderr
    assert "shorter folder or file names" in result.stderr
    listed = run_cli(kb_env, "workspaces").stdout
    assert not any(line.split()[:1] == ["5"] for line in listed.splitlines())  # no empty workspace left


def test_a_turn_with_a_too_long_path_on_disk_refuses_to_commit_and_keeps_the_turn(kb):
    from kb.errors import InvalidPath

    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/a.md", "alpha\n")
    turn = kb.turn(WS, "deep", "agent")
    turn.write("/documents/b.md", "beta\n")
    _deep_tree(turn.path / "documents", 200)  # a tool wrote it straight into the worktree
    with pytest.raises(InvalidPath, match="move it to a shorter path or remove it"):
        turn.commit()
    assert turn.path.is_dir()  # kept for the agent to fix
    assert kb.read(WS, "/documents/a.md") and kb.store(WS).head() is not None


def test_moving_a_folder_onto_an_existing_folder_is_refused_unless_merging(kb_env, kb):
    """kb mv of a folder onto an existing folder merged the two in silence (a new user expected the
    folder inside, or a refusal as for a document); now a refusal naming both ways."""
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/Notes/Personal/Books.md", "books\n")
        tx.write("/documents/Notes/Projects/Plan.md", "plan\n")
    refused = run_cli(kb_env, "mv", "/documents/Notes/Personal", "/documents/Notes/Projects", "-w", "1", check=False)
    assert refused.returncode == 1 and "a folder exists there" in refused.stderr and "--overwrite" in refused.stderr
    assert sorted(kb.store(WS).list_paths()) == [
        "/documents/Notes/Personal/Books.md",
        "/documents/Notes/Projects/Plan.md",
    ]
    turn = kb.turn(WS, "mv", "agent")
    with pytest.raises(PathExists, match="a folder exists there"):
        turn.move("/documents/Notes/Personal", "/documents/Notes/Projects")
    turn.move("/documents/Notes/Personal", "/documents/Notes/Projects/Personal")
    turn.commit()
    run_cli(kb_env, "mv", "/documents/Notes/Projects/Personal", "/documents/Notes/Projects", "-w", "1", "--overwrite")
    assert sorted(kb.store(WS).list_paths()) == [
        "/documents/Notes/Projects/Books.md",
        "/documents/Notes/Projects/Plan.md",
    ]


def test_cli_new_refuses_an_empty_title_and_normalize_says_what_it_adjusted(kb_env, tmp_path):
    empty = run_cli(kb_env, "new", "  ", "-w", "1", check=False)
    assert empty.returncode == 2 and "the title is empty" in empty.stderr
    for nameless in ("..", ". .", "\x01"):  # it became untitled.md without a word
        refused = run_cli(kb_env, "new", nameless, "-w", "1", check=False)
        assert refused.returncode == 2 and "keeps no character in a file name" in refused.stderr, refused.stderr
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "p.md").write_text("one\ntwo\nthree\n")
    run_cli(kb_env, "import", str(notes), "-w", "1")
    run_cli(kb_env, "read", "/documents/p.md", "-w", "1", "--chat", "c")
    answer = tmp_path / "a.md"
    answer.write_text("see [1:L2-9]\n")
    out = run_cli(kb_env, "cite", "normalize", str(answer), "--chat", "c", "-w", "1")
    assert out.stdout == "see [1:L2-L3]\n" and "adjusted to the documents: [1:L2-9] → [1:L2-L3]" in out.stderr


def test_an_unknown_revision_is_not_told_to_use_more_digits(kb):
    from kb.errors import RevisionNotFound

    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/a.md", "a\n")
    with pytest.raises(RevisionNotFound) as missing:
        kb.revert(WS, "deadbeef")
    assert "no revision 'deadbeef' in this workspace" in str(missing.value) and "digits" not in str(missing.value)
    # the command it names can be pasted as it stands: it names the workspace
    assert f"`kb log --workspace {WS}` lists its revisions" in str(missing.value), missing.value
    with pytest.raises(RevisionNotFound, match=rf"use the id `kb log --workspace {WS}` prints"):
        kb.revert(WS, "not-a-revision")


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, None, float("nan"), float("inf"), 2**63])
def test_history_limits_that_are_not_whole_positive_numbers_are_invalid_input(kb, limit):
    from kb.errors import InvalidInput

    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/a.md", "a\n")
    with pytest.raises(InvalidInput, match="limit must be a whole number"):
        kb.history(WS, limit=limit)


def test_text_that_is_not_unicode_is_invalid_input_not_a_database_failure(kb, kb_env):
    import os
    import subprocess
    import sys

    from kb.errors import InvalidInput

    kb.create_workspace(WS)
    for field in ("author", "message"):
        with pytest.raises(InvalidInput, match="not valid Unicode"):
            with kb.transaction(WS, **{"message": "m", "author": "a", field: "x\udcff"}) as tx:
                tx.write("/documents/a.md", "a\n")
    # a turn refuses such an author when it opens: it keeps the author it opened with, so one taken
    # there made every commit of the turn refuse it (design §5)
    with pytest.raises(InvalidInput, match="not valid Unicode"):
        kb.turn(WS, "sur", author="x\udcff")
    assert kb.store(WS).head() is None
    for args in (
        [b"new", b"bad\xff", b"-w", b"1", b"--body", b"x"],
        [b"new", b"T2", b"-w", b"1", b"--author", b"a\xff", b"--body", b"x"],
    ):
        result = subprocess.run(
            [os.fsencode(sys.executable), b"-m", b"kb.adapters.cli", *args],
            env=kb_env,
            capture_output=True,
            timeout=300,
        )
        assert result.returncode == 1, result.stderr
        assert b"not valid Unicode" in result.stderr and b"unexpected" not in result.stderr


def test_a_pack_written_before_its_ref_moves_survives_a_concurrent_git_repack(kb):
    """kb import writes its blobs as one pack before the revision's ref moves; a `git repack -a -d`
    in between dropped every one of them (unreachable yet): an import reported success over a
    revision git could not read. The pack is kept (.keep) until maintenance releases it."""
    from kb.git.repository import LOOSE_LIMIT

    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "alice") as tx:
        tx.write("/documents/a.md", "a\n")
    repository = kb.store(WS).repository
    blobs = repository.add_blobs([f"pending blob {i}\n".encode() for i in range(LOOSE_LIMIT)])
    repo = kb.store(WS).path
    _git(repo, "repack", "-a", "-d", "-q")
    assert missing_objects(repo, blobs) == []
    assert repository.release_pending_packs(older_than=0) == 1  # as maintenance does after an hour
    assert repository.release_pending_packs(older_than=0) == 0
