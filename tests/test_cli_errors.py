"""Every command exits non-zero with a one-line reason on bad input, never a traceback (design §3)."""

from __future__ import annotations

import pytest
from support.commands import run_cli


def _one_line_error(result) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_unknown_workspace(kb, kb_env):
    line = _one_line_error(run_cli(kb_env, "search", "anything", "--workspace", "42", check=False))
    assert "workspace 42 does not exist" in line and "kb import" in line
    line = _one_line_error(run_cli(kb_env, "log", "--workspace", "42", check=False))
    assert "workspace 42" in line


def test_missing_import_path(kb, kb_env, tmp_path):
    line = _one_line_error(run_cli(kb_env, "import", str(tmp_path / "nope"), "--workspace", "1", check=False))
    assert "does not exist" in line
    afile = tmp_path / "file.md"
    afile.write_text("x")
    line = _one_line_error(run_cli(kb_env, "import", str(afile), "--workspace", "1", check=False))
    assert "is not a folder" in line


@pytest.mark.parametrize("bad", ["0", "-3", "abc", str(2**31), str(2**63)])
@pytest.mark.parametrize("command", [["status"], ["import", "."], ["search", "x"]])
def test_bad_workspace_id(kb_env, bad, command):
    """Out of range includes past Postgres' integer (kb.workspaces.id): it used to reach the
    server and come back as "unexpected error: NumericValueOutOfRange"."""
    result = run_cli(kb_env, *command, "--workspace", bad, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "unexpected" not in result.stderr
    assert "--workspace" in result.stderr


def test_unreachable_database(kb_env, tmp_path):
    env = {**kb_env, "KB_DATABASE_URL": f"postgresql://nobody@/kb?host={tmp_path}&port=5999&connect_timeout=2"}
    line = _one_line_error(run_cli(env, "status", check=False))
    assert "cannot connect to Postgres" in line and "KB_DATABASE_URL" in line


def test_read_missing_document_and_bad_path(kb, kb_env, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("a")
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    line = _one_line_error(run_cli(kb_env, "read", "/documents/b.md", "--workspace", "1", check=False))
    assert "no document at '/documents/b.md'" in line  # the path as the user wrote it
    line = _one_line_error(run_cli(kb_env, "read", "/documents/../etc/passwd", "--workspace", "1", check=False))
    assert "invalid path" in line
    line = _one_line_error(
        run_cli(kb_env, "read", "/documents/a.md", "--workspace", "1", "--revision", "deadbeef", check=False)
    )
    assert "revision" in line


def test_db_url_and_psql(kb, kb_env):
    assert run_cli(kb_env, "db-url").stdout.strip() == kb_env["KB_DATABASE_URL"]
    result = run_cli(kb_env, "psql", "-tA", "-c", "SELECT count(*) FROM kb.schema_migrations")
    assert int(result.stdout.strip()) >= 2


def test_messages_say_what_to_type_instead(kb, kb_env, tmp_path):
    """A query read as options, a path without /documents and an unknown chat handle each name
    the command or path that works (found by a new user following the README)."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "faq.md").write_text("# FAQ\n\nanswers\n")
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    result = run_cli(kb_env, "search", "-rf flag", "--workspace", "1", check=False)
    assert result.returncode == 2 and 'goes after "--": kb search -w 1 -- "-rf flag"' in result.stderr
    typo = run_cli(kb_env, "search", "faq", "--workspce", "1", check=False)  # no query hint for a typo
    assert typo.returncode == 2 and "Did you mean '--workspace'?" in typo.stderr and "goes after" not in typo.stderr
    line = _one_line_error(run_cli(kb_env, "read", "faq.md", "--workspace", "1", check=False))
    assert "did you mean '/documents/faq.md'?" in line
    line = _one_line_error(
        run_cli(kb_env, "cite", "resolve", "[9:L1-L2]", "--chat", "c1", "--workspace", "1", check=False)
    )
    assert "kb cite list --chat c1 --workspace 1" in line


def _alpha_and_sub(tmp_path, kb_env) -> None:
    """Workspace 1 holding /documents/Alpha.md (4 lines) and /documents/Sub/Beta.md."""
    notes = tmp_path / "notes"
    (notes / "Sub").mkdir(parents=True)
    (notes / "Alpha.md").write_text("# Alpha\n\nline three\nline four\n")
    (notes / "Sub" / "Beta.md").write_text("beta\n")
    run_cli(kb_env, "import", str(notes), "--workspace", "1")


def test_read_of_a_folder_or_another_letter_case_says_what_to_type(kb, kb_env, tmp_path):
    """A new user's `kb read` of a folder, or of a path spelled in another case, got a bare "no
    document at …": a folder is IsAFolder naming the `kb ls` that lists it; a case slip names the
    document that is there, whichever segment it is in."""
    from kb.errors import DocumentNotFound, IsAFolder

    _alpha_and_sub(tmp_path, kb_env)
    line = _one_line_error(run_cli(kb_env, "read", "/documents/Sub", "--workspace", "1", check=False))
    assert (
        line
        == "kb: error: /documents/Sub is a folder, not a document; list it with `kb ls /documents/Sub --workspace 1`"
    )
    line = _one_line_error(run_cli(kb_env, "read", "/documents/alpha.md", "--workspace", "1", check=False))
    assert "no document at '/documents/alpha.md'" in line and line.endswith("; did you mean '/documents/Alpha.md'?")
    line = _one_line_error(run_cli(kb_env, "read", "/documents/SUB/beta.md", "-w", "1", "--chat", "c1", check=False))
    assert line.endswith("; did you mean '/documents/Sub/Beta.md'?")
    line = _one_line_error(run_cli(kb_env, "read", "/documents/Sub/Gamma.md", "--workspace", "1", check=False))
    assert line.endswith("; `kb ls /documents/Sub --workspace 1` lists what is there")
    with pytest.raises(IsAFolder, match="kb ls /documents/Sub"):  # the Python API says the same
        kb.read_document(1, "/documents/Sub")
    with pytest.raises(DocumentNotFound, match=r"did you mean '/documents/Alpha.md'\?"):
        kb.read(1, "/documents/ALPHA.md")


def test_read_hints_lead_to_a_path_that_reads(kb, kb_env, tmp_path):
    """A new user's slips each got a hint that failed again when followed: a folder in another case
    was suggested as if a document, a name without .md got no hint, and the /documents root said
    only that it is not a document path. Each now names what works."""
    from kb.errors import DocumentNotFound, InvalidPath

    _alpha_and_sub(tmp_path, kb_env)
    line = _one_line_error(run_cli(kb_env, "read", "/documents/sub", "-w", "1", check=False))
    assert line.endswith("; '/documents/Sub' is a folder: `kb ls /documents/Sub --workspace 1` lists it")
    line = _one_line_error(run_cli(kb_env, "read", "/documents/Alpha", "-w", "1", check=False))
    assert line.endswith("; did you mean '/documents/Alpha.md'?")
    line = _one_line_error(run_cli(kb_env, "read", "/documents/sub/beta", "-w", "1", check=False))
    assert line.endswith("; did you mean '/documents/Sub/Beta.md'?")
    line = _one_line_error(run_cli(kb_env, "read", "/documents", "-w", "1", check=False))
    assert line.endswith("the /documents root is a folder, not a document; `kb ls` lists it")
    with pytest.raises(DocumentNotFound, match=r"did you mean '/documents/Sub/Beta.md'\?"):
        kb.ls(1, "/documents/Sub/Beta")
    with pytest.raises(InvalidPath, match="kb ls"):
        kb.read(1, "/documents/")


def test_read_offset_past_the_end_is_an_error_naming_the_line_count(kb, kb_env, tmp_path):
    """`kb read --offset N` past the end printed an empty envelope and exited 0. Now the CLI, with
    or without a chat, the facade's window, the conversation and a turn all refuse it alike; an
    offset equal to the line count is the end (an empty window), as a pager's last page."""
    from kb.errors import InvalidInput, OffsetOutOfRange

    _alpha_and_sub(tmp_path, kb_env)
    expected = (
        "kb: error: offset 10 is past the end of /documents/Alpha.md: it has 4 lines; "
        "offset 3 shows its last line (an offset counts the lines skipped)"
    )
    for chat in ([], ["--chat", "c1"]):
        result = run_cli(kb_env, "read", "/documents/Alpha.md", "-w", "1", "--offset", "10", *chat, check=False)
        assert _one_line_error(result) == expected and result.stdout == ""
    end = run_cli(kb_env, "read", "/documents/Alpha.md", "-w", "1", "--offset", "4").stdout
    assert 'lines="none" of="4"' in end
    assert issubclass(OffsetOutOfRange, InvalidInput)
    with pytest.raises(OffsetOutOfRange, match="it has 4 lines"):
        kb.read_document(1, "/documents/Alpha.md").window(5)
    conversation = kb.conversation(1, "c2")
    with pytest.raises(OffsetOutOfRange, match="it has 4 lines"):
        conversation.read("/documents/Alpha.md", offset=5, limit=2)
    assert conversation.handles() == []  # nothing shown, nothing registered
    turn = kb.turn(1, "t-offset")
    with pytest.raises(OffsetOutOfRange, match="it has 4 lines"):
        turn.read("/documents/Alpha.md", offset=5)
    assert turn.read("/documents/Alpha.md", offset=4).lines == []
    turn.abort()


def test_log_of_a_path_with_no_history_says_so(kb, kb_env):
    """``kb log PATH`` for a folder or a path no document ever had printed nothing at all; it says
    why on stderr and where to look (design §3)."""
    kb.create_workspace(3)
    with kb.transaction(3, "notes", "t") as tx:
        tx.write("/documents/Notes/a.md", "a\n")
    for path in ("/documents/Notes", "/documents/Nope.md"):
        result = run_cli(kb_env, "log", "-w", "3", path)
        assert result.stdout == "" and f"no revision changed a document at {path}" in result.stderr
        assert "kb ls" in result.stderr and "no document was ever there" not in result.stderr  # a folder has some
    assert "notes" in run_cli(kb_env, "log", "-w", "3", "/documents/Notes/a.md").stdout


def test_settings_typos_and_an_absent_server_are_told_in_one_line(kb, kb_env, tmp_path):
    """A KB_DATABASE_URL that is not a URL was "unexpected error: ProgrammingError …" over two
    lines (exit 2); an unreachable KB_SERVER_URL showed urllib's ``<urlopen error [Errno 111] …>``.
    Both now say what is wrong and what to do, on one line."""
    typo = run_cli({**kb_env, "KB_DATABASE_URL": "not a url"}, "status", check=False)
    assert typo.returncode == 1 and "unexpected" not in typo.stderr
    assert typo.stderr.strip().startswith("kb: error: the database URL is not a Postgres URL")
    assert "KB_DATABASE_URL" in typo.stderr and len(typo.stderr.strip().splitlines()) == 1, typo.stderr
    import socket

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    away = run_cli({**kb_env, "KB_SERVER_URL": f"http://127.0.0.1:{port}"}, "search", "x", "-w", "1", check=False)
    assert away.returncode == 1 and "urlopen" not in away.stderr and "Errno" not in away.stderr, away.stderr
    assert "did not answer (Connection refused)" in away.stderr, away.stderr


def test_moving_a_document_onto_a_folder_says_how_to_move_it_into_it(kb, kb_env):
    """`kb mv FILE FOLDER` told the user to "remove the folder first" — advice that deletes data.
    It now says to name the document in full inside the folder."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/a.md", "a\n")
        tx.write("/documents/Notes/b.md", "b\n")
    moved = run_cli(kb_env, "mv", "/documents/a.md", "/documents/Notes", "-w", "1", check=False)
    assert moved.returncode == 1 and "remove the folder" not in moved.stderr, moved.stderr
    assert "/documents/Notes/NAME.md" in moved.stderr, moved.stderr


def test_edit_failures_are_reported_as_every_other_kb_error(kb, kb_env, tmp_path):
    """An editor that is missing or fails is a kb error like any other (one line, ``kb: error:``),
    not click's ``Error:``; nothing is recorded."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("a\n")
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    head = run_cli(kb_env, "log", "--workspace", "1").stdout
    missing = str(tmp_path / "no-such-editor")
    unrunnable = tmp_path / "not-executable.sh"
    unrunnable.write_text("#!/bin/sh\n")
    for editor, said in [
        ("false", "exited with status 1; nothing was recorded"),
        (missing, "not found; set EDITOR"),
        # these ended in "kb: unexpected error: PermissionError" / "ValueError"
        (str(unrunnable), "cannot be run (Permission denied); set EDITOR"),
        (str(tmp_path), "cannot be run (Permission denied); set EDITOR"),
        ('nano "a.md', "cannot be read as a command (No closing quotation); fix EDITOR"),
        # it said "exited with status -15"
        ("sh -c 'kill -TERM $$'", "was ended by SIGTERM; nothing was recorded"),
    ]:
        env = {**kb_env, "EDITOR": editor}
        line = _one_line_error(run_cli(env, "edit", "/documents/a.md", "--workspace", "1", check=False))
        assert line.startswith("kb: error: editor ") and said in line, line
    assert run_cli(kb_env, "log", "--workspace", "1").stdout == head
    # a blank EDITOR is unset (VISUAL is used): split, it named no program and kb ran the document
    blank = run_cli({**kb_env, "EDITOR": "  ", "VISUAL": "true"}, "edit", "/documents/a.md", "-w", "1", check=False)
    assert blank.returncode == 0 and "no changes; nothing recorded" in blank.stdout, blank.stderr
    # a folder: the command that lists it, as `kb read` names it ("ls lists what it holds" named none)
    (notes / "Notes").mkdir()
    (notes / "Notes" / "b.md").write_text("b\n")
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    line = _one_line_error(run_cli(kb_env, "edit", "/documents/Notes", "--workspace", "1", check=False))
    assert "`kb ls /documents/Notes --workspace 1` lists what it holds" in line, line


def test_log_says_when_more_revisions_exist_than_it_shows(kb, kb_env):
    """`kb log -w 2` stopped at its default of 20 revisions without a word: after 40 writes a new
    user thought 20 were lost. When the limit cuts the listing a note on stderr says so and gives
    the command showing them all (-n 0); `kb log PATH` the same. Nothing is said when all fit."""
    kb.create_workspace(2)
    for i in range(4):
        with kb.transaction(2, f"write {i}", "t") as tx:
            tx.write("/documents/Team/Plan.md", f"{i}\n")
    for path in ((), ("/documents/Team/Plan.md",)):
        cut = run_cli(kb_env, "log", *path, "-w", "2", "-n", "3")
        assert cut.stdout.count("write ") == 3 and "write 0" not in cut.stdout
        wanted = f"`kb log {path[0] + ' ' if path else ''}--workspace 2 -n 0` shows them all"
        assert cut.stderr.startswith("note: more revisions exist than the 3 shown") and wanted in cut.stderr
        assert len(cut.stderr.splitlines()) == 1, cut.stderr
        every = run_cli(kb_env, "log", *path, "-w", "2", "-n", "0")
        assert every.stdout.count("write ") == 4 and every.stderr == ""
        assert run_cli(kb_env, "log", *path, "-w", "2", "-n", "4").stderr == ""  # exactly the limit: all shown


def test_log_of_a_path_with_no_history_suggests_commands_in_its_workspace(kb, kb_env):
    """`kb log /documents/Team/Nope.md -w 2` suggested `kb ls …` without --workspace, which fails
    (or lists workspace 1's): the commands it suggests carry the workspace given."""
    kb.create_workspace(2)
    with kb.transaction(2, "notes", "t") as tx:
        tx.write("/documents/Team/a.md", "a\n")
    said = run_cli(kb_env, "log", "/documents/Team/Nope.md", "-w", "2").stderr
    assert "`kb ls /documents/Team/Nope.md --workspace 2` lists them" in said, said
    assert "`kb log --workspace 2` alone shows every revision" in said, said


def test_a_document_under_a_document_is_refused_with_virtual_paths(kb, kb_env):
    """`kb new /documents/Team/Onboarding.md x` said "cannot place documents/Team/Onboarding.md/x.md":
    the repository's spelling of the path, which no command takes. Messages show /documents/…"""
    kb.create_workspace(2)
    with kb.transaction(2, "seed", "t") as tx:
        tx.write("/documents/Team/Onboarding.md", "a\n")
    line = _one_line_error(run_cli(kb_env, "new", "/documents/Team/Onboarding.md", "x", "-w", "2", check=False))
    assert line.startswith("kb: error: cannot place /documents/Team/Onboarding.md/x.md: "), line
    assert "/documents/Team/Onboarding.md is a document, not a folder" in line, line


def test_removing_the_root_says_it_cannot_be_removed(kb, kb_env):
    """`kb rm /documents` said "the /documents root is a folder, not a document" — yet rm takes
    folders. It says the root itself cannot be removed and how to remove what it holds; nothing is."""
    kb.create_workspace(2)
    with kb.transaction(2, "seed", "t") as tx:
        tx.write("/documents/Team/a.md", "a\n")
    for root in ("/documents", "/documents/"):
        line = _one_line_error(run_cli(kb_env, "rm", root, "-w", "2", check=False))
        assert "not a document" not in line and "the /documents root cannot be removed" in line, line
        assert "`kb ls /documents --workspace 2` lists them" in line, line
    assert [e.path for e in kb.ls(2, "/documents/Team")] == ["/documents/Team/a.md"]
