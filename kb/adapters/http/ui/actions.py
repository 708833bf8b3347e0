"""The pages that change something (design §17): reverting a revision, the operator's view with
retrying failed documents and pausing or resuming the span fill.

A change is a POSTed form (no JavaScript needed) checked by
:func:`kb.adapters.http.ui.access.authorize` for the write scope and the anti-forgery token; a
revert first shows a confirmation page (GET) whose button POSTs. Each answers with a redirect
(303, so a reload does not post again) to the page showing the outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote

from fastapi import APIRouter, Depends, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, RedirectResponse

from kb.adapters.http.ui.access import authorize, page_gate
from kb.adapters.http.ui.rendering import render
from kb.errors import InvalidInput

if TYPE_CHECKING:
    from kb.adapters.http.server import Service

MAX_FORM_BYTES = 64 * 1024


async def read_form(request: Request) -> dict[str, str]:
    """The POSTed ``application/x-www-form-urlencoded`` fields (the last of a repeated name).
    Raises InvalidInput for a body over MAX_FORM_BYTES."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise InvalidInput(f"the form is {len(body)} bytes; at most {MAX_FORM_BYTES} are taken")
    return dict(parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True))


def action_router(service: Service, route_class: type[APIRoute] = APIRoute) -> APIRouter:
    """Revert (confirm + POST), the operator's view, retry and span-fill pause/resume."""
    router = APIRouter(route_class=route_class, dependencies=[Depends(page_gate)])

    @router.get("/workspaces/{workspace_id}/revisions/{revision}/revert", response_class=HTMLResponse)
    def confirm_revert(request: Request, workspace_id: int, revision: str) -> HTMLResponse:
        """Ask before reverting: what the revision changed, and the button that records the revert."""
        found = service.kb().revision(workspace_id, revision)
        return render(request, "revert.html", title=f"Revert {found.id[:12]}?", ws=workspace_id, revision=found)

    @router.post("/workspaces/{workspace_id}/revisions/{revision}/revert")
    async def revert(request: Request, workspace_id: int, revision: str) -> RedirectResponse:
        """Record a new revision undoing ``revision`` (design §3); back to the workspace, the
        new revision at the top of its list."""
        form = await read_form(request)
        visitor = authorize(request, workspace_id, "write", form)
        made = await run_in_threadpool(
            service.kb().revert,
            workspace_id,
            revision,
            visitor.committer,  # the token's NAME <kb-token-ID> (None: kb's default author)
            visitor.committer,
            form.get("message") or None,
        )
        note = f"reverted={made.id}" if made is not None else "nothing_to_revert=1"
        return RedirectResponse(f"/ui/workspaces/{workspace_id}?{note}", status_code=303)

    @router.get("/operator", response_class=HTMLResponse)
    def operator(request: Request, retried: str = "", span_fill: str = "") -> HTMLResponse:
        """Queues per kind, failed documents with their reasons, span-fill progress."""
        authorize(request, None, "read")  # every workspace's queues and documents
        kb = service.kb()
        view = kb.operator_view()
        return render(
            request,
            "operator.html",
            title="Operator",
            queues=view["queues"],
            failed=view["failed_documents"],
            span_fill=kb.span_fill().status(),
            retried=retried,
            span_fill_note=span_fill,
        )

    @router.post("/workspaces/{workspace_id}/retry")
    async def retry(request: Request, workspace_id: int) -> RedirectResponse:
        """Index the workspace's failed documents (all, or the form's ``path``) again now."""
        form = await read_form(request)
        authorize(request, workspace_id, "write", form)
        paths = [form["path"]] if form.get("path") else None
        requeued = await run_in_threadpool(service.kb().retry_documents, workspace_id, paths)
        if form.get("back") == "workspace":  # from the workspace page: a workspace token may not see the operator's
            return RedirectResponse(f"/ui/workspaces/{workspace_id}?retried={len(requeued)}", status_code=303)
        return RedirectResponse(f"/ui/operator?retried={len(requeued)}", status_code=303)

    @router.post("/span-fill")
    async def span_fill(request: Request) -> RedirectResponse:
        """Pause or resume the span fill (the form's ``action``: ``pause`` or ``resume``)."""
        form = await read_form(request)
        authorize(request, None, "admin", form)
        action = form.get("action")
        if action not in ("pause", "resume"):
            raise InvalidInput(f"action must be pause or resume, not {action!r}")
        fill = service.kb().span_fill()
        await run_in_threadpool(fill.pause if action == "pause" else fill.resume)
        return RedirectResponse(f"/ui/operator?span_fill={quote(action)}", status_code=303)

    return router
