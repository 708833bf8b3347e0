"""design §3: ``kb import --prune`` removes every document under the prefix that the folder no
longer has, and said so only once done (a new user lost 70 documents to it, brought back by
``kb revert``). ``--dry-run`` says first what an import would add, modify, move and remove, and
records nothing — not even the workspace of a first import."""

from __future__ import annotations

from support.commands import git, run_cli


def _notes(tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    for name, text in {
        "keep.md": "# Keep\n",
        "edit.md": "# Edit\n",
        "gone.md": "# Gone\n",
        "old.md": "# Moved\n",
    }.items():
        (notes / name).write_text(text)
    return notes


def test_a_dry_run_says_what_an_import_with_prune_would_do_and_records_nothing(kb_env, tmp_path):
    notes = _notes(tmp_path)
    run_cli(kb_env, "import", str(notes), "--workspace", "3", "--prefix", "Team")
    repo = tmp_path / "storage" / "knowledge_store" / "3"
    head = git(repo, "rev-parse", "HEAD").strip()
    (notes / "edit.md").write_text("# Edit\n\nchanged\n")
    (notes / "gone.md").unlink()
    (notes / "old.md").rename(notes / "new.md")  # same bytes: a move under --prune
    (notes / "added.md").write_text("# Added\n")
    said = run_cli(kb_env, "import", str(notes), "--workspace", "3", "--prefix", "Team", "--prune", "--dry-run").stdout
    assert "dry run: nothing recorded in workspace 3" in said, said
    assert "4 found, 1 to add, 1 to modify, 1 to move, 1 to remove, 1 unchanged" in said, said
    assert "would move /documents/Team/old.md → /documents/Team/new.md" in said, said
    assert "would remove /documents/Team/gone.md: not in the folder (--prune)" in said, said
    assert git(repo, "rev-parse", "HEAD").strip() == head  # nothing recorded
    assert "gone.md" in run_cli(kb_env, "ls", "/documents/Team", "-w", "3").stdout
    done = run_cli(kb_env, "import", str(notes), "--workspace", "3", "--prefix", "Team", "--prune").stdout
    assert "1 added, 1 modified, 1 moved, 1 removed, 1 unchanged" in done, done  # what the dry run said


def test_a_dry_run_of_a_first_import_creates_no_workspace(kb_env, tmp_path):
    said = run_cli(kb_env, "import", str(_notes(tmp_path)), "--workspace", "4", "--dry-run").stdout
    assert "4 found, 4 to add" in said, said
    assert not (tmp_path / "storage" / "knowledge_store" / "4").exists()
    missing = run_cli(kb_env, "ls", "-w", "4", check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stderr, missing.stderr


def test_a_dry_run_refuses_what_the_import_would_refuse(kb_env, tmp_path):
    """A dry run stages the import as the import does: a file renamed only by case without
    --prune (the draft refuses the second spelling, design §2.2) and an ARTIFACT document --prune
    would remove (design §11) fail the dry run with the import's own error, not '1 to add'."""
    notes = _notes(tmp_path)
    run_cli(kb_env, "import", str(notes), "--workspace", "5")
    (notes / "keep.md").rename(notes / "Keep.md")
    real = run_cli(kb_env, "import", str(notes), "--workspace", "5", check=False)
    dry = run_cli(kb_env, "import", str(notes), "--workspace", "5", "--dry-run", check=False)
    assert real.returncode == 1 and "differs only in case" in real.stderr, real.stderr
    assert dry.returncode == 1 and dry.stderr == real.stderr, (dry.stdout, dry.stderr)
    report = tmp_path / "report.md"
    report.write_text("# Report\n")
    run_cli(kb_env, "artifact", "save", str(report), "--title", "Report", "-w", "5")
    pruning = ("import", str(notes), "--workspace", "5", "--prune")
    real = run_cli(kb_env, *pruning, check=False)
    dry = run_cli(kb_env, *pruning, "--dry-run", check=False)
    assert real.returncode == 1 and "is an ARTIFACT" in real.stderr, real.stderr
    assert dry.returncode == 1 and "/documents/Artifacts/Report.md is an ARTIFACT" in dry.stderr, (
        dry.stdout,
        dry.stderr,
    )
