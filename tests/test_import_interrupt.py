"""Ctrl-C during ``kb import`` (design §3): the command says exactly what happened — the import
landed (with its revision) or nothing was recorded — and leaves no debris: no empty workspace
from an interrupted first import, no ``Aborted!``, no BufferError; ``kb fsck`` removes temporary
packs an interrupted pack write left. SIGINT is delivered at deterministic steps of the commit
(``KB_FAULT_POINT`` with ``KB_FAULT_SIGNAL=INT``, kb/faults.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from support.commands import git, halted_cli, run_cli
from support.named_queries import queries

from kb.db import database


@pytest.fixture(autouse=True)
def _ctrl_c_reaches_kb():
    """A child inherits an ignored SIGINT (a test run started in the background by a
    non-interactive shell ignores it), and Python then keeps ignoring it: the Ctrl-C these tests
    deliver would never arrive. A handled SIGINT is reset to the default at exec, so the CLI
    installs its KeyboardInterrupt handler as under a terminal."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _source(tmp_path, count: int = 3):
    source = tmp_path / "notes"
    source.mkdir()
    for i in range(count):
        (source / f"n{i}.md").write_text(f"# Note {i}\n\nbody {i}\n")
    return source


def _workspace_row(settings, ws: int):
    with database.transaction(settings.database_url) as conn:
        return conn.execute(queries["get_workspace"], {"workspace_id": ws}).fetchone()


def test_ctrl_c_after_the_ref_moved_reports_the_landed_revision(kb_env, settings, tmp_path):
    result = run_cli(
        {**kb_env, "KB_FAULT_POINT": "before_pg_commit", "KB_FAULT_SIGNAL": "INT"},
        "import",
        str(_source(tmp_path)),
        "--workspace",
        "1",
        check=False,
    )
    assert result.returncode == 130, result.stderr
    assert "Aborted!" not in result.stderr and "Traceback" not in result.stderr
    row = _workspace_row(settings, 1)
    assert row["head_revision"] is not None
    assert f"the import had already landed: revision {row['head_revision']}" in result.stderr


def test_ctrl_c_before_anything_landed_says_so_and_leaves_no_empty_workspace(kb_env, settings, tmp_path):
    result = run_cli(
        {**kb_env, "KB_FAULT_POINT": "objects_written", "KB_FAULT_SIGNAL": "INT"},
        "import",
        str(_source(tmp_path)),
        "--workspace",
        "1",
        check=False,
    )
    assert result.returncode == 130, result.stderr
    assert "nothing was recorded in workspace 1" in result.stderr
    assert "Aborted!" not in result.stderr and "Traceback" not in result.stderr
    assert _workspace_row(settings, 1) is None
    assert not (settings.knowledge_store / "1").exists()


def test_fsck_removes_a_stale_temporary_pack(kb, kb_env, tmp_path):
    kb.create_workspace(1)
    with kb.transaction(1, "one", "t") as tx:
        tx.write("/documents/a.md", "a\n")
    pack = kb.store(1).path / ".git" / "objects" / "pack" / "tmpk2j3h4.pack"
    pack.parent.mkdir(parents=True, exist_ok=True)
    pack.write_bytes(b"PACK\x00\x00\x00\x02")
    old = time.time() - 7200
    os.utime(pack, (old, old))
    run_cli(kb_env, "fsck", "--workspace", "1")
    assert not pack.exists()


def test_ctrl_c_as_the_ref_is_renamed_leaves_a_git_commands_ref_lock_alone(kb, kb_env, settings, tmp_path):
    """design §2.1: Ctrl-C arriving just after an import's ref update renamed its lock file over
    the branch ref (the ``ref_renamed`` point, the process stopped there) finds the lock free
    and, in the meantime, taken by a git command run by hand. The import removed
    ``refs/heads/main.lock`` as if it were still its own, so the next writer of kb's took the lock
    beside the git command and one of the two ref updates was lost. Now it leaves a lock file it
    did not make as it is."""
    kb.create_workspace(1)
    with halted_cli(kb_env, "ref_renamed", "import", str(_source(tmp_path)), "--workspace", "1") as importer:
        repo = settings.knowledge_store / "1"
        ref_lock = repo / ".git" / "refs" / "heads" / "main.lock"
        ref_lock.write_bytes(b"held by a git command\n")  # the git command's lock, taken in the gap
        importer.send_signal(signal.SIGINT)  # Ctrl-C, handled once the process runs again
        importer.send_signal(signal.SIGCONT)
        _, stderr = importer.communicate(timeout=300)
    assert importer.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert ref_lock.read_bytes() == b"held by a git command\n"  # the git command's, left to it
    ref_lock.unlink()
    git(repo, "fsck", "--strict")


def test_ctrl_c_during_another_write_says_what_became_of_it(kb_env, tmp_path):
    """design §3: Ctrl-C in a command recording a revision (here `kb mv` and `kb rm`) printed
    click's bare "Aborted!" and exited 1, saying nothing of a write git may already hold. Each
    such command gives its write a key and, interrupted, settles it: it had landed (its revision,
    which `kb log` then shows), or nothing was recorded; exit 130 either way."""
    run_cli(kb_env, "import", str(_source(tmp_path)), "--workspace", "2")
    after_the_ref_moved = {**kb_env, "KB_FAULT_POINT": "before_pg_commit", "KB_FAULT_SIGNAL": "INT"}
    moved = run_cli(
        after_the_ref_moved, "mv", "/documents/n0.md", "/documents/archive/n0.md", "--workspace", "2", check=False
    )
    assert moved.returncode == 130, moved.stderr
    assert "Aborted!" not in moved.stderr and "Traceback" not in moved.stderr, moved.stderr
    assert "kb: interrupted, but `kb mv` had already landed: revision " in moved.stderr, moved.stderr
    landed = moved.stderr.split("revision ")[1].split()[0]
    log = run_cli(kb_env, "log", "-n", "1", "--workspace", "2").stdout
    assert log.startswith(landed) and "/documents/archive/n0.md" in log, log
    before_anything = {**kb_env, "KB_FAULT_POINT": "draft_ready", "KB_FAULT_SIGNAL": "INT"}
    removed = run_cli(before_anything, "rm", "/documents/n1.md", "--workspace", "2", check=False)
    assert removed.returncode == 130, removed.stderr
    assert "kb: interrupted: `kb rm` did not land: nothing was recorded in workspace 2" in removed.stderr, (
        removed.stderr
    )
    assert "/documents/n1.md" in run_cli(kb_env, "ls", "/documents", "--workspace", "2").stdout


def test_ctrl_c_during_kb_edit_says_whether_its_revision_landed(kb_env, tmp_path):
    """design §3: `kb edit` interrupted once its ref moved said only that the revision "may or
    may not have landed"; its save now carries a key, and the command settles it: the revision
    landed (its id, which `kb log` shows), or nothing was recorded."""
    run_cli(kb_env, "import", str(_source(tmp_path)), "--workspace", "2")
    editor = tmp_path / "editor.sh"
    editor.write_text('#!/bin/sh\necho "edited" >> "$1"\n')
    editor.chmod(0o755)
    env = {**kb_env, "EDITOR": str(editor), "KB_FAULT_SIGNAL": "INT"}
    edited = run_cli({**env, "KB_FAULT_POINT": "before_pg_commit"}, "edit", "/documents/n2.md", "-w", "2", check=False)
    assert edited.returncode == 130, edited.stderr
    assert "Aborted!" not in edited.stderr and "Traceback" not in edited.stderr, edited.stderr
    assert "kb: interrupted, but `kb edit` had already landed: revision " in edited.stderr, edited.stderr
    landed = edited.stderr.split("revision ")[1].split()[0]
    assert run_cli(kb_env, "log", "-n", "1", "--workspace", "2").stdout.startswith(landed)
    assert "     4  edited\n" in run_cli(kb_env, "read", "/documents/n2.md", "--workspace", "2").stdout
    refused = run_cli({**env, "KB_FAULT_POINT": "draft_ready"}, "edit", "/documents/n1.md", "-w", "2", check=False)
    assert refused.returncode == 130, refused.stderr
    assert "kb: interrupted: `kb edit` did not land: nothing was recorded in workspace 2" in refused.stderr
    assert "edited" not in run_cli(kb_env, "read", "/documents/n1.md", "--workspace", "2").stdout


def test_a_ctrl_c_typed_in_the_editor_is_the_editors_not_the_end_of_kb_edit(kb_env, tmp_path):
    """design §5: the editor `kb edit` runs has the terminal, and a Ctrl-C typed there (vi leaves
    a command with it) reaches kb too: kb killed the editor and dropped the edit, exit 130. kb
    now leaves SIGINT and SIGQUIT to the editor while it runs, and the save is recorded."""
    run_cli(kb_env, "import", str(_source(tmp_path)), "--workspace", "2")
    editor = tmp_path / "editor.sh"  # as vi under a Ctrl-C: it handles the signal and goes on
    editor.write_text(
        '#!/bin/sh\ntrap "" INT QUIT\nkill -INT $PPID\nkill -QUIT $PPID\nsleep 0.5\necho "kept" >> "$1"\n'
    )
    editor.chmod(0o755)
    edited = run_cli({**kb_env, "EDITOR": str(editor)}, "edit", "/documents/n0.md", "-w", "2", check=False)
    assert edited.returncode == 0, edited.stderr
    assert "updated /documents/n0.md" in edited.stdout, edited.stdout
    assert "     4  kept\n" in run_cli(kb_env, "read", "/documents/n0.md", "--workspace", "2").stdout


def test_ctrl_c_before_a_write_began_says_no_revision_was_recorded(kb_env, tmp_path):
    """design §3: a Ctrl-C that came before a writing command's keyed write began (here `kb new`
    creating its first workspace) said the revision "may or may not have landed", pointing at a
    `kb log` of a workspace that might not exist; nothing can have been recorded then, and it says so."""
    interrupted = run_cli(
        {**kb_env, "KB_FAULT_POINT": "repository_init", "KB_FAULT_SIGNAL": "INT"},
        "new",
        "Plans",
        "--body",
        "x",
        "-w",
        "4",
        check=False,
    )
    assert interrupted.returncode == 130, interrupted.stderr
    assert "kb: interrupted before `kb new` began to write: no revision was recorded" in interrupted.stderr
    assert "may or may not" not in interrupted.stderr, interrupted.stderr


def test_ctrl_c_after_a_write_returned_says_it_finished():
    from kb.adapters.cli import interrupts
    from kb.adapters.cli.main import _interrupted

    try:
        interrupts.mark(interrupts.RECORDED)
        said = _interrupted("mv", ["/documents/a.md", "/documents/b.md", "-w", "2"])
    finally:
        interrupts.mark(interrupts.NOT_BEGUN)
    assert said.startswith("kb: interrupted after `kb mv` finished writing") and "--workspace 2" in said, said
