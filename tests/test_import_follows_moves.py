"""design §3 (identity follows a move): importing a folder again after ``kb mv`` moved one of its
documents updates that document where it is now. It used to add a second copy at the old path,
saying only "1 added" — with ``--prune`` it even moved the document back."""

from __future__ import annotations

from support.commands import run_cli


def _imported(kb_env, tmp_path, workspace: str):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n\nfirst\n")
    (notes / "b.md").write_text("# B\n")
    run_cli(kb_env, "import", str(notes), "--workspace", workspace, "--prefix", "Team")
    run_cli(kb_env, "mv", "/documents/Team/a.md", "/documents/Archive/a.md", "-w", workspace)
    return notes


def _documents(kb_env, workspace: str) -> str:
    return "".join(
        run_cli(kb_env, "ls", folder, "-w", workspace, check=False).stdout
        for folder in ("/documents/Team", "/documents/Archive")
    )


def test_an_import_after_kb_mv_updates_the_moved_document_not_a_copy_at_its_old_path(kb_env, tmp_path):
    notes = _imported(kb_env, tmp_path, "6")
    said = run_cli(kb_env, "import", str(notes), "--workspace", "6", "--prefix", "Team").stdout
    assert "no changes: 2 documents already up to date" in said, said
    assert "1 file unchanged where kb moved its document" in said and "imported /" not in said, said
    (notes / "a.md").write_text("# A\n\nsecond\n")
    for flags in ([], ["--prune"]):  # --prune keeps the moved document: its file is in the folder
        preview = run_cli(kb_env, "import", str(notes), "-w", "6", "--prefix", "Team", "--dry-run", *flags).stdout
        assert "0 to add, 1 to modify, 0 to move, 0 to remove, 1 unchanged" in preview, preview
        assert "would import /documents/Team/a.md at /documents/Archive/a.md" in preview, preview
    said = run_cli(kb_env, "import", str(notes), "--workspace", "6", "--prefix", "Team", "--prune").stdout
    assert "0 added, 1 modified, 0 moved, 0 removed, 1 unchanged" in said, said
    assert "imported /documents/Team/a.md at /documents/Archive/a.md: kb moved that document there since" in said
    listed = _documents(kb_env, "6")
    assert "Team/a.md" not in listed and "Archive/a.md" in listed, listed
    assert "second" in run_cli(kb_env, "read", "/documents/Archive/a.md", "-w", "6").stdout


def test_a_folder_holding_a_file_at_the_new_path_too_imports_the_old_name_as_its_own_document(kb_env, tmp_path):
    notes = _imported(kb_env, tmp_path, "7")
    run_cli(kb_env, "mv", "/documents/Archive/a.md", "/documents/Team/c.md", "-w", "7")
    (notes / "c.md").write_text("# C of the folder\n")  # the folder has its own file at the new path
    said = run_cli(kb_env, "import", str(notes), "--workspace", "7", "--prefix", "Team").stdout
    assert "1 added, 1 modified" in said and "kb moved" not in said, said
    assert "first" in run_cli(kb_env, "read", "/documents/Team/a.md", "-w", "7").stdout
    assert "C of the folder" in run_cli(kb_env, "read", "/documents/Team/c.md", "-w", "7").stdout


def test_a_document_moved_then_removed_in_kb_is_imported_again_at_its_folder_path(kb_env, tmp_path):
    notes = _imported(kb_env, tmp_path, "8")
    run_cli(kb_env, "rm", "/documents/Archive/a.md", "-w", "8")
    said = run_cli(kb_env, "import", str(notes), "--workspace", "8", "--prefix", "Team").stdout
    assert "1 added" in said and "kb moved" not in said, said
    assert "Team/a.md" in _documents(kb_env, "8")


def test_a_folder_file_differing_only_in_case_from_the_moved_documents_path_is_its_own(kb_env, tmp_path):
    """kb moved a.md to C.md and the folder has a c.md: that is the folder's file at C.md (the path
    law's names, design §2.2), so a.md is not followed there and --prune takes the folder as it is
    (C.md moved back to a.md by its bytes, c.md updating nothing of a.md's)."""
    notes = _imported(kb_env, tmp_path, "9")
    run_cli(kb_env, "mv", "/documents/Archive/a.md", "/documents/Team/C.md", "-w", "9")
    (notes / "c.md").write_text("# c of the folder\n")
    preview = run_cli(kb_env, "import", str(notes), "-w", "9", "--prefix", "Team", "--prune", "--dry-run").stdout
    assert "kb moved" not in preview, preview
    said = run_cli(kb_env, "import", str(notes), "-w", "9", "--prefix", "Team", "--prune").stdout
    assert "kb moved" not in said, said
    assert "first" in run_cli(kb_env, "read", "/documents/Team/a.md", "-w", "9").stdout
    assert "c of the folder" in run_cli(kb_env, "read", "/documents/Team/c.md", "-w", "9").stdout


def test_an_import_after_a_case_only_kb_mv_updates_the_document_at_its_new_case(kb_env, tmp_path):
    notes = _imported(kb_env, tmp_path, "10")
    run_cli(kb_env, "mv", "/documents/Archive/a.md", "/documents/Team/A.md", "-w", "10")
    (notes / "a.md").write_text("# A\n\nsecond\n")
    said = run_cli(kb_env, "import", str(notes), "-w", "10", "--prefix", "Team", "--prune").stdout
    assert "0 added, 1 modified, 0 moved, 0 removed, 1 unchanged" in said, said
    assert "imported /documents/Team/a.md at /documents/Team/A.md" in said, said
    assert "second" in run_cli(kb_env, "read", "/documents/Team/A.md", "-w", "10").stdout
