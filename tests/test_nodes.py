"""design §15: two real nodes on this machine — two storage roots, two ``kb serve --with-worker``
processes on two ports, one Postgres. A workspace imported and written on node a is searched, read,
written and used over MCP through node b's port with a's results and true line numbers; b's worker
fails no job; a job that reaches the wrong node re-defers itself; a workspace of b is served
through a's port; when a is down, b answers NodeUnavailable naming it and serves its own."""

from __future__ import annotations

import contextlib
import json
import subprocess

import anyio
import pytest
from support import serving
from support.commands import git, run_cli
from support.named_queries import queries
from support.serving import start_serves, stop_serve
from support.waiting import wait_until

from kb import KnowledgeBase, Settings
from kb.db import database
from kb.jobs.routing import placement
from kb.store.job_deferral import INDEX_TASK

pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")

SYNC_DOC = "# Sync\n\nDevices sync every minute.\nConflicts keep both copies.\n"
NODES_DOC = "# Nodes\n\nline three\nThe zebra crossing is homed on node a.\nline five\n"


TOKEN: dict[str, str] = {}
"""The write token every request of this test sends (design §16: kb serve checks tokens on every
node, and a forwarded request carries the client's header to the home node unchanged)."""


def call(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, object]:
    """``serving.call`` with this test's bearer token."""
    return serving.call(url, method, body, headers={"Authorization": f"Bearer {TOKEN['secret']}"})


def _node(kb_env: dict[str, str], settings: Settings, name: str) -> tuple[dict[str, str], Settings]:
    root = settings.storage_root.parent / f"node-{name}"
    env = {**kb_env, "KB_NODE": name, "KB_STORAGE_ROOT": str(root)}
    return env, settings.model_copy(update={"node": name, "storage_root": root})


def _commit_through(url: str, ws: int, turn: str, path: str, content: str) -> str:
    base = f"{url}/v1/workspaces/{ws}/turns/{turn}"
    status, body = call(f"{base}/files/{path.lstrip('/')}", "PUT", {"content": content})
    assert status == 200, body
    status, body = call(f"{base}/commit", "POST", {"message": f"{turn}: {path}"})
    assert status == 200, body
    return body["revision"]


def _jobs(database_url: str) -> list[dict]:
    with database.connect(database_url, autocommit=True) as conn:
        return conn.execute(queries["test_node_jobs"]).fetchall()


def test_two_nodes_forward_requests_and_jobs_to_the_home_node(kb_env, settings, tmp_path):
    env_a, settings_a = _node(kb_env, settings, "a")
    env_b, settings_b = _node(kb_env, settings, "b")
    running: list[subprocess.Popen] = []
    with KnowledgeBase.open(settings_a) as kb:
        TOKEN["secret"] = kb.tokens().create("nodes-test", "write", None)[1]
    env_a, env_b = ({**env, "KB_TOKEN": TOKEN["secret"]} for env in (env_a, env_b))
    try:
        (a, url_a), (b, url_b) = start_serves(
            [(env_a, tmp_path / "a.log", ("--with-worker",)), (env_b, tmp_path / "b.log", ("--with-worker",))]
        )
        running += [a, b]
        # import and write on a: workspace 1 is homed on a, its repository only under a's root
        notes = tmp_path / "notes"
        for name, text in {
            "Refunds.md": "# Refunds\n\nAnnual plans are refunded pro rata.\n",
            "Sync.md": SYNC_DOC,
        }.items():
            (notes / name).parent.mkdir(parents=True, exist_ok=True)
            (notes / name).write_text(text)
        run_cli(env_a, "import", str(notes), "--workspace", "1")
        revision = _commit_through(url_a, 1, "on-a", "/documents/Nodes.md", NODES_DOC)
        kb_a = KnowledgeBase.open(settings_a, migrate=False)
        assert kb_a.workspace_home(1).node == "a" and kb_a.head(1) == revision
        assert not (settings_b.knowledge_store / "1").exists()

        # search and read through b's port: a's results, with true line numbers
        def indexed() -> dict | None:
            status, body = call(f"{url_b}/v1/workspaces/1/search?q=zebra%20crossing&k=3")
            return body if status == 200 and body["index"]["hint"] is None else None

        through_b = wait_until(indexed, 120, "node a's worker to index workspace 1 (searched through b)")
        assert through_b == call(f"{url_a}/v1/workspaces/1/search?q=zebra%20crossing&k=3")[1]
        top = through_b["results"][0]
        assert top["path"] == "/documents/Nodes.md" and top["revision"] == revision
        assert [4, "The zebra crossing is homed on node a."] in top["lines"]
        lines = git(settings_a.knowledge_store / "1", "show", f"{revision}:documents/Nodes.md").split("\n")
        assert all(lines[n - 1] == text for n, text in top["lines"])
        read = call(f"{url_b}/v1/workspaces/1/documents/documents/Nodes.md")
        assert read == call(f"{url_a}/v1/workspaces/1/documents/documents/Nodes.md") and read[0] == 200
        # the CLI through KB_SERVER_URL=b, and MCP through b, take the same path
        served = {**env_b, "KB_SERVER_URL": url_b}
        assert "The zebra crossing is homed on node a." in run_cli(served, "search", "zebra", "-w", "1").stdout
        assert _mcp_search_and_write(url_b) == ["/documents/Via-mcp.md"]

        # a write through b's port lands on a (the turn lives on a)
        written = _commit_through(url_b, 1, "via-b", "/documents/Via-b.md", "# written through b\n")
        assert kb_a.head(1) == written and not (settings_b.knowledge_store / "1").exists()
        git(settings_a.knowledge_store / "1", "fsck", "--strict")
        # importing into it on b is refused (no empty repository, no destructive hint)
        refused = run_cli(env_b, "import", str(notes), "--workspace", "1", check=False)
        assert refused.returncode == 1 and "homed on node 'a'" in refused.stderr, refused.stderr
        assert "DELETE" not in refused.stderr and not (settings_b.knowledge_store / "1").exists()

        # a job that reaches the wrong node (deferred before nodes, or before a move) re-defers
        kb_b = KnowledgeBase.open(settings_b, migrate=False)
        handed = placement(kb_b.stores, 1, "index", INDEX_TASK)
        assert handed is not None and handed["redeferred_to"] == "a"

        # a workspace of b, written through a's port, lands on b
        kb_b.create_workspace(2)
        on_b = _commit_through(url_a, 2, "via-a", "/documents/B.md", "# homed on b\n")
        assert kb_b.head(2) == on_b and not (settings_a.knowledge_store / "2").exists()

        def b_done() -> list[dict] | None:  # b's worker ran workspace 2's projection and index jobs
            jobs = [j for j in _jobs(settings.database_url) if j["workspace_id"] == 2]
            return jobs if jobs and all(j["status"] not in ("todo", "doing") for j in jobs) else None

        wait_until(b_done, 120, "node b's worker to run workspace 2's jobs")
        jobs = _jobs(settings.database_url)
        assert [j for j in jobs if j["status"] == "failed"] == []
        for job in jobs:  # each workspace's jobs went to its home node's queues
            if job["workspace_id"] is not None:
                assert job["queue_name"].endswith("@a" if job["workspace_id"] == 1 else "@b"), job
        kb_a.close()
        kb_b.close()

        # node a down: b answers NodeUnavailable naming a, and still serves its own workspace
        stop_serve(a, tmp_path / "a.log")
        status, body = call(f"{url_b}/v1/workspaces/1/search?q=zebra")
        assert status == 503 and body["error"] == "NodeUnavailable" and "'a'" in body["message"], body
        assert call(f"{url_b}/v1/workspaces/2/documents/documents/B.md")[0] == 200
        with database.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(queries["test_age_node_heartbeat"], {"name": "a", "seconds": 3600})
        status, body = call(f"{url_b}/v1/workspaces/1/documents/documents/Nodes.md")
        assert status == 503 and "which is down (last heartbeat 3600 s ago" in body["message"], body
        cli = run_cli(served, "read", "/documents/Nodes.md", "-w", "1", check=False)
        assert cli.returncode == 1 and "node 'a'" in cli.stderr
        listed = {n["name"]: n for n in map(json.loads, run_cli(env_b, "nodes", "--json").stdout.splitlines())}
        assert listed["a"]["up"] is False and listed["b"]["up"] is True
        assert listed["a"]["workspaces"] == 1 and listed["b"]["workspaces"] == 1
        assert "Traceback" not in stop_serve(b, tmp_path / "b.log")
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()


def _mcp_search_and_write(url: str) -> list[str]:
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async def session() -> list[str]:
        headers = {"Authorization": f"Bearer {TOKEN['secret']}"}
        transport = streamable_http_client(f"{url}/mcp/1?chat=through-b", http_client=create_mcp_http_client(headers))
        async with Client(transport) as client:
            found = "".join(
                getattr(c, "text", "") for c in (await client.call_tool("search", {"query": "zebra"})).content
            )
            assert "Nodes.md" in found
            await client.call_tool("write", {"path": "/documents/Via-mcp.md", "content": "# via mcp\n"})
            result = await client.call_tool("commit", {"message": "through b over mcp"})
            value = result.structured_content
            value = value.get("result", value) if isinstance(value, dict) else json.loads(result.content[0].text)
            return value["added"]

    return anyio.run(session)


@pytest.fixture
def pgbouncer(database_url: str):
    """A PgBouncer in transaction mode in front of the test's database (design §13)."""
    from support.pgbouncer import run_pgbouncer

    yield from run_pgbouncer(database_url)


def test_two_nodes_through_pgbouncer_in_transaction_mode(kb_env, settings, tmp_path, pgbouncer):
    """The same deployment behind a transaction pooler: every connection of both nodes (serve,
    worker, CLI) goes through PgBouncer; a write through b lands on a, a search through b finds it
    at its true lines once a's worker indexed it, and no job fails on either node."""
    pooled = {"KB_DATABASE_URL": pgbouncer, "KB_DATABASE_POOLER": "transaction"}
    env_a, settings_a = _node({**kb_env, **pooled}, settings, "a")
    env_b, _ = _node({**kb_env, **pooled}, settings, "b")
    with KnowledgeBase.open(settings_a) as kb:
        TOKEN["secret"] = kb.tokens().create("pooled-test", "write", None)[1]
    running: list[subprocess.Popen] = []
    try:
        (a, url_a), (b, url_b) = start_serves(
            [(env_a, tmp_path / "a.log", ("--with-worker",)), (env_b, tmp_path / "b.log", ("--with-worker",))]
        )
        running += [a, b]
        notes = tmp_path / "notes"
        notes.mkdir()
        (notes / "Sync.md").write_text(SYNC_DOC)
        run_cli(env_a, "import", str(notes), "--workspace", "1")
        revision = _commit_through(url_b, 1, "pooled", "/documents/Nodes.md", NODES_DOC)
        with KnowledgeBase.open(settings_a, migrate=False) as kb_a:
            assert kb_a.head(1) == revision and kb_a.workspace_home(1).node == "a"

        def indexed() -> dict | None:
            status, body = call(f"{url_b}/v1/workspaces/1/search?q=zebra%20crossing&k=3")
            return body if status == 200 and body["index"]["hint"] is None else None

        top = wait_until(indexed, 120, "node a's worker to index through the pooler")["results"][0]
        assert top["path"] == "/documents/Nodes.md" and [4, "The zebra crossing is homed on node a."] in top["lines"]
        jobs = _jobs(settings.database_url)
        assert jobs and [j for j in jobs if j["status"] == "failed"] == []
        assert all(j["queue_name"].endswith("@a") for j in jobs if j["workspace_id"] == 1)
        for process, name in ((a, "a"), (b, "b")):
            assert "Traceback" not in stop_serve(process, tmp_path / f"{name}.log")
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()


def test_a_page_form_posted_through_another_node_is_served_by_the_home(settings, tmp_path):
    """A person logged in on node b's pages reverts a revision of a workspace homed on a: the form
    is forwarded to a, whose anti-forgery check sees the browser's ``Origin`` (b) and the ``Host``
    the browser sent (b), not the forwarding hop's; a form from another site is still refused."""
    import re

    import httpx
    from support import kb_nodes

    a, b = (kb_nodes.node(settings.database_url, name, tmp_path / name) for name in ("a", "b"))
    with KnowledgeBase.open(settings.model_copy(update={"node": "a", "storage_root": a.root})) as kb:
        kb.create_workspace(1)
        kb.register_node()  # workspace 1 is homed on a
        for text in ("one\n", "two\n"):
            with kb.transaction(1, text, "alice") as tx:
                tx.write("/documents/a.md", text.encode())
        undone = tx.revision.id
        secret = TOKEN["secret"] = kb.tokens().create("ui-writer", "write", None)[1]
    try:
        for each in (a, b):
            kb_nodes.start(each, worker=False)
        with httpx.Client(base_url=b.url, timeout=60, headers={"Origin": b.url}) as browser:
            login = browser.get("/ui/login").text
            csrf = re.search(r'name="csrf" value="([^"]+)"', login).group(1)
            assert browser.post("/ui/login", data={"csrf": csrf, "token": secret}).status_code == 303
            revert = f"/ui/workspaces/1/revisions/{undone}/revert"
            page = browser.get(revert)
            assert page.status_code == 200 and "Revert" in page.text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            foreign = browser.post(revert, data={"csrf": csrf}, headers={"Origin": "http://evil.example"})
            assert foreign.status_code == 403
            done = browser.post(revert, data={"csrf": csrf})
            assert done.status_code == 303 and "reverted=" in done.headers["location"], done.text
        # Postgres drops every session: b cannot look up the home, so it says the database is away
        # (retry), never WrongNode as if the request had reached the wrong server
        with database.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(queries["test_terminate_other_backends"])
        answers = [call(f"{b.url}/v1/workspaces/1/documents/documents/a.md") for _ in range(8)]
        assert {status for status, _ in answers} <= {200, 503}, answers
        assert all(body["error"] == "DatabaseUnavailable" for status, body in answers if status == 503), answers
        with KnowledgeBase.open(settings.model_copy(update={"node": "a", "storage_root": a.root})) as kb:
            assert kb.read(1, "/documents/a.md") == b"one\n"
            git(a.root / "knowledge_store" / "1", "fsck", "--strict")
    finally:
        for each in (a, b):
            kb_nodes.stop(each)


def test_a_home_killed_mid_commit_of_a_forwarded_write_is_an_unknown_outcome_then_settled(settings, tmp_path):
    """kill -9 of the home's `kb serve` inside a commit forwarded from b (``KB_FAULT_POINT``):
    b does not say "nothing was forwarded" — the outcome is unknown, and once a is back the
    write's Idempotency-Key settles it (it landed: git had it); the repository is clean."""
    from support import kb_nodes

    a, b = (kb_nodes.node(settings.database_url, name, tmp_path / name) for name in ("a", "b"))
    on_a = settings.model_copy(update={"node": "a", "storage_root": a.root})
    with KnowledgeBase.open(on_a) as kb:
        kb.create_workspace(1)
        kb.register_node()
        TOKEN["secret"] = kb.tokens().create("writer", "write", None)[1]
    a.env["KB_FAULT_POINT"] = "before_pg_commit"
    try:
        for each in (a, b):
            kb_nodes.start(each, worker=False)
        turn = f"{b.url}/v1/workspaces/1/turns/killed"
        assert call(f"{turn}/files/documents/K.md", "PUT", {"content": "k\n"})[0] == 200
        status, body = serving.call(
            f"{turn}/commit",
            "POST",
            {"message": "killed"},
            headers={"Authorization": f"Bearer {TOKEN['secret']}", "Idempotency-Key": "kill-1"},
        )
        assert status == 503 and body["outcome"] == "unknown", body
        assert "nothing was forwarded" not in body["message"] and "/writes/kill-1" in body["message"], body
        a.process.wait(30)
        del a.env["KB_FAULT_POINT"]
        kb_nodes.start(a, worker=False)
        status, settled = call(f"{b.url}/v1/workspaces/1/writes/kill-1")
        assert status == 200 and settled["landed"] is True, settled  # it had reached git: it landed
        read = call(f"{b.url}/v1/workspaces/1/documents/documents/K.md")[1]
        assert read["lines"] == [[1, "k"]] and read["revision"] == settled["revision"]["id"], read
        git(a.root / "knowledge_store" / "1", "fsck", "--strict")
    finally:
        for each in (a, b):
            kb_nodes.stop(each)


@contextlib.contextmanager
def _homed_on_a_gone_node(settings, tmp_path):
    """Workspace 1 homed on node a, whose advertised URL answers nobody (its server is gone, its
    heartbeat still fresh); node b serving. Yields ``(b, a's URL, read token of 1, admin token)``."""
    from support import kb_nodes
    from support.network import free_port

    a, b = (kb_nodes.node(settings.database_url, name, tmp_path / name) for name in ("a", "b"))
    gone = f"http://127.0.0.1:{free_port()}"
    with KnowledgeBase.open(settings.model_copy(update={"node": "a", "storage_root": a.root})) as kb:
        kb.create_workspace(1)
        kb.register_node(gone)  # workspace 1 is homed on a, at an address nobody answers
        reader = kb.tokens().create("forwarded-reader", "read", [1])[1]
        admin = kb.tokens().create("forwarded-admin", "admin", None)[1]
    try:
        kb_nodes.start(b, worker=False)
        yield b, gone, reader, admin
    finally:
        kb_nodes.stop(b)


def test_a_forwarding_error_names_the_home_nodes_url_to_an_admin_token_only(settings, tmp_path):
    """Workspace 1 is homed on node a, whose advertised URL answers nobody. Through node b, a read
    token is told node a did not answer and what to do, without a's URL; an admin token is told
    the URL. A read token that sends the forwarding header itself (so b serves the request here,
    and refuses it as homed elsewhere) is not told the URL either (design §15, §16)."""
    with _homed_on_a_gone_node(settings, tmp_path) as (b, gone, reader, admin):
        url = f"{b.url}/v1/workspaces/1/documents/documents/a.md"
        for token, admin_sees in ((reader, False), (admin, True)):
            status, body = serving.call(url, headers={"Authorization": f"Bearer {token}"})
            assert status == 503 and body["error"] == "NodeUnavailable" and body["node"] == "a", body
            assert "did not answer" in body["message"] and "Retry" in body["message"], body
            assert (gone in json.dumps(body)) is admin_sees and ("127.0.0.1" in json.dumps(body)) is admin_sees, body
            if not admin_sees:
                assert "`kb nodes`" in body["message"], body
        forged = {"Authorization": f"Bearer {reader}", "X-Kb-Forwarded-By": "a"}
        status, body = serving.call(url, headers=forged)
        assert status == 421 and body["error"] == "WrongNode" and "homed on node 'a'" in body["message"], body
        assert gone not in json.dumps(body) and "<a kb node's URL>" in body["message"], body
        # the same over MCP: the tools' errors hide what the API's errors hide
        assert gone not in _mcp_tool_error(b.url, forged), gone


def test_a_token_learns_nothing_through_forwarding_of_a_workspace_it_cannot_reach(settings, tmp_path):
    """Workspace 1 is homed on node a, which is gone. A token of workspace 2 only asks node b for
    workspace 1 (API, MCP, a page): it is answered as for a workspace that does not exist, never
    503 NodeUnavailable naming 1's home node — that told it workspace 1 exists and where it lives
    (design §15, §16)."""
    with _homed_on_a_gone_node(settings, tmp_path) as (b, _, _reader, _admin):
        with KnowledgeBase.open(settings.model_copy(update={"node": "b", "storage_root": b.root})) as kb:
            kb.create_workspace(2)
            stranger = kb.tokens().create("stranger-2", "read", [2])[1]
        bearer = {"Authorization": f"Bearer {stranger}"}
        for ws in (1, 99):  # 99 does not exist: workspace 1 must look the same
            for method, path in (
                ("GET", f"/v1/workspaces/{ws}/documents/documents/a.md"),
                ("POST", f"/mcp/{ws}"),
                ("GET", f"/v1/status?workspace={ws}"),
            ):
                status, body = serving.call(f"{b.url}{path}", method, {} if method == "POST" else None, headers=bearer)
                assert status in (403, 404) and "node" not in json.dumps(body).lower(), (ws, path, status, body)


def _mcp_tool_error(url: str, headers: dict[str, str]) -> str:
    """The text of the error the ``ls`` tool answers on ``url``'s ``/mcp/1`` with ``headers``."""
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async def session() -> str:
        transport = streamable_http_client(f"{url}/mcp/1", http_client=create_mcp_http_client(headers))
        async with Client(transport) as client:
            result = await client.call_tool("ls", {})
            text = "".join(getattr(c, "text", "") for c in result.content)
            assert result.is_error and "homed on node 'a'" in text and "<a kb node's URL>" in text, text
            return text

    return anyio.run(session)


def test_an_mcp_path_naming_no_single_workspace_is_refused_where_it_arrives(settings, tmp_path):
    """``/mcp/1/2``, ``/mcp//1``, ``/mcp/1/x``: no workspace is picked from such a path (not
    workspace 1, whose home is then asked for, nor 2): node b answers 404 saying which URL to
    connect to, for a token of workspace 1; ``/mcp/1`` itself is forwarded to 1's home (design §13, §15)."""
    with _homed_on_a_gone_node(settings, tmp_path) as (b, _, reader, _admin):
        bearer = {"Authorization": f"Bearer {reader}"}
        for odd in ("/mcp/1/2", "/mcp//1", "/mcp/1/x", "/mcp/1/1"):
            status, body = serving.call(f"{b.url}{odd}", "POST", {}, headers=bearer)
            assert status == 404 and "connect to /mcp/<workspace id>" in body["message"], (odd, body)
        status, body = serving.call(f"{b.url}/mcp/1", "POST", {}, headers=bearer)
        assert status == 503 and body["error"] == "NodeUnavailable", body  # forwarded to a, which is gone
