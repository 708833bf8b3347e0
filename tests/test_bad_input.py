"""Bad input gets a clear error and loses nothing (design §14); cases found by adversarial testing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.commands import git

from kb.db.database import start_embedded, stop_embedded
from kb.errors import InvalidInput


@pytest.mark.parametrize("message, author", [("a\x00b", "t"), ("ok", "a\x00b"), ("ok", "two\nlines")])
def test_commit_text_git_and_postgres_cannot_hold_is_refused_before_any_write(kb, settings, message, author):
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/a.md", "a\n")
    head = kb.head(1)
    with pytest.raises(InvalidInput):
        with kb.transaction(1, message, author) as tx:
            tx.write("/documents/b.md", "b\n")
    assert kb.head(1) == head
    git(settings.knowledge_store / "1", "fsck", "--strict")  # no stray malformed commit object


@pytest.mark.parametrize(
    "query, k",
    [
        ("", 5),
        ("   ", 5),
        ("a\x00b", 5),
        ("x" * 4001, 5),
        ("\ud800", 5),
        (None, 5),
        ("ok", 0),
        ("ok", 101),
        ("ok", "5"),
    ],
)
def test_bad_queries_are_refused(kb, tmp_path, query, k):
    notes = tmp_path / "n"
    notes.mkdir()
    (notes / "a.md").write_text("hello\n")
    kb.import_folder(notes, 1)
    with pytest.raises(InvalidInput):
        kb.search(1, query, k)


def test_import_skips_symlinks_and_non_utf8_names(kb, tmp_path):
    notes = tmp_path / "n"
    notes.mkdir()
    (notes / "good.md").write_text("good\n")
    secret = tmp_path / "outside.md"
    secret.write_text("secret from outside the folder\n")
    os.symlink(secret, notes / "link.md")
    os.symlink(tmp_path, notes / "loop")
    os.mkdir(os.fsencode(notes) + b"/bad\xffdir")
    with open(os.fsencode(notes) + b"/bad\xff.md", "wb") as handle:
        handle.write(b"bad name\n")
    report = kb.import_folder(notes, 1)
    assert sorted(kb.list_paths(1)) == ["/documents/good.md"]
    assert report.skipped_other == 4


def test_large_documents_stay_in_git_but_are_not_indexed(kb, tmp_path, settings):
    small = kb.__class__.open(settings.model_copy(update={"max_index_bytes": 1000}))
    notes = tmp_path / "n"
    notes.mkdir()
    (notes / "big.md").write_text("word " * 400)
    (notes / "small.md").write_text("word\n")
    small.import_folder(notes, 1)
    report = small.index(1)
    assert report.documents_unindexable == 1 and report.documents_indexed == 1
    assert small.read(1, "/documents/big.md") == (notes / "big.md").read_bytes()
    problems = small.status(1)["workspace"]["problems"]
    assert [(p["path"], p["status"]) for p in problems] == [("/documents/big.md", "unindexable")]
    assert "KB_MAX_INDEX_BYTES" in problems[0]["index_error"]


@pytest.mark.postgres  # starts its own embedded Postgres
def test_embedded_server_survives_a_truncated_handle_list(tmp_path):
    """The wheel rewrites .handle_pids.json in place; a kill mid-write left it empty and every
    later start failed with a JSON error."""
    pgdata = tmp_path / "pg"
    start_embedded(pgdata)
    try:
        (pgdata / ".handle_pids.json").write_text("")
        # a new process, as the next `kb` command would be (the wheel caches servers per process)
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from kb.db.database import start_embedded; print(start_embedded({str(pgdata)!r}))",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("postgresql://")
    finally:
        stop_embedded(pgdata)


@pytest.mark.parametrize(
    "prefix, expected",
    [
        ("Notes/2026", ("Notes", "2026")),
        ("/Notes/", ("Notes",)),
        ("/documents/Notes", ("Notes",)),
        ("documents", ()),
        ("documentsX", ("documentsX",)),
        ("a:b", ("a_b",)),
        (None, ()),
    ],
)
def test_import_prefix_names_a_folder_under_documents(prefix, expected):
    from kb.store.importer import import_prefix

    assert import_prefix(prefix) == expected


@pytest.mark.parametrize("prefix", ["../etc", "a/../../b", "./x"])
def test_import_prefix_with_dot_segments_is_refused(prefix):
    from kb.store.importer import import_prefix

    with pytest.raises(InvalidInput):
        import_prefix(prefix)
