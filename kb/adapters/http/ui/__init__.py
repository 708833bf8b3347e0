"""Pages for people under ``/ui`` (design §17), served by ``kb serve``: workspaces, folders,
documents with true line numbers and per-line last change, revisions with diffs and revert,
search, citations at their lines and where they are now, and the operator's view.

Server-rendered HTML (Jinja2 templates in ``templates/``), readable without JavaScript; the
stylesheet and the one small script are in ``static/`` and every page's Content-Security-Policy
lets it load nothing from outside the server. ``mount_ui(app, service, status_for)`` adds it all
to ``kb serve``'s app. Modules: ``access`` (the one access decision and the anti-forgery token),
``login`` (the token cookie), ``rendering`` (templates, filters, headers), ``pages`` (reading
pages), ``actions`` (revert, retry, span fill, the operator's view), ``diffs`` (a revision's file
diffs), ``events`` (live updates).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import Response

from kb import errors
from kb.adapters.http.auth import as_the_token_names_it, named_ids, request_token
from kb.adapters.http.json_bodies import JsonRoute
from kb.adapters.http.ui.access import PageRefused
from kb.adapters.http.ui.actions import action_router
from kb.adapters.http.ui.events import event_router
from kb.adapters.http.ui.login import login_router
from kb.adapters.http.ui.pages import page_router
from kb.adapters.http.ui.rendering import STATIC, render

if TYPE_CHECKING:
    from kb.adapters.http.server import Service


def _page_route(status_for: Callable[[errors.KbError], int]) -> type[APIRoute]:
    """A route class rendering a KbError as an error page (with the status the JSON API gives it)
    instead of the API's JSON body."""

    class PageRoute(JsonRoute):  # a page's JSON body (none yet) is read strictly as the API's
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def handle(request: Request) -> Response:
                try:
                    return await handler(request)
                except errors.KbError as exc:
                    status = exc.status if isinstance(exc, PageRefused) else status_for(exc)
                    token = request_token(request)  # ids as the visitor's token names them (design §16)
                    message = request.app.state.access.shown(
                        as_the_token_names_it(str(exc), token, named_ids(request)), token
                    )
                    return render(
                        request, "error.html", status, title="Not possible", kind=type(exc).__name__, message=message
                    )

            return handle

    return PageRoute


def mount_ui(app: FastAPI, service: Service, status_for: Callable[[errors.KbError], int]) -> None:
    """Serve the pages under ``/ui`` and their assets under ``/ui/static`` on ``app``;
    ``status_for`` maps a KbError to its HTTP status (the server's table)."""
    route_class = _page_route(status_for)
    for factory in (page_router, action_router, event_router):
        app.include_router(factory(service, route_class), prefix="/ui", include_in_schema=False)
    app.include_router(login_router(route_class), prefix="/ui", include_in_schema=False)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
