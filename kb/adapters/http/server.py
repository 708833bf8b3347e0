"""``kb serve`` (design §13): one long-lived process with an HTTP JSON API, optionally the
Procrastinate worker in the same process.

The app is FastAPI (OpenAPI at ``/openapi.json``, docs at ``/docs``) served by uvicorn:

- ``GET /health`` — liveness (the process answers); ``GET /ready`` — readiness (the database
  answers and the embedder is loaded; 503 until then or when the database is gone).
- ``GET /v1/status``, ``GET /v1/workspaces/{ws}/search?q=…&k=…``, ``GET /v1/workspaces/{ws}/documents/{path}``,
  ``GET /v1/workspaces/{ws}/log`` — the CLI's read commands (``KB_SERVER_URL`` makes the CLI use
  them, ``kb.adapters.http.client``).
- ``/v1/workspaces/{ws}/turns/{turn_id}/…`` — a turn's file operations (write, edit, read, ls,
  remove, move) and ``commit`` / ``DELETE`` (abort), design §5.
- ``/mcp/{ws}`` — the MCP endpoint (streamable HTTP, design §5; ``kb.adapters.mcp.server``).
- ``/v1/workspaces/{ws}/chats/{chat_id}/…`` — citations (design §8): search and read as a chat
  (envelopes cite its handles), ``handles``, ``normalize``, ``resolve?citation=[1:L3-L4]&follow=true``.
- ``/ui`` — the pages for people (design §17, ``kb.adapters.http.ui``); ``/docs`` — Swagger UI
  from the package's files (``kb.adapters.http.openapi_docs``).

The model is loaded once at start-up, so a search costs only the query. Requests run in
uvicorn's thread pool; each thread has its own ``KnowledgeBase`` (its own dulwich repositories)
sharing the one embedder; turns live on one KnowledgeBase behind a lock, as a turn is one
worktree. Other routers (the MCP endpoint, citations) mount on ``create_app(...)``'s app with
``app.include_router`` / ``app.mount``.

Shutdown (SIGTERM/SIGINT): uvicorn stops accepting connections and finishes in-flight requests,
then the worker stops fetching and waits for the jobs it holds to finish, and every repository
and turn is closed. The in-process worker is restarted after a failure (a database outage) for as
long as the server runs (design §7, ``kb.jobs.worker.WorkerSupervisor``); ``/ready`` says how it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from kb import errors
from kb.adapters.http import forwarding
from kb.adapters.http.auth import (
    Access,
    Authentication,
    McpGate,
    as_the_token_names_it,
    committer_of,
    named_ids,
    owned_by_token,
    request_token,
    require,
    unguarded_routes,
)
from kb.adapters.http.json_bodies import JsonRoute, SafeJSONResponse, routes_reading_bodies_leniently
from kb.adapters.http.limits import RequestLimits
from kb.adapters.http.openapi_docs import serve_docs_offline
from kb.adapters.http.ui import mount_ui
from kb.adapters.json_form import json_form
from kb.adapters.mcp.server import deployment_facts, owned_name
from kb.db import database
from kb.db.sql import queries
from kb.settings import Settings
from kb.store.write_keys import new_key

if TYPE_CHECKING:
    from kb.index.embedding import Embedder
    from kb.knowledge_base import KnowledgeBase
    from kb.turns.turn import Turn

log = logging.getLogger(__name__)

ERROR_STATUS: dict[type[errors.KbError], int] = {
    errors.TokenRefused: 401,
    errors.ScopeRefused: 403,
    errors.WorkspaceNotFound: 404,
    errors.DocumentNotFound: 404,
    errors.RevisionNotFound: 404,
    errors.MalformedRevision: 400,  # no revision id at all: the caller's input
    errors.PathExists: 409,
    errors.TurnBusy: 409,
    errors.EditMismatch: 409,
    errors.AuthorConflict: 409,
    errors.DocumentGone: 409,
    errors.IdempotencyKeyReused: 409,
    errors.HistoryDiverged: 409,
    errors.FolderNotEmpty: 409,
    errors.LockTimeout: 503,
    errors.LockUnavailable: 503,
    errors.DatabaseUnavailable: 503,
    errors.DatabaseNotReady: 503,
    errors.ArtifactReadOnly: 403,
    errors.UnknownHandle: 404,
    errors.CommitOutcomeUnknown: 503,
    errors.UnknownChat: 404,
    errors.TooManyChats: 429,  # the MCP tools answer it as a tool error; listed for any other route
    errors.TooManyTurns: 429,
    errors.NodeUnavailable: 503,
    errors.WrongNode: 421,
    errors.PermissionDenied: 503,  # the server's database role, not the caller (design §16)
    errors.WorkspaceMoving: 503,
    errors.MoveFailed: 409,
    errors.WorkspaceBusy: 409,
    errors.StorageError: 507,  # the server's disk or permissions refused: not the caller's input
}
"""HTTP status per error kind; any other KbError is the caller's input (400)."""


def refuse_taken_port(host: str, port: int) -> None:
    """Raise ConfigurationError when ``host:port`` cannot be bound (another process listens there,
    or the address is not this machine's), before kb serve announces itself: uvicorn found out only
    after the start-up banner and the lifespan, printed its own error and exited 3, and a ``curl
    /health`` then answered from the *other* process (design §13). Binds and closes a socket as
    uvicorn will (SO_REUSEADDR), so a port in TIME_WAIT is not refused."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        reason = (
            "is in use (another kb serve?)"
            if exc.errno == errno.EADDRINUSE
            else f"cannot be bound ({exc.strerror or exc})"
        )
        raise errors.ConfigurationError(
            f"kb serve cannot listen on {host}:{port}: the address {reason}; stop what listens there or "
            "pick another port with --port, e.g. kb serve --port 8766"
        ) from None


async def _release_idle_turns(service: Service) -> None:
    """For the server's life: every quarter of ``KB_TURN_IDLE_SECONDS`` (at least once a minute),
    release the API turns left idle that long (``Service.close_idle_turns``). A turn a client
    started and never committed held its worktree lock and a file descriptor for the server's life
    (design §5, §16); its worktree stays for a later call of the turn id."""
    idle = service.settings.turn_idle_seconds
    while True:
        await asyncio.sleep(min(60.0, idle / 4))
        try:
            released = await asyncio.to_thread(service.close_idle_turns)
        except Exception:  # a failure is logged; the next look tries again
            log.exception("releasing idle turns failed")
        else:
            if released:
                log.info("released %d API turn(s) idle for over %g s", released, idle)


def status_for(exc: errors.KbError) -> int:
    """The HTTP status of a KbError (the most specific class listed in ERROR_STATUS, else 400)."""
    for kind in type(exc).__mro__:
        if kind in ERROR_STATUS:
            return ERROR_STATUS[kind]
    return 400


class WriteBody(BaseModel):
    """``PUT …/turns/{turn}/files/{path}``: the new content of the file."""

    content: str = Field(description="The file's full new text (UTF-8).")


class EditBody(BaseModel):
    """``POST …/turns/{turn}/edit/{path}``: replace ``old`` by ``new`` (exactly once unless ``replace_all``)."""

    old: str
    new: str
    replace_all: bool = False


class MoveBody(BaseModel):
    """``POST …/turns/{turn}/move``: move a file or folder."""

    src: str
    dst: str
    overwrite: bool = False


class NormalizeBody(BaseModel):
    """``POST …/chats/{chat}/normalize``: an answer whose citations to rewrite canonically."""

    text: str
    drop_unknown: bool = False


class CommitBody(BaseModel):
    """``POST …/turns/{turn}/commit``: record the turn's changes as one revision."""

    message: str | None = None


class Service:
    """What the routes call: per-thread KnowledgeBase objects sharing one embedder, and the turns."""

    def __init__(self, settings: Settings, embedder: Embedder | None = None, access: Access | None = None) -> None:
        self.settings = settings
        self.access = access or Access()
        self._embedder = embedder
        self._shared: KnowledgeBase | None = None
        self._local = threading.local()
        self._opened: list[KnowledgeBase] = []
        self._opened_lock = threading.Lock()
        self._turns_kb: KnowledgeBase | None = None
        self.ready = False
        self.ready_error: str | None = None

    def start(self) -> KnowledgeBase:
        """Open kb (migrating) and load the embedder once; returns a KnowledgeBase of its own
        for the in-process worker (its jobs run in the worker's threads)."""
        first = self.new_kb()
        self.access.tokens = first.tokens()  # design §16: requests are checked from now on
        self.access.deployment = deployment_facts(first)  # kept from all but admin tokens' errors (design §16)
        self.access.node_urls = lambda: [node.url for node in first.nodes() if node.url]  # so are nodes' URLs
        self._embedder = first.embedder
        self._shared = first  # its default embedder and per-workspace models serve every thread
        self._turns_kb = self.new_kb()
        if not self.access.insecure:  # each token's open turns are bounded (design §16)
            self._turns_kb.admit_turns(self._admit_turn)
        self.ready = True
        return first

    def new_kb(self) -> KnowledgeBase:
        """A KnowledgeBase of its own (sharing the loaded embedder), closed with the service."""
        from kb.knowledge_base import KnowledgeBase

        kb = KnowledgeBase.open(self.settings, migrate=not self._opened)
        if self._shared is not None:
            kb.share_embedders(self._shared)  # one load of each model for every thread
        elif self._embedder is not None:
            kb.use_embedder(self._embedder)  # a caller's own (tests)
        with self._opened_lock:
            self._opened.append(kb)
        return kb

    def release_kb(self, kb: KnowledgeBase) -> None:
        """Close a KnowledgeBase ``new_kb`` gave (an MCP chat's, when the chat ends) and forget it."""
        with self._opened_lock:
            if kb in self._opened:
                self._opened.remove(kb)
        kb.close()

    def kb(self) -> KnowledgeBase:
        """This thread's KnowledgeBase."""
        kb = getattr(self._local, "kb", None)
        if kb is None:
            kb = self._local.kb = self.new_kb()
        return kb

    def turn(self, workspace_id: int, owned: str, author: str | None = None) -> Turn:
        """The turn ``owned`` (a token's turn id, ``owned_by_token``) of a workspace, from the
        KnowledgeBase holding the API's turns, made for ``author`` (the token; None: the OS user)
        when new; a writing request names the author of its next revision with
        ``Turn.acting_for``, under that turn's own lock (design §5). Its token's bound on open turns is checked where a
        turn becomes open (``_admit_turn``, under the lock that opens it), so the call on the turn
        runs beside every other tenant's, each turn serializing its own calls (a ``Turn`` is
        thread-safe, design §5) — one lock for every turn call made one tenant's commit waiting
        for its write lock, or a long grep, stall every other tenant's turns (design §16). Raises
        InvalidTurn, ``KnowledgeBase.turn``'s errors, TooManyTurns (here for a new turn, from the
        turn's next operation for one reused after its commit), and HTTPException 503 before the
        service has started."""
        kb = self._turns_kb
        if kb is None:
            raise HTTPException(503, "starting or stopping")
        return kb.turn(workspace_id, owned, author)

    def _admit_turn(self, key: tuple[int, str], open_keys: list[tuple[int, str]]) -> None:
        """``KnowledgeBase.admit_turns``' admission: ``refuse_another_turn`` for the token whose
        turn ``key`` is (its root turn id is ``t<token id>@…``, ``owned_name``)."""
        token = TOKEN_OF_TURN.match(key[1])
        if token is not None:
            refuse_another_turn(open_keys, int(token.group(1)), self.settings.turns_per_token)

    def close_idle_turns(self) -> int:
        """Release the API's turns idle for ``KB_TURN_IDLE_SECONDS`` (``KnowledgeBase.close_idle_turns``:
        a turn busy in a call is released once that call ends)."""
        return 0 if self._turns_kb is None else self._turns_kb.close_idle_turns(self.settings.turn_idle_seconds)

    def check_database(self) -> None:
        """Raises DatabaseUnavailable when the database does not answer."""
        with database.connect(self.kb().database_url, autocommit=True) as conn:
            conn.execute(queries["database_answers"])

    def close(self) -> None:
        """Close every KnowledgeBase opened (their repositories and turns)."""
        with self._opened_lock:
            for kb in self._opened:
                kb.close()
            self._opened.clear()


def document_path(workspace_id: int, route: str, path: str) -> str:
    """The virtual path of a ``/v1/workspaces/{workspace_id}/{route}/{path}`` URL: ``path`` is the
    document's whole path, ``documents/`` included. Raises InvalidPath for one that leaves it out,
    naming the URL that would name the document (the path law's own "did you mean" names the
    path, which this URL then takes with ``documents/`` twice, design §2.3)."""
    virtual = "/" + path.lstrip("/")
    if virtual != "/documents" and not virtual.startswith("/documents/"):
        raise errors.InvalidPath(
            virtual,
            "a URL names a document by its whole path, documents/ included: "
            f"/v1/workspaces/{workspace_id}/{route}/documents{quote(virtual)}",
        )
    return virtual


def read_router(service: Service) -> APIRouter:
    """Search, read, log and status: the CLI's read commands (``KB_SERVER_URL``)."""
    router = APIRouter(prefix="/v1", tags=["read"], route_class=JsonRoute)
    readable = [Depends(require("read"))]

    @router.get("/status", dependencies=[Depends(require("read", workspace_from="query"))])
    def status(request: Request, workspace: int | None = None) -> dict:
        """Head, index stamp, job counts, blocked and scheduled jobs (``kb status``). The
        deployment's facts (``database``, ``storage_root``) go to an admin token only, and the
        queues' health across workspaces (``job_health``) to a token for every workspace: a token
        for some workspaces learns nothing of the others or of where kb keeps its data (design §16)."""
        from kb.index.embedding import describe_configured_model

        info = service.kb().status(workspace)
        info["embedding_model"] = describe_configured_model(service.settings)
        token = request_token(request)
        if token is not None and token.scope != "admin":
            info.pop("database", None)
            info.pop("storage_root", None)
        if token is not None and token.workspace_ids is not None:
            info.pop("job_health", None)
        return json_form(info)

    @router.get("/workspaces/{workspace_id}/search", dependencies=readable)
    def search(workspace_id: int, q: str = Query(description="The query."), k: int = Query(5, ge=1, le=100)) -> dict:
        """Hybrid search → envelopes (design §8), with how far the index lags the head."""
        kb = service.kb()
        hits = kb.search(workspace_id, q, k)
        freshness = kb.index_freshness(workspace_id)
        return {
            "results": [h.as_json() for h in hits],
            "index": {
                "revisions_behind": freshness.revisions_behind,
                "documents_pending": freshness.documents_pending,
                "hint": freshness.hint(),
            },
        }

    @router.get("/workspaces/{workspace_id}/documents/{path:path}", dependencies=readable)
    def read(
        workspace_id: int, path: str, revision: str | None = None, offset: int = 0, limit: int | None = None
    ) -> dict:
        """One document's envelope at HEAD or ``revision`` (``kb read``): the full view, or lines
        ``offset+1 … offset+limit`` with their true numbers (``view="window"``, ``total_lines``)
        as ``kb read --offset/--limit`` and a turn's file read take them."""
        envelope = service.kb().read_document(workspace_id, document_path(workspace_id, "documents", path), revision)
        return envelope.window(offset, limit).as_json()

    @router.get("/workspaces/{workspace_id}/blame/{path:path}", dependencies=readable)
    def blame(workspace_id: int, path: str) -> dict:
        """Each line of a document at HEAD with the revision that last changed it, following its
        recorded moves (``kb blame``, design §17)."""
        return service.kb().blame(workspace_id, document_path(workspace_id, "blame", path)).as_json()

    @router.get("/workspaces/{workspace_id}/writes/{key:path}", dependencies=readable)
    def write_outcome(request: Request, workspace_id: int, key: str) -> dict:
        """Settle a write by its idempotency key (design §3): ``{"landed": true, "revision": …}``
        when it recorded a revision, ``{"landed": false, "revision": null}`` when it did not (and,
        its writer being gone, never will). The call a 503 ``CommitOutcomeUnknown`` names. A key
        is the token's own, as its turn commits recorded it (design §16)."""
        revision = service.kb().write_outcome(workspace_id, owned_by_token(request, key, errors.InvalidInput))
        return {
            "idempotency_key": key,
            "landed": revision is not None,
            "revision": None if revision is None else json_form(revision),
        }

    @router.get("/workspaces/{workspace_id}/log", dependencies=readable)
    def history(workspace_id: int, path: str | None = None, limit: int = Query(20, ge=1)) -> list[dict]:
        """Revisions newest first, following a path's moves (``kb log``)."""
        return json_form(service.kb().history(workspace_id, path, limit))

    return router


TOKEN_OF_TURN = re.compile(r"t(\d+)@")
"""The token id an API turn's root id starts with (``owned_name``)."""


def refuse_another_turn(open_keys: list[tuple[int, str]], token_id: int, most: int) -> None:
    """Raise TooManyTurns when the token ``token_id`` holds ``most`` of ``open_keys`` (``(workspace
    id, root turn id)`` of the open turns but the one asking) already (``KB_TURNS_PER_TOKEN``):
    each holds a worktree lock and a file descriptor until committed, aborted or released idle,
    and one token opening turns without end ran the server out of descriptors for every tenant
    (design §16). Its own open turns stay usable; a commit or abort is never refused
    (``KnowledgeBase.admit_turns``)."""
    mine = owned_name("", token_id)
    count = sum(1 for _, root in open_keys if root.startswith(mine))
    if count >= most:
        raise errors.TooManyTurns(
            f"this API token holds {count} open turns, the most kb serve keeps for one token "
            "(KB_TURNS_PER_TOKEN); commit or abort one (POST …/turns/ID/commit, DELETE …/turns/ID), "
            "or wait until an idle one is released (KB_TURN_IDLE_SECONDS)"
        )


def turn_router(service: Service) -> APIRouter:
    """A turn's file operations and commit (design §5); the turn's worktree is private to it."""
    router = APIRouter(
        prefix="/v1/workspaces/{workspace_id}/turns/{turn_id}",
        tags=["turns"],
        dependencies=[Depends(require("write"))],
        route_class=JsonRoute,
    )

    def turn(request: Request, workspace_id: int, turn_id: str) -> Turn:
        # a turn id is private to the token that names it (design §16); a token at its bound of
        # open turns may always commit or abort one (``Service.turn``). A turn is made for the
        # token, as a page's edit is (design §16): the server's OS user wrote none of it
        owned = owned_by_token(request, turn_id)
        token = request_token(request)
        return service.turn(workspace_id, owned, None if token is None else token.committer)

    def writing(request: Request, workspace_id: int, turn_id: str, author: str | None):
        # the first writing request since the turn began or last committed names its author
        # (``?author=``, else the token): a read may have opened the turn, and names nobody
        return turn(request, workspace_id, turn_id).acting_for(author)

    author_query = Query(
        None,
        description="Whom the turn's next revision records as author (default: the token). Named by the "
        "first writing request since the turn began or last committed; another author after it is 409.",
    )

    @router.get("/files")
    def ls(request: Request, workspace_id: int, turn_id: str, path: str = "/documents") -> list[dict]:
        """Entries of a folder in the turn's view."""
        return json_form(turn(request, workspace_id, turn_id).ls(path))

    @router.get("/files/{path:path}")
    def read(
        request: Request, workspace_id: int, turn_id: str, path: str, offset: int = 0, limit: int | None = None
    ) -> dict:
        """A file as the turn sees it (its own writes included)."""
        return json_form(turn(request, workspace_id, turn_id).read("/" + path.lstrip("/"), offset, limit))

    @router.put("/files/{path:path}")
    def write(
        request: Request,
        workspace_id: int,
        turn_id: str,
        path: str,
        body: WriteBody,
        author: str | None = author_query,
    ) -> dict:
        """Create or replace a file in the turn (nothing is recorded until commit)."""
        with writing(request, workspace_id, turn_id, author) as open_turn:
            return json_form(open_turn.write("/" + path.lstrip("/"), body.content))

    @router.post("/edit/{path:path}")
    def edit(
        request: Request,
        workspace_id: int,
        turn_id: str,
        path: str,
        body: EditBody,
        author: str | None = author_query,
    ) -> dict:
        """Replace text in a file of the turn."""
        with writing(request, workspace_id, turn_id, author) as open_turn:
            return json_form(open_turn.edit("/" + path.lstrip("/"), body.old, body.new, body.replace_all))

    @router.delete("/files/{path:path}")
    def remove(request: Request, workspace_id: int, turn_id: str, path: str, author: str | None = author_query) -> dict:
        """Remove a file in the turn."""
        with writing(request, workspace_id, turn_id, author) as open_turn:
            return {"removed": open_turn.remove("/" + path.lstrip("/"))}

    @router.post("/move")
    def move(
        request: Request, workspace_id: int, turn_id: str, body: MoveBody, author: str | None = author_query
    ) -> dict:
        """Move a file or folder in the turn."""
        with writing(request, workspace_id, turn_id, author) as open_turn:
            return {"moved": json_form(open_turn.move(body.src, body.dst, body.overwrite))}

    @router.post("/commit")
    def commit(
        workspace_id: int,
        turn_id: str,
        request: Request,
        body: CommitBody | None = None,
        idempotency_key: str | None = Header(None, alias="Idempotency-Key"),
    ) -> dict:
        """Record the turn's changes as one revision; ``{"revision": null}`` when nothing changed.
        The body (``{"message": …}``) may be left out, as the message may: a summary is written.
        With an ``Idempotency-Key`` header, a retry of a commit that landed records nothing and
        answers that commit's revision (design §3); a 503 ``CommitOutcomeUnknown`` says how to
        settle one whose outcome is unknown. The committer is the request's token (design §16).

        The key's fence is taken first, before the turn is looked up: from then on the commit is
        in flight, and ``writes/{key}`` waits for it rather than answer that it never lands."""
        # a key is private to its token, as the turn is: another token's commit with the same
        # key records its own changes instead of being answered with this one's (design §3, §16).
        # Without one the commit still gets a key of the token's own: a 503 CommitOutcomeUnknown
        # names it, and writes/{key} finds only the token's keys (one kb generated bare it never found)
        given = new_key() if idempotency_key is None else idempotency_key
        key = (
            owned_by_token(request, given, errors.InvalidInput)
            if request_token(request) is not None
            else idempotency_key
        )
        with service.kb().store(workspace_id).key_fence(key):
            open_turn = turn(request, workspace_id, turn_id)
            if (committer := committer_of(request)) is not None:
                open_turn.committer = committer  # the author stays whom the turn acts for
            result = open_turn.commit(None if body is None else body.message, idempotency_key=key)
        return {"revision": None} if result is None else json_form(result)

    @router.delete("")
    def abort(request: Request, workspace_id: int, turn_id: str) -> dict:
        """Discard the turn and its worktree."""
        turn(request, workspace_id, turn_id).abort()
        return {"aborted": True}

    return router


def citation_router(service: Service) -> APIRouter:
    """A chat's searches and reads that hand out citation handles, and resolving its citations
    (design §8, ``kb.citations.conversation``; the CLI's ``kb search --chat`` / ``kb cite``)."""
    router = APIRouter(
        prefix="/v1/workspaces/{workspace_id}/chats/{chat_id}",
        tags=["citations"],
        dependencies=[Depends(require("read"))],
        route_class=JsonRoute,
    )

    def chat_of(request: Request, workspace_id: int, chat_id: str):
        """The conversation of the request's token named ``chat_id``: a chat id is private to the
        token that names it (design §16)."""
        return service.kb().conversation(workspace_id, owned_by_token(request, chat_id, errors.InvalidChat))

    @router.get("/search")
    def search(
        request: Request, workspace_id: int, chat_id: str, q: str, k: int = Query(5, ge=1, le=100)
    ) -> list[dict]:
        """Search as this chat: each envelope cites the chat's handle (``cite: "[n]"``)."""
        return [e.as_json() for e in chat_of(request, workspace_id, chat_id).search(q, k)]

    @router.get("/documents/{path:path}")
    def read(
        request: Request,
        workspace_id: int,
        chat_id: str,
        path: str,
        revision: str | None = None,
        offset: int = Query(0, ge=0),
        limit: int | None = Query(None, ge=0),
    ) -> dict:
        """Read (a window of) a document as this chat, registering its handle."""
        return chat_of(request, workspace_id, chat_id).read("/" + path.lstrip("/"), revision, offset, limit).as_json()

    @router.get("/handles")
    def handles(request: Request, workspace_id: int, chat_id: str) -> list[dict]:
        """Every handle the chat was shown, by number."""
        return [h.as_json() for h in chat_of(request, workspace_id, chat_id).handles()]

    @router.delete("/handles")
    def forget(request: Request, workspace_id: int, chat_id: str) -> dict:
        """Forget the chat's handles (the next search starts again at [1])."""
        return {"forgotten": chat_of(request, workspace_id, chat_id).forget()}

    @router.post("/normalize")
    def normalize(request: Request, workspace_id: int, chat_id: str, body: NormalizeBody) -> dict:
        """Rewrite an answer's citations canonically against the chat's handles."""
        return chat_of(request, workspace_id, chat_id).normalize(body.text, drop_unknown=body.drop_unknown).as_json()

    @router.get("/resolve")
    def resolve(
        request: Request,
        workspace_id: int,
        chat_id: str,
        citation: str = Query(description="e.g. [1:L3-L4]"),
        follow: bool = False,
    ) -> dict:
        """The cited lines at the handle's revision; with ``follow``, where they are at HEAD."""
        return chat_of(request, workspace_id, chat_id).resolve(citation, follow).as_json()

    return router


def _validation_details(problems: Sequence[Any]) -> list[dict]:
    """pydantic's validation errors in a JSON-safe form: type, location, message and the input as
    text (a raw body is bytes, which JSON cannot carry — a markdown file sent as is used to turn a
    422 into a 500), cut to 200 characters."""
    details = []
    for problem in problems:
        if problem.get("type") == "json_invalid":  # FastAPI gives ``{}`` as its input: the body is in ``body``
            problem = {key: value for key, value in problem.items() if key != "input"}
        value = problem.get("input")
        if isinstance(value, bytes | bytearray):
            value = bytes(value[:200]).decode("utf-8", errors="replace")
        elif not isinstance(value, str | int | float | bool | type(None)):
            value = json.dumps(value, default=repr, ensure_ascii=False)[:200]  # as the client sent it: JSON
        details.append(
            {"type": problem.get("type"), "loc": [str(p) for p in problem.get("loc", ())], "msg": problem.get("msg")}
            | ({"input": value[:200] if isinstance(value, str) else value} if "input" in problem else {})
        )
    return details


def _problem_text(problem: dict[str, Any], body: Any) -> str:
    """One validation problem as the 422's message says it: ``location: what is wrong``. A body that
    is not JSON (``json_invalid``, at a character offset) is named with the decoder's reason and
    the text around the offset, not pydantic's bare "JSON decode error"."""
    where = ".".join(str(p) for p in problem.get("loc", ()))
    if problem.get("type") != "json_invalid":
        return f"{where}: {problem.get('msg')}"
    reason = (problem.get("ctx") or {}).get("error") or "not valid JSON"
    offset = problem.get("loc", (None, None))[1:2]
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes | bytearray) else body
    if isinstance(text, str) and offset and isinstance(offset[0], int):
        at = offset[0]
        return f"body: not valid JSON ({reason}; character {at}, in {text[max(0, at - 20) : at + 20]!r})"
    return f"body: not valid JSON ({reason})"


def create_app(
    settings: Settings | None = None,
    *,
    with_worker: bool = False,
    concurrency: int = 1,
    embedder: Embedder | None = None,
    routers: list[Callable[[Service], APIRouter]] | None = None,
    mcp_author: str | None = None,
    node_url: str | None = None,
    insecure_no_auth: bool = False,
) -> FastAPI:
    """The ASGI app of ``kb serve``.

    Every route but ``/health`` and ``/ready`` needs a live API token with the route's scope
    (design §16, ``kb.adapters.http.auth``) unless ``insecure_no_auth``; extra ``routers`` must
    then declare ``Depends(require(scope))`` on each route (ConfigurationError otherwise), and a
    route taking a body must be a ``JsonRoute`` (``kb.adapters.http.json_bodies``: a body Python's
    parser cannot take is 422 naming why). Bodies over ``KB_MAX_REQUEST_BYTES`` are 413
    (``kb.adapters.http.limits``).

    ``with_worker`` runs the Procrastinate worker in the same event loop (``concurrency`` jobs at
    once). ``embedder`` replaces the configured one (tests). ``routers``: extra router factories
    taking the Service. ``mcp_author`` is whom MCP turns record as author (default: the chat's API token, as for
    the HTTP API's turns; without tokens the OS user);
    the MCP endpoint (design §5) is served at ``/mcp/<workspace>``. ``node_url``: the URL this node
    advertises to the others (default ``KB_NODE_URL``); requests for workspaces homed on another
    node are forwarded there (design §15, ``kb.adapters.http.forwarding``). Start-up raises what ``KnowledgeBase.open`` raises
    (DatabaseUnavailable, MigrationError, DimensionMismatch…).
    """
    settings = settings or Settings()
    access = Access(insecure=insecure_no_auth)
    service = Service(settings, embedder, access)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        from kb.jobs.worker import ProgressDisplay, WorkerReport, WorkerSupervisor

        kb = await asyncio.to_thread(service.start)
        node = contextlib.AsyncExitStack()  # registered with its URL and heartbeating (design §15)
        await node.enter_async_context(forwarding.serving_node(kb, node_url or settings.node_url))
        from kb.adapters.mcp.server import http_app

        def token_live(token_id: str) -> bool:  # a revoked or expired token's staged MCP changes are not recorded
            return token_id.isdigit() and service.kb().tokens().is_live(int(token_id))

        mcp_app, mcp_lifespan = http_app(
            await asyncio.to_thread(service.new_kb),
            author=mcp_author,  # None: each chat's token is its author (McpSessions.get, design §16)
            kb_factory=service.new_kb,
            kb_release=service.release_kb,
            token_live=token_live,
            shown=access.shown_to_scope,  # the MCP tools' errors hide what the API's do (design §16)
        )
        mcp_endpoint.app = mcp_app
        worker_task = None
        display = None
        if with_worker:
            app.state.worker_report = WorkerReport()
            # a line per job on stderr beside uvicorn's, as `kb worker` prints them off a terminal (design §13)
            display = ProgressDisplay(live=False, every=settings.progress_interval)
            # restarted after a database outage, for as long as the server runs (design §7)
            supervisor = app.state.worker = WorkerSupervisor(
                kb, app.state.worker_report, concurrency=concurrency, display=display
            )
            worker_task = asyncio.create_task(supervisor.run())
        turn_release = asyncio.create_task(_release_idle_turns(service))
        try:
            async with mcp_lifespan():  # commits every open MCP turn when the server stops
                yield
        finally:
            service.ready = False
            turn_release.cancel()
            if worker_task is not None:
                app.state.worker.stop()  # Procrastinate: stop fetching, finish the jobs in hand
                try:
                    await worker_task
                except (Exception, asyncio.CancelledError) as exc:  # never fail the shutdown for it
                    log.warning("worker: stopping ended with an error: %s", type(exc).__name__)
                display.close()
                log.info("worker stopped: %s", app.state.worker_report.summary())
            await node.aclose()
            service.close()

    app = FastAPI(
        title="kb",
        version="1",
        lifespan=lifespan,
        description="A git-native knowledge base on Postgres: search, read, history, turns.",
        docs_url=None,  # served from the package's files below, never a CDN (design §17)
        redoc_url=None,
    )
    app.state.service = service
    app.state.access = access

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> SafeJSONResponse:
        # no such route or method, not ready: kb's error form too (``detail`` kept for older clients)
        body = {"error": f"HTTP{exc.status_code}", "message": str(exc.detail), "detail": exc.detail}
        return SafeJSONResponse(body, exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> SafeJSONResponse:
        # a body or parameter of the wrong shape: kb's error form, with pydantic's details
        problems = "; ".join(_problem_text(e, exc.body) for e in exc.errors())
        kind = request.headers.get("content-type", "")
        if "json" not in kind.lower() and any(e.get("loc", ())[:1] == ("body",) for e in exc.errors()):
            # a JSON body sent without its Content-Type is read as plain bytes: say so, not only
            # "Input should be a valid dictionary", which names no cause
            said = f"Content-Type {kind.split(';')[0]!r}" if kind else "no Content-Type"
            problems += f" (the body came with {said}, so it was not read as JSON: send Content-Type: application/json)"
        body = {"error": "InvalidInput", "message": f"the request does not fit the route: {problems}"}
        return SafeJSONResponse(
            {**body, "cli_message": body["message"], "detail": _validation_details(exc.errors())}, 422
        )

    @app.exception_handler(errors.KbError)
    async def kb_error(request: Request, exc: errors.KbError) -> SafeJSONResponse:
        token = request_token(request)  # where kb keeps its data: for an admin token only (design §16)
        message, cli_message = str(exc), exc.cli_message
        if token is not None:
            # turn ids and keys as the client gave them: kb keeps them as t<token id>@NAME (design
            # §16), and a stored key named to the settle route, which adds the prefix, was looked
            # up as t<id>@t<id>@KEY, which no write has — "did not land"
            ids = named_ids(request)
            if isinstance(exc, errors.CommitOutcomeUnknown):  # a key kb generated for the commit
                ids.append(exc.idempotency_key.removeprefix(owned_name("", token.id)))
            message, cli_message = (as_the_token_names_it(text, token, ids) for text in (message, cli_message))
        body: dict[str, object] = {
            "error": type(exc).__name__,
            "message": access.shown(message, token),
            "cli_message": access.shown(cli_message, token),
        }
        if isinstance(exc, errors.CommitOutcomeUnknown):  # design §3: the one call that settles it
            prefix = "" if token is None else owned_name("", token.id)
            given = exc.idempotency_key.removeprefix(prefix)
            body.update(
                workspace_id=exc.workspace_id,
                idempotency_key=given,
                revision=exc.revision,
                settle={"method": "GET", "path": f"/v1/workspaces/{exc.workspace_id}/writes/{quote(given, safe='')}"},
            )
            return SafeJSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        if isinstance(exc, errors.WorkspaceMoving):  # design §15: retry after the move
            body.update(workspace_id=exc.workspace_id, target_node=exc.target_node, retry_after=exc.retry_after)
            return SafeJSONResponse(body, status_code=503, headers={"Retry-After": str(exc.retry_after)})
        return SafeJSONResponse(body, status_code=status_for(exc))

    @app.get("/health", tags=["operations"])
    def health() -> dict:
        """Liveness: the process answers."""
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"], response_model=None)
    def ready() -> dict | SafeJSONResponse:
        """Readiness: the embedder is loaded and the database answers (503 otherwise, with kb's
        error form: ``DatabaseUnavailable`` when the database does not answer). ``worker``:
        false without ``--with-worker``, else the in-process worker's state (``"starting"``,
        ``"running"``, ``"restarting"`` after a failure, design §7) with ``worker_error`` (type,
        message without deployment facts, when) and ``worker_restarts`` once it failed."""
        if not service.ready:
            raise HTTPException(503, "starting or stopping")
        try:
            service.check_database()
        except errors.KbError as exc:  # anybody may ask: where the database is stays untold (design §16)
            message = access.shown(str(exc), None)
            body = {"error": type(exc).__name__, "message": message, "cli_message": message}
            return SafeJSONResponse(body, status_code=503, headers={"Retry-After": "1"})
        supervisor = getattr(app.state, "worker", None)
        if supervisor is None:
            return {"status": "ready", "worker": False}
        # anybody may ask: the error's message without where the database is (design §16)
        return {"status": "ready"} | supervisor.describe(lambda text: access.shown(text, None))

    mcp_endpoint = _LateMount()
    app.mount("/mcp", McpGate(mcp_endpoint, access))
    app.include_router(read_router(service))
    app.include_router(turn_router(service))
    app.include_router(citation_router(service))
    from kb.adapters.http.moves import moves_router

    app.include_router(moves_router(service))
    for factory in routers or []:
        app.include_router(factory(service))
    serve_docs_offline(app)
    mount_ui(app, service, status_for)  # the pages for people under /ui (design §17)
    if not insecure_no_auth and (missing := unguarded_routes(app)):
        raise errors.ConfigurationError(
            f"routes without a token check (design §16): {', '.join(missing)}; add "
            "dependencies=[Depends(kb.adapters.http.auth.require(scope))]"
        )
    if lenient := routes_reading_bodies_leniently(app):  # a body Python's parser cannot take would be a 400 or 500
        raise errors.ConfigurationError(
            f"routes reading a JSON body without kb's strict parsing: {', '.join(lenient)}; give their "
            "router route_class=kb.adapters.http.json_bodies.JsonRoute"
        )
    app.add_middleware(
        forwarding.NodeForwarding,
        kb_for_thread=service.kb,
        node=settings.node,
        stale_seconds=settings.node_stale_seconds,
    )
    app.add_middleware(Authentication, access=access)
    app.add_middleware(RequestLimits, max_bytes=settings.max_request_bytes)  # outermost: before any lookup
    return app


class _LateMount:
    """An ASGI app mounted before the app it forwards to exists (the MCP app needs the
    KnowledgeBase the lifespan opens); 503 until it is set."""

    def __init__(self) -> None:
        self.app = None

    async def __call__(self, scope, receive, send) -> None:
        if self.app is None:
            await JSONResponse({"error": "starting"}, status_code=503)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def serve(
    settings: Settings | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    with_worker: bool = False,
    concurrency: int = 1,
    embedder: Embedder | None = None,
    mcp_author: str | None = None,
    insecure_no_auth: bool = False,
) -> None:
    """Run the server until SIGTERM/SIGINT (``kb serve``); returns after a graceful shutdown.

    Raises ConfigurationError before listening on a non-loopback ``host`` when no API token is
    live and not ``insecure_no_auth`` (design §16, ``kb.adapters.http.auth.start_up_check``).
    """
    import uvicorn

    from kb.adapters.http.auth import start_up_check
    from kb.knowledge_base import KnowledgeBase

    settings = settings or Settings()

    def tokens_live() -> bool:
        with KnowledgeBase.open(settings) as kb:
            return kb.tokens().any_live()

    banner = start_up_check(host, port, insecure=insecure_no_auth, tokens_live=tokens_live)
    refuse_taken_port(host, port)  # after the access check (what to fix first), before the banner
    log.warning(banner)
    app = create_app(
        settings,
        with_worker=with_worker,
        concurrency=concurrency,
        embedder=embedder,
        mcp_author=mcp_author,
        node_url=forwarding.advertised_url(settings.node_url, host, port),
        insecure_no_auth=insecure_no_auth,
    )
    uvicorn.run(app, host=host, port=port, log_level="info", lifespan="on")
