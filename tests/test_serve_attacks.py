"""A hostile tenant and a clumsy client against a real ``kb serve`` (design §3, §5, §16): faults
found by attacking the server by hand, each kept as the request that found it. Nothing may reach
another token's work, and no write may be answered with an outcome that is not its own."""

from __future__ import annotations

import re

import httpx
import pytest
from support.commands import git
from support.serving import start_serve, stop_serve

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
