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
    assert "would add /documents/Team/added.md" in said and "would modify /documents/Team/edit.md" in said, said
    assert git(repo, "rev-parse", "HEAD").strip() == head  # nothing recorded
    assert "gone.md" in run_cli(kb_env, "ls", "/documents/Team", "-w", "3").stdout
    done = run_cli(kb_env, "import", str(notes), "--workspace", "3", "--prefix", "Team", "--prune").stdout
    assert "1 added, 1 modified, 1 moved, 1 removed, 1 unchanged" in done, done  # what the dry run said


def test_a_dry_run_of_a_first_import_creates_no_workspace(kb_env, tmp_path):
    notes = _notes(tmp_path)
    (notes / "CON.md").write_text("# A name Windows reserves\n")
    said = run_cli(kb_env, "import", str(notes), "--workspace", "4", "--dry-run").stdout
    assert "5 found, 5 to add" in said and "would add /documents/keep.md" in said, said
    # the names the path law would change, said before anything is recorded (as the import says them)
    assert "1 name would be made safe for every OS (CON.md -> /documents/CON_.md)" in said, said
    assert not (tmp_path / "storage" / "knowledge_store" / "4").exists()
    missing = run_cli(kb_env, "ls", "-w", "4", check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stderr, missing.stderr


def test_a_dry_run_refuses_what_the_import_would_refuse(kb_env, tmp_path):
    """A dry run stages the import as the import does: a file renamed only by case without
    --prune (the draft refuses the second spelling, design §2.2) and a file written over an
    ARTIFACT document (design §11) fail the dry run with the import's own error, not '1 to add'."""
    notes = _notes(tmp_path)
    run_cli(kb_env, "import", str(notes), "--workspace", "5")
    (notes / "keep.md").rename(notes / "Keep.md")
    real = run_cli(kb_env, "import", str(notes), "--workspace", "5", check=False)
    dry = run_cli(kb_env, "import", str(notes), "--workspace", "5", "--dry-run", check=False)
    assert real.returncode == 1 and "differs only in case" in real.stderr, real.stderr
    assert dry.returncode == 1 and dry.stderr == real.stderr, (dry.stdout, dry.stderr)
    (notes / "Keep.md").rename(notes / "keep.md")
    report = tmp_path / "report.md"
    report.write_text("# Report\n")
    run_cli(kb_env, "artifact", "save", str(report), "--title", "Report", "-w", "5")
    (notes / "Artifacts").mkdir()
    (notes / "Artifacts" / "Report.md").write_text("# Report, edited in the folder\n")
    importing = ("import", str(notes), "--workspace", "5")
    real = run_cli(kb_env, *importing, check=False)
    dry = run_cli(kb_env, *importing, "--dry-run", check=False)
    assert real.returncode == 1 and "is an ARTIFACT" in real.stderr, real.stderr
    assert dry.returncode == 1 and "/documents/Artifacts/Report.md is an ARTIFACT" in dry.stderr, (
        dry.stdout,
        dry.stderr,
    )


def test_prune_leaves_the_artifacts_an_application_saved_and_says_so(kb_env, tmp_path):
    """design §11: ``--prune`` refused the whole import when the workspace held an ARTIFACT
    document the folder lacks — which is every artifact (an application saves them, no folder
    has them), so a workspace with one could never be pruned. Prune now leaves artifacts, names
    each it kept, and removes the rest."""
    notes = _notes(tmp_path)
    run_cli(kb_env, "import", str(notes), "--workspace", "9")
    report = tmp_path / "report.md"
    report.write_text("# Report\n")
    run_cli(kb_env, "artifact", "save", str(report), "--title", "Report", "-w", "9")
    (notes / "gone.md").unlink()
    pruning = ("import", str(notes), "--workspace", "9", "--prune")
    dry = run_cli(kb_env, *pruning, "--dry-run").stdout
    assert "1 to remove" in dry and "would remove /documents/gone.md" in dry, dry
    assert "kept /documents/Artifacts/Report.md: an ARTIFACT (id " in dry, dry
    done = run_cli(kb_env, *pruning).stdout
    assert "1 removed" in done and "kept /documents/Artifacts/Report.md: an ARTIFACT" in done, done
    assert "`kb artifact delete " in done, done
    assert "Report" in run_cli(kb_env, "read", "/documents/Artifacts/Report.md", "-w", "9").stdout
    assert "gone.md" not in run_cli(kb_env, "ls", "/documents", "-w", "9").stdout
