"""Logging in to the pages (design §16, §17): ``/ui/login`` takes an API token (``kb token
create``) and keeps it in the ``kb_token`` cookie — HttpOnly (no script reads it), SameSite=Strict
(no other site's page sends it), Secure over HTTPS — which ``kb.adapters.http.auth`` takes as the
token of the pages' requests; ``/ui/logout`` forgets it. The login page is the one page answered
without a token; the token is verified before the cookie is set.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse, Response

from kb import errors
from kb.adapters.http.auth import TOKEN_COOKIE
from kb.adapters.http.ui.access import check_form, page_gate
from kb.adapters.http.ui.actions import read_form
from kb.adapters.http.ui.rendering import render


def _next_page(raw: str | None) -> str:
    """Where to go after logging in: a path under /ui on this server, else /ui."""
    if raw and raw.startswith("/ui") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return "/ui"


def login_router(route_class: type[APIRoute] = APIRoute) -> APIRouter:
    """``GET/POST /ui/login`` (no token needed) and ``POST /ui/logout``."""
    router = APIRouter(route_class=route_class)

    @router.get("/login", response_class=HTMLResponse)
    def login_form(request: Request, next: str = "/ui") -> HTMLResponse:
        """The form asking for a token."""
        insecure = request.app.state.access.insecure
        return render(request, "login.html", title="Log in", next=_next_page(next), insecure=insecure, problem=None)

    @router.post("/login", response_model=None)
    async def login(request: Request) -> Response:
        """Check the token; set the cookie and go on, or show the form again saying why."""
        form = await read_form(request)
        check_form(request, form)
        secret = form.get("token", "").strip()
        try:
            await run_in_threadpool(request.app.state.access.authenticate, f"Bearer {secret}")
        except errors.TokenRefused as exc:
            return render(
                request,
                "login.html",
                401,
                title="Log in",
                next=_next_page(form.get("next")),
                insecure=False,
                problem=str(exc),
            )
        response = RedirectResponse(_next_page(form.get("next")), status_code=303)
        response.set_cookie(
            TOKEN_COOKIE, secret, httponly=True, samesite="strict", secure=request.url.scheme == "https", path="/"
        )
        return response

    @router.post("/logout", dependencies=[Depends(page_gate)])
    async def logout(request: Request) -> RedirectResponse:
        """Forget the token cookie."""
        check_form(request, await read_form(request))
        response = RedirectResponse("/ui/login", status_code=303)
        response.delete_cookie(TOKEN_COOKIE, path="/")
        return response

    return router
