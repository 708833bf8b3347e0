"""How ``kb serve`` reads a JSON request body (design §13, §16): strictly, so that every body the
parser cannot take is a 422 ``InvalidInput`` naming the cause.

FastAPI reads a JSON body with ``json.loads``: a ``json.JSONDecodeError`` becomes a 422
(``json_invalid``, at an offset), but any other exception a bare 400 "There was an error parsing
the body" that names no cause — and Python's parser raises others: ``UnicodeDecodeError`` for
bytes that are not UTF-8, ``RecursionError`` for arrays or objects nested thousands deep,
``ValueError`` for an integer literal past Python's int-string conversion limit. It also takes
``NaN``, ``Infinity`` and ``-Infinity``, which JSON does not have, and turns ``1e400`` into an
infinity: a body holding one was either used as is or refused with a 422 that could not be
rendered (JSON cannot carry the value back), a 500.

:class:`JsonRoute` is the route class of every API router: its requests parse their body with
:func:`parse_body`, which raises ``json.JSONDecodeError`` (the decoder's own kind, with a reason
and an offset) for each of these, so FastAPI answers them as it answers any body that is not
JSON. ``create_app`` refuses a route taking a body that is not a ``JsonRoute``
(:func:`routes_reading_bodies_leniently`). :class:`SafeJSONResponse` renders an error quoting
what a body held.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)', re.DOTALL)
"""A JSON string (skipped) or a number or non-JSON constant literal outside strings (group 1)."""


class _Refused(Exception):
    """A literal ``parse_body`` refuses (raised from the parser's hooks, which know no offset)."""

    def __init__(self, literal: str, reason: str) -> None:
        super().__init__(reason)
        self.literal = literal
        self.reason = reason


def _constant(literal: str) -> Any:
    raise _Refused(literal, f"{literal} is not JSON (JSON numbers are finite): send a number or null")


def _float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _Refused(literal, f"the number {literal[:20]} is out of range of a 64-bit float")
    return value


def _int(literal: str) -> int:
    most = sys.get_int_max_str_digits()
    digits = len(literal.lstrip("-"))
    if most and digits > most:
        raise _Refused(literal, f"an integer literal has {digits} digits, more than the {most} kb serve reads")
    return int(literal)


def _offset(text: str, literal: str) -> int:
    """Where ``literal`` first stands outside a string in ``text`` (0 if nowhere)."""
    for token in _TOKEN.finditer(text):
        if token.group(1) == literal:
            return token.start(1)
    return 0


def parse_body(body: bytes) -> Any:
    """The JSON value of a request body, read strictly: UTF-8 (or the UTF-16/32 JSON allows, told
    by its first bytes), finite numbers, integers within Python's conversion limit, nesting the
    parser can follow. Raises ``json.JSONDecodeError`` — whose ``msg`` says what is wrong and
    ``pos`` where — for a body that is not JSON or breaks one of these (design §13)."""
    encoding = json.detect_encoding(body)
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        shown = body.decode(encoding, errors="replace")
        at = len(body[: exc.start].decode(encoding, errors="replace"))
        name = encoding.upper().removesuffix("-SIG")
        raise json.JSONDecodeError(
            f"the body is not {name}: byte {exc.start} (0x{body[exc.start]:02x}) cannot start or continue a character",
            shown,
            at,
        ) from None
    try:
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except _Refused as exc:
        raise json.JSONDecodeError(exc.reason, text, _offset(text, exc.literal)) from None
    except RecursionError:
        raise json.JSONDecodeError(
            "arrays or objects nested too deep for the parser (kb's bodies nest a level or two)", text, 0
        ) from None


class StrictJsonRequest(Request):
    """A request whose ``json()`` is :func:`parse_body`."""

    async def json(self) -> Any:
        """The body's JSON value (cached); raises ``json.JSONDecodeError`` (``parse_body``)."""
        if not hasattr(self, "_json"):
            self._json = parse_body(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """A FastAPI route whose JSON body is read by :func:`parse_body` (see the module docstring)."""

    def get_route_handler(self):
        """FastAPI's handler, given the request as a :class:`StrictJsonRequest` (same scope and
        stream: nothing is read twice)."""
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(StrictJsonRequest(request.scope, request.receive))

        return handle


def routes_reading_bodies_leniently(app) -> list[str]:
    """The API routes of ``app`` taking a request body that are not :class:`JsonRoute` (their body
    would be read by ``json.loads`` as is): ``create_app`` refuses to build an app with one."""
    from kb.adapters.http.routes import api_routes

    return [
        f"{','.join(sorted(methods))} {path}"
        for path, methods, route in api_routes(app)
        if route.body_field is not None and not isinstance(route, JsonRoute)
    ]


class SafeJSONResponse(JSONResponse):
    """kb serve's JSON error response: a ``JSONResponse`` whose rendering cannot fail on the text
    it quotes. A body's ``"\\ud800"`` escape gives Python a lone surrogate, which UTF-8 cannot
    carry: a 422 quoting that input (or an error message quoting it) failed to encode, a 500. Such
    a response is written with ``\\u`` escapes instead (ASCII JSON, the same value)."""

    def render(self, content: Any) -> bytes:
        """``content`` as UTF-8 JSON, or as ASCII JSON when it holds a lone surrogate."""
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
