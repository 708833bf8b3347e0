"""Who may see and do what on the pages (design §16, §17): the one access decision of ``/ui``.

:func:`authorize` is the only function that decides: every page route runs it through the
routers' dependency (:func:`page_gate`, read scope on the path's workspace) and the pages that
change something call it again with the write (or admin) scope and the POSTed form. It reads the
request's API token (``kb.adapters.http.auth``: the ``Authorization`` header, or the ``kb_token``
cookie the login page sets — HttpOnly, SameSite=Strict) and checks it as the JSON API does: a
workspace the token does not name is 404, too small a scope 403. Under ``kb serve
--insecure-no-auth`` everyone may do everything and revisions name kb's default author.

Writes (revert, retry, span-fill pause/resume) are POSTed forms guarded against cross-site
requests twice: a double-submit token (the ``kb_csrf`` cookie, HttpOnly and SameSite=Strict, must
equal the form's ``csrf`` field) and, when the browser sends one, an ``Origin`` naming this server.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from fastapi import Request
from starlette.responses import Response

from kb import errors
from kb.adapters.http.auth import request_token

CSRF_COOKIE = "kb_csrf"
"""The cookie holding the visitor's anti-forgery token (set by the first page it loads)."""

ANY_WORKSPACE: Literal["any"] = "any"
"""``authorize``'s workspace for a page listing workspaces: the scope on at least one is enough
(the page shows only those ``Visitor.reaches``)."""

Scope = Literal["read", "write", "admin"]


class PageRefused(errors.InvalidInput):
    """The form did not come from one of this server's pages (``status`` 403): a missing or
    stale anti-forgery token, or another site's ``Origin``; reload the page and submit again."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Visitor:
    """Who is asking: ``committer`` is what a revision they make records as author and committer
    (the token's ``NAME <kb-token-ID>``; None under --insecure-no-auth: kb's defaults);
    ``workspaces`` the ids the token names (None: every workspace)."""

    committer: str | None
    workspaces: tuple[int, ...] | None

    def reaches(self, workspace_id: int) -> bool:
        """True when the visitor may see workspace ``workspace_id``."""
        return self.workspaces is None or workspace_id in self.workspaces


def authorize(
    request: Request, workspace_id: int | None | Literal["any"], scope: Scope, form: dict[str, str] | None = None
) -> Visitor:
    """Decide whether this request may use ``scope`` on workspace ``workspace_id`` (None: every
    workspace, as the operator's view; ANY_WORKSPACE: at least one); returns the Visitor.

    A write (``scope`` other than "read") must come with the POSTed ``form`` holding the
    ``csrf`` field equal to the visitor's ``kb_csrf`` cookie, and an ``Origin`` header, when
    present, naming this server. Raises TokenRefused (401: no token), WorkspaceNotFound (404: the
    token does not name the workspace), ScopeRefused (403), PageRefused (403: the form)."""
    if scope != "read":
        check_form(request, form)
    return _decide(request, workspace_id, scope)


def may(request: Request, workspace_id: int | None, scope: Scope) -> bool:
    """True when :func:`authorize` would let this request use ``scope`` on ``workspace_id`` (the
    form aside): the pages show a button (revert, retry, span-fill pause) only to a visitor whose
    token may press it, rather than a button that answers 403."""
    try:
        _decide(request, workspace_id, scope)
    except (errors.TokenError, errors.WorkspaceNotFound):
        return False
    return True


def _decide(request: Request, workspace_id: int | None | Literal["any"], scope: Scope) -> Visitor:
    """The decision of :func:`authorize` and :func:`may`, raising as :func:`authorize` says."""
    if request.app.state.access.insecure:
        return Visitor(committer=None, workspaces=None)
    token = request_token(request)
    if token is None:  # only when the Authentication middleware was bypassed
        raise errors.TokenRefused("these pages need an API token: log in at /ui/login")
    if workspace_id == ANY_WORKSPACE:
        if not token.grants(scope):
            raise errors.ScopeRefused(f"token {token.name!r} has the {token.scope} scope; this needs {scope}")
    else:
        token.check(workspace_id, scope)
    return Visitor(committer=token.committer, workspaces=token.workspace_ids)


def page_gate(request: Request) -> Visitor:
    """The dependency every page route declares: :func:`authorize` with the read scope on the
    path's ``{workspace_id}`` (ANY_WORKSPACE for a page without one, which checks further itself)."""
    raw = request.path_params.get("workspace_id")
    try:
        workspace: int | Literal["any"] = ANY_WORKSPACE if raw is None else int(raw)
    except ValueError:
        raise errors.InvalidInput(f"a workspace id is a number, not {raw!r}") from None
    return authorize(request, workspace, "read")


page_gate.kb_scope = "read"  # type: ignore[attr-defined]  # kb serve's start-up check: every route is guarded


def check_form(request: Request, form: dict[str, str] | None) -> None:
    """Refuse a POSTed form that did not come from this server's page (see the module docstring).
    Raises PageRefused."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise PageRefused(f"a form posted from {origin} is not this server's; use the page this server serves")
    expected = request.cookies.get(CSRF_COOKIE, "")
    given = (form or {}).get("csrf", "")
    if not expected or not hmac.compare_digest(expected, given):
        raise PageRefused(
            "this form did not come from this server's page (its anti-forgery token is missing or "
            "stale); reload the page and submit again"
        )


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
