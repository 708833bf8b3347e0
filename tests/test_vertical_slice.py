"""design §3 acceptance: import a real markdown folder, index it with a real Procrastinate worker,
search it, and check every envelope line against the file on disk and the repo with real git."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.commands import git, run_cli
from support.corpus import corpus_path, markdown_files

from kb.citations.envelope import document_lines
from kb.errors import PathExists


def test_import_index_search_the_test_corpus(kb, kb_env, settings):
    source = corpus_path("en")
    pages = len(markdown_files(source))
    run_cli(kb_env, "init")
    out = run_cli(kb_env, "import", str(source), "--workspace", "1").stdout
    assert "created workspace 1" in out
    assert f"{pages} found, {pages} added" in out

    repo = settings.knowledge_store / "1"
    git(repo, "fsck", "--strict")
    assert len(git(repo, "log", "--format=%H").split()) == 1
    assert git(repo, "status", "--porcelain") == ""
    assert len(git(repo, "ls-files").splitlines()) == pages

    run_cli(kb_env, "worker", "--until-idle")
    status = json.loads(run_cli(kb_env, "status", "--workspace", "1", "--json").stdout)
    ws = status["workspace"]
    assert ws["index_stamp"] == ws["head"]
    assert ws["documents"] == pages and ws["failed"] == 0 and ws["pending"] == 0
    assert ws["chunks"] > pages
    assert {j["status"] for j in status["jobs"]} == {"succeeded"}

    hits = json.loads(
        run_cli(kb_env, "search", "refund for an annual subscription", "--workspace", "1", "--json").stdout
    )
    top3 = [h["path"] for h in hits[:3]]
    assert any(p.endswith("Refund policy.md") for p in top3), top3
    for hit in hits:
        assert hit["revision"] == ws["head"]
        on_disk = document_lines((source / Path(hit["path"]).relative_to("/documents")).read_bytes())
        assert hit["lines"], hit
        for line_no, text in hit["lines"]:
            assert on_disk[line_no - 1] == text, (hit["path"], line_no)


def test_reimport_unchanged_records_nothing_and_prune(kb, tmp_path, settings):
    notes = tmp_path / "notes"
    (notes / "Projects").mkdir(parents=True)
    (notes / "Projects" / "Roadmap.md").write_text("# Roadmap\nship it\n")
    (notes / "Todo.md").write_text("- [ ] write tests\n")
    (notes / "image.png").write_bytes(b"\x89PNG")
    (notes / ".obsidian").mkdir()
    (notes / ".obsidian" / "workspace.md").write_text("hidden")
    first = kb.import_folder(notes, 3)
    assert first.created_workspace and first.added == 2
    assert first.skipped_other == 1 and first.skipped_hidden == 1
    assert sorted(kb.list_paths(3)) == ["/documents/Projects/Roadmap.md", "/documents/Todo.md"]

    again = kb.import_folder(notes, 3)
    assert again.revision is None and again.unchanged == 2
    assert len(kb.history(3)) == 1

    (notes / "Todo.md").unlink()
    kept = kb.import_folder(notes, 3)
    assert kept.revision is None  # without --prune nothing is removed
    pruned = kb.import_folder(notes, 3, prune=True)
    assert pruned.removed == 1
    assert sorted(kb.list_paths(3)) == ["/documents/Projects/Roadmap.md"]
    repo = settings.knowledge_store / "3"
    git(repo, "fsck", "--strict")
    assert git(repo, "status", "--porcelain") == ""
    assert len(git(repo, "log", "--format=%H").split()) == 2


def test_reimport_with_prune_after_a_rename_by_case_only_takes_the_new_names(kb, tmp_path, settings):
    """(design §2.2, §3) Foo.md → foo.md and Guides/ → guides/ in the folder: `kb import --prune` was
    refused ("differs only in case … from the existing 'Foo.md'") though the import removes it; a
    file renamed with its bytes kept is recorded as moved, so its history follows it."""
    notes = tmp_path / "notes"
    (notes / "Guides").mkdir(parents=True)
    (notes / "Guides" / "setup.md").write_text("# Setup\n")
    (notes / "Foo.md").write_text("# Foo\n")
    kb.import_folder(notes, 4)
    (notes / "Foo.md").rename(notes / "foo.md")
    (notes / "Guides").rename(notes / "guides")
    with pytest.raises(PathExists, match="differs only in case.*`kb import --prune` takes the new name"):
        kb.import_folder(notes, 4)  # without --prune the old name stays: the message says what to do
    report = kb.import_folder(notes, 4, prune=True)
    assert (report.added, report.modified, report.moved, report.removed) == (0, 0, 2, 0), report
    (notes / "Other.md").write_text("# Other\n")
    kb.import_folder(notes, 4)
    (notes / "Other.md").rename(notes / "guides" / "Elsewhere.md")  # moved in the folder, bytes kept
    (notes / "guides" / "setup.md").write_text("# Setup\nedited too\n")
    report = kb.import_folder(notes, 4, prune=True)
    assert (report.added, report.modified, report.moved, report.removed) == (0, 1, 1, 0), report
    moved = {c.old_path: c.path for c in report.revision.changes if c.change == "moved"}
    assert moved == {"/documents/Other.md": "/documents/guides/Elsewhere.md"}
    assert sorted(kb.list_paths(4)) == [
        "/documents/foo.md",
        "/documents/guides/Elsewhere.md",
        "/documents/guides/setup.md",
    ]
    assert kb.read(4, "/documents/foo.md") == b"# Foo\n"
    assert len(kb.history(4, "/documents/foo.md")) == 2  # its history follows it past the rename
    (notes / "foo.md").rename(notes / "bar.md")
    (notes / "bar.md").write_text("# Foo\nedited as renamed\n")
    report = kb.import_folder(notes, 4, prune=True)
    assert (report.added, report.moved, report.removed) == (1, 0, 1)  # other bytes: no move to claim
    git(settings.knowledge_store / "4", "fsck", "--strict")


def test_import_applies_path_law_and_prefix(kb, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "Roadmap.md").write_text("upper")
    (notes / "roadmap.md").write_text("lower")
    (notes / "CON.md").write_text("device")
    (notes / "a:b.md").write_text("colon")
    report = kb.import_folder(notes, 4, prefix="Inbox/2026")
    assert report.added == 4
    assert sorted(kb.list_paths(4)) == [
        "/documents/Inbox/2026/CON_.md",
        "/documents/Inbox/2026/Roadmap.md",
        "/documents/Inbox/2026/a_b.md",
        "/documents/Inbox/2026/roadmap (2).md",
    ]
    assert kb.read(4, "/documents/Inbox/2026/roadmap (2).md") == b"lower"


def test_read_envelope_is_full_and_numbered(kb, tmp_path):
    notes = tmp_path / "n"
    notes.mkdir()
    (notes / "Doc.md").write_bytes(b"# Title\r\nline two\n\nline four")
    kb.import_folder(notes, 2)
    envelope = kb.read_document(2, "/documents/Doc.md")
    assert envelope.lines == [(1, "# Title"), (2, "line two"), (3, ""), (4, "line four")]
    text = envelope.render()
    assert text.startswith('<document title="Doc" path="/documents/Doc.md" view="full" revision="')
    assert "     2  line two" in text
