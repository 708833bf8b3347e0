"""Rendering the pages (design §17): the Jinja2 environment over the templates shipped in this
package, the filters the templates share, and the HTML response every page returns — with a
Content-Security-Policy that lets a page load nothing from outside this server."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from kb.adapters.http.ui.access import csrf_token, may, remember_csrf

PACKAGE = Path(__file__).resolve().parent
TEMPLATES = PACKAGE / "templates"
STATIC = PACKAGE / "static"

SECURITY_HEADERS = {
    # Every script, style, image, font, frame and fetch from this server only (design §17).
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def document_url(workspace_id: int, path: str, **query: object) -> str:
    """The document page of virtual ``path`` (``/documents/a/b.md``); ``lines="3-5"`` highlights
    and scrolls to those lines, ``revision`` shows it at that revision."""
    url = f"/ui/workspaces/{workspace_id}/documents/{quote(path.removeprefix('/documents/'), safe='/')}"
    args = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items() if v is not None)
    anchor = ""
    lines = query.get("lines")
    if lines:
        anchor = f"#L{str(lines).split('-')[0]}"
    return url + (f"?{args}" if args else "") + anchor


def folder_url(workspace_id: int, path: str) -> str:
    """The folder page of virtual ``path`` (``/documents`` is the root)."""
    rel = path.removeprefix("/documents").strip("/")
    return f"/ui/workspaces/{workspace_id}/folders/{quote(rel, safe='/')}"


def revision_url(workspace_id: int, revision: str) -> str:
    """The revision page."""
    return f"/ui/workspaces/{workspace_id}/revisions/{revision}"


def short(revision: str | None) -> str:
    """A revision id cut to 12 characters ('—' for none)."""
    return revision[:12] if revision else "—"


def when(moment: datetime | None) -> str:
    """A time as ``2026-12-02 06:00 UTC``."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def duration(seconds: float | None) -> str:
    """Seconds as ``4 s``, ``3 min``, ``2 h``, ``5 d`` ('—' for None)."""
    if seconds is None:
        return "—"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def first_line(message: str) -> str:
    """A commit message's subject."""
    return message.split("\n", 1)[0]


ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENVIRONMENT.filters.update(short=short, when=when, duration=duration, first_line=first_line)
ENVIRONMENT.globals.update(document_url=document_url, folder_url=folder_url, revision_url=revision_url)


def render(request: Request, template: str, status_code: int = 200, **context: object) -> HTMLResponse:
    """The page ``template`` with ``context`` (and ``csrf``, the visitor's anti-forgery token,
    which the response sets as a cookie when new) as an HTML response with the security headers."""
    html = ENVIRONMENT.get_template(template).render(
        csrf=csrf_token(request),
        path=request.url.path,
        may=lambda workspace_id, scope: may(request, workspace_id, scope),  # hide buttons a 403 would answer
        **context,
    )
    response = HTMLResponse(html, status_code=status_code, headers=SECURITY_HEADERS)
    remember_csrf(request, response)
    return response
