"""Live updates for the pages (design §17): ``GET /ui/workspaces/{ws}/events`` is a stream of
server-sent events relaying the workspace's ``kb_events`` notifications (design §6), so an open
workspace page reloads when a revision lands. Pages work without it (plain HTML, no JavaScript).

Each stream holds one Postgres session that LISTENs (``KB_DIRECT_DATABASE_URL`` when set: a
transaction pooler cannot LISTEN, and then the stream answers 204 and the page stays static) and
lives at most STREAM_SECONDS: a server shutting down waits for open responses, so a stream must
end on its own; the browser's EventSource reconnects after ``retry``. At most MAX_STREAMS are
open at once (each holds a thread and a session); more answer 503 and those pages stay static.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from starlette.responses import Response, StreamingResponse

from kb.adapters.http.ui.access import page_gate
from kb.db import database
from kb.db.sql import queries

if TYPE_CHECKING:
    from kb.adapters.http.server import Service

STREAM_SECONDS = 20.0
WAIT_SECONDS = 2.0
"""How long one wait for notifications lasts; a keep-alive comment follows each quiet wait."""
MAX_STREAMS = 16
RECONNECT_MS = 1000


def event_router(service: Service, route_class: type[APIRoute] = APIRoute) -> APIRouter:
    """The server-sent event stream of a workspace's changes."""
    router = APIRouter(route_class=route_class, dependencies=[Depends(page_gate)])
    open_streams = threading.BoundedSemaphore(MAX_STREAMS)

    @router.get("/workspaces/{workspace_id}/events")
    def events(request: Request, workspace_id: int) -> Response:
        """``text/event-stream``: an event ``change`` (data: the kb_events payload) for each change
        of the workspace, comments to keep the connection alive; ends after STREAM_SECONDS."""
        kb = service.kb()
        url = database.session_database_url(kb.settings, kb.database_url)
        if database.is_transaction_pooled(url):
            return Response(status_code=204)  # EventSource stops: no live updates behind a pooler
        if not open_streams.acquire(blocking=False):
            return Response("too many open event streams", status_code=503, headers={"Retry-After": "30"})
        try:
            conn = database.connect(url, autocommit=True)
            conn.execute(queries["listen_events"])
        except BaseException:
            open_streams.release()
            raise
        return StreamingResponse(
            _relay(conn, workspace_id, open_streams),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    return router


def _relay(conn, workspace_id: int, open_streams: threading.BoundedSemaphore) -> Iterator[str]:
    """The stream's text: the workspace's notifications as ``change`` events until the deadline."""
    deadline = time.monotonic() + STREAM_SECONDS
    try:
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
    finally:
        conn.close()
        open_streams.release()
