"""(design §13) the CLI says what it is waiting for — the index lag on search and in `kb workspaces`,
how to index after an import, the worker's progress and summary — and what is there (`kb ls`), and
ends without dulwich noise on stderr."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from support.commands import git, run_cli


def _notes(tmp_path: Path, count: int = 3, name: str = "notes") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for i in range(count):
        (folder / f"Note {i}.md").write_text(f"# Note {i}\n\nRefund policy for plan {i}: zebra crossing.\n")
    return folder


def test_search_before_indexing_says_how_far_behind_and_still_answers(kb_env, tmp_path):
    imported = run_cli(kb_env, "import", str(_notes(tmp_path)), "-w", "1")
    assert "not indexed yet: run `kb worker --until-idle`" in imported.stdout
    before = run_cli(kb_env, "search", "zebra", "-w", "1")
    assert before.stdout.strip() == "no results"
    assert "index is 1 revision behind HEAD: 3 documents pending — run `kb worker --until-idle`" in before.stderr
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    after = run_cli(kb_env, "search", "zebra", "-w", "1")
    assert "Note" in after.stdout and after.stderr == ""
    # one more revision: the hint counts it, and the results the index has are still printed
    (tmp_path / "notes" / "Note 9.md").write_text("# Note 9\n\nzebra again\n")
    run_cli(kb_env, "import", str(tmp_path / "notes"), "-w", "1")
    stale = run_cli(kb_env, "search", "zebra", "-w", "1")
    assert "index is 1 revision behind HEAD: 1 document pending" in stale.stderr
    assert "/documents/Note 0.md" in stale.stdout


def test_worker_prints_progress_lines_and_a_summary(kb_env, tmp_path):
    notes = _notes(tmp_path, 4)
    run_cli(kb_env, "import", str(notes), "-w", "1")
    first = run_cli(kb_env, "worker", "--until-idle")
    assert "4 document(s) indexed, 0 failed; 4 chunks written (4 embedded, 0 from the embedding cache)" in first.stdout
    assert "job(s) run, 0 failed" in first.stdout and "no job is scheduled for later" in first.stdout
    assert "kb.index_changes (workspace 1) done in" in first.stderr  # plain lines: not a terminal
    assert "index ws 1: 4/4 documents, 4 chunks stored" in first.stderr
    # the same texts in another workspace come from the embedding cache
    run_cli(kb_env, "import", str(notes), "-w", "2")
    second = run_cli(kb_env, "worker", "--until-idle", "--quiet")
    assert "4 chunks written (0 embedded, 4 from the embedding cache)" in second.stdout
    assert second.stderr == ""


def test_worker_progress_says_which_chunks_were_kept_unchanged(kb_env, tmp_path):
    """After a one-paragraph edit the progress line said "1/1 documents, 42 chunks" while one
    chunk was embedded: the count includes the rows of unchanged chunks, and now says so."""
    notes = tmp_path / "notes"
    notes.mkdir()
    sections = [f"## Part {i}\n\n" + " ".join(f"word{i}x{j}" for j in range(400)) for i in range(6)]
    (notes / "Long.md").write_text("# Long\n\n" + "\n\n".join(sections) + "\n")
    run_cli(kb_env, "import", str(notes), "-w", "1")
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    sections[2] = sections[2].replace("word2x7 ", "edited ")
    (notes / "Long.md").write_text("# Long\n\n" + "\n\n".join(sections) + "\n")
    run_cli(kb_env, "import", str(notes), "-w", "1")
    edited = run_cli(kb_env, "worker", "--until-idle")
    line = next(x for x in edited.stderr.splitlines() if "index ws 1: 1/1 documents" in x)
    written, unchanged = (int(n) for n in re.search(r"(\d+) chunks stored \((\d+) unchanged\)", line).groups())
    assert written > unchanged >= 4, line
    assert "1 chunks embedded" not in edited.stderr and "1 document, 1 chunk embedded" in edited.stderr


SCRIPT = """
from kb import KnowledgeBase

{body}
"""


def test_scripts_and_commands_end_without_dulwich_noise(kb_env, kb, tmp_path):
    run_cli(kb_env, "import", str(_notes(tmp_path)), "-w", "1")
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    git(kb.settings.knowledge_store / "1", "gc", "-q")  # packs: what dulwich's __del__ complains about
    bodies = [
        "with KnowledgeBase.open() as kb:\n    print(len(kb.search(1, 'zebra', 3)))",
        "kb = KnowledgeBase.open()\nprint(len(kb.search(1, 'zebra', 3)))\nkb.close()",
        "kb = KnowledgeBase.open()\nprint(len(kb.search(1, 'zebra', 3)))",  # never closed: atexit does
    ]
    for body in bodies:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SCRIPT.format(body=body))],
            env=kb_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0 and result.stdout.strip() == "3", result.stderr
        assert result.stderr == "", body
    for args in (
        ("search", "zebra", "-w", "1"),
        ("read", "/documents/Note 1.md", "-w", "1"),
        ("log", "-w", "1"),
        ("status", "-w", "1"),
    ):
        assert run_cli(kb_env, *args).stderr == "", args


def test_close_releases_the_repositories_and_the_object_stays_usable(kb):
    kb.create_workspace(1)
    with kb.transaction(1, "one", "alice") as tx:
        tx.write("/documents/a.md", "alpha\n")
    store = kb.store(1)
    repository = store.repository
    kb.close()
    assert kb.store(1) is not store and repository._repo.object_store._pack_cache == {}  # stores forgotten
    assert kb.read(1, "/documents/a.md") == b"alpha\n"  # reopened on demand
    kb.close()


def test_status_says_how_long_a_job_waited_in_words_a_reader_takes_in():
    """``kb status``'s "oldest waiting" was a raw timedelta (``0:00:21.737824``); through
    ``kb serve`` it is seconds as a float. Both read as a short age."""
    from datetime import timedelta

    from kb.adapters.cli.status import _age

    assert _age(None) == "-"
    assert _age(timedelta(seconds=21.737824)) == "21s"
    assert _age(125.4) == "2m 05s"
    assert _age(timedelta(hours=3, minutes=12, seconds=40)) == "3h 12m"


def test_workspaces_says_what_a_lagging_workspace_waits_for(kb, kb_env, tmp_path):
    """Right after an import `kb workspaces` said "behind (1 revisions, 0 documents pending)": the
    projection had not run, so no document row was pending yet. It now says the revision waits to
    be projected, counts in the singular and plural, and names what runs it."""
    run_cli(kb_env, "import", str(_notes(tmp_path)), "-w", "1")
    waiting = "(`kb worker --until-idle` does it)"
    listed = run_cli(kb_env, "workspaces").stdout
    assert f"behind: 1 revision waiting to be projected, then indexed {waiting}" in listed
    assert "pending" not in listed and "revisions" not in listed
    kb.project(1)  # projected, not indexed: the documents wait now
    assert f"behind: 1 revision and 3 documents waiting to be indexed {waiting}" in run_cli(kb_env, "workspaces").stdout
    (tmp_path / "notes" / "Note 7.md").write_text("# Note 7\n")
    run_cli(kb_env, "import", str(tmp_path / "notes"), "-w", "1")
    assert "behind: 1 revision waiting to be projected" in run_cli(kb_env, "workspaces").stdout
    (tmp_path / "notes" / "Note 8.md").write_text("# Note 8\n")
    run_cli(kb_env, "import", str(tmp_path / "notes"), "-w", "1")
    assert "behind: 2 revisions waiting to be projected, then indexed" in run_cli(kb_env, "workspaces").stdout
    summary = json.loads(run_cli(kb_env, "workspaces", "--json").stdout)
    assert (summary["revisions_unprojected"], summary["revisions_behind"]) == (2, 3)
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    assert run_cli(kb_env, "workspaces").stdout.splitlines()[1].endswith("  indexed")


def test_ls_lists_a_folder_as_the_python_api_and_the_mcp_tool_do(kb, kb_env, tmp_path):
    """`kb ls [FOLDER] -w N [--json]` mirrors `KnowledgeBase.ls`, the committed counterpart of a
    turn's `ls` (the MCP ls tool): folders first, then documents, by name, .keep hidden."""
    notes = _notes(tmp_path, 2)
    (notes / "Sub").mkdir()
    (notes / "Sub" / "Deep.md").write_text("deep\n")
    run_cli(kb_env, "import", str(notes), "-w", "1")
    with kb.transaction(1, "an empty folder", "alice") as tx:
        tx.write("/documents/Empty/.keep", b"", allow_keep=True)
    assert run_cli(kb_env, "ls", "-w", "1").stdout.splitlines() == [
        "/documents/Empty/",
        "/documents/Sub/",
        "/documents/Note 0.md",
        "/documents/Note 1.md",
    ]
    assert run_cli(kb_env, "ls", "/documents/Empty", "-w", "1").stdout == ""
    listed = json.loads(run_cli(kb_env, "ls", "/documents/Sub", "-w", "1", "--json").stdout)
    assert listed == [{"name": "Deep.md", "path": "/documents/Sub/Deep.md", "kind": "file"}]
    assert run_cli(kb_env, "ls", "/documents/Sub/Deep.md", "-w", "1").stdout == "/documents/Sub/Deep.md\n"
    first = kb.history(1)[-1].id  # the import, before the empty folder
    assert "/documents/Empty/" not in run_cli(kb_env, "ls", "-w", "1", "--revision", first).stdout
    turn = kb.turn(1, "t-ls")
    for folder in ("/documents", "/documents/Sub", "/documents/Sub/Deep.md"):
        assert kb.ls(1, folder) == turn.ls(folder)
    turn.abort()
    failed = run_cli(kb_env, "ls", "/documents/sub", "-w", "1", check=False)
    assert failed.returncode == 1 and failed.stderr.strip().endswith("did you mean '/documents/Sub'?")
    assert "Example: kb ls" in run_cli(kb_env, "ls", "--help").stdout


def test_version_names_the_installed_kb(kb_env):
    """``kb --version`` prints the installed distribution's version (as ``pip show kb`` does) and
    MCP's serverInfo carries the same; it was no option at all."""
    import importlib.metadata

    import kb

    assert run_cli(kb_env, "--version").stdout == f"kb {importlib.metadata.version('kb')}\n"
    assert kb.__version__ == importlib.metadata.version("kb")


def test_reports_count_one_thing_in_the_singular(kb_env, tmp_path):
    """Reports said "1 documents" and "1 chunks written": a count of one is in the singular."""
    notes = _notes(tmp_path, 1)
    run_cli(kb_env, "import", str(notes), "-w", "1")
    again = run_cli(kb_env, "import", str(notes), "-w", "1")
    assert "no changes: 1 document already up to date" in again.stdout
    indexed = run_cli(kb_env, "index", "-w", "1")
    assert "indexed 1 document (1 chunk written, 0 reused" in indexed.stdout
    deleted = run_cli(kb_env, "workspace", "delete", "1", "--yes")
    assert re.search(
        r"deleted workspace 1: 1 document, \d+ folders?, \d+ jobs?; removed 1 folder from disk", deleted.stdout
    )


def test_counted_words_a_count():
    from kb.adapters.cli.counts import counted

    assert [counted(n, "document") for n in (0, 1, 2)] == ["0 documents", "1 document", "2 documents"]
    assert counted(1, "batch", "batches") == "1 batch" and counted(3, "batch", "batches") == "3 batches"


def test_rm_removes_documents_and_folders_in_one_revision_that_revert_undoes(kb, kb_env):
    """The CLI could not delete a document (only `import --prune` or deleting the workspace):
    `kb rm PATH...` removes documents and folders in one revision; history keeps them."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", "t") as tx:
        tx.write("/documents/keep.md", "keep\n")
        tx.write("/documents/old.md", "old\n")
        tx.write("/documents/Scratch/a.md", "a\n")
        tx.write("/documents/Scratch/b.md", "b\n")
    removed = run_cli(kb_env, "rm", "/documents/old.md", "/documents/Scratch", "-w", "1")
    revision = re.match(r"revision ([0-9a-f]{40}): removed 3 documents$", removed.stdout.strip())
    assert revision, removed.stdout
    assert run_cli(kb_env, "ls", "/documents", "-w", "1").stdout.split() == ["/documents/keep.md"]
    missing = run_cli(kb_env, "rm", "/documents/nope.md", "/documents/keep.md", "-w", "1", check=False)
    assert missing.returncode == 1 and "no such document or folder" in missing.stderr
    assert kb.read(1, "/documents/keep.md") == b"keep\n"  # nothing removed when one path is wrong
    run_cli(kb_env, "revert", revision.group(1), "-w", "1")
    assert kb.read(1, "/documents/Scratch/b.md") == b"b\n"


def test_search_text_shows_each_hits_fused_score_as_json_does(kb_env, tmp_path):
    """Search pads to k with weaker matches (no relevance threshold, design §8): each envelope
    shows its fused score, the one ``--json`` carries, so a reader can tell a strong hit from
    padding; a full read has no score."""
    run_cli(kb_env, "import", str(_notes(tmp_path)), "-w", "1")
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    text = run_cli(kb_env, "search", "zebra", "-w", "1", "-k", "3").stdout
    hits = json.loads(run_cli(kb_env, "search", "zebra", "-w", "1", "-k", "3", "--json").stdout)
    assert len(hits) == 3 and all(isinstance(hit["score"], float) for hit in hits)
    heads = [line for line in text.splitlines() if line.startswith("<document ")]
    assert len(heads) == 3
    for head, hit in zip(heads, hits, strict=True):
        assert f'path="{hit["path"]}"' in head
        assert head.endswith(f' score="{hit["score"]:.4f}">'), head
    assert "score=" not in run_cli(kb_env, "read", "/documents/Note 0.md", "-w", "1").stdout


def _run_with_stderr_on_a_terminal(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """Run the kb CLI with stderr on a pseudo-terminal (stdout a pipe); returns the process and
    what it wrote to the terminal."""
    import os
    import pty
    import threading

    leader, follower = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the follower closed: EIO
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "kb.adapters.cli", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=600,
        )
    finally:
        os.close(follower)
    reader.join(timeout=60)
    os.close(leader)
    return result, b"".join(chunks).decode()


def test_import_shows_its_progress_on_a_terminal_and_nothing_in_a_pipe(kb_env, tmp_path):
    """A large import (25,000 files, ~9 s) printed nothing until it was done. On a terminal it now
    keeps a live line on stderr — files found, files read, the revision being recorded — and
    clears it before the report; a script's stderr stays empty."""
    result, terminal = _run_with_stderr_on_a_terminal(kb_env, "import", str(_notes(tmp_path)), "-w", "1")
    assert result.returncode == 0, terminal
    assert "revision " in result.stdout and "3 found, 3 added" in result.stdout
    assert "3 markdown files found" in terminal and "read 3/3 files" in terminal, terminal
    assert "recording 3 documents as one revision" in terminal, terminal
    assert terminal.endswith("\r\x1b[K"), repr(terminal)  # the live line is cleared
    piped = run_cli(kb_env, "import", str(_notes(tmp_path, name="more")), "-w", "2")
    assert piped.stderr == ""


def test_status_says_its_document_counts_wait_for_the_projection(kb_env, tmp_path):
    """`kb status` counts the documents the projection has rows for: while newer revisions wait to
    be projected it says so next to the counts, instead of "0 pending" beside an index lag."""
    run_cli(kb_env, "import", str(_notes(tmp_path)), "-w", "1")
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    settled = run_cli(kb_env, "status", "-w", "1")
    assert "documents:  3 (0 pending" in settled.stdout and "not projected" not in settled.stdout
    run_cli(kb_env, "new", "Later.md", "-w", "1", "--body", "# Later\n\nwritten after the index\n")
    waiting = run_cli(kb_env, "status", "-w", "1")
    line = next(line for line in waiting.stdout.splitlines() if line.startswith("documents:"))
    assert "documents:  3 " in line
    assert "revisions after" in line and "not projected yet" in line and "kb worker --until-idle" in line
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    assert "documents:  4 (0 pending" in run_cli(kb_env, "status", "-w", "1").stdout


def test_ctrl_c_on_a_worker_until_idle_says_so_at_once_and_ends_with_its_summary(kb_env, tmp_path):
    """design §7: Ctrl-C on `kb worker --until-idle` while a job runs was silent until the job had
    finished, then ended in click's bare "Aborted!" (exit 1) without the summary. Now the worker
    says at once that it is stopping, lets the job in hand finish, prints its summary and exits 130."""
    import signal

    notes = tmp_path / "many"
    notes.mkdir()
    for i in range(1500):
        (notes / f"n{i:04}.md").write_text(f"# Note {i}\n\n" + "words about refunds and plans. " * 40 + "\n")
    run_cli(kb_env, "import", str(notes), "-w", "1")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # a child must not inherit SIG_IGN
    try:
        worker = subprocess.Popen(
            [sys.executable, "-m", "kb.adapters.cli", "worker", "--until-idle"],
            env={**kb_env, "KB_PROGRESS_INTERVAL": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    assert worker.stderr is not None
    seen = []
    for line in worker.stderr:  # the first job has started: Ctrl-C now
        seen.append(line)
        if " started" in line:
            worker.send_signal(signal.SIGINT)
            break
    out, err = worker.communicate(timeout=600)
    err = "".join(seen) + err
    assert worker.returncode == 130, (out, err)
    assert "stopping: the jobs in hand finish first" in err and "Aborted" not in err, err
    assert "worker stopped after" in out and "job(s) run" in out, out
    assert "interrupted before the queue was idle" in err


def test_import_prune_names_what_it_removed_and_how_to_bring_one_back(kb_env, tmp_path):
    """`kb import --prune` removes every document not in the folder, those made inside kb too
    (`kb new`, the API): it said only "1 removed". Now each is named, with the restore that
    brings one back."""
    notes = _notes(tmp_path, count=2)
    run_cli(kb_env, "import", str(notes), "-w", "1")
    run_cli(kb_env, "new", "Made here", "-w", "1", "--body", "# Made here\n")
    pruned = run_cli(kb_env, "import", str(notes), "-w", "1", "--prune").stdout
    assert "1 removed" in pruned and "removed /documents/Made here.md: not in the folder (--prune)" in pruned
    restore = re.search(r"`(kb restore PATH --revision ([0-9a-f]{12}) --workspace 1)` brings one back", pruned)
    assert restore, pruned
    run_cli(kb_env, "restore", "/documents/Made here.md", "--revision", restore.group(2), "-w", "1")
    assert "# Made here" in run_cli(kb_env, "read", "/documents/Made here.md", "-w", "1").stdout


def test_import_says_which_names_and_which_prefix_the_path_law_changed(kb_env, tmp_path):
    """``--prefix a:b`` imported into /documents/a_b without a word, and the renames' one example
    was a name only brought to its composed form (NFD ``Résumé.md`` → NFC), which reads as no
    change. The folder imported into is said when the prefix changed, and the examples show the
    renames a reader can see first, a composed-only one marked as such (design §2.2)."""
    notes = tmp_path / "odd"
    notes.mkdir()
    (notes / "Re\u0301sume\u0301.md").write_text("# R\n")
    (notes / "a:b.md").write_text("# A\n")
    out = run_cli(kb_env, "import", str(notes), "-w", "1", "--prefix", "x:y").stdout
    assert "into /documents/x_y: --prefix 'x:y' was changed because it holds characters some OS forbid" in out, out
    said = re.search(r"2 names were made safe for every OS \((.*)\); see", out)
    assert said, out
    first, second = said.group(1).split(", ", 1)
    assert first == "a:b.md -> /documents/x_y/a_b.md", out
    assert second.endswith("(the same letters, composed: NFC)"), out
    plain = run_cli(kb_env, "import", str(notes), "-w", "2", "--prefix", "/documents/Notes").stdout
    assert "made safe for every OS; see" not in plain and "into /documents" not in plain, plain


def test_worker_progress_moves_while_a_batch_embeds_before_any_document_is_stored():
    """A first index run embeds a whole batch of documents before it stores one: for minutes the
    worker printed "0/22 documents, 0 chunks stored, 0.0 chunks/s, embedded 640 (1.9/s)" with no
    ETA, which read as stuck. The line says how many of the texts in hand are embedded, and an ETA
    of the batch by the embedder's pace (design §7)."""
    import io

    from kb.index.indexer import IndexReport
    from kb.jobs.worker import ProgressDisplay

    stream = io.StringIO()
    display = ProgressDisplay(stream=stream, live=False, every=3600)
    try:
        display.job_started(7, "kb.index_changes", 1)
        report = IndexReport(workspace_id=1, documents_total=22, embeddings_due=743, embeddings_computed=640)
        line = display._progress_text(1, "index", 0, 22, report)
        assert "0/22 documents, 0 chunks stored" in line and "embedded 640 of 743 (" in line, line
        assert re.search(r"ETA of this batch \d+m\d\ds$", line), line
        report.embeddings_computed, report.documents_done, report.chunks_written = 743, 11, 400
        line = display._progress_text(1, "index", 11, 22, report)  # a batch stored: the run's ETA
        assert "embedded 743 (" in line and re.search(r", ETA \d+m\d\ds$", line), line
    finally:
        display.close()
