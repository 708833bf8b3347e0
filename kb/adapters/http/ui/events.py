"""Live updates for the pages (design §17): ``GET /ui/workspaces/{ws}/events`` is a stream of
server-sent events relaying the workspace's ``kb_events`` notifications (design §6), so an open
workspace page reloads when a revision lands. Pages work without it (plain HTML, no JavaScript).

Each stream holds one Postgres session that LISTENs (``KB_DIRECT_DATABASE_URL`` when set: a
transaction pooler cannot LISTEN, and then the stream answers 204 and the page stays static) and
lives at most STREAM_SECONDS: a server shutting down waits for open responses, so a stream must
end on its own; the browser's EventSource reconnects after ``retry``. At most MAX_STREAMS are
open at once (each holds a thread and a session); more answer 503 and those pages stay static.
One API token holds at most MAX_STREAMS_PER_TOKEN of them (a fair share: one token, a read token
included, cannot take every stream and so leave every other person's pages static); more answer
429 saying so (design §16, §17).
"""

from __future__ import annotations

import inspect
import json
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Literal

from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from starlette.responses import Response, StreamingResponse

from kb.adapters.http.auth import request_token
from kb.adapters.http.ui.access import page_gate
from kb.db import database
from kb.db.sql import queries

if TYPE_CHECKING:
    from kb.adapters.http.server import Service

STREAM_SECONDS = 20.0
WAIT_SECONDS = 2.0
"""How long one wait for notifications lasts; a keep-alive comment follows each quiet wait."""
MAX_STREAMS = 16
MAX_STREAMS_PER_TOKEN = 4
"""A token's share of MAX_STREAMS (a person with a few tabs of kb's pages open)."""
RECONNECT_MS = 1000


class StreamSlots:
    """The open event streams, counted in all and per API token. Thread-safe."""

    def __init__(self, total: int = MAX_STREAMS, per_token: int = MAX_STREAMS_PER_TOKEN) -> None:
        self.total = total
        self.per_token = per_token
        self._lock = threading.Lock()
        self._open = 0
        self._by_token: dict[int, int] = {}

    def take(self, token_id: int | None) -> Literal["token", "server"] | None:
        """Take a slot for a stream of ``token_id`` (None: nobody checked, --insecure-no-auth,
        where only the total counts). Returns None when taken, else who is full: "token" (it
        holds ``per_token`` streams) or "server" (``total`` are open)."""
        with self._lock:
            if token_id is not None and self._by_token.get(token_id, 0) >= self.per_token:
                return "token"
            if self._open >= self.total:
                return "server"
            self._open += 1
            if token_id is not None:
                self._by_token[token_id] = self._by_token.get(token_id, 0) + 1
            return None

    def give_back(self, token_id: int | None) -> None:
        """Release the slot a stream of ``token_id`` took."""
        with self._lock:
            self._open -= 1
            if token_id is not None:
                left = self._by_token.pop(token_id) - 1
                if left:
                    self._by_token[token_id] = left


def _refusal(full: Literal["token", "server"], slots: StreamSlots) -> Response:
    """The answer to a stream over the limit: kb's error form, what is full and what to do."""
    from starlette.responses import JSONResponse

    after = f"retry in {STREAM_SECONDS:g} s, when a stream ends on its own"
    if full == "token":
        message = (
            f"this API token already has {slots.per_token} open event streams (the live updates of open pages), "
            f"its share of the {slots.total} this server keeps: close a tab of kb's pages, or {after}. The page "
            "works without it; it shows changes when reloaded"
        )
        status = 429
    else:
        message = (
            f"this server has its {slots.total} event streams (the live updates of open pages) open: {after}. "
            "The page works without it; it shows changes when reloaded"
        )
        status = 503
    body = {"error": "TooManyStreams", "message": message, "cli_message": message}
    return JSONResponse(body, status_code=status, headers={"Retry-After": f"{STREAM_SECONDS:.0f}"})


def event_router(service: Service, route_class: type[APIRoute] = APIRoute) -> APIRouter:
    """The server-sent event stream of a workspace's changes."""
    router = APIRouter(route_class=route_class, dependencies=[Depends(page_gate)])
    slots = StreamSlots()

    @router.get("/workspaces/{workspace_id}/events")
    def events(request: Request, workspace_id: int) -> Response:
        """``text/event-stream``: an event ``change`` (data: the kb_events payload) for each change
        of the workspace, comments to keep the connection alive; ends after STREAM_SECONDS."""
        kb = service.kb()
        url = database.session_database_url(kb.settings, kb.database_url)
        if database.is_transaction_pooled(url):
            return Response(status_code=204)  # EventSource stops: no live updates behind a pooler
        token = request_token(request)
        token_id = None if token is None else token.id
        if full := slots.take(token_id):
            return _refusal(full, slots)
        try:
            conn = database.connect(url, autocommit=True)
            conn.execute(queries["listen_events"])
        except BaseException:
            slots.give_back(token_id)
            raise

        def finish() -> None:  # the session closed and the slot given back, once
            conn.close()
            slots.give_back(token_id)

        return _EventStream(_relay(conn, workspace_id), finish)

    return router


class _Once:
    """A callable that calls ``fn`` the first time only (from any thread)."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._lock = threading.Lock()
        self._fn: Callable[[], None] | None = fn

    def __call__(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()


def _guarded(relay: Iterator[str], finish: _Once) -> Generator[str, None, None]:
    """``relay``'s text, then ``finish`` however it ends (it holds no reference to its response:
    a cycle would leave it to the cyclic collector, and the slot held until that runs)."""
    try:
        yield from relay
    finally:
        finish()


class _EventStream(StreamingResponse):
    """The stream's response: ``finish`` (close its session, give its slot back) runs once however
    the response ends — when ``relay`` ends or is closed, and when the client hung up before it
    began: Starlette then never starts ``relay``, whose own ``finally`` never runs, and the slot
    and session were held until the server stopped."""

    def __init__(self, relay: Iterator[str], finish: Callable[[], None]) -> None:
        self._finish = _Once(finish)
        self.body_generator = _guarded(relay, self._finish)
        super().__init__(
            self.body_generator,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # never started (the client left first): nothing will start it now — a next() in a
            # worker thread is awaited to its end before the response's task ends
            if inspect.getgeneratorstate(self.body_generator) == inspect.GEN_CREATED:
                self.body_generator.close()
                self._finish()


def _relay(conn, workspace_id: int) -> Iterator[str]:
    """The stream's text: the workspace's notifications as ``change`` events until the deadline
    (the caller closes ``conn``: ``_EventStream``)."""
    deadline = time.monotonic() + STREAM_SECONDS
    yield f"retry: {RECONNECT_MS}\n\n"
    while time.monotonic() < deadline:
        for note in conn.notifies(timeout=WAIT_SECONDS):
            try:
                event = json.loads(note.payload)
            except ValueError:
                continue
            if event.get("workspace_id") == workspace_id:
                yield f"event: change\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"
        yield ": waiting\n\n"
