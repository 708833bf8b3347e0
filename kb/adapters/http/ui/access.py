"""Who may see and do what on the pages (design §16, §17): the one access decision of ``/ui``.

Every page calls :func:`authorize` before it reads or writes anything; nothing else in the UI
decides access. Today ``kb serve`` has no tokens (design §16, "Not built yet" there): every visitor
may read and write, and the revision a page records names the server's OS user as author. When
tokens land, this function is the one place that reads the visitor's token (the login page's
cookie) and checks its scope for the workspace.

Writes (revert, retry, span-fill pause/resume) are POSTed forms guarded against cross-site
requests twice: a double-submit token (the ``kb_csrf`` cookie, HttpOnly and SameSite=Strict, must
equal the form's ``csrf`` field) and, when the browser sends one, an ``Origin`` naming this server.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response

from kb import errors

CSRF_COOKIE = "kb_csrf"
"""The cookie holding the visitor's anti-forgery token (set by the first page it loads)."""

SCOPES = ("read", "write", "admin")


class PageRefused(errors.InvalidInput):
    """The visitor may not do this (``status`` 403), or the form is not one of our pages'
    (a missing or wrong anti-forgery token: reload the page and submit again)."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Visitor:
    """Who is asking: ``author`` is what a revision they make records (None: the server's OS
    user, kb's default author); ``scopes`` what they may do."""

    author: str | None
    scopes: tuple[str, ...]


def authorize(request: Request, workspace_id: int | None, scope: str, form: dict[str, str] | None = None) -> Visitor:
    """Decide whether this request may use ``scope`` ("read", "write" or "admin") on workspace
    ``workspace_id`` (None: every workspace, as the operator's view); returns the Visitor.

    A write (``scope`` other than "read") must come with the POSTed ``form`` holding the
    ``csrf`` field equal to the visitor's ``kb_csrf`` cookie, and an ``Origin`` header, when
    present, naming this server. Raises PageRefused (403) otherwise."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    visitor = Visitor(author=None, scopes=SCOPES)  # no tokens yet (design §16): everyone may do everything
    if scope not in visitor.scopes:
        raise PageRefused(f"this needs the {scope} scope on workspace {workspace_id}")
    if scope != "read":
        _check_same_origin(request)
        expected = request.cookies.get(CSRF_COOKIE, "")
        given = (form or {}).get("csrf", "")
        if not expected or not hmac.compare_digest(expected, given):
            raise PageRefused(
                "this form did not come from this server's page (its anti-forgery token is missing or "
                "stale); reload the page and submit again"
            )
    return visitor


def _check_same_origin(request: Request) -> None:
    origin = request.headers.get("origin")
    if origin is None:  # not every browser sends one on a same-origin POST; the token still checks
        return
    if urlsplit(origin).netloc != request.headers.get("host", ""):
        raise PageRefused(f"a form posted from {origin} is not this server's; use the page this server serves")


def csrf_token(request: Request) -> str:
    """The visitor's anti-forgery token: the cookie's, or a new one (set by :func:`remember_csrf`)."""
    token = request.cookies.get(CSRF_COOKIE)
    if not token:
        token = getattr(request.state, "new_csrf", None) or secrets.token_urlsafe(32)
        request.state.new_csrf = token
    return token


def remember_csrf(request: Request, response: Response) -> None:
    """Set the ``kb_csrf`` cookie on ``response`` when this request made a new token."""
    token = getattr(request.state, "new_csrf", None)
    if token:
        response.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", path="/ui")
