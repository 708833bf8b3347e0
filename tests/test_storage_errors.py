"""design §14, fault 4's kind (design §14): a damaged repository surfaces as a kb error, never a raw one.

A loose object of a real workspace repository is corrupted on disk (garbage, truncated, content that
does not match its id, or unreadable), then the document is read through the facade and through a
turn by a fresh KnowledgeBase (no object cached in memory): each read raises StorageError with a
one-line message naming the object and what to do.
"""

from __future__ import annotations

import os
import shutil
import zlib

import pytest
from support.commands import git

from kb.errors import StorageError
from kb.knowledge_base import KnowledgeBase

WS = 1
DOC = "/documents/notes/a.md"


def damage(path, how: str) -> None:
    os.chmod(path, 0o644)
    if how == "garbage":
        path.write_bytes(b"this is not a zlib stream")
    elif how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "other content":  # a valid object, but not the one its name (id) promises
        path.write_bytes(zlib.compress(b"blob 6\0forged"))
    elif how == "unreadable":  # opening it fails in the OS (EISDIR), as an I/O error would
        path.unlink()
        path.mkdir()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["garbage", "truncated", "other content", "unreadable"])
@pytest.mark.parametrize("target", ["blob", "tree"])
def test_a_damaged_object_is_a_storage_error_with_one_line(kb, settings, how, target):
    kb.create_workspace(WS)
    with kb.transaction(WS, "seed", "t") as tx:
        tx.write(DOC, "alpha\n")
        tx.write("/documents/b.md", "beta\n")
    repo = kb.store(WS).path
    spec = "HEAD:documents/notes/a.md" if target == "blob" else "HEAD:documents/notes"
    sha = git(repo, "rev-parse", spec).strip()
    loose = repo / ".git" / "objects" / sha[:2] / sha[2:]
    assert loose.is_file()
    damage(loose, how)

    fresh = KnowledgeBase(settings, kb.database_url)
    turn = fresh.turn(WS, "reader", "agent")
    try:
        for read in (lambda: fresh.read(WS, DOC), lambda: turn.read(DOC)):
            with pytest.raises(StorageError) as raised:
                read()
            message = str(raised.value)
            assert "\n" not in message and sha in message and "kb fsck" in message, message
        assert fresh.read(WS, "/documents/b.md") == b"beta\n"  # the rest stays readable
    finally:
        turn.abort()
        fresh.close()
        if loose.is_dir():
            shutil.rmtree(loose)
