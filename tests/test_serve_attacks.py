"""A hostile tenant and a clumsy client against a real ``kb serve`` (design §3, §5, §16): faults
found by attacking the server by hand, each kept as the request that found it. Nothing may reach
another token's work, and no write may be answered with an outcome that is not its own."""

from __future__ import annotations

import re

import httpx
import pytest
from support.commands import git
from support.named_queries import queries
from support.serving import start_serve, stop_serve
from support.waiting import wait_until

pytest.importorskip("fastapi", reason="kb serve needs the serve extra (pip install -e '.[serve]')")


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def served(kb, kb_env, tmp_path):
    """``kb serve`` over workspace 1 (one document); yields its URL and checks its log at the end."""
    kb.create_workspace(1)
    with kb.transaction(1, "seed", author="seed") as tx:
        tx.write("/documents/Plan.md", "# Plan\n\nzebra\n")
    log = tmp_path / "serve.log"
    process, url = start_serve(kb_env, log)
    try:
        yield url
    finally:
        output = stop_serve(process, log)
    assert "Traceback" not in output, output


def test_a_revert_message_cannot_claim_another_tokens_turn(kb, served):
    """A revert posted from the pages with a message ending in ``Turn: t<victim>@<turn>`` (the
    trailer the log shows for every turn's revision) made the victim's next commit of that turn
    take the attacker's revision for its own (design §5 recovery): answered 200 with a revision
    that was not its write, and its staged changes discarded. The message is refused; the
    victim's commit records its own changes."""
    victim, victim_secret = kb.tokens().create("victim", "write", [1])
    attacker = kb.tokens().create("attacker", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60)
    staged = api.put(
        "/v1/workspaces/1/turns/draft/files/documents/Victim.md",
        json={"content": "the victim's work\n"},
        headers=_as(victim_secret),
    )
    assert staged.status_code == 200, staged.text
    seed = kb.head(1)
    web = httpx.Client(base_url=served, timeout=60, headers=_as(attacker))
    revert = f"/ui/workspaces/1/revisions/{seed}/revert"
    csrf = re.search(r'name="csrf" value="([^"]+)"', web.get(revert).text).group(1)
    forged = web.post(revert, data={"csrf": csrf, "message": f"tidy up\n\nTurn: t{victim.id}@draft"})
    assert forged.status_code == 400 and "Turn:" in forged.text, forged.text
    assert kb.head(1) == seed  # nothing recorded
    committed = api.post("/v1/workspaces/1/turns/draft/commit", json={"message": "mine"}, headers=_as(victim_secret))
    assert committed.status_code == 200, committed.text
    assert committed.json()["added"] == ["/documents/Victim.md"], committed.text
    repo = kb.settings.knowledge_store / "1"
    assert git(repo, "show", f"{committed.json()['revision']}:documents/Victim.md") == "the victim's work\n"
    assert git(repo, "log", "-1", "--format=%B").rstrip("\n").endswith(f"Turn: t{victim.id}@draft")


def test_an_empty_idempotency_key_is_refused_not_shared_by_every_write(kb, served):
    """``Idempotency-Key:`` sent empty (a client whose variable was unset) behind a token became
    the key ``t<token id>@``, one for every such commit of the token: the second commit, with other
    changes, was answered with the first one's revision and its own changes were dropped (design
    §3). An empty key is refused before anything is written, and the turn is kept for a retry."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60)
    empty = _as(secret) | {"Idempotency-Key": ""}
    for turn, name in (("first", "First.md"), ("second", "Second.md")):
        staged = api.put(
            f"/v1/workspaces/1/turns/{turn}/files/documents/{name}", json={"content": f"{turn}\n"}, headers=_as(secret)
        )
        assert staged.status_code == 200, staged.text
        head = kb.head(1)
        refused = api.post(f"/v1/workspaces/1/turns/{turn}/commit", json={}, headers=empty)
        assert refused.status_code == 400 and refused.json()["error"] == "InvalidInput", refused.text
        assert "empty" in refused.json()["message"] and kb.head(1) == head, refused.text
        kept = api.post(f"/v1/workspaces/1/turns/{turn}/commit", json={}, headers=_as(secret))
        assert kept.json()["added"] == [f"/documents/{name}"], kept.text
    # a turn id empty before its '::' is refused too, as it is without a token
    odd = api.put("/v1/workspaces/1/turns/::sub/files/documents/X.md", json={"content": "x\n"}, headers=_as(secret))
    assert odd.status_code == 400 and odd.json()["error"] == "InvalidTurn", odd.text


def test_a_tenants_turn_goes_on_while_another_tenants_commit_waits_for_its_write_lock(kb, kb_env, tmp_path):
    """Every turn call of every tenant went through one lock of the server: while tenant A's
    commit waited for its workspace's write lock (a slow writer, up to ``KB_LOCK_TIMEOUT``), tenant
    B could not read, write or commit its own turn, and a keyed commit of B queued there was not
    yet fenced, so ``writes/{key}`` answered ``landed: false`` and the commit landed a moment later.
    Now only a turn's own calls wait for each other (design §16): B's turn works and commits while
    A's commit waits, and the settle of B's key answers what the commit did (design §3)."""
    import threading

    from kb.db import database
    from kb.db.locks import WRITE_LOCK_NAMESPACE

    for ws in (1, 2):
        kb.create_workspace(ws)
    slow_secret = kb.tokens().create("slow", "write", [1])[1]
    secret = kb.tokens().create("mine", "write", [2])[1]
    log = tmp_path / "serve.log"
    process, url = start_serve({**kb_env, "KB_LOCK_TIMEOUT": "30"}, log)
    api = httpx.Client(base_url=url, timeout=90)
    answers: dict[str, httpx.Response] = {}
    try:
        put = api.put(
            "/v1/workspaces/1/turns/t/files/documents/Slow.md", json={"content": "x\n"}, headers=_as(slow_secret)
        )
        assert put.status_code == 200, put.text
        with (
            database.transaction(kb.database_url) as writer,  # a slow writer of workspace 1 holds its lock
            database.connect(kb.database_url, autocommit=True) as admin,
        ):
            writer.execute(queries["test_hold_advisory_lock"], {"namespace": WRITE_LOCK_NAMESPACE, "workspace_id": 1})
            slow = threading.Thread(
                target=lambda: answers.__setitem__(
                    "slow",
                    httpx.post(url + "/v1/workspaces/1/turns/t/commit", json={}, headers=_as(slow_secret), timeout=90),
                )
            )
            slow.start()
            waiting = lambda: admin.execute(queries["test_advisory_lock_waiters"]).fetchone()  # noqa: E731
            wait_until(waiting, 60, "the slow commit to wait for workspace 1's write lock")
            mine = "/v1/workspaces/2/turns/u/files/documents/Mine.md"
            assert api.put(mine, json={"content": "mine\n"}, headers=_as(secret)).status_code == 200
            assert api.get(mine, headers=_as(secret)).json()["lines"] == [[1, "mine"]]
            keyed = api.post(
                "/v1/workspaces/2/turns/u/commit", json={}, headers=_as(secret) | {"Idempotency-Key": "mine-1"}
            )
            assert keyed.status_code == 200, keyed.text
            settle = api.get("/v1/workspaces/2/writes/mine-1", headers=_as(secret)).json()
            assert settle["landed"] and settle["revision"]["id"] == keyed.json()["revision"], settle
            assert slow.is_alive() and "slow" not in answers  # A's commit still waits: the lock is held
        # the writer's transaction ended: its lock is released, and A's commit goes on
        slow.join(90)
    finally:
        output = stop_serve(process, log)
    assert answers["slow"].status_code == 200, answers["slow"].text
    assert "Traceback" not in output, output


def test_one_token_cannot_open_turns_without_end(kb, kb_env, tmp_path):
    """Each HTTP API turn holds a worktree lock and a file descriptor until committed, aborted or
    released idle (15 minutes): one write token opened 300 turns in 3 s, 300 descriptors, and
    went on until the server had none left for any tenant. One token holds at most
    ``KB_TURNS_PER_TOKEN`` open turns; past it a new one is 429 ``TooManyTurns`` and nothing is
    made, while its open turns stay usable, ending one makes room, and other tokens are not
    affected (design §16)."""
    kb.create_workspace(1)
    flooder, secret = kb.tokens().create("flooder", "write", [1])
    other = kb.tokens().create("other", "write", [1])[1]
    log = tmp_path / "serve.log"
    process, url = start_serve({**kb_env, "KB_TURNS_PER_TOKEN": "3"}, log)
    api = httpx.Client(base_url=url, timeout=60)

    def put(turn: str, token: str) -> httpx.Response:
        return api.put(
            f"/v1/workspaces/1/turns/{turn}/files/documents/F.md", json={"content": "f\n"}, headers=_as(token)
        )

    try:
        for turn in ("t0", "t1", "t2"):
            assert put(turn, secret).status_code == 200
        refused = put("t3", secret)
        assert refused.status_code == 429 and refused.json()["error"] == "TooManyTurns", refused.text
        assert "KB_TURNS_PER_TOKEN" in refused.json()["message"], refused.text
        worktrees = kb.settings.knowledge_store / "1" / ".git" / "worktrees"
        assert not (worktrees / f"t{flooder.id}@t3").exists()  # nothing made for it
        assert put("t0", secret).status_code == 200  # its open turns stay usable
        assert put("t0", other).status_code == 200  # another token is not affected
        committed = api.post("/v1/workspaces/1/turns/t0/commit", json={}, headers=_as(secret))
        assert committed.status_code == 200 and committed.json()["revision"], committed.text
        assert put("t3", secret).status_code == 200  # ending one made room
        assert api.delete("/v1/workspaces/1/turns/t9", headers=_as(secret)).status_code == 200  # ending: never refused
    finally:
        output = stop_serve(process, log)
    assert "Traceback" not in output, output


def test_a_line_break_in_a_path_is_refused_saying_so(kb, served):
    """``%0A`` in a document path (or a key) fell outside every route's ``{path:path}``, which
    does not match a line break: the client got a bare 404 "Not Found" naming no problem, where
    every other control character gets InvalidPath. It is 400 saying what is wrong; nothing is
    written."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    head = kb.head(1)
    for refused in (
        api.put("/v1/workspaces/1/turns/t/files/documents/a%0Ab.md", json={"content": "x\n"}),
        api.get("/v1/workspaces/1/documents/documents/a%0Ab.md"),
        api.get("/v1/workspaces/1/writes/key%0Aline"),
    ):
        assert refused.status_code == 400 and refused.json()["error"] == "InvalidInput", refused.text
        assert "line break" in refused.json()["message"], refused.text
    assert kb.head(1) == head


def test_an_author_no_revision_can_record_is_refused_when_the_turn_opens(kb, served):
    """``?author=`` with a line break on a turn's first write was taken: the turn keeps the author
    it opened with, so every commit refused it (InvalidInput) and nothing the client sent later —
    another write's author, the commit (which takes none) — could change it; its changes could
    only be aborted or left until the turn was released idle (design §5). It is refused at that
    write, before anything is made, and the client's next write with a good author works."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    file = "/v1/workspaces/1/turns/a/files/documents/A.md"
    for bad in ("Ada%0AEvil", "Ada%00", "%0AAda"):
        refused = api.put(f"{file}?author={bad}", json={"content": "a\n"})
        assert refused.status_code == 400 and refused.json()["error"] == "InvalidInput", refused.text
        assert "author" in refused.json()["message"], refused.text
    assert api.put(f"{file}?author=Ada%20%3Cada%40example.com%3E", json={"content": "a\n"}).status_code == 200
    committed = api.post("/v1/workspaces/1/turns/a/commit", json={})
    assert committed.status_code == 200 and committed.json()["added"] == ["/documents/A.md"], committed.text
    assert git(kb.settings.knowledge_store / "1", "log", "-1", "--format=%an") == "Ada\n"


def test_the_pages_name_the_turn_of_the_trailer_not_a_line_of_the_message(kb, served):
    """A turn's commit message holding ``Turn: <another token's turn>`` above kb's own trailer:
    the pages named that other turn as the one that recorded the revision (any ``Turn:`` line
    was taken). They name the trailer's turn, the last line (design §5, §17)."""
    writer, secret = kb.tokens().create("writer", "write", [1])
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    assert api.put("/v1/workspaces/1/turns/mine/files/documents/A.md", json={"content": "a\n"}).status_code == 200
    message = "hello\n\nTurn: t999@someone-else\n\nmore"
    committed = api.post("/v1/workspaces/1/turns/mine/commit", json={"message": message})
    assert committed.status_code == 200, committed.text
    for page in (f"/ui/workspaces/1/revisions/{committed.json()['revision']}", "/ui/workspaces/1"):
        shown = api.get(page).text
        assert f"<code>t{writer.id}@mine</code>" in shown and "<code>t999@someone-else</code>" not in shown, shown


def test_a_json_body_without_its_content_type_is_told_to_send_one(kb, served):
    """A JSON body sent without ``Content-Type: application/json`` (or as text/plain) is read as
    bytes; the 422 said only "Input should be a valid dictionary", naming no cause. It says the
    body was not read as JSON and which header to send; nothing is written."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60)
    file = "/v1/workspaces/1/turns/t/files/documents/A.md"
    for kind in (None, "text/plain"):
        headers = _as(secret) | ({} if kind is None else {"Content-Type": kind})
        refused = api.put(file, content=b'{"content": "a\\n"}', headers=headers)
        assert refused.status_code == 422 and refused.json()["error"] == "InvalidInput", refused.text
        assert "Content-Type: application/json" in refused.json()["message"], refused.text
    missing = api.get(file, headers=_as(secret))
    assert missing.status_code == 404, missing.text  # nothing was written in the turn


def test_a_body_that_is_not_json_is_told_where_it_breaks(kb, served):
    """A body sent as JSON that does not parse (a missing comma) was answered 422 with "body.12:
    JSON decode error" and an ``input`` of ``{}`` in its details: the client was shown an empty
    object it never sent and no reason. The 422 gives the decoder's reason, the offset and the
    text around it; nothing is written."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret) | {"Content-Type": "application/json"})
    file = "/v1/workspaces/1/turns/t/files/documents/A.md"
    refused = api.put(file, content=b'{"content": "a\\n" "more": 1}')
    assert refused.status_code == 422 and refused.json()["error"] == "InvalidInput", refused.text
    message = refused.json()["message"]
    assert "not valid JSON" in message and "delimiter" in message and '"more"' in message, message
    assert all(detail.get("input") != {} for detail in refused.json()["detail"]), refused.text
    assert api.get(file).status_code == 404  # nothing was written in the turn
    # a body of the wrong shape shows what was sent as JSON, not as a Python repr ({'text': 5})
    shaped = api.put(file, content=b'{"text": 5}')
    assert shaped.status_code == 422 and '{"text": 5}' in [d.get("input") for d in shaped.json()["detail"]], shaped.text


def test_a_commit_without_a_body_records_the_turn_with_a_summary(kb, served):
    """``POST …/commit`` with no body at all was refused (422 blaming a missing Content-Type),
    though the message is optional everywhere else and ``{}`` worked. It commits, with kb's summary
    as the message."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    assert api.put("/v1/workspaces/1/turns/t/files/documents/A.md", json={"content": "a\n"}).status_code == 200
    committed = api.post("/v1/workspaces/1/turns/t/commit")
    assert committed.status_code == 200 and committed.json()["added"] == ["/documents/A.md"], committed.text
    message = git(kb.settings.knowledge_store / "1", "log", "-1", "--format=%s", committed.json()["revision"])
    assert message.startswith("docs: add 1 file"), message  # kb's summary (kb.store.knowledge_store.summarize)


def test_a_turn_opened_without_an_author_records_its_token_as_author(kb, served):
    """A turn's revision made with a token and no ``?author=`` recorded the server's OS user as its
    author ("root" on a container): a person who wrote none of it. Like an edit made on the pages,
    it records the token as author and committer; ``?author=`` still names someone else."""
    token, secret = kb.tokens().create("agent-7", "write", [1])
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    repo = kb.settings.knowledge_store / "1"
    for turn, query, expected in (
        ("plain", "", f"agent-7 <kb-token-{token.id}>"),
        ("named", "?author=Ada%20%3Cada%40example.com%3E", "Ada <ada@example.com>"),
    ):
        written = api.put(f"/v1/workspaces/1/turns/{turn}/files/documents/{turn}.md{query}", json={"content": "x\n"})
        assert written.status_code == 200, written.text
        committed = api.post(f"/v1/workspaces/1/turns/{turn}/commit", json={})
        assert committed.status_code == 200, committed.text
        shown = git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", committed.json()["revision"])
        assert shown == f"{expected}|agent-7 <kb-token-{token.id}>\n", shown


def test_the_settle_call_answers_for_a_commit_sent_without_a_key(kb, served):
    """A commit sent without an Idempotency-Key is recorded with a key kb generates, and a 503
    ``CommitOutcomeUnknown`` names that key and ``GET …/writes/{key}`` to settle it (design §3).
    The route prefixes the key with the token's id, so for the generated key it looked up one no
    write had and answered ``landed: false`` — for a write that landed. The route now gives such a
    commit a key of the token's own (as the 503 names it: without the prefix), which the settle
    finds. Checked on a commit that landed: the key in its commit object, as the 503 would give
    it, settles as landed."""
    token, secret = kb.tokens().create("writer", "write", [1])
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    assert api.put("/v1/workspaces/1/turns/t/files/documents/A.md", json={"content": "a\n"}).status_code == 200
    committed = api.post("/v1/workspaces/1/turns/t/commit", json={})
    assert committed.status_code == 200, committed.text
    revision = committed.json()["revision"]
    header = git(kb.settings.knowledge_store / "1", "cat-file", "commit", revision)
    key = next(line.split(" ", 1)[1] for line in header.splitlines() if line.startswith("kb-write-key "))
    given = key.removeprefix(f"t{token.id}@")  # what the 503 names (kb serve's error handler)
    settled = api.get(f"/v1/workspaces/1/writes/{given}")
    assert settled.status_code == 200 and settled.json()["landed"], (key, settled.text)
    assert settled.json()["revision"]["id"] == revision


def test_an_mcp_commit_is_settled_by_the_key_its_unknown_outcome_names(kb, served):
    """An MCP ``commit`` was recorded under a bare key kb generated; were its outcome unknown, the
    tool error names that key, and the one settle call over kb serve (``GET …/writes/{key}``,
    which prefixes the token's id) could never find it: ``landed: false`` for a write that landed
    (design §3, §16). The tool now commits under a key of the token's own. Checked on an MCP
    commit that landed: its key, as the error would name it, settles as landed."""
    import json

    import anyio
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    token, secret = kb.tokens().create("agent", "write", [1])

    async def commit_over_mcp() -> str:
        transport = streamable_http_client(f"{served}/mcp/1", http_client=create_mcp_http_client(headers=_as(secret)))
        async with Client(transport) as client:
            await client.call_tool("write", {"path": "/documents/M.md", "content": "m\n"})
            done = await client.call_tool("commit", {"message": "by mcp"})
            assert not done.is_error, done.content
            return json.loads(done.content[0].text)["revision"]

    revision = anyio.run(commit_over_mcp)
    header = git(kb.settings.knowledge_store / "1", "cat-file", "commit", revision)
    key = next(line.split(" ", 1)[1] for line in header.splitlines() if line.startswith("kb-write-key "))
    given = key.removeprefix(f"t{token.id}@")  # what the tool's error names
    settled = httpx.get(f"{served}/v1/workspaces/1/writes/{given}", headers=_as(secret), timeout=60)
    assert settled.status_code == 200 and settled.json()["landed"], (key, settled.text)
    assert settled.json()["revision"]["id"] == revision


def test_a_turn_of_a_workspace_deleted_by_another_process_is_not_found_and_makes_no_repository(kb, served):
    """``kb workspace delete`` in another process, then a write to a turn of that workspace on
    ``kb serve`` (the turn committed before, or a new one): the turn's worktree was opened as if
    the workspace were there — answered 200 — and its admin folder ``.git/worktrees/<turn>`` was
    made with its parents, a ``.git`` where the deleted repository was. ``kb workspace create``
    of that id then failed for good (FileNotFoundError: a ``.git`` that is no repository) and the
    turn's commit answered 507 "free space or fix permissions". The write is 404 WorkspaceNotFound,
    nothing is made, and the id can be created again (design §5)."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    assert api.put("/v1/workspaces/1/turns/t/files/documents/A.md", json={"content": "a\n"}).status_code == 200
    assert api.post("/v1/workspaces/1/turns/t/commit", json={}).status_code == 200
    kb.delete_workspace(1)
    repository = kb.settings.knowledge_store / "1"
    for turn in ("t", "fresh"):
        written = api.put(f"/v1/workspaces/1/turns/{turn}/files/documents/B.md", json={"content": "b\n"})
        assert written.status_code == 404 and written.json()["error"] == "WorkspaceNotFound", written.text
    assert not repository.exists(), sorted(str(p) for p in repository.rglob("*"))
    kb.create_workspace(1)  # the id is free again
    assert kb.head(1) is None


def test_a_turn_open_across_a_workspace_delete_and_re_create_writes_nothing_into_the_new_one(kb, served):
    """A turn open on ``kb serve`` while another process deletes its workspace (``--force``) and
    creates one with the same id: the turn's next write answered 200 (into a worktree of a
    repository that was gone) and its commit then recorded that write into the new workspace — a
    write accepted while no workspace existed, landing in another one that reuses the id. Every
    call of the turn now answers WorkspaceNotFound and nothing of it lands (design §5, §16)."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    turn = "/v1/workspaces/1/turns/t"
    assert api.put(f"{turn}/files/documents/Old.md", json={"content": "old\n"}).status_code == 200
    kb.delete_workspace(1, force=True)
    kb.create_workspace(1)
    written = api.put(f"{turn}/files/documents/Late.md", json={"content": "late\n"})
    assert written.status_code == 404 and written.json()["error"] == "WorkspaceNotFound", written.text
    committed = api.post(f"{turn}/commit", json={})
    assert committed.status_code == 200 and committed.json()["revision"] is None, committed.text
    assert kb.head(1) is None  # nothing of the old turn in the new workspace
    again = api.put(f"{turn}/files/documents/New.md", json={"content": "new\n"})  # the id starts afresh
    assert again.status_code == 200, again.text
    assert api.post(f"{turn}/commit", json={}).json()["added"] == ["/documents/New.md"]


def test_json_bodies_the_parser_cannot_take_are_422_saying_why(kb, served):
    """Bodies sent as JSON that Python's parser cannot take were answered 400 "There was an error
    parsing the body" (FastAPI's catch-all, naming no cause) or 500: bytes that are not UTF-8,
    arrays nested thousands deep (RecursionError), an integer literal past Python's int-string
    conversion limit (ValueError), and the literals NaN, Infinity and -Infinity, which JSON does
    not have, and ``1e400``, which it made an infinity (taken as is, or refused with a 422 that
    failed to render them: 500). Each is 422 InvalidInput with the cause and where it is; nothing
    is written."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret) | {"Content-Type": "application/json"})
    file = "/v1/workspaces/1/turns/t/files/documents/A.md"
    for raw, cause in (
        (b'{"content": "\xff"}', "UTF-8"),
        (b'{"content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deep"),
        (b'{"content": "a", "n": ' + b"9" * 5000 + b"}", "digits"),
        (b'{"content": NaN}', "NaN"),
        (b'{"content": "a", "n": Infinity}', "Infinity"),
        (b'{"content": "a", "n": -Infinity}', "-Infinity"),
        (b'{"content": "a", "n": 1e400}', "out of range"),  # Python made it an infinity
    ):
        refused = api.put(file, content=raw)
        assert refused.status_code == 422 and refused.json()["error"] == "InvalidInput", (cause, refused.text)
        assert cause in refused.json()["message"], (cause, refused.text)
    for route in ("/v1/workspaces/1/turns/t/commit", "/v1/workspaces/1/chats/c/normalize"):
        refused = api.post(route, content=b'{"text": "a", "drop_unknown": NaN}')
        assert refused.status_code == 422 and "NaN" in refused.json()["message"], refused.text
    assert api.get(file).status_code == 404  # nothing was written in the turn


def test_a_route_reading_a_body_without_strict_json_is_refused_at_start():
    """Every route taking a body reads it with ``parse_body`` (its router's ``route_class`` is
    ``JsonRoute``): ``create_app`` refuses a router that forgot it, as it refuses one without a
    token check, rather than serve a route where a body Python's parser cannot take is a 400 or 500."""
    from fastapi import APIRouter, Depends

    from kb.adapters.http.auth import require
    from kb.adapters.http.server import create_app
    from kb.errors import ConfigurationError
    from kb.settings import Settings

    def lenient(service):
        router = APIRouter(dependencies=[Depends(require("write"))])

        @router.put("/v1/workspaces/{workspace_id}/lenient")
        def put(workspace_id: int, body: dict) -> dict:
            return {}

        return router

    with pytest.raises(ConfigurationError, match="PUT /v1/workspaces/{workspace_id}/lenient.*JsonRoute"):
        create_app(Settings(), routers=[lenient])


def test_parse_body_says_what_is_wrong_and_where():
    """``parse_body``'s refusals name the cause and the offset of the literal (outside strings)."""
    import json

    from kb.adapters.http.json_bodies import parse_body

    assert parse_body(b'{"a": "NaN 1e400", "b": [1, 2.5, -3]}') == {"a": "NaN 1e400", "b": [1, 2.5, -3]}
    assert parse_body('\ufeff{"a": 1}'.encode()) == {"a": 1}  # a UTF-8 byte order mark, as json.loads took it
    for raw, reason, at in (
        (b'{"a": "NaN", "b": NaN}', "NaN is not JSON", 18),
        (b'{"a": "x\\" -Infinity", "b": -Infinity}', "-Infinity is not JSON", 28),
        (b'{"a": 2e308}', "out of range", 6),
        (b'{"a": -' + b"1" * 4301 + b"}", "4301 digits", 6),
        (b'{"a": "\xc3("}', "not UTF-8: byte 7 (0xc3)", 7),
        (b"[" * 50_000, "nested too deep", 0),
    ):
        with pytest.raises(json.JSONDecodeError) as refused:
            parse_body(raw)
        assert reason in refused.value.msg and refused.value.pos == at, (raw[:30], refused.value)


def test_a_route_without_a_token_check_is_refused_at_start():
    """``create_app`` refuses a router whose routes declare no ``require(scope)``. The check read
    ``app.routes``, where FastAPI keeps an included router as one entry: it saw ``/health`` and
    ``/ready`` only and passed every router, guarded or not."""
    from fastapi import APIRouter

    from kb.adapters.http.json_bodies import JsonRoute
    from kb.adapters.http.server import create_app
    from kb.errors import ConfigurationError
    from kb.settings import Settings

    def open_door(service):
        router = APIRouter(route_class=JsonRoute)

        @router.get("/v1/workspaces/{workspace_id}/open")
        def get(workspace_id: int) -> dict:
            return {}

        return router

    with pytest.raises(ConfigurationError, match="GET /v1/workspaces/{workspace_id}/open"):
        create_app(Settings(), routers=[open_door])


def test_a_body_of_the_wrong_shape_holding_a_lone_surrogate_is_422(kb, served):
    """A JSON body whose strings hold a lone surrogate (``"\\ud800"``, which no UTF-8 text can carry)
    and of the wrong shape was answered 500: the 422 quoting the input failed to encode as UTF-8.
    It is 422, the surrogate shown escaped as it was sent."""
    secret = kb.tokens().create("writer", "write", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret) | {"Content-Type": "application/json"})
    for method, route, raw in (
        ("PUT", "/v1/workspaces/1/turns/t/files/documents/A.md", b'{"text": "\\ud800"}'),
        ("PUT", "/v1/workspaces/1/turns/t/files/documents/A.md", b'{"content": ["\\udfff x"]}'),
        ("POST", "/v1/workspaces/1/turns/t/move", b'{"src": "\\ud800"}'),
        ("POST", "/v1/workspaces/1/chats/c/normalize", b'{"text": 5, "\\ud800": 1}'),
    ):
        refused = api.request(method, route, content=raw)
        assert refused.status_code == 422 and refused.json()["error"] == "InvalidInput", (route, refused.text)
    # the right shape: kb's own error about the path is rendered too
    moved = api.post(
        "/v1/workspaces/1/turns/t/move", content=b'{"src": "/documents/\\ud800.md", "dst": "/documents/b.md"}'
    )
    assert moved.status_code in (400, 404) and moved.json()["error"], moved.text


def test_normalizing_text_with_a_lone_surrogate_is_refused_saying_so(kb, served):
    """``POST …/chats/{chat}/normalize`` with text holding a lone surrogate (``"\\ud800"``, no UTF-8
    text can carry one) was rewritten and its answer, echoing the text, failed to encode: a 500.
    It is refused as InvalidInput naming the character and where it is."""
    secret = kb.tokens().create("reader", "read", [1])[1]
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret) | {"Content-Type": "application/json"})
    shown = api.get("/v1/workspaces/1/chats/c/documents/documents/Plan.md")
    assert shown.status_code == 200, shown.text
    refused = api.post("/v1/workspaces/1/chats/c/normalize", content=b'{"text": "see [1:L1] \\ud800 and [1]"}')
    assert refused.status_code == 400 and refused.json()["error"] == "InvalidInput", refused.text
    assert "lone surrogate" in refused.json()["message"] and "U+D800" in refused.json()["message"], refused.text
    kept = api.post("/v1/workspaces/1/chats/c/normalize", json={"text": "see [1:L1] \u00e9"})
    assert kept.status_code == 200 and kept.json()["text"] == "see [1:L1] \u00e9", kept.text


def test_the_first_write_names_the_turns_author_though_a_read_opened_the_turn(kb, served):
    """``?author=`` on a turn's first write was ignored when an ``ls`` or ``read`` of the same turn
    came first: that request opened the turn with the token as author, and the turn kept it, so
    the revision recorded the token, not the person the client named (design §5, §16). The first
    writing request names the author; a later one naming another is refused (409, saying whom the
    turn acts for), one naming none or the same goes on; after the commit the next write names
    the author again."""
    token, secret = kb.tokens().create("agent-7", "write", [1])
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    repo = kb.settings.knowledge_store / "1"
    turn = "/v1/workspaces/1/turns/t"
    ada, bob = "Ada%20%3Cada%40example.com%3E", "Bob%20%3Cbob%40example.com%3E"
    assert api.get(f"{turn}/files").status_code == 200
    assert api.get(f"{turn}/files/documents/Plan.md").status_code == 200
    assert api.put(f"{turn}/files/documents/A.md?author={ada}", json={"content": "a\n"}).status_code == 200
    refused = api.put(f"{turn}/files/documents/B.md?author={bob}", json={"content": "b\n"})
    assert refused.status_code == 409 and refused.json()["error"] == "AuthorConflict", refused.text
    assert "Ada <ada@example.com>" in refused.json()["message"], refused.text
    for same in (f"?author={ada}", ""):
        assert api.put(f"{turn}/files/documents/C.md{same}", json={"content": "c\n"}).status_code == 200
    committed = api.post(f"{turn}/commit", json={})
    assert committed.json()["added"] == ["/documents/A.md", "/documents/C.md"], committed.text
    assert git(repo, "log", "-1", "--format=%an <%ae>") == "Ada <ada@example.com>\n"
    # the turn's next revision: named afresh by its first write, after a read again
    assert api.get(f"{turn}/files").status_code == 200
    assert api.post(f"{turn}/edit/documents/A.md?author={bob}", json={"old": "a", "new": "b"}).status_code == 200
    assert api.post(f"{turn}/commit", json={}).status_code == 200
    assert git(repo, "log", "-1", "--format=%an <%ae>") == "Bob <bob@example.com>\n"
    # a turn whose first write named nobody acts for the token
    assert api.get(f"{turn}/files").status_code == 200
    assert api.delete(f"{turn}/files/documents/C.md").status_code == 200
    refused = api.put(f"{turn}/files/documents/D.md?author={ada}", json={"content": "d\n"})
    assert refused.status_code == 409 and f"kb-token-{token.id}" in refused.json()["message"], refused.text
    assert api.post(f"{turn}/commit", json={}).status_code == 200
    assert git(repo, "log", "-1", "--format=%an <%ae>") == f"agent-7 <kb-token-{token.id}>\n"


@pytest.mark.parametrize(
    "author", ["\nAda <ada@example.com>", "Ada <ada@example.com>\r", "Ada\tLovelace", "Ada\x1b[2J"]
)
def test_kb_serve_and_kb_mcp_refuse_an_author_with_a_control_character_at_start(kb, kb_env, author):
    """``kb serve --author`` and ``kb mcp --author`` with a line break (a leading one too) or
    another control character started, and every MCP turn then failed at its first call (or, for
    a tab or an escape, recorded it): no revision can record such an author, and nothing the client
    sends can change it. Both refuse it at start-up, saying why, before they listen or open kb."""
    import socket
    import subprocess
    import sys

    kb.create_workspace(1)
    with socket.socket() as taken:  # were the author taken, kb serve would stop at the port instead
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args in (("serve", "--port", port), ("mcp", "--workspace", "1")):
            refused = subprocess.run(
                [sys.executable, "-m", "kb.adapters.cli", *args, "--author", author],
                env=kb_env,
                input="",
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert refused.returncode == 2, (args, refused.returncode, refused.stderr)
            assert "--author" in refused.stderr and "control character" in refused.stderr, refused.stderr


def test_an_error_shows_the_tokens_ids_as_given_and_any_other_text_as_it_is(kb, served):
    """The server strips the ``t<token id>@`` prefix kb keeps turn, chat and key ids under from the
    ids an error names (the client never sent it). It stripped it from the whole message: a
    document path or the client's own text holding ``t12@`` was shown without it — a path that is
    not the one the client sent. Only the ids the request named lose the prefix."""
    token, secret = kb.tokens().create("writer", "write", [1])
    api = httpx.Client(base_url=served, timeout=60, headers=_as(secret))
    mine = f"t{token.id}@"
    turn = "/v1/workspaces/1/turns/t"
    assert api.put(f"{turn}/files/documents/A.md", json={"content": "a\n"}).status_code == 200
    missing = api.get(f"{turn}/files/documents/{mine}notes.md")
    assert missing.status_code == 404 and f"/documents/{mine}notes.md" in missing.json()["message"], missing.text
    quoted = api.put(f"{turn}/files/documents/A.md?author={mine}t%0A", json={"content": "a\n"})  # its own text
    assert quoted.status_code == 400 and f"'{mine}t\\n'" in quoted.json()["message"], quoted.text
    # the ids the request named are shown as the client gave them
    other = api.put(f"{turn}/files/documents/B.md?author=Bob%20%3Cb%40x%3E", json={"content": "b\n"})
    assert other.status_code == 409 and "turn 't' acts for" in other.json()["message"], other.text
    chat = api.post("/v1/workspaces/1/chats/c/normalize", json={"text": "[1]"})
    assert chat.status_code == 404 and "chat 'c' has" in chat.json()["message"], chat.text
    assert "--chat c " in chat.json()["message"] and mine not in chat.json()["message"], chat.text
