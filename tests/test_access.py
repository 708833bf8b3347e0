"""design §16: who may call `kb serve` — real HTTP requests against a real `kb serve` process:
no token → 401; a read token for workspace 1 searches 1, cannot write 1 (403) and cannot see 2
(404, as a missing workspace); a write token commits and the revision names the token as
committer (the claimed author kept); a revoked token is refused by the next request; MCP over
HTTP follows the same rules; bad input (oversized, non-UTF-8, wrong shape, outside /documents)
is a clear 4xx and writes nothing."""

from __future__ import annotations

import http.client
import signal
import subprocess
import sys
import urllib.parse

import anyio
import httpx
import pytest
from support import api_fuzz
from support.commands import git
from support.named_queries import queries
from support.network import Relay, free_port
from support.serving import start_serve, stop_serve
from support.waiting import wait_until

pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")

from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from kb.adapters.mcp.server import WRITE_TOOLS
from kb.db import database

LIMIT = 4096


@pytest.fixture
def server(kb, kb_env, tmp_path):
    """A `kb serve` on loopback over workspaces 1 and 2 (one document each), with a small body limit."""
    for ws in (1, 2):
        kb.create_workspace(ws)
        with kb.transaction(ws, "seed", author="seed") as tx:
            tx.write("/documents/Plan.md", f"# Plan {ws}\n\nzebra refunds for workspace {ws}\n")
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "serve", "--port", str(port)],
        env={**kb_env, "KB_MAX_REQUEST_BYTES": str(LIMIT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return process.poll() is not None

    wait_until(ready, 120, "kb serve to be ready")
    assert process.poll() is None, (tmp_path / "serve.log").read_text()
    yield url
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=120)
    log.close()
    output = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in output, output


def _as(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def test_access_over_http(kb, kb_env, server):
    """One server for the acceptance path, bad input and a fuzz sample (a server start is the cost)."""
    _bad_input_writes_nothing(kb, server)  # first: it checks the head stays where the seed left it
    _scopes_workspaces_revocation_and_mcp(kb, server)
    _remote_cli_status_with_a_workspace_token(kb, kb_env, server)
    _fuzz_sample(kb, server)


def _scopes_workspaces_revocation_and_mcp(kb, server):
    reader = kb.tokens().create("reader", "read", [1])[1]
    writer_token, writer = kb.tokens().create("writer", "write", [1])
    api = httpx.Client(base_url=server, timeout=60)
    search = "/v1/workspaces/{}/search?q=zebra"
    # no token, a bad one: 401 everywhere but /health and /ready (OpenAPI and MCP included)
    assert api.get("/health").status_code == 200
    for path in (search.format(1), "/openapi.json", "/v1/status", "/mcp/1"):
        refused = api.get(path)
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer"), path
        assert refused.json()["error"] == "TokenRefused"
    assert api.get(search.format(1), headers=_as("kb_" + "x" * 43)).status_code == 401
    # a read token: searches 1; cannot write 1 (403); workspace 2 is as absent as 99 (404)
    assert api.get(search.format(1), headers=_as(reader)).status_code == 200
    file = "/v1/workspaces/1/turns/t1/files/documents/New.md"
    denied = api.put(file, json={"content": "x\n"}, headers=_as(reader))
    assert denied.status_code == 403 and denied.json()["error"] == "ScopeRefused"
    hidden, missing = (api.get(search.format(ws), headers=_as(reader)) for ws in (2, 99))
    assert hidden.status_code == missing.status_code == 404 and hidden.json()["error"] == "WorkspaceNotFound"
    # the same words for both, which do not tell the person a workspace they know of is missing
    assert hidden.json()["message"].replace("2", "N") == missing.json()["message"].replace("99", "N")
    assert "or token" in hidden.json()["message"] and "does not reach it" in hidden.json()["message"]
    assert api.get("/v1/status", headers=_as(reader)).status_code == 403  # every workspace: not its own
    own = api.get("/v1/status?workspace=1", headers=_as(reader))
    assert own.status_code == 200 and own.json()["workspace"]["id"] == 1, own.text
    # nothing of where kb keeps its data, nor of other workspaces' queues
    assert not {"database", "storage_root", "job_health"} & set(own.json()), own.json().keys()
    admin = kb.tokens().create("status-admin", "admin", None)[1]
    everything = api.get("/v1/status", headers=_as(admin)).json()
    assert {"database", "storage_root", "job_health"} <= set(everything)
    # a write token: the revision's committer names the token, the author is the one claimed
    written = api.put(f"{file}?author=Ada%20%3Cada%40example.com%3E", json={"content": "x\n"}, headers=_as(writer))
    assert written.status_code == 200, written.text
    committed = api.post("/v1/workspaces/1/turns/t1/commit", json={"message": "new"}, headers=_as(writer))
    assert committed.status_code == 200, committed.text
    repo = kb.settings.knowledge_store / "1"
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>") == (
        f"Ada <ada@example.com>|writer <kb-token-{writer_token.id}>\n"
    )
    _turns_and_chats_are_private_to_their_token(kb, server, writer, writer_token.id, repo)
    # MCP over HTTP: the same rules
    _mcp(server, reader, writer, writer_token.id, repo, kb.tokens())
    # a turn's edit of a document another revision removed is a conflict (409), not bad input
    gone = "/v1/workspaces/1/turns/t9/files/documents/Gone.md"
    with kb.transaction(1, "to be removed", "tester") as tx:
        tx.write("/documents/Gone.md", "soon gone\n")
    assert api.put(gone, json={"content": "edited\n"}, headers=_as(writer)).status_code == 200
    with kb.transaction(1, "remove it", "tester") as tx:
        tx.remove("/documents/Gone.md")
    refused = api.post("/v1/workspaces/1/turns/t9/commit", json={"message": "edit"}, headers=_as(writer))
    assert refused.status_code == 409 and refused.json()["error"] == "DocumentGone", refused.text
    # revoked: the very next request is refused
    kb.tokens().revoke("writer")
    assert api.get(search.format(1), headers=_as(writer)).status_code == 401


def _turns_and_chats_are_private_to_their_token(kb, server, writer, writer_id, repo):
    """A second write token of the same workspace that names the first one's turn or chat id gets
    a turn or chat of its own: it cannot commit, read or abort the first one's changes, nor see
    its citation handles."""
    other_token, other = kb.tokens().create("other-writer", "write", [1])
    other_id = other_token.id
    api = httpx.Client(base_url=server, timeout=60)
    draft = "/v1/workspaces/1/turns/shared/files/documents/Draft.md"
    assert api.put(draft, json={"content": "first writer's draft\n"}, headers=_as(writer)).status_code == 200
    assert api.get(draft, headers=_as(other)).status_code == 404  # not in the other token's turn
    head = kb.head(1)
    taken = api.post("/v1/workspaces/1/turns/shared/commit", json={"message": "x"}, headers=_as(other))
    assert taken.status_code == 200 and taken.json() == {"revision": None}, taken.text
    assert api.delete("/v1/workspaces/1/turns/shared", headers=_as(other)).status_code == 200
    assert kb.head(1) == head
    mine = api.post("/v1/workspaces/1/turns/shared/commit", json={"message": "draft"}, headers=_as(writer))
    assert mine.status_code == 200 and mine.json()["revision"] is not None, mine.text
    assert git(repo, "show", "HEAD:documents/Draft.md") == "first writer's draft\n"
    # an idempotency key: one token's commit with another's key records its own changes (never
    # answered with the other's revision while its own are dropped), and each settles its own
    key = {"Idempotency-Key": "commit-key-1"}
    assert api.put(draft, json={"content": "other's draft\n"}, headers=_as(other)).status_code == 200
    theirs = api.post("/v1/workspaces/1/turns/shared/commit", json={"message": "o"}, headers=_as(other) | key)
    assert theirs.status_code == 200 and theirs.json()["revision"] is not None, theirs.text
    assert api.put(draft, json={"content": "writer's second draft\n"}, headers=_as(writer)).status_code == 200
    second = api.post("/v1/workspaces/1/turns/shared/commit", json={"message": "w"}, headers=_as(writer) | key)
    assert second.status_code == 200 and second.json()["revision"] != theirs.json()["revision"], second.text
    assert git(repo, "show", "HEAD:documents/Draft.md") == "writer's second draft\n"
    for who, landed in ((writer, second), (other, theirs)):
        settled = api.get("/v1/workspaces/1/writes/commit-key-1", headers=_as(who)).json()
        assert settled["landed"] and settled["revision"]["id"] == landed.json()["revision"], settled
    # citation handles: the chat "c" of one token is not the chat "c" of another
    shown = api.get("/v1/workspaces/1/chats/c/documents/documents/Plan.md", headers=_as(writer))
    assert shown.status_code == 200, shown.text
    assert api.get("/v1/workspaces/1/chats/c/handles", headers=_as(writer)).json()
    assert api.get("/v1/workspaces/1/chats/c/handles", headers=_as(other)).json() == []
    # a long id: the token's prefix counts against the 200 characters, and the refusal counts
    # the client's own id (not the key it never gave)
    room = 200 - len(f"t{writer_id}@")
    longest = api.put(
        f"/v1/workspaces/1/turns/{'a' * room}/files/documents/L.md", json={"content": "l\n"}, headers=_as(writer)
    )
    assert longest.status_code == 200, longest.text
    assert api.delete(f"/v1/workspaces/1/turns/{'a' * room}", headers=_as(writer)).status_code == 200
    for url, error in (
        (f"/v1/workspaces/1/turns/{'a' * (room + 1)}/files/documents/L.md", "InvalidTurn"),
        (f"/v1/workspaces/1/chats/{'a' * (room + 1)}/handles", "InvalidChat"),
    ):
        refused = api.get(url, headers=_as(writer))
        assert refused.status_code == 400 and refused.json()["error"] == error, refused.text
        assert f"at most {room}" in refused.json()["message"] and f"t{writer_id}@" not in refused.text, refused.text
    # the citation page too: a person with the token opens its chat "c"; another token of the
    # workspace neither reaches it by "c" nor by the key kb stores it under
    page = "/ui/workspaces/1/citation"
    mine = api.get(page, params={"chat": "c", "c": "[1:L1]"}, headers=_as(writer))
    assert mine.status_code == 200 and "At its revision" in mine.text, mine.text
    for chat in ("c", f"t{writer_id}@c"):
        theirs = api.get(page, params={"chat": chat, "c": "[1:L1]"}, headers=_as(other))
        assert theirs.status_code == 404 and "At its revision" not in theirs.text, (chat, theirs.text)
        # it says why, in the visitor's own ids: it named the key kb keeps (t<id>@c) and a `kb cite
        # list` of it, which looks at the command line's chats and finds none of the token's
        assert "private to the token that made it" in theirs.text and "kb cite list" not in theirs.text, theirs.text
        assert f"t{other_id}@" not in theirs.text, theirs.text


def test_a_caller_is_not_told_where_the_database_is_when_it_does_not_answer(kb, kb_env, tmp_path):
    """Postgres away: the token cannot be checked, and the 503 says so without the database's
    address (host, port, user, database), which /v1/status keeps for an admin token (design §16)."""
    import psycopg

    info = psycopg.conninfo.conninfo_to_dict(kb.database_url)
    if str(info.get("host", "")).startswith("/"):
        pytest.skip("the test database listens on a Unix socket; the relay is TCP")
    relay = Relay(info.get("host") or "127.0.0.1", int(info.get("port") or 5432))
    url = psycopg.conninfo.make_conninfo(kb.database_url, host="127.0.0.1", port=str(relay.port))
    token = kb.tokens().create("some-reader", "read", [1])[1]
    # KB_POOL_TIMEOUT: the pool gives up on the away database in 5 s, not 30
    process, server = start_serve({**kb_env, "KB_DATABASE_URL": url, "KB_POOL_TIMEOUT": "5"}, tmp_path / "serve.log")
    try:
        assert httpx.get(f"{server}/v1/status", headers=_as(token), timeout=60).status_code == 403  # checked
        relay.close()
        # anybody (anything shaped as a token; a live one is answered alike): the pool's wait, then 503
        away = httpx.get(f"{server}/v1/workspaces/1/search?q=x", headers=_as("kb_" + "x" * 43), timeout=120)
        assert away.status_code == 503 and away.json()["error"] == "DatabaseUnavailable", away.text
        assert str(relay.port) not in away.text and info["dbname"] not in away.text, away.text
        # the readiness probe answers anybody, no token at all: not ready, and nothing of where
        unready = httpx.get(f"{server}/ready", timeout=120)
        assert unready.status_code == 503, unready.text
        assert str(relay.port) not in unready.text and info["dbname"] not in unready.text, unready.text
    finally:
        stop_serve(process, tmp_path / "serve.log")


def test_the_direct_database_url_is_kept_from_a_non_admin_token(kb, kb_env, tmp_path):
    """KB_DIRECT_DATABASE_URL (the session URL a page's live updates LISTEN on) is a deployment
    fact as KB_DATABASE_URL is: when it does not answer, a read token's page is told so without
    its address (user, host, port, database), an admin token's with it (design §16)."""
    kb.create_workspace(1)
    reader = kb.tokens().create("direct-reader", "read", [1])[1]
    admin = kb.tokens().create("direct-admin", "admin", None)[1]
    port = free_port()
    direct = f"postgresql://kbdirectuser@127.0.0.1:{port}/kbdirectdb"
    process, server = start_serve({**kb_env, "KB_DIRECT_DATABASE_URL": direct}, tmp_path / "serve.log")
    try:
        for token, admin_sees in ((reader, False), (admin, True)):
            page = httpx.get(f"{server}/ui/workspaces/1/events", headers=_as(token), timeout=60)
            assert page.status_code == 503 and "DatabaseUnavailable" in page.text, page.text
            for fact in ("kbdirectuser", "kbdirectdb", str(port)):
                assert (fact in page.text) is admin_sees, (fact, page.text)
    finally:
        stop_serve(process, tmp_path / "serve.log")


def test_errors_name_the_storage_root_to_an_admin_token_only(kb, kb_env, tmp_path):
    """A turn whose worktree cannot be made (a file where its folder goes): the StorageError
    reaches a write token over HTTP and over MCP without the storage root (design §16)."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", author="seed") as tx:
        tx.write("/documents/Plan.md", "# Plan\n")
    token, secret = kb.tokens().create("writer", "write", [1])
    worktrees = kb.settings.knowledge_store / "1" / ".git" / "worktrees"
    worktrees.mkdir(exist_ok=True)
    for name in (f"t{token.id}@blocked", f"mcp:t{token.id}@blocked"):
        (worktrees / name).write_text("in the way\n")
    root = str(kb.settings.storage_root)
    process, server = start_serve(kb_env, tmp_path / "serve.log")
    try:
        api = httpx.Client(base_url=server, timeout=60)
        refused = api.put(
            "/v1/workspaces/1/turns/blocked/files/documents/X.md", json={"content": "x\n"}, headers=_as(secret)
        )
        assert refused.json()["error"] == "StorageError" and root not in refused.text, refused.text
        assert refused.status_code == 507  # the server's storage refused, not the client's input (was 400)
        assert "<kb's storage root>/knowledge_store/1" in refused.json()["message"], refused.text
        headers = _as(secret) | {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        headers["X-KB-Chat"] = "blocked"
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
        opened = api.post(
            "/mcp/1", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=headers
        )
        headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        api.post("/mcp/1", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
        write = {"name": "write", "arguments": {"path": "/documents/S.md", "content": "s\n"}}
        tool = api.post(
            "/mcp/1", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": write}, headers=headers
        )
        assert '"isError":true' in tool.text and "cannot create the worktree" in tool.text, tool.text
        assert root not in tool.text and "<kb's storage root>" in tool.text, tool.text
    finally:
        stop_serve(process, tmp_path / "serve.log")


def test_mcp_errors_before_a_tool_runs_hide_the_storage_root_from_a_non_admin_token(kb, kb_env, tmp_path):
    """Workspace 7's repository is incomplete (an empty ``.git``): the chat cannot be opened, so
    every tool fails before it runs, and a resource cannot be read. Each error reaches a read
    token over MCP saying what is wrong without the storage root, and an admin token with it
    (design §16); none is an unexplained crash in the server's log."""
    (kb.settings.knowledge_store / "7" / ".git").mkdir(parents=True)
    reader = kb.tokens().create("reader-7", "read", [7])[1]
    admin = kb.tokens().create("admin-7", "admin", None)[1]
    root = str(kb.settings.storage_root)
    process, server = start_serve(kb_env, tmp_path / "serve.log")

    async def errors_of(token: str) -> tuple[str, str]:
        transport = streamable_http_client(f"{server}/mcp/7", http_client=create_mcp_http_client(headers=_as(token)))
        async with Client(transport) as client:
            tool = await client.call_tool("ls", {})
            assert tool.is_error
            try:
                await client.read_resource("kb://workspace/7/documents/Plan.md")
            except Exception as exc:  # the client's error for a refused read
                return tool.content[0].text, str(exc)
            raise AssertionError("the resource of a broken repository was read")

    try:
        for token, admin_sees in ((reader, False), (admin, True)):
            for text in anyio.run(errors_of, token):
                assert "is incomplete" in text, text
                assert (root in text) is admin_sees and ("<kb's storage root>" in text) is not admin_sees, text
    finally:
        output = stop_serve(process, tmp_path / "serve.log")
    assert "Traceback" not in output, output


def test_a_redis_lock_servers_address_and_password_are_kept_from_error_messages(settings):
    """KB_REDIS_URL down: LockUnavailable names it without its password to anybody, and without its
    address (URL, ``host:port`` as redis-py says it) to all but an admin token; so is an embedding
    endpoint of the deployment's own (design §16)."""
    from types import SimpleNamespace

    from kb.adapters.mcp.server import deployment_facts, hide_facts
    from kb.db.redis_lock import RedisLock
    from kb.errors import LockUnavailable

    port = free_port()
    own = settings.model_copy(
        update={
            "lock_backend": "redis",
            "redis_url": f"redis://:s3cret-pw@127.0.0.1:{port}/0",
            "openai_base_url": f"http://10.9.8.7:{port}/v1",
        }
    )
    with pytest.raises(LockUnavailable) as refused, RedisLock(own).hold(1):
        pass
    message = str(refused.value)
    assert "s3cret-pw" not in message and str(port) in message, message  # an admin reads where, never the password
    facts = deployment_facts(SimpleNamespace(settings=own, database_url=own.database_url))
    hidden = hide_facts(message, facts)
    assert str(port) not in hidden and "<kb's Redis>" in hidden, hidden
    said = f"embedding endpoint http://10.9.8.7:{port}/v1 failed: timed out"
    assert hide_facts(said, facts) == "embedding endpoint <kb's embedding endpoint> failed: timed out"


def test_hidden_facts_leave_document_paths_alone():
    """A short storage root hides where it starts a path, not inside a document's path."""
    from kb.adapters.mcp.server import hide_facts

    facts = {"/data": "<kb's storage root>", "user=kb host=db": "<kb's database>"}
    text = "cannot write /documents/data/x.md in /data/knowledge_store/1 (Postgres at user=kb host=db)"
    assert hide_facts(text, facts) == (
        "cannot write /documents/data/x.md in <kb's storage root>/knowledge_store/1 (Postgres at <kb's database>)"
    )
    assert hide_facts("at /x/y", {"/": "<root>"}) == "at /x/y"
    # libpq names the server it could not reach in its own words (address, port, socket, host name)
    for said in (
        'connection to server at "10.0.0.5", port 6543 failed: Connection refused',
        'connection to server at "db.internal" (10.0.0.5), port 6543 failed: timeout expired',
        'connection to server on socket "/run/pg/.s.PGSQL.6543" failed: No such file or directory',
        "failed to resolve host 'db.internal': [Errno -2] Name or service not known",
        # the server's FATAL answers name the database, the role and the client's host
        'connection to server at "db.internal" (10.0.0.5), port 6543 failed: FATAL:  database "kbprod" does not exist',
        'connection to server at "10.0.0.5", port 6543 failed: FATAL:  password authentication failed for user "kbsvc"',
        'connection to server at "10.0.0.5", port 6543 failed: FATAL:  role "kbsvc" does not exist',
        'connection to server at "10.0.0.5", port 6543 failed: FATAL:  no pg_hba.conf entry for host "10.0.0.9", '
        'user "kbsvc", database "kbprod", no encryption',
    ):
        hidden = hide_facts(said, facts)
        named = ("10.0.0.5", "6543", "db.internal", "/run/pg", "kbprod", "kbsvc", "10.0.0.9")
        assert not [fact for fact in named if fact in hidden], hidden
        assert "<kb's database>" in hidden, hidden


def test_a_revoked_tokens_staged_mcp_changes_are_not_committed(kb, kb_env, tmp_path):
    """Write tokens stage a change over MCP and are revoked (or expire) before committing it: the
    server's shutdown, which commits every open MCP turn, does not record it under their name."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", author="seed") as tx:
        tx.write("/documents/Plan.md", "# Plan\n")
    tokens = {name: kb.tokens().create(name, "write", [1])[1] for name in ("soon-revoked", "soon-expired")}
    process, server = start_serve(kb_env, tmp_path / "serve.log")
    try:
        for name, token in tokens.items():
            _stage_over_mcp(server, token, f"/documents/{name}.md")
        kb.tokens().revoke("soon-revoked")
        with database.pooled_connection(kb.database_url) as conn:
            conn.execute(queries["test_expire_api_token"], {"name": "soon-expired"})
    finally:
        output = stop_serve(process, tmp_path / "serve.log")
    tree = git(kb.settings.knowledge_store / "1", "ls-tree", "-r", "--name-only", "HEAD")
    assert "soon-revoked" not in tree and "soon-expired" not in tree, tree
    assert output.count("revoked or expired") == 2 and "Traceback" not in output, output


def _stage_over_mcp(server: str, token: str, path: str) -> None:
    """Write ``path`` in a fresh MCP session of ``token``, without committing it."""
    api = httpx.Client(base_url=server, timeout=60)
    headers = _as(token) | {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    opened = api.post(
        "/mcp/1", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=headers
    )
    headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
    api.post("/mcp/1", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    write = {"name": "write", "arguments": {"path": path, "content": "staged\n"}}
    staged = api.post(
        "/mcp/1", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": write}, headers=headers
    )
    assert '"isError":false' in staged.text, staged.text


def _remote_cli_status_with_a_workspace_token(kb, kb_env, server):
    """`kb status -w 1` through kb serve with a token for workspace 1: the workspace's status,
    without the deployment's facts the server keeps from such a token."""
    token = kb.tokens().create("status-reader", "read", [1])[1]
    env = {k: v for k, v in kb_env.items() if k != "KB_DATABASE_URL"}
    shown = subprocess.run(
        [sys.executable, "-m", "kb.adapters.cli", "status", "-w", "1"],
        env={**env, "KB_SERVER_URL": server, "KB_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "workspace:  1" in shown.stdout and "database:" not in shown.stdout, shown.stdout


def _mcp(server: str, reader: str, writer: str, writer_id: int, repo, kb_tokens) -> None:
    def client(token: str, ws: int = 1, extra: dict[str, str] | None = None) -> Client:
        headers = {**_as(token), **(extra or {})}
        transport = streamable_http_client(f"{server}/mcp/{ws}", http_client=create_mcp_http_client(headers=headers))
        return Client(transport)

    other_writer = kb_tokens.create("other-mcp-writer", "write", [1])[1]
    agent_chat = "agent-chat"
    # the headers kb serve sets for the MCP tools (scope, committer) cannot be sent by a client
    forged = {"X-KB-Token-Scope": "admin", "X-KB-Token-Committer": "Mallory <mallory@example.com>"}

    async def run() -> None:
        async with client(reader) as read_only:
            plan = await read_only.call_tool("read", {"path": "/documents/Plan.md"})
            assert "zebra refunds for workspace 1" in "".join(c.text for c in plan.content)
            own = await read_only.read_resource("kb://workspace/1/documents/Plan.md")
            assert "zebra refunds for workspace 1" in own.contents[0].text
            other = "kb://workspace/2/documents/Plan.md"  # a resource of a workspace it cannot reach
            with pytest.raises(Exception, match="no workspace 2"):
                await read_only.read_resource(other)
            refused = await read_only.call_tool("write", {"path": "/documents/M.md", "content": "m\n"})
            assert refused.is_error and "write token" in refused.content[0].text
            offered = {tool.name for tool in (await read_only.list_tools()).tools}
            assert {"search", "read"} <= offered and not offered & WRITE_TOOLS, offered
        async with client(reader, extra=forged) as forging:
            offered = {tool.name for tool in (await forging.list_tools()).tools}
            assert not offered & WRITE_TOOLS, offered
            refused = await forging.call_tool("write", {"path": "/documents/M.md", "content": "forged\n"})
            assert refused.is_error and "write token" in refused.content[0].text
        async with client(writer, extra={**forged, "X-KB-Chat": agent_chat}) as agent:
            assert {tool.name for tool in (await agent.list_tools()).tools} >= WRITE_TOOLS
            await agent.call_tool("write", {"path": "/documents/M.md", "content": "m\n"})
            async with client(other_writer, extra={"X-KB-Chat": agent_chat}) as intruder:
                taken = await intruder.call_tool("commit", {"message": "taken"})
                assert '"revision": null' in taken.content[0].text.replace("None", "null"), taken.content[0].text
            assert not (await agent.call_tool("commit", {"message": "by mcp"})).is_error
        with pytest.raises(Exception):  # noqa: B017 - the transport's error for a 404 at connect
            async with client(reader, ws=2) as other:
                await other.call_tool("search", {"query": "zebra"})

    anyio.run(run)
    # the chat's token is its author too (kb serve started without --author): it recorded the
    # server's OS user, as if a person on the server had written what every agent wrote
    assert git(repo, "log", "-1", "--format=%s|%an <%ae>|%cn <%ce>") == (
        f"by mcp|writer <kb-token-{writer_id}>|writer <kb-token-{writer_id}>\n"
    )
    _mcp_sessions_belong_to_their_token(server, writer, [other_writer, reader])
    _mcp_session_end_commits_the_chat_the_tools_used(server, writer, repo)
    assert httpx.post(f"{server}/mcp/2", json={}, headers=_as(reader), timeout=30).status_code == 404
    for odd in ("/mcp/%D9%A2", "/mcp/%EF%BC%92", "/mcp/1/2"):  # another script's digit 2, a fullwidth 2
        assert httpx.post(f"{server}{odd}", json={}, headers=_as(reader), timeout=30).status_code == 404, odd


def _mcp_sessions_belong_to_their_token(server: str, owner: str, others: list[str]) -> None:
    """An MCP session (its Mcp-Session-Id) answers only the token that opened it: another token
    that learns the id can neither end the session (HTTP DELETE) nor send on it."""
    api = httpx.Client(base_url=server, timeout=60)
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    opened = api.post(
        "/mcp/1", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=_as(owner) | accept
    )
    assert opened.status_code == 200, opened.text
    session = {"Mcp-Session-Id": opened.headers["mcp-session-id"]}
    ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert api.post("/mcp/1", json=ready, headers=_as(owner) | accept | session).status_code == 202
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    for other in others:
        assert api.post("/mcp/1", json=listing, headers=_as(other) | accept | session).status_code == 404
        assert api.delete("/mcp/1", headers=_as(other) | accept | session).status_code == 404
    answer = api.post("/mcp/1", json=listing, headers=_as(owner) | accept | session)
    assert answer.status_code == 200 and '"commit"' in answer.text, answer.text
    assert api.delete("/mcp/1", headers=_as(owner) | accept | session).status_code == 200
    # a chat id that is not UTF-8 (a header is bytes): the end of its session is answered, and
    # the server logs no traceback (the fixture checks)
    odd = api.delete("/mcp/1", headers={**_as(owner), **accept, "X-KB-Chat": b"caf\xe9 \xff"})
    assert odd.status_code < 500, odd.text


def _mcp_session_end_commits_the_chat_the_tools_used(server: str, writer: str, repo) -> None:
    """The end of a session (HTTP DELETE) commits its chat's turn; a client that sends X-KB-Chat
    twice: the tools take the first, and so does the end of its session."""
    api = httpx.Client(base_url=server, timeout=60)
    headers = [
        *_as(writer).items(),
        ("Accept", "application/json, text/event-stream"),
        ("Content-Type", "application/json"),
        ("X-KB-Chat", "first-chat"),
        ("X-KB-Chat", "second-chat"),
    ]
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    opened = api.post(
        "/mcp/1", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}, headers=headers
    )
    headers.append(("Mcp-Session-Id", opened.headers["mcp-session-id"]))
    api.post("/mcp/1", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    write = {"name": "write", "arguments": {"path": "/documents/Twice.md", "content": "twice\n"}}
    wrote = api.post(
        "/mcp/1", json={"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": write}, headers=headers
    )
    assert wrote.status_code == 200 and '"isError":false' in wrote.text, wrote.text
    assert api.delete("/mcp/1", headers=headers).status_code == 200
    # the answer goes out before the commit: wait for it (a session that ended uncommitted never lands)
    wait_until(lambda: "documents/Twice.md" in git(repo, "ls-tree", "-r", "--name-only", "HEAD"), 60, "the commit")
    assert git(repo, "show", "HEAD:documents/Twice.md") == "twice\n"


def _bad_input_writes_nothing(kb, server):
    head = kb.head(1)
    writer = _as(kb.tokens().create("bad-input", "write", None)[1])
    api = httpx.Client(base_url=server, timeout=60, headers=writer)
    turn = "/v1/workspaces/1/turns/bad"
    big = api.put(f"{turn}/files/documents/Big.md", json={"content": "x" * (2 * LIMIT)})
    assert big.status_code == 413 and "KB_MAX_REQUEST_BYTES" in big.json()["message"]
    # a chunked body (no Content-Length) is cut off once it passes the limit
    host, port = urllib.parse.urlsplit(server).netloc.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = iter([b'{"content": "', *[b"y" * 1000] * 10, b'"}'])
    headers = {**writer, "Content-Type": "application/json"}
    conn.request("PUT", f"{turn}/files/documents/Chunked.md", body=body, headers=headers, encode_chunked=True)
    assert conn.getresponse().status == 413
    conn.close()
    for path, body, status in (
        (f"{turn}/files/documents/%FF.md", {"content": "x"}, 400),  # not UTF-8
        (f"{turn}/files/etc/passwd", {"content": "x"}, 400),  # outside /documents
        (f"{turn}/files/documents/%2E%2E/%2E%2E/x.md", {"content": "x"}, 400),
        (f"{turn}/files/documents/../../x.md", {"content": "x"}, 404),  # the client resolves it: no route
        (f"{turn}/files/documents/Shape.md", {"content": 7}, 422),  # wrong shape
        (f"{turn}/files/documents/Shape.md", ["content"], 422),
    ):
        answer = api.put(path, json=body)
        assert answer.status_code == status and answer.json()["error"], (path, answer.text)
    not_json = api.put(
        f"{turn}/files/documents/B.md", content=b'{"content": "\xff"}', headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 422 and "not UTF-8" in not_json.json()["message"]  # was a bare 400
    # a body that is not JSON at all (markdown sent as is, a bare word, binary): 422, never a 500
    for url, raw, kind in (
        (f"{turn}/files/documents/Raw.md", b"# Raw\n\nmarkdown sent as is\n", "text/markdown"),
        (f"{turn}/commit", b"hello", "text/plain"),
        (f"{turn}/files/documents/Raw.md", b"\xff\xfe\x00binary", "application/octet-stream"),
    ):
        answer = api.request(
            "POST" if url.endswith("commit") else "PUT", url, content=raw, headers={"Content-Type": kind}
        )
        assert answer.status_code == 422 and answer.json()["error"] == "InvalidInput", (url, answer.text)
    assert api.post(f"{turn}/commit", json={"message": "bad"}).json() == {"revision": None}
    assert kb.head(1) == head


def _fuzz_sample(kb, server):
    """A sample of the HTTP API fuzz (the long run: bin/fuzz_http_api.py)."""
    tokens, writer_id, heads = api_fuzz.prepare(kb)
    report = api_fuzz.run(server, tokens, 60, seed=7)
    api_fuzz.check_history(kb, writer_id, heads, report)
    assert report.requests >= 50 and not report.server_errors and not report.unauthorized_writes, report.summary()
