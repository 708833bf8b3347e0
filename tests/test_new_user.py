"""What a new user tripped on, each typed as the user typed it (the ``kb`` CLI in a subprocess):
``kb new`` with a title alone, hints that name the CLI's option (``--overwrite``, not
``overwrite=True``), ``kb artifact revise`` taking its file like ``save``, ``kb psql -d NAME``,
``kb import`` naming what it skipped and what it stored but cannot index, ``kb worker`` logging
progress when its output is not a terminal, and the README's test line showing skip reasons.
A second trial, a quickstart then a second node: a renamed node hands its workspaces over and
``kb nodes forget`` clears its row; ``kb workspace set-model`` from a node that is not the home,
saying whether workers will re-embed; ``kb workspaces`` naming another node's workspace as homed
there; ``kb status -w`` naming the workspace's model first; ``kb token list`` times in UTC."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.commands import run_cli

from kb.errors import PathExists, WorkspaceBusy

ROOT = Path(__file__).resolve().parents[1]


def _notes(tmp_path: Path, files: dict[str, str], name: str = "notes") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    for relative, text in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    return folder


# -- 1. kb new TITLE -----------------------------------------------------------------------------
def test_new_with_a_title_alone_creates_the_document_at_the_root(kb_env, tmp_path):
    created = run_cli(kb_env, "new", "Client/Server FAQ", "-w", "2", "--body", "# FAQ\n\nask support\n")
    assert created.stdout.strip() == "/documents/Client_Server FAQ.md"
    # a first document starts a workspace; the revision recorded follows
    assert re.fullmatch(r"created workspace 2\nrevision [0-9a-f]{40}", created.stderr.strip())
    assert "ask support" in run_cli(kb_env, "read", "/documents/Client_Server FAQ.md", "-w", "2").stdout
    # FOLDER TITLE still works, and the help shows both forms
    inside = run_cli(kb_env, "new", "/documents/Plans", "Q3 plan: draft?", "-w", "2", "--body", "x\n")
    assert inside.stdout.strip() == "/documents/Plans/Q3 plan_ draft_.md"
    assert "created workspace" not in inside.stderr
    assert "[FOLDER] TITLE" in run_cli(kb_env, "new", "--help").stdout


def test_readme_shows_kb_new_with_a_title():
    readme = (ROOT / "README.md").read_text()
    assert re.search(r'^kb new "[^"/]+/?[^"]*" --workspace \d', readme, re.M), "no `kb new TITLE` example"


# -- 2. hints name the caller's spelling ---------------------------------------------------------
def test_mv_onto_an_existing_document_names_the_cli_option(kb, kb_env, tmp_path):
    run_cli(kb_env, "import", str(_notes(tmp_path, {"a.md": "a\n", "b.md": "b\n"})), "-w", "1")
    refused = run_cli(kb_env, "mv", "/documents/a.md", "/documents/b.md", "-w", "1", check=False)
    assert refused.returncode == 1
    assert "pass --overwrite to replace it" in refused.stderr and "overwrite=True" not in refused.stderr
    run_cli(kb_env, "mv", "/documents/a.md", "/documents/b.md", "-w", "1", "--overwrite")
    # the same error raised under Python names the keyword argument
    with pytest.raises(PathExists, match=r"pass overwrite=True to replace it") as raised:
        with kb.transaction(1, "move", "me") as tx:
            tx.write("/documents/c.md", "c\n")
            tx.move("/documents/c.md", "/documents/b.md")
    assert "--overwrite" not in str(raised.value) and "--overwrite" in raised.value.cli_message


def test_workspace_delete_while_busy_names_force_as_each_caller_spells_it(kb, kb_env, tmp_path):
    run_cli(kb_env, "import", str(_notes(tmp_path, {"a.md": "a\n"})), "-w", "1")
    turn = kb.turn(1, "open-turn")
    turn.write("/documents/draft.md", "draft\n")
    refused = run_cli(kb_env, "workspace", "delete", "1", "--yes", check=False)
    assert refused.returncode == 1 and "--force" in refused.stderr and "force=True" not in refused.stderr
    with pytest.raises(WorkspaceBusy, match="force=True") as raised:
        kb.delete_workspace(1)
    assert "--force" not in str(raised.value)
    turn.abort()


def _python_keyword_hints_without_cli_spelling() -> list[str]:
    """``raise …("… name=True …")`` calls in kb/ (the message names a Python keyword argument)
    that give no ``cli=`` message."""
    keyword = re.compile(r"\b[a-z_]+=(True|False)\b")
    missing = []
    for path in sorted((ROOT / "kb").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            texts = [
                c.value
                for arg in node.exc.args
                for c in ast.walk(arg)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ]
            python_only = path.parts[-3:-1] == ("kb", "turns")  # turns: Python, HTTP and MCP only, no CLI
            if (
                any(keyword.search(t) for t in texts)
                and not any(k.arg == "cli" for k in node.exc.keywords)
                and not python_only
            ):
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return missing


def test_every_error_naming_a_python_keyword_also_has_the_cli_spelling():
    assert _python_keyword_hints_without_cli_spelling() == []


# -- 3. kb artifact revise ID --generation N FILE ------------------------------------------------
def test_artifact_revise_takes_the_file_as_an_argument_like_save(kb_env, tmp_path):
    (tmp_path / "report.md").write_text("# Report\n\nfirst\n")
    (tmp_path / "report2.md").write_text("# Report\n\nsecond\n")
    run_cli(kb_env, "import", str(_notes(tmp_path, {"a.md": "a\n"})), "-w", "3")
    saved = run_cli(kb_env, "artifact", "save", str(tmp_path / "report.md"), "--title", "Report", "-w", "3").stdout
    artifact_id = saved.split()[1].rstrip(":")
    revised = run_cli(
        kb_env, "artifact", "revise", artifact_id, "--generation", "1", str(tmp_path / "report2.md"), "-w", "3"
    )
    assert "generation: 2" in revised.stdout
    shown = run_cli(kb_env, "artifact", "show", artifact_id, "--markdown", "-w", "3").stdout
    assert "second" in shown
    stale = run_cli(
        kb_env,
        "artifact",
        "revise",
        artifact_id,
        "--generation",
        "1",
        str(tmp_path / "report.md"),
        "-w",
        "3",
        check=False,
    )
    assert stale.returncode == 1 and "generation 2, not 1" in stale.stderr
    assert f"`kb artifact show {artifact_id} -w 3`" in stale.stderr
    assert f"`kb artifact revise {artifact_id} --generation 2 FILE -w 3`" in stale.stderr


# -- 4. kb psql -d NAME ------------------------------------------------------------------------
def test_psql_database_option_switches_the_database_on_kbs_server(kb, kb_env):
    switched = run_cli(kb_env, "psql", "-d", "postgres", "-tA", "-c", "SELECT current_database()")
    assert switched.stdout.strip() == "postgres"
    for args in (("--dbname=postgres",), ("-tAd", "postgres"), ("postgres",)):
        result = run_cli(kb_env, "psql", *args, "-tA", "-c", "SELECT current_database()")
        assert result.stdout.strip() == "postgres", args
    # without one, kb's own database, and psql's other options pass through
    own = run_cli(kb_env, "psql", "-tA", "-v", "ON_ERROR_STOP=1", "-c", "SELECT count(*) FROM kb.schema_migrations")
    assert int(own.stdout.strip()) >= 2


# -- 5. kb import names what it skipped and what it cannot index --------------------------------
def test_import_names_each_skipped_file_and_each_document_it_cannot_index(kb_env, tmp_path):
    notes = _notes(tmp_path, {"Good.md": "# Good\n\nzebra crossing\n", ".obsidian/workspace.md": "hidden\n"})
    (notes / "binary.md").write_bytes(b"# bin\n\x00\x01\x02 data\n")
    (notes / "latin1.md").write_bytes("# Café\n\nrésumé\n".encode("latin-1"))
    (notes / "big.md").write_bytes(b"# Big\n\n" + b"word " * (5 * 1024 * 1024 // 5))
    (notes / "photo.png").write_bytes(b"\x89PNG")
    (tmp_path / "outside.md").write_text("from outside\n")
    os.symlink(tmp_path / "outside.md", notes / "link.md")
    out = run_cli(kb_env, "import", str(notes), "-w", "1").stdout
    assert "skipped 2 other (non-markdown, links, non-UTF-8 names) and 1 hidden" in out
    assert "skipped .obsidian/: hidden" in out
    assert "skipped link.md: symbolic link (never followed" in out
    assert "skipped photo.png: not markdown" in out
    assert "stored but not indexed (3)" in out and "search will not find them" in out
    assert re.search(r"/documents/binary\.md: contains NUL bytes", out)
    assert re.search(r"/documents/latin1\.md: not valid UTF-8 \(byte \d+\); save it as UTF-8", out)
    assert re.search(r"/documents/big\.md: 5,242,8\d\d bytes is more than KB_MAX_INDEX_BYTES \(5,000,000\)", out)
    assert "Good.md" not in out.split("stored but not indexed")[1]
    # what the import said kb does with them: stored, readable, counted as unindexable by the index
    run_cli(kb_env, "worker", "--until-idle", "--quiet")
    assert "# Caf" in run_cli(kb_env, "read", "/documents/latin1.md", "-w", "1").stdout
    assert "3 unindexable" in run_cli(kb_env, "status", "-w", "1").stdout


# -- 6. kb worker's progress off a terminal ----------------------------------------------------
def test_worker_logs_progress_every_interval_when_not_on_a_terminal(kb_env, tmp_path):
    paragraphs = "\n\n".join(f"## Part {j}\n\n" + " ".join(f"w{j}x{k}" for k in range(60)) for j in range(12))
    notes = _notes(tmp_path, {f"Doc {i}.md": f"# Doc {i}\n\n{paragraphs}\n{i}\n" for i in range(10)})
    run_cli(kb_env, "import", str(notes), "-w", "1")
    # one embedder call per chunk: the one batch of 10 documents takes many calls, well over 0.1 s
    env = {**kb_env, "KB_PROGRESS_INTERVAL": "0.1", "KB_EMBED_BATCH_SIZE": "1"}
    worker = run_cli(env, "worker", "--until-idle")  # stderr is a pipe: not a terminal
    lines = worker.stderr.splitlines()
    finished = next(i for i, line in enumerate(lines) if "kb.index_changes (workspace 1) done" in line)
    during = [line for line in lines[:finished] if "index ws 1: 0/10 documents" in line]
    assert len(during) >= 2, worker.stderr  # lines while the one batch of 10 documents embeds
    assert all("10 documents left" in line for line in during)
    # "embedded 40 of 120 (…/s)" while the batch embeds, "embedded 120 (…/s)" once all of it has
    embedded = [int(re.search(r"embedded (\d+)(?: of \d+)? \(", line).group(1)) for line in during]
    dues = {int(m.group(1)) for line in during if (m := re.search(r"embedded \d+ of (\d+) \(", line))}
    assert len(dues) <= 1 and all(e <= due for e in embedded for due in dues), during  # one batch due
    assert embedded == sorted(embedded) and embedded[-1] > embedded[0], during
    assert any("index ws 1: 10/10 documents" in line for line in lines)
    assert "10 document(s) indexed" in worker.stdout


# -- 7. skip reasons in the README's test line ---------------------------------------------------
def _readme_test_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    return [
        line
        for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
        for line in block.splitlines()
        if "python -m pytest" in line
    ]


def test_readme_test_lines_run_verbatim_in_ci_and_show_why_tests_skipped(tmp_path):
    lines = _readme_test_lines()
    assert lines and all(" -rs" in line for line in lines), lines
    ci = (ROOT / ".ci" / "run").read_text()
    assert lines[0] in ci.splitlines()  # leg 1: the README's line, verbatim
    server_line = next(line for line in lines if line.startswith("KB_TEST_DATABASE_URL="))
    assert server_line.split("python -m pytest", 1)[1] in ci  # leg 2: the same pytest options
    # the pytest options of the README's line, run on a test that skips: the reason is printed
    options = lines[0].split("python -m pytest", 1)[1].split()
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\ndef test_needs_redis():\n    pytest.skip('no Redis server at 127.0.0.1:6379')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", *options, "-p", "no:cacheprovider", "test_skips.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "1 skipped" in result.stdout
    assert "no Redis server at 127.0.0.1:6379" in result.stdout, result.stdout


# -- second trial: a quickstart then a second node (design §15) ---------------------------------
def _age_node(database_url: str, name: str, seconds: float) -> None:
    from support.named_queries import queries

    from kb.db import database

    with database.connect(database_url, autocommit=True) as conn:
        conn.execute(queries["test_age_node_heartbeat"], {"name": name, "seconds": seconds})


def test_a_renamed_node_hands_its_workspaces_over_and_is_forgotten(kb_env, settings, tmp_path):
    quickstart = {**kb_env, "KB_NODE": "vm"}  # the quickstart's node: the host name
    run_cli(quickstart, "import", str(_notes(tmp_path, {"a.md": "# A\n\nalpha\n"})), "-w", "1")
    renamed = {**kb_env, "KB_NODE": "a"}  # the same storage root, started with a name of its own
    run_cli(renamed, "worker", "--until-idle")  # registers node a
    homed = run_cli(renamed, "nodes", "forget", "vm", check=False)
    assert homed.returncode == 1 and "home to 1 workspace" in homed.stderr and "kb workspace move" in homed.stderr
    moved = run_cli(renamed, "workspace", "move", "1", "--to", "a")
    assert "nothing to copy" in moved.stdout
    _age_node(settings.database_url, "vm", 0)
    up = run_cli(renamed, "nodes", "forget", "vm", check=False)
    assert up.returncode == 1 and "'vm' is up" in up.stderr
    _age_node(settings.database_url, "vm", 3600)  # its processes stopped an hour ago
    assert run_cli(renamed, "nodes", "forget", "vm").stdout.strip() == "forgot node 'vm'"
    names = [json.loads(line)["name"] for line in run_cli(renamed, "nodes", "--json").stdout.splitlines()]
    assert names == ["a"]
    unknown = run_cli(renamed, "nodes", "forget", "vm", check=False)
    assert unknown.returncode == 1 and "no node is called 'vm'" in unknown.stderr
    assert "kb nodes forget" in run_cli(renamed, "nodes", "forget", "--help").stdout
    assert "Example: kb nodes --json" in run_cli(renamed, "nodes", "--help").stdout


def test_set_model_from_any_node_and_what_lists_a_workspace_of_another_node(kb_env, settings, tmp_path):
    from support.named_queries import queries
    from support.waiting import wait_until

    from kb.db import database
    from kb.jobs.worker import live_workers

    b = {**kb_env, "KB_NODE": "b", "KB_STORAGE_ROOT": str(tmp_path / "store-b")}
    a = {**kb_env, "KB_NODE": "a"}
    for ws in ("1", "2"):
        run_cli(b, "import", str(_notes(tmp_path, {"a.md": "# A\n\nalpha\n"}, f"notes-{ws}")), "-w", ws)
    run_cli(a, "worker", "--until-idle")  # registers node a (b's workspaces are not its to run)
    listed = run_cli(a, "workspaces").stdout
    assert re.search(r"^\s+1\s+\d+\s+[0-9a-f]{12}\s+homed on node b$", listed, re.M), listed
    assert "no repository" not in listed
    # node a records the switch; the job goes to b's queue; no worker runs: say to start one
    switched = run_cli(a, "workspace", "set-model", "2", "hashing").stdout
    assert "switching to hashing" in switched and "run `kb worker --until-idle`" in switched, switched
    with database.connect(settings.database_url, autocommit=True) as conn:
        jobs = [j for j in conn.execute(queries["test_node_jobs"]).fetchall() if j["task_name"] == "kb.switch_model"]
    assert [j["queue_name"] for j in jobs] == ["maintenance@b"]
    c = {**kb_env, "KB_NODE": "c", "KB_STORAGE_ROOT": str(tmp_path / "store-c")}  # any node's worker counts
    worker = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "worker"], env=c, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(lambda: live_workers(settings.database_url, 60) > 0, 60, "node c's worker to start")
        switched = run_cli(a, "workspace", "set-model", "1", "hashing").stdout
        assert "1 kb worker(s) running will re-embed it" in switched and "run `kb worker" not in switched, switched
    finally:
        worker.terminate()
        worker.wait(30)
    run_cli(b, "worker", "--until-idle")  # the home node's worker runs the switches
    # kb status -w: the workspace's own model first, the default named as the default
    lines = run_cli(b, "status", "-w", "1").stdout.splitlines()
    model = next(i for i, line in enumerate(lines) if line.startswith("model:"))
    default = next(i for i, line in enumerate(lines) if line.startswith("embedder:"))
    assert model < default and "the default" in lines[default] and "workspace 1's" in lines[model]


def test_token_list_names_the_time_zone(kb_env):
    run_cli(kb_env, "token", "create", "--name", "reader", "--scope", "read", "-w", "1", "--expires", "2d")
    listed = run_cli(kb_env, "token", "list").stdout
    assert re.search(r"created \d{4}-\d\d-\d\d \d\d:\d\d UTC  expires \d{4}-\d\d-\d\d \d\d:\d\d UTC$", listed, re.M)


def test_the_workspaces_page_names_the_home_of_another_nodes_workspace():
    pytest.importorskip("fastapi", reason="the pages need the serve extra (pip install -e '.[serve]')")
    from kb.adapters.http.ui.rendering import ENVIRONMENT
    from kb.workspace.lifecycle import WorkspaceSummary

    remote = WorkspaceSummary(1, 3, "a" * 40, "elsewhere", 0, 0, 0, home_node="b")
    page = ENVIRONMENT.get_template("workspaces.html").render(
        csrf="x", path="/ui", may=lambda *_: True, workspaces=[remote], title="Workspaces"
    )
    assert "<td>homed on node b</td>" in page and "no repository" not in page


def test_status_names_auto_as_the_default_and_a_local_command_says_it_is_local(kb, kb_env, tmp_path):
    """`kb status` under the default KB_EMBEDDING_MODEL=auto says the model is picked per workspace
    (it named MiniLM, which a German workspace never gets); with KB_SERVER_URL set, a command that
    works locally (`kb ls`) says so on stderr instead of seeming to use the server."""
    kb.create_workspace(1)
    status = run_cli({**kb_env, "KB_EMBEDDING_MODEL": "auto"}, "status").stdout
    assert "embedder:   auto, picked per workspace by its documents' languages" in status, status
    listed = run_cli({**kb_env, "KB_SERVER_URL": "http://127.0.0.1:9"}, "ls", "-w", "1")
    assert "`kb ls` works on this machine's database and storage, not through KB_SERVER_URL" in listed.stderr
    assert "works on this machine" not in run_cli(kb_env, "ls", "-w", "1").stderr
    # a command kb serve answers, asked with an option it does not take, names the options
    chat = run_cli({**kb_env, "KB_SERVER_URL": "http://127.0.0.1:9"}, "search", "x", "-w", "1", "--chat", "c1")
    assert "`kb search` with these options works on this machine's database" in chat.stderr, chat.stderr
