"""design §16: the API-token store — only digests in Postgres, scopes read ⊂ write ⊂ admin,
workspaces named or all, expiry and revocation seen by the very next verify, and `kb token`."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import timedelta

import pytest
from support.commands import run_cli
from support.named_queries import queries

from kb.db import database
from kb.errors import InvalidInput, ScopeRefused, TokenExists, TokenNotFound, TokenRefused, WorkspaceNotFound


def test_create_verify_check_and_revoke(kb):
    tokens = kb.tokens()
    reader, secret = tokens.create("support-bot", "read", [1, 3, 1])
    assert secret.startswith("kb_") and len(secret) == 46
    assert reader.workspace_ids == (1, 3) and reader.committer == f"support-bot <kb-token-{reader.id}>"
    # Postgres holds the digest, never the token
    with database.connect(kb.database_url, autocommit=True) as conn:
        stored = conn.execute(queries["test_api_token_rows"]).fetchall()
    assert [bytes(r["secret_sha256"]) for r in stored] == [hashlib.sha256(secret.encode()).digest()]
    assert secret not in repr(stored)

    assert tokens.verify(secret) == reader
    reader.check(3, "read")
    with pytest.raises(ScopeRefused, match="needs write"):
        reader.check(1, "write")
    with pytest.raises(WorkspaceNotFound):  # not named: the answer a missing workspace gets
        reader.check(2, "read")
    with pytest.raises(ScopeRefused):  # a call about every workspace
        reader.check(None, "read")
    admin, admin_secret = tokens.create("ops", "admin", None)
    admin.check(None, "write")
    admin.check(99, "admin")

    for bad in (None, "", "Bearer x", "kb_" + "A" * 43, secret[:-1]):
        with pytest.raises(TokenRefused):
            tokens.verify(bad)
    with pytest.raises(TokenExists):
        tokens.create("support-bot", "write", [1])
    for name, scope, ids in (("bad name", "read", [1]), ("x", "owner", [1]), ("x", "read", []), ("x", "read", [0])):
        with pytest.raises(InvalidInput):
            tokens.create(name, scope, ids)

    assert tokens.revoke("support-bot").id == reader.id
    with pytest.raises(TokenRefused):  # the very next verify: no cache
        tokens.verify(secret)
    with pytest.raises(TokenNotFound):
        tokens.revoke(reader.id)
    assert [t.name for t in tokens.list()] == ["ops"]
    assert [t.name for t in tokens.list(include_revoked=True)] == ["support-bot", "ops"]
    again, _ = tokens.create("support-bot", "write", [1])  # a revoked token's name is free again
    assert again.id != reader.id
    assert tokens.verify(admin_secret).scope == "admin"


def test_an_expired_token_is_refused(kb):
    tokens = kb.tokens()
    assert not tokens.any_live()
    _, secret = tokens.create("brief", "read", [1], timedelta(seconds=1))
    assert tokens.any_live() and tokens.verify(secret).expires_at is not None
    time.sleep(1.2)
    with pytest.raises(TokenRefused):
        tokens.verify(secret)
    assert not tokens.any_live()


def test_kb_token_cli(kb_env):
    created = run_cli(kb_env, "token", "create", "--name", "ci", "--scope", "write", "-w", "2", "--expires", "30d")
    secret = created.stdout.strip()
    assert secret.startswith("kb_") and "shown only now" in created.stderr
    listed = [json.loads(line) for line in run_cli(kb_env, "token", "list", "--json").stdout.splitlines()]
    assert [(t["name"], t["scope"], t["workspaces"]) for t in listed] == [("ci", "write", [2])]
    assert secret not in run_cli(kb_env, "token", "list").stdout
    refused = run_cli(kb_env, "token", "create", "--name", "x", "--scope", "read", check=False)
    assert refused.returncode == 1 and "--all-workspaces" in refused.stderr
    bad = run_cli(
        kb_env, "token", "create", "--name", "x", "--scope", "read", "-w", "1", "--expires", "soon", check=False
    )
    assert bad.returncode == 1 and "30d" in bad.stderr
    assert "revoked token" in run_cli(kb_env, "token", "revoke", "ci").stdout
    assert run_cli(kb_env, "token", "list").stdout == ""
