"""API tokens of ``kb serve`` and MCP over HTTP (design §16): create, list, revoke, verify.

A token is ``kb_`` and 43 characters of ``secrets.token_urlsafe(32)`` (256 random bits), shown
once by :meth:`TokenStore.create`; Postgres keeps only its SHA-256 (``kb.api_tokens``). Why a
plain SHA-256 and not bcrypt/scrypt/argon2: those slow hashes protect *passwords*, which people
choose from a small space an attacker can enumerate; a 256-bit random token cannot be enumerated,
so a leaked digest gives nothing away whatever the hash's speed, while a slow hash would cost
~100 ms of CPU on every request (the bar is 1 ms, design §14) and, being salted, could not be
looked up by an index — each request would have to try every stored token. With a plain digest
the server finds the token by one index lookup, and timing reveals at most a digest prefix.

A token has a name (``[A-Za-z0-9][A-Za-z0-9._-]{0,63}``, unique among live tokens), one scope —
``read`` ⊂ ``write`` ⊂ ``admin`` — and the workspaces it reaches (``None``: every workspace), and
optionally an expiry. :meth:`TokenStore.verify` asks Postgres on every call (no cache), so a
revoked or expired token is refused by the next request. Every object here is safe to share
between threads (the store holds only a URL and uses the process's connection pool).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from kb.db import database
from kb.db.sql import queries
from kb.errors import (
    DatabaseUnavailable,
    InvalidInput,
    ScopeRefused,
    TokenExists,
    TokenNotFound,
    TokenRefused,
    WorkspaceNotFound,
)

Scope = Literal["read", "write", "admin"]
SCOPES: tuple[Scope, ...] = ("read", "write", "admin")
"""The scopes, each including the ones before it (read ⊂ write ⊂ admin)."""

PREFIX = "kb_"
"""Every token starts with it (so a token pasted somewhere is recognisable, and a scanner can find it)."""

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TOKEN = re.compile(r"kb_[A-Za-z0-9_-]{43}")


def digest(secret: str) -> bytes:
    """The SHA-256 of a token's text (what ``kb.api_tokens.secret_sha256`` holds)."""
    return hashlib.sha256(secret.encode("ascii", errors="replace")).digest()


def check_scope(scope: object) -> Scope:
    """``scope`` when it is one of :data:`SCOPES`; raises InvalidInput naming them."""
    if scope not in SCOPES:
        raise InvalidInput(f"the scope {scope!r} is not one of {', '.join(SCOPES)}")
    return scope  # narrowed to Scope by the membership test above


@dataclass(frozen=True)
class Token:
    """A token as Postgres records it (never its secret). ``workspace_ids`` None: every workspace.
    Times are timezone-aware UTC datetimes; ``expires_at``/``revoked_at`` None when not set."""

    id: int
    name: str
    scope: Scope
    workspace_ids: tuple[int, ...] | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None

    @property
    def committer(self) -> str:
        """Who records the revisions this token makes: ``NAME <kb-token-ID>`` (``git log``'s
        committer; the author stays whom the request names)."""
        return f"{self.name} <kb-token-{self.id}>"

    def reaches(self, workspace_id: int | None) -> bool:
        """True when the token names the workspace; ``None`` (a call about every workspace, such
        as ``/v1/status`` without one) is reached only by a token for every workspace."""
        if self.workspace_ids is None:
            return True
        return workspace_id is not None and workspace_id in self.workspace_ids

    def grants(self, scope: Scope) -> bool:
        """True when the token's scope includes ``scope`` (read ⊂ write ⊂ admin)."""
        return SCOPES.index(self.scope) >= SCOPES.index(scope)

    def check(self, workspace_id: int | None, scope: Scope) -> None:
        """Refuse a call the token may not make (design §16).

        Raises WorkspaceNotFound when the token does not name the workspace — the same answer as
        for a workspace that does not exist, so a token learns nothing of workspaces it cannot
        reach — and ScopeRefused when it names it with a smaller scope than ``scope``.
        """
        if not self.reaches(workspace_id):
            if workspace_id is None:
                raise ScopeRefused(
                    f"token {self.name!r} names some workspaces only; this call is about every workspace "
                    "(name one, or use a token created with --all-workspaces)"
                )
            raise WorkspaceNotFound(
                f"workspace {workspace_id} does not exist, or token {self.name!r} does not reach it "
                "(a token names the workspaces it may use: ask kb's operator for one that names it)"
            )
        if not self.grants(scope):
            raise ScopeRefused(
                f"token {self.name!r} has the {self.scope} scope; this call needs {scope} "
                f"(create a token with --scope {scope})"
            )

    def expired(self, now: datetime | None = None) -> bool:
        """True when the token's lifetime ended by ``now`` (default: this moment, UTC): refused
        as a revoked one is (design §16)."""
        return self.expires_at is not None and self.expires_at <= (now or datetime.now(UTC))

    def as_json(self) -> dict:
        """The token's fields as JSON values (ISO times, ``workspaces``: a list or ``"all"``;
        ``live``: neither revoked nor expired now)."""
        return {
            "id": self.id,
            "name": self.name,
            "scope": self.scope,
            "workspaces": "all" if self.workspace_ids is None else list(self.workspace_ids),
            "created_at": self.created_at.isoformat(),
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
            "revoked_at": None if self.revoked_at is None else self.revoked_at.isoformat(),
            "live": self.revoked_at is None and not self.expired(),
        }


def _token(row: dict) -> Token:
    ids = row["workspace_ids"]
    return Token(
        row["id"],
        row["name"],
        row["scope"],
        None if ids is None else tuple(ids),
        row["created_at"],
        row["expires_at"],
        row["revoked_at"],
    )


class TokenStore:
    """The API tokens in the database at ``database_url`` (``kb.api_tokens``). Thread-safe."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def create(
        self,
        name: str,
        scope: Scope,
        workspace_ids: Iterable[int] | None,
        expires_in: timedelta | None = None,
    ) -> tuple[Token, str]:
        """Create a token; returns it and its secret (the only time the secret exists outside
        the caller: Postgres keeps its digest).

        ``workspace_ids`` None: every workspace (also ones created later). ``expires_in`` None:
        never expires. Raises InvalidInput (bad name, scope, workspace id or duration),
        TokenExists (a live token has the name), DatabaseUnavailable.
        """
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise InvalidInput(
                f"the token name {name!r} is not 1 to 64 letters, digits, '.', '_' or '-' starting with a "
                "letter or digit; e.g. support-bot"
            )
        check_scope(scope)
        ids = None
        if workspace_ids is not None:
            ids = sorted(set(workspace_ids))
            if not ids or any(not isinstance(i, int) or isinstance(i, bool) or not 1 <= i < 2**31 for i in ids):
                raise InvalidInput(f"a token names one or more workspace ids (1 to 2^31-1), not {ids}")
        if expires_in is not None and expires_in <= timedelta(0):
            raise InvalidInput(f"a token's lifetime must be positive, not {expires_in}")
        secret = PREFIX + secrets.token_urlsafe(32)
        with database.pooled_transaction(self.database_url) as conn:
            row = conn.execute(
                queries["insert_api_token"],
                {
                    "name": name,
                    "digest": digest(secret),
                    "scope": scope,
                    "workspace_ids": ids,
                    "expires_in": expires_in,
                },
            ).fetchone()
        if row is None:
            raise TokenExists(
                f"a token named {name!r} exists; revoke it (kb token revoke {name}) or choose another name"
            )
        return _token(row), secret

    def verify(self, secret: str | None) -> Token:
        """The live token whose text is ``secret``, asked of Postgres now (no cache: a token
        revoked or expired a moment ago is refused). Raises TokenRefused when ``secret`` is
        missing, malformed, unknown, revoked or expired; DatabaseUnavailable."""
        if not secret:
            raise TokenRefused(
                "this request needs an API token: send 'Authorization: Bearer <token>' (kb token create)",
                cli="kb serve needs an API token: set KB_TOKEN to one that `kb token create` printed",
            )
        if not isinstance(secret, str) or not _TOKEN.fullmatch(secret):
            raise TokenRefused("the API token is malformed (a kb token is 'kb_' and 43 characters)")
        row = self._lookup(digest(secret))
        if row is None:
            raise TokenRefused(
                "the API token is unknown, revoked or expired (kb token list shows the live ones)",
                cli="the API token in KB_TOKEN is unknown, revoked or expired (kb token list shows the live ones)",
            )
        return _token(row)

    def _lookup(self, secret_digest: bytes) -> dict | None:
        # One round trip on the autocommit pool (no checkout probe, no COMMIT): the check runs on
        # every request (design §16, ≤ 1 ms). A connection whose backend ended while idle fails
        # once; then every idle connection is checked (the dead ones replaced) and it runs again.
        for attempt in (1, 2):
            try:
                with database.pooled_connection(self.database_url, autocommit=True) as conn:
                    return conn.execute(queries["verify_api_token"], {"digest": secret_digest}).fetchone()
            except DatabaseUnavailable:
                if attempt == 2:
                    raise
                database.pool(self.database_url, autocommit=True).check()
        return None

    def list(self, include_revoked: bool = False) -> list[Token]:
        """Every live token (with ``include_revoked``, the revoked ones too), oldest first."""
        with database.pooled_connection(self.database_url) as conn:
            rows = conn.execute(queries["list_api_tokens"], {"include_revoked": include_revoked}).fetchall()
        return [_token(r) for r in rows]

    def revoke(self, token: int | str) -> Token:
        """Revoke a live token by id (an int, or a string of digits) or by name; the next request
        carrying it is refused. Returns the revoked token. Raises TokenNotFound."""
        by_id = token if isinstance(token, int) else int(token) if str(token).isdigit() else None
        if by_id is not None and not 0 < by_id < 2**63:
            raise TokenNotFound(f"no token has the id {token!r} (kb token list shows them)")
        with database.pooled_transaction(self.database_url) as conn:
            row = conn.execute(
                queries["revoke_api_token"], {"id": by_id, "name": None if by_id is not None else str(token)}
            ).fetchone()
        if row is None:
            raise TokenNotFound(f"no live token has the id or name {token!r} (kb token list shows them)")
        return _token(row)

    def is_live(self, token_id: int) -> bool:
        """True when the token with id ``token_id`` is live (not revoked, not expired), decided by
        Postgres as every request's check is (design §16). Raises DatabaseUnavailable."""
        with database.pooled_connection(self.database_url) as conn:
            return bool(conn.execute(queries["api_token_is_live"], {"id": token_id}).fetchone()["live"])

    def any_live(self) -> bool:
        """True when at least one token is live (not revoked, not expired): ``kb serve`` refuses a
        non-loopback address without one (design §16)."""
        with database.pooled_connection(self.database_url) as conn:
            return bool(conn.execute(queries["live_api_token_exists"]).fetchone()["present"])
