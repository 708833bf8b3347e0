"""A storage root that holds no knowledge base (design §2.1, §13): a command that only reads
refuses, naming the folder and how to create one, instead of starting a new, empty embedded
Postgres there; the commands that create (``kb import``, ``kb init``, …) still create it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from support.commands import run_cli

from kb.db.database import stop_embedded

READS = [
    ["status"],
    ["search", "refund", "-w", "1"],
    ["read", "/documents/a.md", "-w", "1"],
    ["log", "-w", "1"],
    ["ls", "/documents", "-w", "1"],
    ["workspaces"],
    ["db-url"],
    ["psql", "-c", "SELECT 1"],
]


@pytest.fixture
def storage_root():
    """A storage root (not yet made) whose embedded server is stopped after the test. Outside
    pytest's tmp_path, as in tests/test_embedded_server.py (the server's OS user must reach it)."""
    root = Path(tempfile.mkdtemp(prefix="kbroot-"))
    yield root / "storage"
    stop_embedded(root / "storage" / "postgres")
    shutil.rmtree(root, ignore_errors=True)


def _embedded_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KB_")}
    env.update(KB_STORAGE_ROOT=str(root), KB_EMBEDDING_MODEL="hashing")
    return env


def _refused(result, root: Path) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and not result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith("kb: error: ") and str(root) in line and "no knowledge base" in line, line
    assert "kb import" in line and "kb init" in line and "KB_STORAGE_ROOT" in line, line
    return line


@pytest.mark.postgres  # the import starts its own embedded Postgres
def test_reads_refuse_a_storage_root_without_a_knowledge_base_and_import_creates_one(storage_root, tmp_path):
    env = _embedded_env(storage_root)
    for command in READS:
        line = _refused(run_cli(env, *command, check=False), storage_root)
        assert "does not exist" in line, line
    assert not storage_root.exists()  # a read creates nothing

    # A folder that exists but holds no kb (the user's notes, say) is refused as well.
    storage_root.mkdir()
    line = _refused(run_cli(env, "status", check=False), storage_root)
    assert "no embedded database" in line, line
    assert sorted(storage_root.iterdir()) == []

    # The README's first command still creates the knowledge base from nothing.
    shutil.rmtree(storage_root)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n\nrefund policy\n")
    first = run_cli(env, "import", str(notes), "--workspace", "1")
    # and says so, with where: a forgotten KB_STORAGE_ROOT otherwise shows only "created workspace"
    assert f"started a new knowledge base at {storage_root}" in first.stderr, first.stderr
    assert "1" in run_cli(env, "workspaces").stdout
    assert "refund policy" in run_cli(env, "read", "/documents/a.md", "-w", "1").stdout
    again = run_cli(env, "new", "/documents/b.md", "-w", "1", "--body", "# B\n")
    assert "new knowledge base" not in again.stderr, again.stderr


def test_with_a_configured_database_a_missing_storage_root_is_named_not_the_workspace(kb_env, tmp_path):
    """With KB_DATABASE_URL the knowledge base is that server's, so reads of Postgres still answer;
    a workspace whose repository is missing because the storage root itself does not exist says
    so (it used to say the workspace does not exist and to `kb import` it)."""
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n\nrefund policy\n")
    run_cli(kb_env, "import", str(notes), "--workspace", "1")
    typo = tmp_path / "typo"
    env = {**kb_env, "KB_STORAGE_ROOT": str(typo)}
    for command in READS[1:5]:
        result = run_cli(env, *command, check=False)
        assert result.returncode == 1, (result.stdout, result.stderr)
        line = result.stderr.strip()
        assert line.startswith("kb: error: ") and "\n" not in line, result.stderr
        assert f"storage root {typo} does not exist" in line and "KB_STORAGE_ROOT" in line, line
        assert "kb import" not in line, line
    assert not typo.exists()  # a read creates nothing

    # Another node's process (KB_NODE) is told where the workspace lives, and creates nothing either.
    result = run_cli({**env, "KB_NODE": "elsewhere"}, "log", "-w", "1", check=False)
    assert result.returncode == 1 and "is homed on node" in result.stderr, result.stderr
    assert not typo.exists()


@pytest.mark.postgres  # kb init starts its own embedded Postgres
def test_with_a_server_url_a_write_never_starts_a_private_knowledge_base(storage_root, tmp_path):
    """KB_SERVER_URL set on a machine holding no knowledge base: ``kb new`` started a new embedded
    Postgres under the storage root, created the workspace there and exited 0 with a note — the
    user's document landed where nobody who uses the server sees it. The commands that would start
    one are refused (exit 1, one line naming KB_SERVER_URL, the storage root and what to do) and
    create nothing; ``kb init``, asked for by name, still creates one."""
    env = {**_embedded_env(storage_root), "KB_SERVER_URL": "http://127.0.0.1:9", "KB_TOKEN": "kb_x"}
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n")
    for command in (
        ["new", "Meeting notes", "-w", "2", "--body", "hello"],
        ["import", str(notes), "-w", "2"],
        ["token", "create", "--name", "someone", "--scope", "read", "--all-workspaces"],
    ):
        result = run_cli(env, *command, check=False)
        assert result.returncode == 1 and not result.stdout, (command, result.stdout, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("kb: error: "), (command, result.stderr)
        assert "KB_SERVER_URL" in lines[0] and str(storage_root) in lines[0] and "nothing was written" in lines[0]
        assert not storage_root.exists(), command  # no embedded server was started
    created = run_cli(env, "init")
    assert "Traceback" not in created.stderr and (storage_root / "postgres").is_dir(), created.stderr
