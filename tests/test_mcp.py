"""kb over MCP (design §5): the SDK's own client against a real ``kb mcp`` (stdio) and a real
``kb serve`` (streamable HTTP) on a real workspace, with the real git CLI checking the result."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from support.commands import git, run_cli
from support.named_queries import queries
from support.network import free_port
from support.serving import turn_locks_held

AUTHOR = "Ada Lovelace <ada@example.com>"
PLAN = "# Plan\n\nline three\nline four about the refund window\nline five\n"


def _text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def _structured(result):
    if result.structured_content is not None:
        value = result.structured_content
        return value.get("result", value) if isinstance(value, dict) and set(value) == {"result"} else value
    return json.loads(_text(result))


@pytest.fixture
def workspace(kb, kb_env) -> int:
    kb.create_workspace(1)
    with kb.transaction(1, "seed", author="seed") as tx:
        tx.write("/documents/Plan.md", PLAN)
        tx.write("/documents/Notes/Refunds.md", "# Refunds\n\nAnnual plans are refunded within 30 days.\n")
        tx.write("/documents/Notes/Other.md", "# Other\n\nnothing about money\n")
    run_cli(kb_env, "worker", "--until-idle")
    return 1


def _stdio(kb_env, *extra: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "kb.adapters.cli", "mcp", "--workspace", "1", "--author", AUTHOR, *extra],
        env=kb_env,
        cwd=str(Path(__file__).resolve().parents[1]),
    )


def test_stdio_tools_search_read_edit_commit_and_cite(workspace, kb, kb_env, settings) -> None:
    repo = settings.knowledge_store / "1"

    async def session() -> dict:
        async with Client(_stdio(kb_env)) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            found = _text(await client.call_tool("search", {"query": "refund annual plans", "k": 3}))
            window = _text(await client.call_tool("read", {"path": "/documents/Plan.md", "offset": 2, "limit": 2}))
            edited = await client.call_tool(
                "edit", {"path": "/documents/Plan.md", "old": "line five", "new": "line five, edited over MCP"}
            )
            escape = await client.call_tool("write", {"path": "/documents/../etc/passwd", "content": "x"})
            ambiguous = await client.call_tool("edit", {"path": "/documents/Plan.md", "old": "line", "new": "LINE"})
            committed = _structured(await client.call_tool("commit", {"message": "mcp edit"}))
            cite = found.split('cite="', 1)[1].split('"', 1)[0]
            resolved = _structured(await client.call_tool("resolve_citation", {"citation": cite}))
            resources = await client.list_resources()
            return dict(
                names=names,
                found=found,
                window=window,
                edited=edited,
                escape=escape,
                ambiguous=ambiguous,
                committed=committed,
                resolved=resolved,
                resources=resources,
            )

    out = anyio.run(session)
    assert {
        "search",
        "read",
        "ls",
        "glob",
        "grep",
        "write",
        "edit",
        "move",
        "remove",
        "mkdir",
        "commit",
        "abort",
        "resolve_citation",
        "normalize_citations",
    } <= out["names"]
    assert "/documents/Notes/Refunds.md" in out["found"]
    assert "     3  line three" in out["window"] and "     4  line four" in out["window"]
    assert "line five" not in out["window"]  # honest window: exactly lines 3-4
    assert not out["edited"].is_error
    assert out["escape"].is_error and "documents" in _text(out["escape"])
    assert out["ambiguous"].is_error
    assert out["committed"]["modified"] == ["/documents/Plan.md"]
    assert "Refunds.md" in json.dumps(out["resolved"])
    uris = [str(r.uri) for r in out["resources"].resources]
    assert "kb://workspace/1/documents/Plan.md" in uris
    log = git(repo, "log", "-1", "--format=%an <%ae>|%cn|%s")
    assert log.startswith(AUTHOR + "|") and "mcp edit" in log
    assert "line five, edited over MCP" in git(repo, "show", "HEAD:documents/Plan.md")
    git(repo, "fsck", "--strict")


def test_stdio_read_past_the_end_and_ls_agree_with_the_cli(workspace, kb, kb_env) -> None:
    """The read tool refuses an offset past the end with the message `kb read` and
    ``conv.read`` give, for a committed document and for one written in the turn alike; the ls
    tool lists what ``kb ls --json`` lists."""
    committed_message = (
        "offset 9 is past the end of /documents/Plan.md: it has 5 lines; "
        "offset 4 shows its last line (an offset counts the lines skipped)"
    )

    async def session() -> dict:
        async with Client(_stdio(kb_env)) as client:
            committed = await client.call_tool("read", {"path": "/documents/Plan.md", "offset": 9})
            end = await client.call_tool("read", {"path": "/documents/Plan.md", "offset": 5})
            listed = _structured(await client.call_tool("ls", {"path": "/documents"}))
            await client.call_tool("write", {"path": "/documents/Draft.md", "content": "one\ntwo\n"})
            uncommitted = await client.call_tool("read", {"path": "/documents/Draft.md", "offset": 3})
            await client.call_tool("abort", {})
            return dict(committed=committed, end=end, listed=listed, uncommitted=uncommitted)

    out = anyio.run(session)
    assert out["committed"].is_error and committed_message in _text(out["committed"])
    cli = run_cli(kb_env, "read", "/documents/Plan.md", "-w", "1", "--offset", "9", check=False)
    assert cli.returncode == 1 and cli.stderr.strip() == f"kb: error: {committed_message}"
    assert not out["end"].is_error and 'lines="none" of="5"' in _text(out["end"])
    assert out["uncommitted"].is_error
    assert "offset 3 is past the end of /documents/Draft.md: it has 2 lines" in _text(out["uncommitted"])
    assert out["listed"] == json.loads(run_cli(kb_env, "ls", "-w", "1", "--json").stdout)


def test_stdio_disconnect_commits_the_turn(workspace, kb_env, settings) -> None:
    repo = settings.knowledge_store / "1"
    before = git(repo, "rev-list", "--count", "HEAD").strip()

    async def session() -> None:
        async with Client(_stdio(kb_env)) as client:
            result = await client.call_tool("write", {"path": "/documents/Inbox/Left open.md", "content": "# kept\n"})
            assert not result.is_error

    anyio.run(session)
    assert int(git(repo, "rev-list", "--count", "HEAD")) == int(before) + 1
    assert git(repo, "show", "HEAD:documents/Inbox/Left open.md") == "# kept\n"


def test_killed_server_loses_nothing_next_session_of_the_chat_commits(workspace, kb_env, settings) -> None:
    repo = settings.knowledge_store / "1"
    request = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "kb.adapters.cli", "mcp", "--workspace", "1", "--chat", "crashy", "--author", AUTHOR],
        env=kb_env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        for message in (
            request,
            {"jsonrpc": "2.0", "method": "notifications/initialized"},
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "write", "arguments": {"path": "/documents/Crash.md", "content": "# survived\n"}},
            },
        ):
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
            if "id" in message:
                reply = json.loads(proc.stdout.readline())
                assert "error" not in reply, reply
                if message["method"] == "initialize":  # kb's version, not an empty one
                    assert reply["result"]["serverInfo"]["version"] == importlib.metadata.version("kb"), reply
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert "Crash.md" not in git(repo, "ls-tree", "-r", "--name-only", "HEAD")

    async def recover() -> dict:
        async with Client(_stdio(kb_env, "--chat", "crashy")) as client:
            return _structured(await client.call_tool("commit", {}))

    result = anyio.run(recover)
    assert result["added"] == ["/documents/Crash.md"]
    assert git(repo, "show", "HEAD:documents/Crash.md") == "# survived\n"


@pytest.fixture
def served(workspace, kb_env):
    with _serving(kb_env) as (base, _proc):
        yield base


@contextlib.contextmanager
def _serving(kb_env):
    """``kb serve`` without tokens on a free port: ``(base URL, process)``; stopped (SIGTERM) at the end."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kb.adapters.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--author",
            AUTHOR,
            "--insecure-no-auth",  # tokens over MCP: tests/test_access.py
        ],
        env=kb_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        raise AssertionError(f"kb serve did not start: {proc.stderr.read().decode()[-2000:]}")
    try:
        yield base, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def test_streamable_http_two_concurrent_sessions_both_land(served, settings) -> None:
    repo = settings.knowledge_store / "1"

    async def one(name: str) -> dict:
        async with Client(f"{served}/mcp/1?chat={name}") as client:
            found = _text(await client.call_tool("search", {"query": "refund", "k": 2}))
            assert "Refunds.md" in found
            await client.call_tool("write", {"path": f"/documents/HTTP/{name}.md", "content": f"# {name}\n"})
            escape = await client.call_tool("read", {"path": "/etc/passwd"})
            assert escape.is_error
            return _structured(await client.call_tool("commit", {"message": f"http {name}"}))

    async def both() -> list[dict]:
        results: list[dict] = []

        async def run(name: str) -> None:
            results.append(await one(name))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "alpha")
            tg.start_soon(run, "beta")
        return results

    results = anyio.run(both)
    assert sorted(r["added"][0] for r in results) == ["/documents/HTTP/alpha.md", "/documents/HTTP/beta.md"]
    tree = git(repo, "ls-tree", "-r", "--name-only", "HEAD")
    assert "documents/HTTP/alpha.md" in tree and "documents/HTTP/beta.md" in tree
    assert git(repo, "log", "-1", "--format=%an <%ae>").strip() == AUTHOR
    git(repo, "fsck", "--strict")


def test_streamable_http_unknown_workspace_url_is_refused(served) -> None:
    response = httpx.post(f"{served}/mcp/not-a-workspace", json={}, timeout=10)
    assert response.status_code == 404
    assert "/mcp/<workspace id>" in response.text


MCP_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _rpc_result(response: httpx.Response) -> dict:
    """The JSON-RPC reply of a streamable-HTTP POST (an SSE ``data:`` line or a JSON body)."""
    text = response.text
    data = next((line[5:] for line in text.splitlines() if line.startswith("data:")), text)
    return json.loads(data)


@contextlib.contextmanager
def _chat_session(base: str, chat: str):
    """An MCP session of chat ``chat`` over streamable HTTP, never ended (no HTTP DELETE: a killed
    or careless client). Yields ``call(tool, arguments)`` returning the tool call's JSON-RPC reply;
    ``arguments`` may be the raw JSON bytes of the arguments object (escapes a client can send
    that Python's encoder would not)."""
    url = f"{base}/mcp/1?chat={chat}"
    with httpx.Client(timeout=30) as client:
        hello = client.post(url, headers=MCP_ACCEPT, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
        })  # fmt: skip
        headers = {**MCP_ACCEPT, "mcp-session-id": hello.headers["mcp-session-id"]}
        client.post(url, headers=headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        ids = iter(range(2, 1000))

        def call(tool: str, arguments: dict | bytes) -> dict:
            raw = arguments if isinstance(arguments, bytes) else json.dumps(arguments).encode()
            body = b'{"jsonrpc": "2.0", "id": %d, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}'
            return _rpc_result(client.post(url, headers=headers, content=body % (next(ids), tool.encode(), raw)))

        yield call


def _abandoned_chat(base: str, chat: str, tool: str, arguments: dict) -> dict:
    """A client that opens an MCP session, calls one tool and goes away without ending it (no
    HTTP DELETE: a killed or careless client). Returns the tool call's JSON-RPC reply."""
    with _chat_session(base, chat) as call:
        return call(tool, arguments)


def test_streamable_http_bounds_open_chats_and_closes_idle_ones(workspace, kb_env, settings) -> None:
    """design §16: a client that never ended its session (no HTTP DELETE) left its chat in kb serve
    for the server's life — its turn open, a file descriptor and a worktree lock each — so abandoned
    sessions piled up until the process ran out of descriptors, for every tenant. A chat idle for
    KB_MCP_CHAT_IDLE_SECONDS is now closed as if its client had ended it (the turn committed), and
    a token past KB_MCP_CHATS_PER_TOKEN open chats is refused a new one."""
    repo = settings.knowledge_store / "1"
    env = {**kb_env, "KB_MCP_CHATS_PER_TOKEN": "2", "KB_MCP_CHAT_IDLE_SECONDS": "10"}  # past the set-up under load
    with _serving(env) as (base, proc):
        for name in ("gone-1", "gone-2"):
            written = _abandoned_chat(base, name, "write", {"path": f"/documents/{name}.md", "content": f"# {name}\n"})
            assert not written["result"]["isError"], written
        refused = _abandoned_chat(base, "third", "read", {"path": "/documents/Plan.md"})
        assert refused["result"]["isError"] and "KB_MCP_CHATS_PER_TOKEN" in refused["result"]["content"][0]["text"]
        assert turn_locks_held(proc.pid) == 2

        def committed() -> bool:
            tree = git(repo, "ls-tree", "-r", "--name-only", "HEAD")
            return "documents/gone-1.md" in tree and "documents/gone-2.md" in tree

        deadline = time.monotonic() + 60
        while not (committed() and turn_locks_held(proc.pid) == 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert committed(), "the abandoned chats' turns were not committed once idle"
        assert turn_locks_held(proc.pid) == 0, "the idle chats' turns still hold their worktree locks"
        assert "MCP client disconnected" in git(repo, "log", "-1", "--format=%B")
        again = _abandoned_chat(base, "third", "read", {"path": "/documents/Plan.md"})
        assert not again["result"]["isError"], again


def test_a_chat_called_while_its_idle_close_commits_waits_for_that_commit(workspace, kb, settings) -> None:
    """design §5, §16: the idle reaper (``McpSessions.close_idle``) forgets a chat, then commits its
    turn — while the turn's worktree stays locked. A call of the same chat arriving in that window
    (the client came back after KB_MCP_CHAT_IDLE_SECONDS) made a new chat state whose turn opened
    the same worktree and failed with TurnBusy ("open in another process"). The call now waits for
    the close to end and goes on in a fresh turn; both changes land. The reaper's commit is held
    in flight by the workspace's write lock, taken by the test."""
    import threading

    from kb.adapters.mcp.server import McpSessions
    from kb.db import database
    from kb.db.locks import WRITE_LOCK_NAMESPACE
    from kb.knowledge_base import KnowledgeBase

    opened: list[KnowledgeBase] = []

    def factory() -> KnowledgeBase:
        opened.append(KnowledgeBase.open(settings))
        return opened[-1]

    sessions = McpSessions(kb, AUTHOR, None, kb_factory=factory)
    first = sessions.get(1, "back-later")
    with first.lock:
        first.turn.write("/documents/before.md", "# before\n")
    results: dict = {}
    with database.transaction(kb.database_url) as holder:
        holder.execute(queries["test_hold_advisory_lock"], {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": 1})
        reaper = threading.Thread(target=lambda: results.setdefault("closed", sessions.close_idle(0.0)))
        reaper.start()
        deadline = time.monotonic() + 30
        with database.connect(kb.database_url, autocommit=True) as admin:  # the reaper's commit waits
            while not admin.execute(queries["test_advisory_lock_waiters"]).fetchone():
                assert time.monotonic() < deadline, "the reaper's commit never reached the write lock"
                time.sleep(0.02)

        def come_back() -> None:
            try:
                again = sessions.get(1, "back-later")
                with again.lock:
                    again.turn.write("/documents/after.md", "# after\n")
                results["again"] = again
            except Exception as exc:
                results["again"] = exc

        caller = threading.Thread(target=come_back)
        caller.start()
        caller.join(1.0)  # it waits for the close, whose commit waits for the write lock
    reaper.join(60)
    caller.join(60)
    assert results["closed"] == 1
    again = results["again"]
    assert not isinstance(again, Exception), again
    assert again is not first
    sessions.close_all()
    tree = git(settings.knowledge_store / "1", "ls-tree", "-r", "--name-only", "HEAD")
    assert "documents/before.md" in tree and "documents/after.md" in tree
    for each in opened:
        each.close()


def test_a_chat_that_cannot_be_opened_releases_the_knowledge_base_made_for_it(workspace, kb, settings) -> None:
    """design §16: kb serve makes each MCP chat a KnowledgeBase of its own (``kb_factory``) and
    closes it when the chat ends (``kb_release``). A call that named a workspace that does not
    exist (``/mcp/999``) or a chat id no turn can have made one, failed, and kept it: kb serve's
    list of KnowledgeBases grew by one per such call for the server's life (2,000 calls: 2,000
    objects, ~10 MB), whatever the caller's scope. It is released when the chat cannot be made."""
    from kb.adapters.mcp.server import McpSessions
    from kb.errors import InvalidTurn, WorkspaceNotFound
    from kb.knowledge_base import KnowledgeBase

    made: list[KnowledgeBase] = []
    released: list[KnowledgeBase] = []

    def factory() -> KnowledgeBase:
        made.append(KnowledgeBase.open(settings))
        return made[-1]

    def release(each: KnowledgeBase) -> None:
        released.append(each)
        each.close()

    sessions = McpSessions(kb, AUTHOR, None, kb_factory=factory, kb_release=release)
    for attempt in range(3):
        with pytest.raises(WorkspaceNotFound):
            sessions.get(999, f"lost-{attempt}")
        with pytest.raises(InvalidTurn):
            sessions.get(1, f"no spaces {attempt}")
    assert len(made) == 6 and released == made
    sessions.get(1, "fine")  # a chat that opens keeps its KnowledgeBase until it ends
    assert len(made) == 7 and len(released) == 6
    sessions.close_all()
    assert released == made


def test_one_chat_failing_to_close_leaves_the_others_closed_and_callable(workspace, kb, settings) -> None:
    """design §16: the idle reaper forgets every idle chat at once, then closes them one by one. A
    close that raised something unforeseen — here the token check (``token_live``, a Postgres
    query in kb serve) failing for one chat — ended the loop: the chats after it were forgotten
    but never committed, and a call of one of them waited for a close that never came. Each chat
    is now closed on its own; a failure is logged and the others are closed and callable."""
    from kb.adapters.mcp.server import McpSessions
    from kb.knowledge_base import KnowledgeBase

    opened: list[KnowledgeBase] = []

    def factory() -> KnowledgeBase:
        opened.append(KnowledgeBase.open(settings))
        return opened[-1]

    def token_live(token_id: str) -> bool:
        if token_id == "2":
            raise RuntimeError("the token check failed")
        return True

    sessions = McpSessions(kb, AUTHOR, None, kb_factory=factory)
    sessions.token_live = token_live
    for n in (1, 2, 3):
        state = sessions.get(1, f"chat-{n}", str(n))
        state.token_id = str(n)
        with state.lock:
            state.turn.write(f"/documents/chat-{n}.md", f"# {n}\n")
    assert sessions.close_idle(0.0) == 3
    tree = git(settings.knowledge_store / "1", "ls-tree", "-r", "--name-only", "HEAD")
    assert "documents/chat-1.md" in tree and "documents/chat-3.md" in tree, tree
    for n in (1, 2, 3):  # none is left waiting for a close
        again = sessions.get(1, f"chat-{n}", str(n))
        with again.lock:
            assert again.turn.read(f"/documents/chat-{n}.md") is not None
    sessions.close_all()
    for each in opened:
        each.close()


def test_normalizing_text_with_a_lone_surrogate_is_refused_and_the_chat_goes_on(served) -> None:
    """``normalize_citations`` with text holding a lone surrogate (``"\\ud800"`` in the call's
    JSON; no UTF-8 text can carry one): refused, never a crash — by the MCP SDK's parser (a JSON-RPC
    parse error, as it is now) or by the tool (``normalizer.check_text``, for a parser that takes
    it) — and the chat goes on."""
    with _chat_session(served, "surrogate") as call:
        shown = call("read", {"path": "/documents/Plan.md"})
        assert not shown["result"]["isError"], shown
        refused = call("normalize_citations", b'{"text": "see [1:L1] \\ud800"}')
        if "error" in refused:
            assert refused["error"]["code"] == -32700 and "escape" in refused["error"]["message"], refused
        else:
            assert refused["result"]["isError"] and "lone surrogate" in _text_of(refused), refused
        kept = call("normalize_citations", {"text": "see [1:L1]"})
        assert not kept["result"]["isError"] and "[1:L1]" in _text_of(kept), kept


def _text_of(reply: dict) -> str:
    return "".join(part.get("text", "") for part in reply["result"]["content"])
