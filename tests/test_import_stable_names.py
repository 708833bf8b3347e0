"""design §2.2 (path law, collisions) and §3 (identity): the names ``kb import`` gives stay the
same across imports of a changing folder. ``a:b.md`` and ``a_b.md`` both map to ``a_b.md``; the
second took ``a_b (2).md``. With ``a:b.md`` gone from the folder, an import with ``--prune`` gave
``a_b.md`` to the file that remained: the colon file's document took the other file's text and
the document of the file still in the folder was removed — history, citations and document ids
pointing at the wrong document."""

from __future__ import annotations

import json

from support.commands import run_cli

COLON, UNDER, QUESTION = "# colon\n", "# under\n", "# question\n"


def _documents(kb_env, workspace: str, folder: str = "/documents/Edge") -> dict[str, str]:
    """``{path: text}`` of every document under ``folder``."""
    found: dict[str, str] = {}
    for entry in json.loads(run_cli(kb_env, "ls", folder, "-w", workspace, "--json").stdout):
        if entry["kind"] == "folder":
            found |= _documents(kb_env, workspace, entry["path"].rstrip("/"))
        else:
            read = json.loads(run_cli(kb_env, "read", entry["path"], "-w", workspace, "--json").stdout)
            found[entry["path"]] = "\n".join(text for _, text in read["lines"])
    return found


def _import(kb_env, edge, workspace: str, *flags: str) -> str:
    return run_cli(kb_env, "import", str(edge), "-w", workspace, "--prefix", "Edge", *flags).stdout


def _where(documents: dict[str, str]) -> dict[str, str]:
    """``{text: path}`` (the texts of a test are distinct)."""
    return {text.strip(): path for path, text in documents.items()}


def _folder(tmp_path, files: dict[str, str]):
    edge = tmp_path / "edge"
    for name, text in files.items():
        (edge / name).parent.mkdir(parents=True, exist_ok=True)
        (edge / name).write_text(text)
    return edge


def _remove_one_and_prune(kb_env, tmp_path, workspace: str, files: dict[str, str], gone: str) -> None:
    """Import ``files``, remove ``gone`` from the folder, import with ``--prune`` (dry run first):
    only ``gone``'s document is removed, every other document keeps its path and text."""
    edge = _folder(tmp_path, files)
    _import(kb_env, edge, workspace)
    before = _where(_documents(kb_env, workspace))
    assert len(before) == len(files), before
    (edge / gone).unlink()
    removed = before[files[gone].strip()]
    preview = _import(kb_env, edge, workspace, "--prune", "--dry-run")
    kept = len(files) - 1
    assert f"0 to add, 0 to modify, 0 to move, 1 to remove, {kept} unchanged" in preview, preview
    assert f"would remove {removed}: not in the folder" in preview, preview
    said = _import(kb_env, edge, workspace, "--prune")
    assert f"0 added, 0 modified, 0 moved, 1 removed, {kept} unchanged" in said, said
    assert f"removed {removed}: not in the folder" in said, said
    after = _where(_documents(kb_env, workspace))
    assert after == {text: path for text, path in before.items() if path != removed}, (before, after)
    assert "no changes" in _import(kb_env, edge, workspace, "--prune")  # and it stays so


def test_the_file_left_in_the_folder_keeps_its_document_when_the_colliding_one_goes(kb_env, tmp_path):
    _remove_one_and_prune(kb_env, tmp_path, "6", {"a:b.md": COLON, "a_b.md": UNDER}, "a:b.md")


def test_the_renamed_file_keeps_its_document_when_the_file_of_that_name_goes(kb_env, tmp_path):
    _remove_one_and_prune(kb_env, tmp_path, "7", {"a:b.md": COLON, "a_b.md": UNDER}, "a_b.md")


def test_three_files_on_one_safe_name_keep_their_documents_whichever_goes(kb_env, tmp_path):
    files = {"a:b.md": COLON, "a?b.md": QUESTION, "a_b.md": UNDER}
    for workspace, gone in zip(("8", "9", "10"), files):
        _remove_one_and_prune(kb_env, tmp_path / gone.replace(":", "c").replace("?", "q"), workspace, files, gone)


def test_colliding_folders_keep_their_paths_when_one_goes(kb_env, tmp_path):
    files = {"x:y/n.md": COLON, "x_y/n.md": UNDER, "x_y/m.md": QUESTION}
    _remove_one_and_prune(kb_env, tmp_path / "colon", "11", files, "x:y/n.md")
    files = {"x:y/n.md": COLON, "x:y/m.md": QUESTION, "x_y/n.md": UNDER}
    _remove_one_and_prune(kb_env, tmp_path / "under", "12", files, "x_y/n.md")


def _edit_and_import(kb_env, edge, workspace: str, edited: list[str], kept: dict[str, str]) -> None:
    """Edit the files ``edited`` and import: each modifies its own document, ``kept``
    (``{text: path}``), and no two documents swap texts."""
    for name in edited:
        (edge / name).write_text((edge / name).read_text() + "edited\n")
    modified, unchanged = len(edited), len(kept) - len(edited)
    preview = _import(kb_env, edge, workspace, "--prune", "--dry-run")
    assert f"0 to add, {modified} to modify, 0 to move, 0 to remove, {unchanged} unchanged" in preview, preview
    said = _import(kb_env, edge, workspace, "--prune")
    assert f"0 added, {modified} modified, 0 moved, 0 removed, {unchanged} unchanged" in said, said
    documents = _documents(kb_env, workspace)
    assert {path: text.split("\n")[0] for path, text in documents.items()} == {
        path: text for text, path in kept.items()
    }, documents


def test_an_import_of_colliding_files_with_nothing_changed_or_files_edited_swaps_no_documents(kb_env, tmp_path):
    """Whichever way colliding names were given (``a:b.md`` at ``a_b.md`` from a first import of
    both; ``a_b.md`` there when ``a:b.md`` came later), an import records nothing when nothing
    changed, and edited files, one or both at once, modify their own documents."""
    edge = _folder(tmp_path / "together", {"a:b.md": COLON, "a_b.md": UNDER})
    _import(kb_env, edge, "13")
    together = _where(_documents(kb_env, "13"))
    assert together == {"# colon": "/documents/Edge/a_b.md", "# under": "/documents/Edge/a_b (2).md"}
    assert "no changes: 2 documents already up to date" in _import(kb_env, edge, "13", "--prune")
    _edit_and_import(kb_env, edge, "13", ["a:b.md", "a_b.md"], together)
    _edit_and_import(kb_env, edge, "13", ["a_b.md"], together)
    edge = _folder(tmp_path / "later", {"a_b.md": UNDER})
    _import(kb_env, edge, "14")
    (edge / "a:b.md").write_text(COLON)
    assert "1 added, 0 modified" in _import(kb_env, edge, "14")
    later = _where(_documents(kb_env, "14"))
    assert later == {"# under": "/documents/Edge/a_b.md", "# colon": "/documents/Edge/a_b (2).md"}
    assert "no changes: 2 documents already up to date" in _import(kb_env, edge, "14", "--prune")
    _edit_and_import(kb_env, edge, "14", ["a:b.md"], later)
    _edit_and_import(kb_env, edge, "14", ["a_b.md"], later)
