"""What ``kb serve`` refuses before any route runs (design §14, §16): request bodies larger than
``KB_MAX_REQUEST_BYTES`` (**413**, from ``Content-Length`` before reading, or as soon as a chunked
body passes the limit) and a path or query string whose percent-escapes are not UTF-8 (**400**:
decoded leniently, ``%FF`` would become U+FFFD and name another file than the client meant), or
whose path holds a line break (**400**: a route's ``{path:path}`` does not match one, so a
document path or key with ``%0A`` was a bare 404 "Not Found" that named no route problem; no kb
path, turn id, chat id or key can hold one). Nothing is written for a refused request: no route
has run.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from kb import errors
from kb.adapters.http.auth import error_response


def _line_break(raw: bytes) -> bool:
    """True when ``raw`` (a request's path) holds a line break once its %-escapes are decoded."""
    return b"\n" in unquote_to_bytes(raw)


def _not_utf8(raw: bytes) -> bool:
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


class RequestLimits:
    """ASGI middleware: 413 for a body over ``max_bytes``, 400 for a path or query that is not
    UTF-8 and for a path holding a line break."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogateescape")
        for part, raw in (("path", raw_path), ("query string", scope.get("query_string", b""))):
            if _not_utf8(raw):
                exc = errors.InvalidInput(f"the request's {part} is not UTF-8 once its %-escapes are decoded")
                await error_response(400, exc)(scope, receive, send)
                return
        if _line_break(raw_path):
            exc = errors.InvalidInput(
                "the request's path holds a line break (%0A); no document path, turn or chat id or "
                "idempotency key can hold one: remove it"
            )
            await error_response(400, exc)(scope, receive, send)
            return
        too_large = errors.InvalidInput(
            f"the request body is larger than {self.max_bytes} bytes (KB_MAX_REQUEST_BYTES); send less"
        )
        for key, value in scope.get("headers", []):
            if key.lower() == b"content-length":
                if not value.strip().isdigit():
                    exc = errors.InvalidInput("the Content-Length header is not a number")
                    await error_response(400, exc)(scope, receive, send)
                    return
                if int(value) > self.max_bytes:
                    await error_response(413, too_large, {"Connection": "close"})(scope, receive, send)
                    return
        received = 0
        responded = False  # the app's response started, or ours (413) was sent
        refused = False

        async def limited_receive():
            nonlocal received, refused, responded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    refused = True
                    if not responded:
                        responded = True
                        await error_response(413, too_large, {"Connection": "close"})(scope, receive, send)
                    return {"type": "http.disconnect"}  # the app stops reading; nothing was handled
            return message

        async def guarded_send(message):
            nonlocal responded
            if refused:
                return  # the 413 went out instead
            if message["type"] == "http.response.start":
                responded = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)
