"""Who may call ``kb serve`` (design §16): bearer tokens on every route but ``/health`` and
``/ready``, checked per workspace and scope; the same for MCP over HTTP.

Three parts, so no route can be forgotten:

- :class:`Authentication` (ASGI middleware, outermost but one) refuses every request without a live
  token with **401** (``{"error": "TokenRefused", …}`` and ``WWW-Authenticate: Bearer``) before
  any route runs — OpenAPI (``/openapi.json``, ``/docs``) and ``/mcp`` included — and leaves the
  token in the ASGI scope (:func:`request_token`). It asks Postgres on every request
  (``TokenStore.verify``, one index lookup, no cache), so a revoked token is refused by the next request.
- :func:`require` is the FastAPI dependency each router declares with its scope: the token must
  name the route's workspace (``{workspace_id}`` in the path, or the ``workspace`` query parameter
  where ``workspace_from="query"``) and hold the scope. A workspace the token does not name is
  **404** ``WorkspaceNotFound``, the very answer a missing workspace gets, so a token learns
  nothing of workspaces it cannot reach; a workspace it names with too small a scope is **403**
  ``ScopeRefused`` (the token can see the workspace exists, so a 404 would hide nothing and only
  mislead). ``create_app`` checks at start that every API route has one.
- :class:`McpGate` wraps the MCP mount (``/mcp/<workspace>``): read on the workspace to connect,
  and it passes the token's scope and committer to the MCP tools in headers the client cannot set
  (:data:`SCOPE_HEADER`, :data:`COMMITTER_HEADER`); the tools that change documents refuse a read
  token (``kb.adapters.mcp.server``). An MCP session answers only the token that opened it.

``kb serve --insecure-no-auth`` (``Access(insecure=True)``) skips all of it and says so at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Literal

from fastapi import Request  # at run time: FastAPI reads the dependency's annotation
from pydantic import TypeAdapter

from kb import errors
from kb.adapters.mcp.server import (
    TOKEN_COMMITTER_HEADER,
    TOKEN_ID_HEADER,
    TOKEN_SCOPE_HEADER,
    hide_facts,
    mcp_workspace,
    owned_name,
)

if TYPE_CHECKING:
    from kb.db.tokens import Scope, Token, TokenStore

PUBLIC_PATHS = frozenset({"/health", "/ready", "/ui/login"})
"""The only routes answered without a token (liveness and readiness probes, and the pages' login
page, which takes one)."""

PUBLIC_PREFIXES = ("/ui/static/", "/docs-assets/")
"""Static files answered without a token: the pages' stylesheet and script, Swagger UI's files
(the same for everyone, shipped in the package; no data)."""

TOKEN_COOKIE = "kb_token"
"""The cookie the login page (``/ui/login``, design §17) sets: HttpOnly, SameSite=Strict. Taken as
the token, when no ``Authorization`` header came, on the paths of :data:`COOKIE_PATHS` only."""

COOKIE_PATHS = ("/ui", "/docs", "/openapi.json")

SCOPE_HEADER = TOKEN_SCOPE_HEADER.encode()
COMMITTER_HEADER = TOKEN_COMMITTER_HEADER.encode()
TOKEN_HEADER = TOKEN_ID_HEADER.encode()
INTERNAL_HEADERS = frozenset({SCOPE_HEADER, COMMITTER_HEADER, TOKEN_HEADER})
"""Headers only the server sets (removed from every request as it arrives)."""

NODE_URL = "<a kb node's URL>"
"""What an error message says instead of a node's URL to a caller without an admin token."""

TOKEN_KEY = "kb.token"
"""Where :class:`Authentication` leaves the request's ``Token`` in the ASGI scope."""


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (scheme case-insensitive),
    or None when there is none or another scheme."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


class Access:
    """The server's rule of access: tokens from ``tokens`` (set by the service once kb is open),
    or nobody checked at all (``insecure``, ``kb serve --insecure-no-auth``). Thread-safe."""

    def __init__(self, insecure: bool = False) -> None:
        self.insecure = insecure
        self.tokens: TokenStore | None = None
        self.deployment: dict[str, str] = {}
        """Text of the deployment's facts (the database's address, the storage root) → what an
        error message says instead to a caller without an admin token (set by the service)."""
        self.node_urls: Callable[[], list[str]] | None = None
        """Reads the registered nodes' URLs (set by the service): they change while the server
        runs, so they are read when a message may name one."""

    def reveals(self, token: Token | None) -> bool:
        """True when the caller of ``token`` may read the deployment's facts (the database's
        address, storage roots, node URLs): an admin token, or nobody checked (design §16)."""
        return self.insecure or (token is not None and token.scope == "admin")

    def shown(self, text: str, token: Token | None) -> str:
        """``text`` (an error message) as the caller of ``token`` may read it: the database's
        address, the storage root and the nodes' URLs replaced by placeholders unless the token
        is an admin one (or nobody is checked), as ``/v1/status`` keeps them (design §16)."""
        return self.shown_to_scope(text, None if token is None else token.scope)

    def shown_to_scope(self, text: str, scope: str | None) -> str:
        """``shown`` for a caller whose token has ``scope`` (None: no token known): the rule the
        MCP tools' errors follow too (``kb.adapters.mcp.server.http_app``'s ``shown``)."""
        if self.insecure or scope == "admin":
            return text
        text = hide_facts(text, self.deployment)
        if "://" in text:  # a node's URL may be in it: read them (one query, on an error only)
            text = self._hide_node_urls(text)
        return text

    def _hide_node_urls(self, text: str) -> str:
        import re

        try:
            facts = {} if self.node_urls is None else {url: NODE_URL for url in self.node_urls()}
        except errors.KbError:  # Postgres cannot say which URLs are nodes': hide every web address
            return re.sub(r"https?://[^\s'\"(),;]+", NODE_URL, text)
        return hide_facts(text, facts)

    def authenticate(self, authorization: str | None) -> Token | None:
        """The live token of an ``Authorization`` header value (None when insecure). Raises
        TokenRefused (missing, malformed, unknown, revoked, expired), DatabaseNotReady while the
        server starts, DatabaseUnavailable."""
        if self.insecure:
            return None
        if self.tokens is None:
            raise errors.DatabaseNotReady("kb serve is starting; retry in a moment")
        return self.tokens.verify(bearer(authorization))


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, ``localhost``)."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def start_up_check(host: str, port: int, *, insecure: bool, tokens_live: Callable[[], bool]) -> str:
    """Decide whether ``kb serve`` may listen on ``host`` (design §16); returns the line to log.

    Raises ConfigurationError on a non-loopback ``host`` with no live token (naming ``kb token
    create``), unless ``insecure``. ``tokens_live``: asks Postgres whether a live token exists.
    """
    if insecure:
        return (
            f"kb serve on {host}:{port} WITHOUT authentication (--insecure-no-auth): anyone who reaches "
            "it can read, write and delete every workspace; use it only on a trusted network"
        )
    if tokens_live():
        return f"kb serve on {host}:{port}: every route but /health and /ready needs an API token"
    if not is_loopback(host):
        raise errors.ConfigurationError(
            f"kb serve refuses to listen on {host} (not loopback) with no API token defined: create one "
            "with `kb token create --name NAME --scope read|write|admin -w N`, or pass --insecure-no-auth "
            "on a trusted network"
        )
    return (
        f"kb serve on {host}:{port}: no API token is defined, so every request but /health and /ready "
        "is refused (401) until you run `kb token create`"
    )


def error_response(
    status: int, exc: errors.KbError, headers: dict[str, str] | None = None, shown: Callable[[str], str] = str
):
    """kb serve's JSON error response (``{"error", "message", "cli_message"}``) as an ASGI app;
    ``shown`` rewrites the messages for the caller (``Access.shown``)."""
    from kb.adapters.http.json_bodies import SafeJSONResponse

    body = {"error": type(exc).__name__, "message": shown(str(exc)), "cli_message": shown(exc.cli_message)}
    return SafeJSONResponse(body, status_code=status, headers=headers)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _cookie(scope, name: str) -> str | None:
    from http.cookies import CookieError, SimpleCookie

    raw = _header(scope, b"cookie")
    if not raw:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw)
    except CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None and morsel.value else None


class Authentication:
    """ASGI middleware: 401 for any request but :data:`PUBLIC_PATHS` without a live token (see the
    module docstring); strips :data:`INTERNAL_HEADERS` from every request."""

    def __init__(self, app, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in INTERNAL_HEADERS]
        scope = dict(scope, headers=headers)
        path = scope.get("path", "")
        if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES) or self.access.insecure:
            await self.app(scope, receive, send)
            return
        import anyio

        authorization = _header(scope, b"authorization")
        if authorization is None and path.startswith(COOKIE_PATHS):
            cookie = _cookie(scope, TOKEN_COOKIE)  # a person's browser, logged in by /ui/login
            authorization = None if cookie is None else f"Bearer {cookie}"
        try:
            token = await anyio.to_thread.run_sync(self.access.authenticate, authorization)
        except errors.TokenRefused as exc:
            if path.startswith("/ui") and scope.get("method") == "GET":  # a person: to the login page
                from urllib.parse import quote

                from starlette.responses import RedirectResponse

                await RedirectResponse(f"/ui/login?next={quote(path, safe='/')}", 303)(scope, receive, send)
                return
            await error_response(401, exc, {"WWW-Authenticate": 'Bearer realm="kb"'})(scope, receive, send)
            return
        except errors.KbError as exc:  # the database does not answer: nobody can be checked
            # nor told where the database is (the caller is nobody known yet)
            shown = lambda text: self.access.shown(text, None)  # noqa: E731
            await error_response(503, exc, {"Retry-After": "1"}, shown)(scope, receive, send)
            return
        scope[TOKEN_KEY] = token
        await self.app(scope, receive, send)


def request_token(request: Request) -> Token | None:
    """The token that authenticated ``request`` (None under ``--insecure-no-auth``)."""
    return request.scope.get(TOKEN_KEY)


def committer_of(request: Request) -> str | None:
    """Whom the revisions of ``request`` record as committer: its token's ``NAME <kb-token-ID>``
    (None under ``--insecure-no-auth``: kb's own identity)."""
    token = request_token(request)
    return None if token is None else token.committer


OWNED_ID_CHARS = 200
"""The most characters of a turn's root id (``kb.git.worktree.root_turn_id``) and of a chat id
(``kb.citations.registry.MAX_CHAT_ID_CHARS``), the token's prefix included."""


ID_PARAMETERS = ("turn_id", "chat_id", "key", "chat")
"""The path and query parameters naming a turn, chat or idempotency key (``owned_by_token``)."""


def named_ids(request: Request) -> list[str]:
    """The turn, chat and key ids ``request``'s client gave (:data:`ID_PARAMETERS` of its path and
    query, its ``Idempotency-Key`` header), as the client spelled them."""
    given = [request.path_params.get(name) or request.query_params.get(name) for name in ID_PARAMETERS]
    given.append(request.headers.get("idempotency-key"))
    return [name for name in given if name]


def as_the_token_names_it(text: str, token: Token | None, ids: Iterable[str]) -> str:
    """``text`` (an error's message) with the turn, chat and key ids ``ids`` (as the client gave
    them, ``named_ids``; a sub-agent turn id's root too) shown so: kb keeps them as ``t<token
    id>@NAME`` (``owned_by_token``), a prefix the client never sent and cannot use — a message
    naming ``t2@support-42`` sent the reader to look up a chat no command of theirs finds (design
    §16). Only where a message names an id, whole in quotes (``'t2@x'``) or after ``--chat `` or
    ``write-outcome `` (the commands it tells to run): the prefix was stripped from every
    ``t2@`` of the message, so a document path or the client's own text holding one was shown
    as another than they sent. ``text`` unchanged without a token."""
    if token is None:
        return text
    names = {part for name in ids for part in (name, name.split("::", 1)[0]) if part}
    if not names:
        return text
    prefix = re.escape(owned_name("", token.id))
    alternatives = "|".join(re.escape(name) for name in sorted(names, key=len, reverse=True))
    quoted = rf"(?P<q>['\"]){prefix}(?P<id>{alternatives})(?P=q)"
    commanded = rf"(?P<c>--chat |write-outcome ){prefix}(?P<cid>{alternatives})(?=[\s`]|$)"

    def given(found: re.Match) -> str:
        if found.group("q"):
            return found.group("q") + found.group("id") + found.group("q")
        return found.group("c") + found.group("cid")

    return re.sub(f"{quoted}|{commanded}", given, text)


def owned_by_token(request: Request, name: str, error: type[errors.KbError] = errors.InvalidTurn) -> str:
    """A client-given turn or chat id as kb keys it for ``request``'s token: private to that token
    (``owned_name``: ``t<token id>@<name>``; ``name`` itself under ``--insecure-no-auth``), so a
    second token of the same workspace that names it reaches a turn or chat of its own, never the
    first token's worktree, changes or citation handles (design §16).

    Raises ``error`` (InvalidTurn; InvalidChat for a chat) when the prefix leaves no room for the
    id (its root, before ``::``): the message counts the client's own id, not the key it never gave;
    and when that root is empty (an ``Idempotency-Key:`` header sent empty): the prefix alone would
    be a key, the same one for every such write of the token, and a later write would be answered
    with the first one's revision while its own changes were dropped (design §3)."""
    token = request_token(request)
    if token is None:
        return name
    owned = owned_name(name, token.id)
    room = OWNED_ID_CHARS - (len(owned) - len(name))
    root = name.split("::", 1)[0]
    if not root:  # the key would be the token's prefix alone, one for every empty id of the token
        raise error(
            f"the id {name!r} is empty{' before its ::' if name else ''}: give 1 to {room} characters "
            "(an idempotency key: one per write, e.g. a UUID; an empty one would name every write sent with it)"
        )
    if len(root) > room:
        raise error(
            f"the id {root[:40]!r}… has {len(root)} characters; use at most {room} (behind an API token kb "
            f"keeps {OWNED_ID_CHARS - room} of the {OWNED_ID_CHARS} for the token the id is private to)"
        )
    return owned


_INTEGER = TypeAdapter(int)  # the routes' own parsing of an int parameter (built once: ~0.1 ms)


def _workspace(raw: str | None) -> int | None | Literal[False]:
    """A workspace id as the route will parse it; False when it will refuse it (422)."""
    if raw is None:
        return None
    from pydantic import ValidationError

    try:
        return _INTEGER.validate_python(raw)
    except ValidationError:
        return False


def require(
    scope: Scope, *, workspace_from: Literal["path", "query"] = "path"
) -> Callable[[Request], Awaitable[Token | None]]:
    """A FastAPI dependency: the request's token must reach the route's workspace with ``scope``
    (design §16). ``workspace_from``: the ``{workspace_id}`` path parameter, or the optional
    ``workspace`` query parameter (absent: a call about every workspace, which only a token for
    every workspace may make). Returns the token (None when insecure). Raises TokenRefused (401;
    only if the middleware was bypassed), WorkspaceNotFound (404), ScopeRefused (403)."""

    async def check(request: Request) -> Token | None:  # async: no I/O, so no thread-pool hop
        access: Access = request.app.state.access
        if access.insecure:
            return None
        token = request_token(request)
        if token is None:
            raise errors.TokenRefused("this request needs an API token: send 'Authorization: Bearer <token>'")
        raw = request.path_params.get("workspace_id") if workspace_from == "path" else None
        if workspace_from == "query":
            raw = request.query_params.get("workspace")
        workspace = _workspace(raw)
        if workspace is False:  # the route refuses the id itself (422), before doing anything
            return token
        token.check(workspace, scope)
        return token

    check.kb_scope = scope  # type: ignore[attr-defined]  # create_app checks every route has one
    return check


class McpGate:
    """ASGI wrapper of the MCP mount (``/mcp/<workspace>``): the token must reach the workspace
    (read scope at least: 404/403 as :func:`require`); it tells the MCP tools the token's scope
    and committer in :data:`SCOPE_HEADER` / :data:`COMMITTER_HEADER`, and its id in
    :data:`TOKEN_HEADER` (a chat id is private to its token)."""

    def __init__(self, app, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.access.insecure:
            await self.app(scope, receive, send)
            return
        token: Token | None = scope.get(TOKEN_KEY)
        if token is None:  # never: Authentication runs first
            await error_response(401, errors.TokenRefused("this request needs an API token"))(scope, receive, send)
            return
        workspace = mcp_workspace(scope.get("path", ""))  # the routing's own reading of the path
        if workspace is not None:  # else the MCP routing answers 404 (no workspace in the URL)
            try:
                token.check(workspace, "read")
            except errors.WorkspaceNotFound as exc:
                await error_response(404, exc)(scope, receive, send)
                return
            except errors.ScopeRefused as exc:
                await error_response(403, exc)(scope, receive, send)
                return
        headers = [
            *scope["headers"],
            (SCOPE_HEADER, token.scope.encode()),
            (COMMITTER_HEADER, token.committer.encode("utf-8")),
            (TOKEN_HEADER, str(token.id).encode()),
        ]
        await self.app(dict(scope, headers=headers, user=_mcp_principal(token)), receive, send)


def _mcp_principal(token: Token):
    """The token as the MCP SDK's authenticated user: its session manager binds a session
    (``Mcp-Session-Id``) to the user that opened it and answers any other one 404 "Session not
    found", so a token that learns another token's session id can neither end that session (HTTP
    DELETE) nor send on it or take its stream (design §16). Only the token's id goes in, never its
    secret."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(
        AccessToken(token=f"kb-token-{token.id}", client_id=f"kb-token-{token.id}", scopes=[token.scope])
    )


def unguarded_routes(app) -> list[str]:
    """The API routes of ``app`` (but :data:`PUBLIC_PATHS`), those of included routers too, that
    declare no :func:`require` dependency: ``create_app`` refuses to build an app with one."""
    from kb.adapters.http.routes import api_routes

    return [
        f"{','.join(sorted(methods))} {path}"
        for path, methods, route in api_routes(app)
        if path not in PUBLIC_PATHS and not any(hasattr(d.call, "kb_scope") for d in route.dependant.dependencies)
    ]
