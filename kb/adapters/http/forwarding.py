"""Request forwarding between nodes (design §15): ``kb serve`` answers a request for a workspace
homed on another node by proxying it to that node's URL.

``NodeForwarding`` is ASGI middleware in front of every route. For a path naming a workspace —
``/v1/workspaces/{ws}/…``, ``/ui/workspaces/{ws}/…`` (pages for people, design §17), ``/mcp/{ws}…``
and ``/v1/status?workspace={ws}`` — it reads the
workspace's home (``KnowledgeBase.workspace_home``: one pooled query; a workspace without a home
node whose repository is here is adopted) and:

- serves it here when the request's token does not name the workspace (the route answers 404
  as for a workspace that does not exist: no lookup, so a token never learns that a workspace it
  cannot reach exists, nor its home node, nor that the node is down; design §16), when the home
  is this node, or a node sharing this node's storage (a shared file system), or the workspace
  does not exist (the route answers 404) or has no home node yet;
- answers 503 (``DatabaseUnavailable``, ``Retry-After: 1``) when Postgres does not answer the
  lookup: nothing is done (serving here would refuse a workspace homed elsewhere as WrongNode);
- answers 503 ``NodeUnavailable`` naming the node when the home's heartbeat is older than
  ``KB_NODE_STALE_SECONDS``, it advertises no URL, or it does not answer — nothing is done, and
  other workspaces are unaffected; when it went away after the request reached it, the answer
  says so instead (``"outcome": "unknown"`` for a write, with the call that settles it). These
  answers name the home node's URL (and the connection's error) to an admin token only: another
  caller is told the node's name and what to do (design §16);
- otherwise forwards the request with httpx: method, path, query, body and headers unchanged
  (``Authorization`` and ``Host`` included; hop-by-hop headers dropped, ``X-Kb-Forwarded-By``
  added) and
  streams the response back as it comes (status, headers, body bytes unchanged — server-sent
  events of the MCP endpoint included). Turns therefore stay on the home node.

A request that already carries ``X-Kb-Forwarded-By`` is served where it arrives (one hop at most:
two nodes that disagree about a home — a move flipping it meanwhile — never bounce a request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, quote

from kb import errors
from kb.adapters.http.auth import TOKEN_KEY, error_response
from kb.adapters.mcp.server import mcp_workspace
from kb.db.nodes import Heartbeat

if TYPE_CHECKING:
    import httpx

    from kb.db.nodes import WorkspaceHome
    from kb.knowledge_base import KnowledgeBase

log = logging.getLogger(__name__)

FORWARDED_BY = "x-kb-forwarded-by"
"""Header a forwarded request carries: the forwarding node's name."""

CONNECT_SECONDS = 5.0
"""How long to wait for the home node to accept the connection before NodeUnavailable."""

_WORKSPACE_PATH = re.compile(r"^/(?:v1/workspaces|ui/workspaces)/([0-9]+)(?:/|$)")
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers not passed on. ``Host`` is: the home node sees the address the client used, as the
page forms' anti-forgery check needs (a browser's ``Origin`` names that address, design §17)."""


def workspace_of(scope: dict) -> int | None:
    """The workspace an HTTP request names in its path (or ``/v1/status``'s ``workspace`` query
    parameter), else None. An MCP path names one only as ``mcp_workspace`` reads it (a path
    such as ``/mcp/1/2`` names none, and is answered 404 where it arrives)."""
    path = scope.get("path", "")
    if path == "/mcp" or path.startswith("/mcp/"):
        return mcp_workspace(path)  # as the MCP routing reads it: /mcp/1/2 names none (404 here)
    if match := _WORKSPACE_PATH.match(path):
        return int(match.group(1))
    if path == "/v1/status":
        values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("workspace", [])
        if values and values[-1].isascii() and values[-1].isdigit():  # the last, as the route reads it
            return int(values[-1])
    return None


class NodeForwarding:
    """ASGI middleware: forward requests for workspaces homed on another node (module docstring).

    ``kb_for_thread``: returns the calling thread's KnowledgeBase (``Service.kb``); the home lookup
    runs in a worker thread with it. ``stale_seconds``: ``KB_NODE_STALE_SECONDS``; ``node``: this
    node's name."""

    def __init__(self, app, kb_for_thread, node: str, stale_seconds: float) -> None:
        self.app = app
        self.kb_for_thread = kb_for_thread
        self.node = node
        self.stale_seconds = stale_seconds
        self._client: httpx.AsyncClient | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing_on_shutdown(send))
            return
        if scope["type"] != "http" or (ws := workspace_of(scope)) is None or _header(scope, FORWARDED_BY):
            await self.app(scope, receive, send)
            return
        token = scope.get(TOKEN_KEY)
        if token is not None and not token.reaches(ws):
            # a workspace the token does not name: refused here as one that does not exist, never
            # told where it lives nor that its home is down (design §16)
            await self.app(scope, receive, send)
            return
        try:
            home = await asyncio.to_thread(self._home, ws)
        except (errors.DatabaseUnavailable, errors.StatementCanceled, errors.DatabaseNotReady) as exc:
            # the database is away: where the workspace lives is unknown (serving here: WrongNode);
            # where the database is stays untold but to an admin token (design §16)
            access = scope["app"].state.access
            shown = lambda text: access.shown(text, scope.get(TOKEN_KEY))  # noqa: E731
            await error_response(503, exc, {"Retry-After": "1"}, shown)(scope, receive, send)
            return
        except errors.KbError as exc:  # an id the route refuses (422) or a missing workspace (404)
            log.debug("home of workspace %s unknown (%s); the route answers", ws, exc)
            home = None
        if home is None:
            await self.app(scope, receive, send)
            return
        if not home.is_up(self.stale_seconds):
            age = "never" if home.heartbeat_age is None else f"{home.heartbeat_age:.0f} s ago"
            await _unavailable(
                send,
                home.node,
                f"workspace {ws} is homed on node {home.node!r}, which is down (last heartbeat {age}, "
                f"more than KB_NODE_STALE_SECONDS={self.stale_seconds:g}); nothing was done. Retry when "
                f"it is back (`kb nodes` shows it); its workspaces are never re-homed silently",
            )
            return
        if not home.url:
            await _unavailable(
                send,
                home.node,
                f"workspace {ws} is homed on node {home.node!r}, which advertises no URL; start its "
                "`kb serve` (it advertises KB_NODE_URL, or the address it listens on)",
            )
            return
        await self._forward(scope, receive, send, home)

    def _home(self, ws: int) -> WorkspaceHome | None:
        """The workspace's home when another node must serve it, else None (served here)."""
        kb: KnowledgeBase = self.kb_for_thread()
        home = kb.workspace_home(ws)
        if home is None or home.node is None or kb.is_home(home):
            return None
        return home

    def _http(self):
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(None, connect=CONNECT_SECONDS), follow_redirects=False
            )
        return self._client

    async def _forward(self, scope, receive, send, home: WorkspaceHome) -> None:
        import httpx

        target = home.url.rstrip("/") + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            target += "?" + scope["query_string"].decode("latin-1")
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name.decode("latin-1").lower() not in _HOP_BY_HOP and name.lower() != FORWARDED_BY.encode()
        ]
        headers.append((FORWARDED_BY, self.node))
        disconnected = asyncio.Event()

        async def body():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    return
                if chunk := message.get("body", b""):
                    yield chunk
                if not message.get("more_body", False):
                    return

        client = self._http()
        has_body = any(name.lower() in ("content-length", "transfer-encoding") for name, _ in headers) or bool(
            _header(scope, "transfer-encoding")
        )
        request = client.build_request(scope["method"], target, headers=headers, content=body() if has_body else b"")
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:  # nothing was sent
            where, why = _where(scope, home, exc)
            await _unavailable(
                send,
                home.node,
                f"workspace {workspace_of(scope)} is homed on node {home.node!r}{where}, which did not answer "
                f"({why}); nothing was forwarded. Retry when it is back{_ask_an_operator(scope, home)}",
            )
            return
        except httpx.TransportError as exc:  # sent: the home may have acted before it went away
            await _unavailable(send, home.node, _went_away(scope, home, exc), outcome="unknown")
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k.encode("latin-1"), v.encode("latin-1"))
                        for k, v in response.headers.multi_items()
                        if k.lower() not in _HOP_BY_HOP
                    ],
                }
            )
            await self._stream(response, receive, send, disconnected)
        finally:
            await response.aclose()

    async def _stream(self, response, receive, send, disconnected: asyncio.Event) -> None:
        """Copy the response body to the client until it ends or the client goes away (a
        server-sent-event stream lives as long as its client)."""

        async def pump() -> None:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def client_gone() -> None:
            while not disconnected.is_set():
                if (await receive())["type"] == "http.disconnect":
                    return

        pumping, watching = asyncio.create_task(pump()), asyncio.create_task(client_gone())
        try:
            await asyncio.wait({pumping, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pumping, watching):
                task.cancel()
            for task in (pumping, watching):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if pumping.done() and not pumping.cancelled() and pumping.exception() is not None:
            log.warning("forwarding to %s broke off: %s", response.url, pumping.exception())

    def _closing_on_shutdown(self, send):
        async def wrapped(message) -> None:
            if message["type"] == "lifespan.shutdown.complete" and self._client is not None:
                await self._client.aclose()
                self._client = None
            await send(message)

        return wrapped


def _header(scope: dict, name: str) -> str | None:
    wanted = name.encode("latin-1")
    for key, value in scope.get("headers", []):
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _reveals(scope: dict) -> bool:
    """True when the request's caller may read where the nodes are (an admin token, or nobody
    checked: ``Access.reveals``, design §16)."""
    return scope["app"].state.access.reveals(scope.get(TOKEN_KEY))


def _where(scope: dict, home: WorkspaceHome, exc: Exception) -> tuple[str, str]:
    """``(" at URL", "ErrorType: detail")`` naming the home node's address and the connection's
    error for a caller who may read them (``_reveals``), else ``("", "ErrorType")``: the node's
    URL is a deployment fact kept from all but admin tokens (design §16)."""
    if _reveals(scope):
        return f" at {home.url}", f"{type(exc).__name__}: {exc}"
    return "", type(exc).__name__


def _ask_an_operator(scope: dict, home: WorkspaceHome) -> str:
    """What a caller who is not told the node's address can do besides retrying."""
    if _reveals(scope):
        return ""
    return f"; if it stays so, ask kb's operator to check node {home.node!r} (`kb nodes`)"


def _went_away(scope: dict, home: WorkspaceHome, exc: Exception) -> str:
    """What to tell the client whose request reached the home node, which then went away before
    answering: a read changed nothing; a write's outcome is unknown, and how to settle it."""
    where, why = _where(scope, home, exc)
    gone = (
        f"the request reached node {home.node!r}{where} (the home of workspace {workspace_of(scope)}), which "
        f"went away before answering ({why})"
    )
    if scope["method"] in _SAFE_METHODS:
        return f"{gone}; a read changes nothing. Retry when it is back{_ask_an_operator(scope, home)}"
    ws = workspace_of(scope)
    key = _header(scope, "idempotency-key")
    settle = (
        f"GET /v1/workspaces/{ws}/writes/{quote(key, safe='')} (its Idempotency-Key) settles it"
        if key
        else f"read GET /v1/workspaces/{ws}/log before writing again"
    )
    return f"{gone}; whether it took effect is unknown. When the node is back, {settle}"


async def _unavailable(send, node: str | None, message: str, **extra: str) -> None:
    """A 503 NodeUnavailable answer in kb's error form (``{"error", "message", "node"}`` and
    ``extra`` fields, e.g. ``outcome="unknown"`` for a write the home may have done)."""
    body = json.dumps(
        {"error": errors.NodeUnavailable.__name__, "message": message, "cli_message": message, "node": node, **extra}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [(b"content-type", b"application/json"), (b"retry-after", b"5")],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def advertised_url(node_url: str | None, host: str, port: int) -> str:
    """The URL this node's ``kb serve`` advertises: ``KB_NODE_URL``, else ``http://HOST:PORT`` (for
    a wildcard ``HOST`` the machine's host name)."""
    if node_url:
        return node_url.rstrip("/")
    if host in ("0.0.0.0", "::", ""):
        import socket

        host = socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@contextlib.asynccontextmanager
async def serving_node(kb: KnowledgeBase, url: str | None):
    """Register ``kb``'s node with ``url`` (adopting its homeless workspaces) and heartbeat while
    the server runs (design §15)."""
    await asyncio.to_thread(kb.register_node, url)
    beat = Heartbeat(kb.database_url, kb.settings).start()
    try:
        yield
    finally:
        await asyncio.to_thread(beat.stop)
