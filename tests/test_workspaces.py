"""Listing and deleting workspaces (design §2.1, §6)."""

from __future__ import annotations

import json

import psycopg
import psycopg.sql
import pytest
from psycopg.rows import dict_row
from support.commands import run_cli
from support.named_queries import queries

from kb.errors import InvalidWorkspace, WorkspaceBusy, WorkspaceNotFound
from kb.git.worktree import worktrees_root
from kb.index.vector_index import index_name


def _fill(kb, ws: int, n: int = 3) -> None:
    kb.create_workspace(ws)
    with kb.transaction(ws, "seed", "seeder") as tx:
        for i in range(n):
            tx.write(f"/documents/Folder {i % 2}/doc {i}.md", f"# Doc {i}\n\nbody of document {i} in {ws}\n")


def _rows_of(conn, ws: int) -> dict[str, int]:
    """Rows mentioning the workspace in every kb table with a workspace_id column (so tables later
    features add are covered), plus Procrastinate's jobs of it."""
    conn = conn.cursor(row_factory=psycopg.rows.tuple_row)
    tables = conn.execute(queries["test_tables_with_workspace_id"]).fetchall()
    counts = {}
    for (table,) in tables:
        counts[table] = conn.execute(
            psycopg.sql.SQL(queries["test_count_workspace_rows"]).format(table=psycopg.sql.Identifier(table)),
            {"workspace_id": ws},
        ).fetchone()[0]
    counts["kb.workspaces"] = conn.execute(queries["test_count_workspace_row"], {"workspace_id": ws}).fetchone()[0]
    counts["jobs"] = conn.execute(queries["test_count_workspace_jobs"], {"workspace_id": str(ws)}).fetchone()[0]
    return counts


def test_list_workspaces(kb):
    _fill(kb, 1)
    _fill(kb, 2, 5)
    kb.index(1)
    summaries = {s.id: s for s in kb.list_workspaces()}
    assert set(summaries) == {1, 2}
    assert (summaries[1].documents, summaries[1].head, summaries[1].index_state) == (3, kb.head(1), "indexed")
    assert summaries[2].head == kb.head(2) and summaries[2].index_state == "behind"


@pytest.mark.parametrize("bad", [0, -1, 2**31, 2**63, True, "1", 1.0, None])
def test_a_workspace_id_outside_postgres_integer_is_refused_before_the_database(kb, bad):
    """kb.workspaces.id is a Postgres integer: 2**31 and past reached the server and came back
    as psycopg's NumericValueOutOfRange."""
    calls = [
        lambda: kb.create_workspace(bad),
        lambda: kb.status(bad),
        lambda: kb.index_freshness(bad),
        lambda: kb.search(bad, "anything"),
        lambda: kb.index(bad),
    ]
    if bad is None:
        calls = calls[:1] + calls[2:]  # kb.status(None): every workspace
    for call in calls:
        with pytest.raises(InvalidWorkspace, match="from 1 to 2147483647"):
            call()
    kb.create_workspace(2**31 - 1)  # the largest is a workspace like any other
    assert kb.status(2**31 - 1)["workspace"]["id"] == 2**31 - 1


def test_delete_leaves_nothing_behind_and_subscribers_see_the_rows_go(kb, database_url):
    _fill(kb, 1)
    _fill(kb, 2)
    kb.index(1)
    kb.index(2)
    with kb.transaction(1, "more", "w") as tx:  # a revision whose jobs are still waiting
        tx.write("/documents/late.md", "late\n")
    with psycopg.connect(database_url, autocommit=True) as conn:  # a partial HNSW index, as the job builds
        conn.execute(
            psycopg.sql.SQL(queries["create_vector_index"]).format(
                name=psycopg.sql.Identifier(index_name(1, "hashing")),
                dim=psycopg.sql.Literal(384),
                workspace_id=psycopg.sql.Literal(1),
                model=psycopg.sql.Literal("hashing"),
            )
        )
    artifact = kb.artifacts(1).save("Report", "# Report\n", files={"pdf": b"%PDF-1.4 fake"})
    assert artifact and (kb.settings.storage_root / "artifact_blobs" / "1").is_dir()
    turn = kb.turn(1, "open-turn", "agent")
    turn.write("/documents/draft.md", "draft\n")
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        before = _rows_of(conn, 1)
        ids = {r["id"] for r in conn.execute(queries["test_document_ids"], {"workspace_id": 1})}
        other_before = _rows_of(conn, 2)
    assert before["chunks"] > 0 and before["documents"] == 4 and before["jobs"] > 0
    with pytest.raises(WorkspaceBusy, match="turn"):
        kb.delete_workspace(1)
    assert kb.store(1).exists()
    listener = psycopg.connect(database_url, autocommit=True)
    listener.execute(queries["listen_events"])
    report = kb.delete_workspace(1, force=True)
    events = [json.loads(n.payload) for n in listener.notifies(timeout=2, stop_after=len(ids) + 10)]
    listener.close()
    assert report.documents == 4 and report.jobs == before["jobs"]
    assert report.vector_indexes == [index_name(1, "hashing")]
    assert {e["id"] for e in events if e["event"] == "document_deleted"} == ids
    assert events[-1] == {"event": "workspace_deleted", "workspace_id": 1, "revision": None, "id": 1, "path": None}
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        assert {k: v for k, v in _rows_of(conn, 1).items() if v} == {}
        assert _rows_of(conn, 2) == other_before
        assert conn.execute(queries["test_count_vector_indexes"]).fetchone()["n"] == 0
    store = kb.settings.knowledge_store
    assert not (store / "1").exists() and not worktrees_root(store, 1).exists()
    assert not list(store.glob(".deleted-*"))
    assert not (kb.settings.storage_root / "artifact_blobs" / "1").exists()
    assert (store / "2" / ".git").is_dir() and kb.read(2, "/documents/Folder 0/doc 0.md")
    assert [s.id for s in kb.list_workspaces()] == [2]
    with pytest.raises(WorkspaceNotFound):
        kb.delete_workspace(1)


def test_a_writer_holding_the_store_cannot_resurrect_a_deleted_workspace(kb, database_url):
    _fill(kb, 3)
    store = kb.store(3)
    store.repository  # noqa: B018 (opened before the deletion)
    kb.delete_workspace(3)
    with pytest.raises(WorkspaceNotFound):
        with store.transaction("late", "w") as tx:
            tx.write("/documents/x.md", "x\n")
    with psycopg.connect(database_url) as conn:
        assert conn.execute(queries["test_count_workspace_row"], {"workspace_id": 3}).fetchone()[0] == 0
    assert not (kb.settings.knowledge_store / "3").exists()


def test_cli_workspaces_and_delete(kb, kb_env):
    _fill(kb, 4)
    kb.project(4)
    listed = run_cli(kb_env, "workspaces", "--json").stdout.splitlines()
    assert [json.loads(line)["id"] for line in listed] == [4]
    assert "4" in run_cli(kb_env, "workspaces").stdout
    refused = run_cli(kb_env, "workspace", "delete", "4", check=False)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    done = run_cli(kb_env, "workspace", "delete", "4", "--yes")
    assert "deleted workspace 4: 3 documents" in done.stdout
    missing = run_cli(kb_env, "workspace", "delete", "4", "--yes", check=False)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
    # without --yes it said "pass --yes to confirm" for a workspace that was not there
    unconfirmed = run_cli(kb_env, "workspace", "delete", "77", check=False)
    assert unconfirmed.returncode == 1 and "workspace 77 does not exist" in unconfirmed.stderr, unconfirmed.stderr
    assert "--yes" not in unconfirmed.stderr


def test_calls_racing_a_workspace_deletion_raise_workspace_not_found(kb, monkeypatch):
    """A workspace deleted while a call ran reached callers as raw errors: a chat's search then
    registered its handles for a workspace row that was gone (psycopg ForeignKeyViolation), an
    index run opened the repository that was gone (FileNotFoundError). Each interleaving is forced:
    the deletion runs between the call's steps."""
    _fill(kb, 1)
    kb.index(1)
    conversation = kb.conversation(1, "chat")
    search = kb.search

    def search_then_delete(*args, **kwargs):
        found = search(*args, **kwargs)
        kb.delete_workspace(1, force=True)
        return found

    monkeypatch.setattr(kb, "search", search_then_delete)
    with pytest.raises(WorkspaceNotFound, match="workspace 1 was deleted while this call ran"):
        conversation.search("body of document")
    monkeypatch.undo()
    with pytest.raises(WorkspaceNotFound, match="workspace 1 does not exist"):
        kb.reindex(1)
    with pytest.raises(WorkspaceNotFound, match="workspace 1 does not exist"):
        kb.index(1)


def test_a_forced_delete_is_not_failed_by_a_turn_writing_its_worktree_meanwhile(kb, monkeypatch):
    """A forced delete while a turn in another process (kb serve) writes into its worktree: the
    turn's file landed in the worktree folder while ``shutil.rmtree`` emptied it, and the delete
    raised a raw OSError (ENOTEMPTY) after Postgres had deleted the workspace — told it failed
    though it was gone, the artifact files not removed (found by the breaker against a real kb
    serve). The write is forced between rmtree's steps: the worktrees folder is set aside first
    and removed there, so a writer writing by path only leaves a folder for the janitor."""
    import os

    kb.create_workspace(1)
    kb.turn(1, "t", "w").write("/documents/a.md", "a\n")
    turn_folder = worktrees_root(kb.settings.knowledge_store, 1) / "t" / "documents"
    real_rmdir, written = os.rmdir, []

    def rmdir(path, *args, **kwargs):  # the other process's write, once the worktree is being emptied
        if not written and not (turn_folder / "a.md").exists():
            turn_folder.mkdir(parents=True, exist_ok=True)
            (turn_folder / "late.md").write_text("late\n")
            written.append(True)
        return real_rmdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "rmdir", rmdir)
    deleted = kb.delete_workspace(1, force=True)
    monkeypatch.undo()
    assert written and deleted.id == 1
    with pytest.raises(WorkspaceNotFound):
        kb.head(1)
    kb.create_workspace(1)
    assert kb.head(1) is None


def test_a_write_to_a_workspace_deleted_meanwhile_is_not_recorded(kb, database_url):
    """The write found the workspace when it began and not when it committed."""
    _fill(kb, 1)
    with pytest.raises(WorkspaceNotFound):
        with kb.transaction(1, "late write", "writer") as tx:
            tx.write("/documents/late.md", "written while the workspace went\n")
            kb.delete_workspace(1, force=True)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        assert {k: v for k, v in _rows_of(conn, 1).items() if v} == {}
    assert not (kb.settings.knowledge_store / "1").exists()


def test_a_search_canceled_by_an_administrator_is_a_kb_error(kb):
    """pg_cancel_backend of a search waiting behind an administrator's table lock reached the caller
    as a raw psycopg QueryCanceled; it is StatementCanceled, and the next search works."""
    import threading
    import time

    from kb.errors import StatementCanceled
    from kb.index.embedding import HashingEmbedder

    kb.use_embedder(HashingEmbedder())
    _fill(kb, 1)
    kb.index(1)
    kb.search(1, "body of document", 3)
    outcome: dict = {}

    def search() -> None:
        try:
            outcome["found"] = kb.search(1, "body of document", 3)
        except BaseException as exc:  # handed to the test below
            outcome["error"] = exc

    with psycopg.connect(kb.database_url, row_factory=dict_row) as admin:
        admin.execute(queries["test_lock_chunks_exclusively"])
        admin_pid = admin.info.backend_pid
        runner = threading.Thread(target=search, daemon=True)
        runner.start()
        deadline, blocked = time.monotonic() + 30, None
        while blocked is None and time.monotonic() < deadline:
            with psycopg.connect(kb.database_url, autocommit=True, row_factory=dict_row) as side:
                blocked = side.execute(queries["test_backends_blocked_by"], {"pids": [admin_pid]}).fetchone()
                if blocked is not None:
                    side.execute(queries["test_cancel_backend"], {"pid": blocked["pid"]})
            time.sleep(0.02)
        admin.rollback()
        runner.join(30)
    assert blocked is not None, "the search never waited behind the lock"
    assert isinstance(outcome.get("error"), StatementCanceled), outcome
    assert "canceled" in str(outcome["error"]) and "\n" not in str(outcome["error"])
    assert len(kb.search(1, "body of document", 3)) == 3


def test_an_incomplete_git_folder_is_workspace_not_found(kb):
    """A workspace folder whose .git is not (yet) a repository — another process is creating or
    deleting it, or a crash left it so — let dulwich's NotGitRepository escape search and index."""
    (kb.settings.knowledge_store / "7" / ".git").mkdir(parents=True)
    for call in (lambda: kb.search(7, "refund", 5), lambda: kb.index(7)):
        with pytest.raises(WorkspaceNotFound, match="workspace 7's git repository .* is incomplete"):
            call()


def test_a_workspace_deleted_by_another_knowledge_base_is_not_found_there_too(kb):
    """A KnowledgeBase keeps its workspaces' stores open; one that another KnowledgeBase (another
    process) deleted searched as empty there ([]) instead of WorkspaceNotFound."""
    from kb.index.embedding import HashingEmbedder
    from kb.knowledge_base import KnowledgeBase

    kb.use_embedder(HashingEmbedder())
    other = KnowledgeBase.open(kb.settings)
    other.use_embedder(HashingEmbedder())
    _fill(kb, 1)
    kb.index(1)
    assert len(other.search(1, "body of document", 3)) == 3
    kb.delete_workspace(1)
    with pytest.raises(WorkspaceNotFound, match="workspace 1 does not exist"):
        other.search(1, "body of document", 3)
    _fill(kb, 1)  # created again: the other KnowledgeBase finds the new one
    kb.index(1)
    assert len(other.search(1, "body of document", 3)) == 3
    other.close()


def test_workspaces_says_what_an_outside_commit_and_a_damaged_repository_wait_for(kb):
    """Faults found by trying to break `kb workspaces`: a revision committed with git outside kb
    showed "indexed" (the stamp was compared with Postgres' head, not git's), and once projected it
    showed every revision of the workspace as "waiting to be projected"; one repository that cannot
    be read made the whole listing fail, hiding every other workspace."""
    from support.commands import git

    for ws in (1, 2, 3):
        _fill(kb, ws)
        kb.index(ws)
    repo = kb.store(1).path
    (repo / "documents" / "outside.md").write_text("written with git, outside kb\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=Outside", "-c", "user.email=o@example.org", "commit", "-qm", "outside kb")
    outside = {s.id: s for s in kb.list_workspaces()}[1]
    assert (outside.index_state, outside.head_unrecorded, outside.head) == ("behind", True, kb.head(1))
    assert outside.describe_lag() == (
        "git's HEAD is a revision made outside kb: `kb sweep` records it, then `kb worker --until-idle` indexes it"
    )
    kb.rebuild_projection(1)  # projects git's HEAD before Postgres has recorded it
    kb.index(1)  # indexed, still unrecorded: the hint stays what records it
    projected = {s.id: s for s in kb.list_workspaces()}[1]
    assert projected.revisions_unprojected == 0 and "`kb sweep` records it" in projected.describe_lag()
    kb.sweep()  # what the hint says, and what the worker's periodic sweep does
    kb.run_worker(until_idle=True)
    assert {s.id: s for s in kb.list_workspaces()}[1].index_state == "indexed"

    broken = kb.store(2).path
    broken.rename(broken.with_name("2.aside"))
    (broken / ".git").mkdir(parents=True)  # a repository being created, deleted or damaged
    try:
        listed = {s.id: s for s in kb.list_workspaces()}
        assert set(listed) == {1, 2, 3} and listed[3].index_state == "indexed"
        assert listed[2].index_state == "damaged" and listed[2].head is None
        assert "is incomplete" in listed[2].describe_lag() and "retry" in listed[2].describe_lag()
    finally:
        (broken / ".git").rmdir()
        broken.rmdir()
        broken.with_name("2.aside").rename(broken)


def test_problems_name_the_documents_and_any_lag_besides():
    """ "problems" alone said neither what failed nor that revisions were waiting as well."""
    from kb.workspace.lifecycle import WorkspaceSummary

    summary = WorkspaceSummary(
        4,
        10,
        "ab" * 20,
        "problems",
        revisions_behind=1,
        documents_pending=0,
        documents_failed=2,
        revisions_unprojected=1,
        documents_unindexable=1,
    )
    assert summary.describe_lag() == (
        "2 documents failed, 1 document unindexable (`kb status --workspace 4` lists them); "
        "1 revision waiting to be projected, then indexed (`kb worker --until-idle` does it)"
    )
    settled = WorkspaceSummary(4, 10, "ab" * 20, "problems", 0, 0, 0, documents_quarantined=1)
    assert settled.describe_lag() == "1 document quarantined (`kb status --workspace 4` lists them)"


def test_a_kb_commit_listed_mid_way_is_not_taken_for_an_outside_one(kb):
    """A listing that read Postgres' head just before a kb commit and git's head just after called
    the commit "made outside kb" (72 of 2,448 listings beside a writer). The listing now asks
    Postgres, after reading git, whether git's head is recorded. Here the first read's view is
    made by setting the row's head back to the parent, as that read saw it."""
    from kb.db import database

    _fill(kb, 1)
    first = kb.head(1)
    with kb.transaction(1, "second", "alice") as tx:
        tx.write("/documents/second.md", "two\n")
    kb.index(1)
    with database.connect(kb.database_url, autocommit=True) as conn:
        conn.execute(queries["test_set_workspace_head"], {"workspace_id": 1, "head": first})
        try:
            listed = {s.id: s for s in kb.list_workspaces()}[1]
        finally:
            conn.execute(queries["test_set_workspace_head"], {"workspace_id": 1, "head": kb.head(1)})
    assert not listed.head_unrecorded and "outside kb" not in listed.describe_lag()


def test_a_corrupt_branch_ref_is_damage_and_the_sweep_goes_on(kb):
    """A branch ref holding "garbage" was listed as a head, read as "'garbage' is not a revision
    id" (blaming the user), and stopped `kb sweep` for every workspace."""
    from kb.errors import StorageError

    for ws in (1, 2):
        _fill(kb, ws)
    with kb.transaction(2, "more", "alice") as tx:
        tx.write("/documents/more.md", "more\n")
    (kb.store(1).path / ".git" / "refs" / "heads" / "main").write_text("garbage\n")
    listed = {s.id: s for s in kb.list_workspaces()}
    assert listed[1].index_state == "damaged" and "holds 'garbage', not a revision id" in listed[1].problem
    assert listed[2].index_state == "behind"
    with pytest.raises(StorageError, match="not a revision id; the repository is damaged"):
        kb.ls(1)
    report = kb.sweep()
    assert list(report.damaged) == [1] and 2 in report.index_deferred


def test_no_repository_has_nothing_to_wait_for():
    """A workspace whose .git is gone was told "1 revision waiting to be projected … (`kb worker
    --until-idle` does it)", which no worker can do."""
    from kb.workspace.lifecycle import WorkspaceSummary

    gone = WorkspaceSummary(5, 0, None, "no repository", 0, 0, 0, revisions_unprojected=1)
    assert gone.describe_lag() == ""


def test_lag_a_worker_is_working_on_says_so(kb):
    """`kb workspaces` told a user to run `kb worker --until-idle` while a worker was already
    running the workspace's job (new-user walkthrough); now it says a worker is on it. The job
    is fetched as a worker fetches it, with Procrastinate's own functions: a registered worker
    whose heartbeat is fresh (a killed worker's job is not running: test_worker_stop)."""
    from kb.db import database

    _fill(kb, 1)
    waiting = {s.id: s for s in kb.list_workspaces()}[1]
    assert waiting.describe_lag().endswith("(`kb worker --until-idle` does it)") and waiting.jobs_running == 0
    with database.connect(kb.database_url, autocommit=True) as conn:
        assert (
            conn.execute(
                queries["test_fetch_job_as_worker"], {"queues": [f"projection@{kb.settings.node}"]}
            ).fetchone()["id"]
            is not None
        )
    running = {s.id: s for s in kb.list_workspaces()}[1]
    assert running.jobs_running == 1
    assert (
        running.describe_lag() == "1 revision waiting to be projected, then indexed (a worker is running its job now)"
    )


def test_a_repository_appears_whole_or_not_at_all(kb, kb_env, settings):
    """design §2.1: a workspace's ``.git`` is renamed into place complete, config included, so a
    reader that finds it (another process's sweep, a second creator) never meets one without its
    config, and a creator killed midway leaves no half repository that the next create would take
    as existing (with git's defaults instead of kb's: hooks run, CRLF conversion)."""
    import signal
    import subprocess
    import sys
    import threading

    killed = subprocess.run(
        [sys.executable, "-c", "from kb import KnowledgeBase; KnowledgeBase.open().create_workspace(3)"],
        env={**kb_env, "KB_FAULT_POINT": "repository_init"},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    repository = settings.knowledge_store / "3"
    assert not (repository / ".git").exists()
    assert kb.create_workspace(3)
    assert "hooksPath = /dev/null" in (repository / ".git" / "config").read_text()

    # readers polling while workspaces are created never see a .git without its config
    seen_half: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for n in range(10, 30):
                git = settings.knowledge_store / str(n) / ".git"
                if git.is_dir() and not (git / "config").is_file():
                    seen_half.append(str(git))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for n in range(10, 30):
            kb.create_workspace(n)
    finally:
        done.set()
        watcher.join()
    assert seen_half == []
