"""Every command exits non-zero with a one-line reason on bad input, never a traceback (issue 2)."""

from __future__ import annotations

import os

import pytest
from conftest import run_cli


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
    line = _one_line_error(run_cli(kb_env, "read", "/documents/a.md", "--workspace", "1", "--revision", "deadbeef", check=False))
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
    line = _one_line_error(run_cli(kb_env, "read", "faq.md", "--workspace", "1", check=False))
    assert "did you mean '/documents/faq.md'?" in line
    line = _one_line_error(run_cli(kb_env, "cite", "resolve", "[9:L1-L2]", "--chat", "c1", "--workspace", "1",
                                   check=False))
    assert "kb cite list --chat c1 --workspace 1" in line
