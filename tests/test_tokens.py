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

from kb.adapters.cli.tokens import parse_lifetime
from kb.adapters.http.auth import is_loopback, start_up_check
from kb.db import database
from kb.errors import (
    ConfigurationError,
    InvalidInput,
    ScopeRefused,
    TokenExists,
    TokenNotFound,
    TokenRefused,
    WorkspaceNotFound,
)


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


def test_verify_survives_its_idle_connections_ending(kb):
    tokens = kb.tokens()
    _, secret = tokens.create("steady", "read", [1])
    tokens.verify(secret)  # the autocommit pool now holds idle connections
    with database.connect(kb.database_url, autocommit=True) as conn:
        assert conn.execute(queries["test_terminate_other_backends"]).fetchone()["terminated"] >= 1
    assert tokens.verify(secret).name == "steady"  # a dead connection is retried once, not an error


def test_an_expired_token_is_refused(kb):
    tokens = kb.tokens()
    assert not tokens.any_live()
    _, secret = tokens.create("brief", "read", [1], timedelta(seconds=1))
    assert tokens.any_live() and tokens.verify(secret).expires_at is not None
    time.sleep(1.2)
    with pytest.raises(TokenRefused):
        tokens.verify(secret)
    assert not tokens.any_live()
    listed = [t for t in tokens.list() if t.name == "brief"]  # listed, and said to be expired
    assert listed[0].expired() and listed[0].as_json()["live"] is False


def test_kb_token_list_says_a_token_past_its_lifetime_is_expired(kb_env, settings):
    """design §16: `kb token list` showed an expired token as "expires <past time>", as if live,
    while the 401 told people to use it to see the live ones."""
    run_cli(kb_env, "token", "create", "--name", "brief", "--scope", "read", "--all-workspaces", "--expires", "1m")
    run_cli(kb_env, "token", "create", "--name", "lasting", "--scope", "read", "--all-workspaces", "--expires", "30d")
    with database.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(queries["test_expire_token"], {"name": "brief"})
    lines = run_cli(kb_env, "token", "list").stdout.splitlines()
    assert "EXPIRED" in next(line for line in lines if "brief" in line), lines
    assert " expires " in next(line for line in lines if "lasting" in line), lines
    listed = {
        t["name"]: t["live"] for t in map(json.loads, run_cli(kb_env, "token", "list", "--json").stdout.splitlines())
    }
    assert listed == {"brief": False, "lasting": True}


def test_kb_token_cli_and_serve_refusing_a_public_address_without_tokens(kb_env, tmp_path):
    public = run_cli(kb_env, "serve", "--host", "0.0.0.0", "--port", "1", check=False)
    assert public.returncode == 1 and "kb token create" in public.stderr and "--insecure-no-auth" in public.stderr
    created = run_cli(kb_env, "token", "create", "--name", "ci", "--scope", "write", "-w", "2", "--expires", "30d")
    secret = created.stdout.strip()
    assert secret.startswith("kb_") and "shown only now" in created.stderr
    assert "no workspace 2 exists yet" in created.stderr  # a typo is told, the token stands
    assert ": write on workspace 2, " in created.stderr  # one workspace, in the singular
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "a.md").write_text("# A\n")
    run_cli(kb_env, "import", str(notes), "--workspace", "2")
    known = run_cli(kb_env, "token", "create", "--name", "ci2", "--scope", "read", "-w", "2")
    assert "exists yet" not in known.stderr
    run_cli(kb_env, "token", "revoke", "ci2")
    listed = [json.loads(line) for line in run_cli(kb_env, "token", "list", "--json").stdout.splitlines()]
    assert [(t["name"], t["scope"], t["workspaces"]) for t in listed] == [("ci", "write", [2])]
    assert listed[0]["expires_at"] and secret not in json.dumps(listed)
    refused = run_cli(kb_env, "token", "create", "--name", "x", "--scope", "read", check=False)
    assert refused.returncode == 1 and "--all-workspaces" in refused.stderr
    assert "revoked token" in run_cli(kb_env, "token", "revoke", "ci").stdout


@pytest.mark.parametrize("text", ["30d", "12h", "90m", "2w"])
def test_token_lifetimes(text):
    assert parse_lifetime(text).total_seconds() > 0


@pytest.mark.parametrize("text", ["soon", "0d", "30", "-1d", "1y"])
def test_bad_token_lifetimes(text):
    with pytest.raises(InvalidInput, match="30d"):
        parse_lifetime(text)


def test_start_up_check():
    def never() -> bool:
        raise AssertionError("insecure: no need to ask Postgres")

    assert "WITHOUT authentication" in start_up_check("0.0.0.0", 1, insecure=True, tokens_live=never)
    assert "401" in start_up_check("127.0.0.1", 1, insecure=False, tokens_live=lambda: False)
    assert "needs an API token" in start_up_check("10.1.2.3", 1, insecure=False, tokens_live=lambda: True)
    for host in ("0.0.0.0", "::", "example.org", "10.1.2.3"):
        with pytest.raises(ConfigurationError, match="kb token create"):
            start_up_check(host, 1, insecure=False, tokens_live=lambda: False)
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"))
