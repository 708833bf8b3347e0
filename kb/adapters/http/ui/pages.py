"""The reading pages of ``/ui`` (design §17): workspaces, one workspace, folders, documents with
true line numbers and per-line last change, revisions with their diffs, search, and a citation at
its lines and where those lines are now.

Every page is let in by :func:`kb.adapters.http.ui.access.page_gate` (the read scope on its
workspace) before it runs; then it calls
the facade (``Service.kb()``: this thread's KnowledgeBase) and renders a template. Pages are plain
HTML: links and forms work without JavaScript; ``static/ui.js`` only adds the live refresh.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Query, Request
from fastapi.routing import APIRoute
from starlette.responses import HTMLResponse

from kb.adapters.http.auth import owned_by_token, request_token
from kb.adapters.http.ui.access import ANY_WORKSPACE, authorize, page_gate
from kb.adapters.http.ui.diffs import revision_diffs
from kb.adapters.http.ui.rendering import render
from kb.errors import InvalidChat, InvalidInput, UnknownChat, UnknownHandle
from kb.lines import line_span
from kb.store.knowledge_store import trailer_turn

if TYPE_CHECKING:
    from kb.adapters.http.server import Service

LINES = re.compile(r"^(\d+)(?:-(\d+))?$")
HISTORY_SHOWN = 15
SEARCH_RESULTS = 10


def parse_lines(lines: str | None) -> tuple[int, int] | None:
    """``"3-5"`` → (3, 5), ``"7"`` → (7, 7), None → None. Raises InvalidInput otherwise."""
    if not lines:
        return None
    match = LINES.match(lines)
    if not match:
        raise InvalidInput(f"lines must look like 3-5 or 7, not {lines!r}")
    start = int(match.group(1))
    return start, int(match.group(2) or start)


def _span_is(start: int, end: int) -> str:
    """``line 7 is`` or ``lines 3–5 are``: a one-line span is one line."""
    return line_span(start, end, "–") + (" is" if start == end else " are")


def highlight_within(highlight: tuple[int, int] | None, total: int) -> tuple[tuple[int, int] | None, str | None]:
    """The lines ``highlight`` asks for, cut to a document of ``total`` lines, and what the page
    says when it had to cut: ``((start, end) or None, note or None)``. A range past the last line
    marks nothing and says so; one running past it is cut at the last line (never a list of two
    billion line numbers for ``?lines=1-2000000000``); one from line 0 starts at line 1, and says so."""
    if highlight is None:
        return None, None
    start, end = highlight
    if end == 0:
        return None, "Line 0 names no line: lines are numbered from 1."
    if start == 0:
        shown, note = highlight_within((1, end), total)
        return shown, "Lines are numbered from 1" + (f"; {note}" if note else f": lines 1–{min(end, total)} are shown.")
    if start > end:
        return None, f"Lines {start}–{end} name no line: the first must not come after the last."
    if start > total:
        return None, f"{_span_is(start, end).capitalize()} past the end: the document has {total} lines here."
    if end > total:
        return (start, total), f"The document ends at line {total}: {_span_is(start, total)} shown."
    return (start, end), None


def turn_of(message: str) -> str | None:
    """The turn id a revision's message names in its ``Turn:`` trailer (design §5), or None: its
    last line only (``trailer_turn``). Any ``Turn:`` line was taken, so a turn's commit whose
    message carried ``Turn: <another token's turn>`` above kb's trailer showed that turn as the
    one that recorded it."""
    return trailer_turn(message)


def excerpt_ranges(lines: list[tuple[int | None, str]]) -> list[tuple[int, int]]:
    """The contiguous numbered ranges of an envelope's lines: [(first, last), …]."""
    ranges: list[list[int]] = []
    for number, _ in lines:
        if number is None:
            continue
        if ranges and number == ranges[-1][1] + 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return [(a, b) for a, b in ranges]


def page_router(service: Service, route_class: type[APIRoute] = APIRoute) -> APIRouter:
    """The GET pages under ``/ui`` (the router's route class renders errors as pages)."""
    router = APIRouter(route_class=route_class, dependencies=[Depends(page_gate)])

    @router.get("", response_class=HTMLResponse)
    def workspaces(request: Request) -> HTMLResponse:
        """Every workspace: documents, head, index state."""
        visitor = authorize(request, ANY_WORKSPACE, "read")
        shown = [w for w in service.kb().list_workspaces() if visitor.reaches(w.id)]
        return render(request, "workspaces.html", title="Workspaces", workspaces=shown)

    @router.get("/workspaces/{workspace_id}", response_class=HTMLResponse)
    def workspace(
        request: Request, workspace_id: int, reverted: str = "", nothing_to_revert: str = "", retried: str = ""
    ) -> HTMLResponse:
        """Head, index lag, problems, the last revisions; refreshed live when one lands."""
        kb = service.kb()
        state = kb.status(workspace_id)["workspace"]
        return render(
            request,
            "workspace.html",
            title=f"Workspace {workspace_id}",
            ws=workspace_id,
            state=state,
            freshness=kb.index_freshness(workspace_id),
            revisions=kb.history(workspace_id, None, HISTORY_SHOWN),
            turn_of=turn_of,
            reverted=reverted,
            nothing_to_revert=nothing_to_revert,
            retried=retried,
        )

    @router.get("/workspaces/{workspace_id}/folders/{path:path}", response_class=HTMLResponse)
    def folder(request: Request, workspace_id: int, path: str) -> HTMLResponse:
        """A folder's entries at HEAD, folders first."""
        virtual = "/documents" + ("/" + path.strip("/") if path.strip("/") else "")
        entries = service.kb().ls(workspace_id, virtual)
        crumbs = _crumbs(virtual)
        return render(
            request, "folder.html", title=virtual, ws=workspace_id, folder=virtual, entries=entries, crumbs=crumbs
        )

    @router.get("/workspaces/{workspace_id}/documents/{path:path}", response_class=HTMLResponse)
    def document(
        request: Request,
        workspace_id: int,
        path: str,
        revision: str | None = None,
        lines: str | None = Query(None, description="Lines to highlight, e.g. 3-5"),
    ) -> HTMLResponse:
        """A document with true line numbers, its title, type and history; at HEAD each line
        names the revision that last changed it."""
        kb = service.kb()
        virtual = "/documents/" + path.lstrip("/")
        envelope = kb.read_document(workspace_id, virtual, revision)
        at_head = revision is None or envelope.revision == kb.head(workspace_id)
        blame = kb.blame(workspace_id, virtual) if at_head else None
        if blame is not None and blame.revision != envelope.revision:  # a revision landed meanwhile
            if revision is None:  # HEAD asked for: show the text the blame is of
                envelope = kb.read_document(workspace_id, virtual, blame.revision)
            else:  # that revision asked for: it is shown, without another text's blame
                blame, at_head = None, False
        highlight, highlight_note = highlight_within(parse_lines(lines), len(envelope.lines))
        return render(
            request,
            "document.html",
            title=envelope.title,
            ws=workspace_id,
            envelope=envelope,
            record=kb.document_record(workspace_id, virtual),
            history=kb.history(workspace_id, virtual, HISTORY_SHOWN),
            origins=blame.lines if blame else None,
            blame_complete=blame.complete if blame else True,
            at_head=at_head,
            highlight=highlight,
            highlight_note=highlight_note,
            crumbs=_crumbs(virtual),
        )

    @router.get("/workspaces/{workspace_id}/revisions/{revision}", response_class=HTMLResponse)
    def revision_page(request: Request, workspace_id: int, revision: str) -> HTMLResponse:
        """Author, committer, message, turn, and the diff of every file (renames as renames)."""
        kb = service.kb()
        found = kb.revision(workspace_id, revision)
        return render(
            request,
            "revision.html",
            title=f"Revision {found.id[:12]}",
            ws=workspace_id,
            revision=found,
            turn=turn_of(found.message),
            diffs=revision_diffs(kb, workspace_id, found),
        )

    @router.get("/workspaces/{workspace_id}/search", response_class=HTMLResponse)
    def search(request: Request, workspace_id: int, q: str = "") -> HTMLResponse:
        """Search: excerpts with true line numbers, each linking to the document at its lines."""
        kb = service.kb()
        hits = kb.search(workspace_id, q, SEARCH_RESULTS) if q.strip() else []
        return render(
            request,
            "search.html",
            title=f"Search: {q}" if q else "Search",
            ws=workspace_id,
            q=q,
            hits=[(hit, excerpt_ranges(hit.lines)) for hit in hits],
            freshness=kb.index_freshness(workspace_id) if q.strip() else None,
        )

    @router.get("/workspaces/{workspace_id}/citation", response_class=HTMLResponse)
    def citation(request: Request, workspace_id: int, chat: str = "", c: str = "") -> HTMLResponse:
        """A chat's citation (``[3:L341-L342]``) at its revision with the lines highlighted, and
        where those lines are at HEAD. The chat is the visitor's token's own, as on the API: a
        chat id is private to the token that names it (design §16)."""
        resolution = envelope = None
        if chat and c:
            kb = service.kb()
            try:
                resolution = kb.conversation(workspace_id, owned_by_token(request, chat, InvalidChat)).resolve(
                    c, follow=True
                )
            except (UnknownChat, UnknownHandle) as exc:
                if request_token(request) is None:
                    raise
                # the message's `kb cite list` looks at the CLI's chats, never this token's: it
                # sent the visitor to a chat the page cannot open (design §16)
                raise type(exc)(
                    f"the chat {chat!r} of the token you signed in with has no handle for {c}: a chat is "
                    "private to the token that made it, so a chat made with the kb command or another "
                    "token does not open here. Open a citation of a chat this token made (its searches "
                    f"and reads through the API with chat={chat}); nothing was changed"
                ) from exc
            envelope = kb.read_document(workspace_id, resolution.handle.path, resolution.handle.revision)
        cited = {n for n, _ in resolution.lines} if resolution is not None and resolution.level == "lines" else set()
        return render(
            request,
            "citation.html",
            title=f"Citation {c}" if c else "Citation",
            ws=workspace_id,
            chat=chat,
            c=c,
            resolution=resolution,
            envelope=envelope,
            cited=cited,
        )

    return router


def _crumbs(virtual: str) -> list[tuple[str, str]]:
    """``(name, folder path)`` for each folder above and including a path's parent."""
    parts = virtual.strip("/").split("/")
    return [(parts[i], "/" + "/".join(parts[: i + 1])) for i in range(len(parts) - 1)]
