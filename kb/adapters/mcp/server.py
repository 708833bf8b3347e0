"""kb over the Model Context Protocol (design §5 turns, §8 citations, §13 ``kb mcp``).

One MCP conversation is one kb *conversation* (its citation handles, design §8) and one *turn* (its
private worktree, design §5). The tools an agent gets are the turn's file operations plus search,
windowed reads and citations; ``commit`` records the turn's changes as one revision.

Where the conversation comes from:

- over stdio (``kb mcp``) the process is the conversation: its chat id is ``--chat`` or a fresh id;
  when the client disconnects (stdin closes) the open turn is committed;
- over streamable HTTP (mounted by ``kb serve`` at ``/mcp/<workspace>``) the chat id is the
  ``chat`` query parameter or ``X-KB-Chat`` header when the client gives one, else the transport's
  ``Mcp-Session-Id``; a client that ends its session (HTTP DELETE) has its turn committed, and so
  has every open turn when the server shuts down. Behind API tokens a chat id is private to the
  token that gave it (``owned_name``).

If the server process dies, nothing is lost: the turn id is derived from the chat's key
(``mcp:<chat>``, ``mcp:t<token id>@<chat>`` behind tokens), so the next conversation with the same chat id commits the worktree left behind
(turn recovery, design §5), and the janitor removes it only after ``KB_WORKTREE_TTL``.

Errors come back as MCP tool errors carrying kb's one-line messages (``KbError``); bad paths are
refused exactly as in turns (``InvalidPath``). Every error — a tool's, one raised before the tool
runs (opening the chat's workspace), a resource's — names where kb keeps its data (the database's
address, the storage root) only to an admin token, as kb serve's errors (design §16).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version as distribution_version
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, ListResourcesResult, ListToolsResult, PaginatedRequestParams, Resource

from kb.adapters.json_form import json_form
from kb.citations.envelope import attribute_value
from kb.errors import CommitOutcomeUnknown, DocumentNotFound, InvalidInput, IsAFolder, KbError, TooManyChats
from kb.paths import StorePath
from kb.store.authors import default_author
from kb.store.write_keys import new_key

if TYPE_CHECKING:
    from kb.knowledge_base import KnowledgeBase
    from kb.turns.turn import Turn

log = logging.getLogger(__name__)

RESOURCE_PAGE_SIZE = 100
"""Documents per ``resources/list`` page."""

CHAT_HEADER = "x-kb-chat"
WORKSPACE_HEADER = "x-kb-workspace"
SESSION_HEADER = "mcp-session-id"
TOKEN_SCOPE_HEADER = "x-kb-token-scope"
"""Set by ``kb serve`` (``kb.adapters.http.auth.McpGate``, never the client): the request's token scope."""
TOKEN_COMMITTER_HEADER = "x-kb-token-committer"
"""Set by ``kb serve``: whom the token's revisions record as committer (design §16)."""
TOKEN_ID_HEADER = "x-kb-token-id"
"""Set by ``kb serve``: the id of the request's token, which a client's chat ids are private to."""


def owned_name(name: str, token_id: object | None) -> str:
    """The name kb keys a client-given chat or turn id by: ``name`` itself where no token is
    checked (stdio, ``--insecure-no-auth``), else ``t<token id>@<name>``, so that an id one
    token's client gave never reaches another token's chat or turn, whoever learns or guesses it
    (a second writer of the same workspace; design §16). The same token and id find the same
    turn again after a restart (turn recovery, design §5)."""
    return f"t{token_id}@{name}" if token_id is not None and token_id != "" else name


def deployment_facts(kb: KnowledgeBase) -> dict[str, str]:
    """Text naming where ``kb`` keeps its data and the servers it talks to → the placeholder an
    error message shows instead to a caller without an admin token (design §16): the database's
    redacted address and ``KB_DIRECT_DATABASE_URL``'s (a page's live updates connect there), the
    storage root, the Redis lock server (its redacted URL and ``host:port``, as redis-py names it)
    and an embedding endpoint other than OpenAI's own."""
    from kb.db.database import redact
    from kb.db.redis_lock import redacted_redis_url, redis_address

    settings = kb.settings
    facts = {redact(kb.database_url): "<kb's database>"}
    if settings.direct_database_url:
        facts[redact(settings.direct_database_url)] = "<kb's database>"
    facts[str(settings.storage_root)] = "<kb's storage root>"
    if settings.lock_backend == "redis":
        facts[redacted_redis_url(settings.redis_url)] = "<kb's Redis>"
        if address := redis_address(settings.redis_url):
            facts[address] = "<kb's Redis>"
    if settings.openai_base_url.rstrip("/") != OPENAI_BASE_URL:
        facts[settings.openai_base_url.rstrip("/")] = "<kb's embedding endpoint>"
    return facts


OPENAI_BASE_URL = "https://api.openai.com/v1"
"""OpenAI's own embedding endpoint: public, named in errors to anybody."""


LIBPQ_SERVER_NAMES = (
    (re.compile(r'connection to server at "[^"]*"(?: \([^)]*\))?, port \d+'), "connection to <kb's database>"),
    (re.compile(r'connection to server on socket "[^"]*"'), "connection to <kb's database>"),
    (re.compile(r"failed to resolve host '[^']*'"), "failed to resolve <kb's database>'s host"),
    (re.compile(r'\b(database|role|user) "[^"]*"'), r"\1 <kb's database>"),
    (re.compile(r'\bhost "[^"]*"'), "host <kb's database>"),
)
"""How libpq's own messages (inside kb's DatabaseUnavailable) name the server it could not reach
— host, its address, port, socket — and how the server's FATAL answers name the database, role
and client host it refused (``database "kb" does not exist``, ``password authentication failed
for user "kb"``, ``no pg_hba.conf entry for host "10.0.0.9", user "kb", database "kb"``), and what
``hide_facts`` says instead."""


def hide_facts(text: str, facts: dict[str, str]) -> str:
    """``text`` with every fact of ``facts`` (``deployment_facts``) replaced by its placeholder
    where it starts a path or a word, so a short storage root such as ``/data`` does not eat the
    ``/data`` of a document's path ``/documents/data/…``; and with libpq's naming of a database
    server it could not reach (``LIBPQ_SERVER_NAMES``: host, address, port or socket, which the
    database's address in ``facts`` does not spell alike) hidden too (design §16)."""
    for fact, placeholder in facts.items():
        if len(fact) > 1:  # a root of "/" names nothing worth hiding, and is in every path
            text = re.sub(r"(?<![\w./@:-])" + re.escape(fact), placeholder.replace("\\", "\\\\"), text)
    for pattern, placeholder in LIBPQ_SERVER_NAMES:
        text = pattern.sub(placeholder, text)
    return text


WRITE_TOOLS = frozenset({"write", "edit", "move", "remove", "mkdir", "commit", "abort"})
"""The tools that change the chat's turn: they need a write (or admin) token."""


MCP_PATH = re.compile(r"/mcp/([0-9]+)/?")
"""An MCP endpoint's path: ``/mcp/<workspace id>`` (ASCII digits; a trailing ``/`` allowed)."""


def mcp_workspace(path: str) -> int | None:
    """The workspace an MCP endpoint's ``path`` names, or None when the path names none — any
    other path under ``/mcp`` (``/mcp/1/2``, ``/mcp//1``, ``/mcp/x``): kb serve answers it 404
    and never picks one of its numbers. The one reading of the path the token check
    (``McpGate``), the routing (``WorkspaceRouting``) and forwarding (design §15) share."""
    match = MCP_PATH.fullmatch(path)
    return int(match.group(1)) if match else None


def turn_id_for_chat(chat_id: str) -> str:
    """The turn id of a chat's MCP conversation (one function, so recovery finds the same worktree)."""
    return f"mcp:{chat_id}"


def document_uri(workspace_id: int, path: str) -> str:
    """``kb://workspace/<id>/documents/<folders>/<file>`` for the virtual path ``/documents/...``."""
    below = path.removeprefix("/documents/")
    return f"kb://workspace/{workspace_id}/documents/{quote(below, safe='/')}"


@dataclass
class ChatState:
    """One MCP conversation: its workspace, chat id, kb conversation and turn (created lazily)."""

    workspace_id: int
    chat_id: str
    kb: KnowledgeBase
    turn: Turn
    conversation: Any
    lock: threading.RLock
    token_id: str | None = None
    """The API token whose chat this is (None over stdio and --insecure-no-auth)."""
    token_scope: str | None = None
    """That token's scope: its errors name where kb keeps its data only for an admin one."""
    owner: str | None = None
    """Whose conversation this counts as for ``McpSessions.chats_per_owner`` (the token id)."""
    last_used: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` of its last call: ``McpSessions.close_idle`` closes it after a while."""


class McpSessions:
    """The conversations an MCP server holds, keyed by ``(workspace, chat id)``. Thread-safe.

    Over HTTP a client that never ends its session (killed, or buggy) would leave its chat here
    for the server's life, with its turn open (a file descriptor and a worktree lock each): kb
    serve closes a chat idle for ``KB_MCP_CHAT_IDLE_SECONDS`` as if its client had ended it
    (``close_idle``), and refuses a token more than ``KB_MCP_CHATS_PER_TOKEN`` open chats
    (``TooManyChats``), so one client cannot exhaust what every tenant shares (design §16)."""

    def __init__(
        self,
        kb: KnowledgeBase,
        author: str | None,
        committer: str | None,
        kb_factory: Callable[[], KnowledgeBase] | None = None,
        kb_release: Callable[[KnowledgeBase], None] | None = None,
        chats_per_owner: int | None = None,
    ) -> None:
        self.kb = kb
        self.kb_factory = kb_factory
        self.kb_release = kb_release
        """Closes a KnowledgeBase ``kb_factory`` gave a chat, once the chat is closed."""
        self.chats_per_owner = chats_per_owner
        """Open chats one owner (an API token; None: every caller without one) may hold; None: no bound."""
        self.author = author
        self.committer = committer
        self._chats: dict[tuple[int, str], ChatState] = {}
        self._closing: dict[tuple[int, str], threading.Event] = {}
        """Chats forgotten and not yet closed (their turns being committed), each set once closed."""
        self._lock = threading.Lock()
        self.token_live: Callable[[str], bool] | None = None
        """Asks whether an API token (by id) is still live: a chat of a token revoked or expired
        since is not committed when it closes (``kb serve`` sets it; design §16)."""

    def get(
        self, workspace_id: int, chat_id: str, owner: str | None = None, owner_name: str | None = None
    ) -> ChatState:
        """The state of one chat (created on first use by ``owner``, an API token's id or None,
        whose turn records ``owner_name`` — the token's ``NAME <kb-token-ID>`` — as author when the
        sessions have no author of their own; else the OS user), marked used now. A chat being closed (idle, or its client ended it) is waited for: its turn
        still holds the worktree, which a new turn of the chat would find busy (design §5). Raises
        WorkspaceNotFound, InvalidTurn, TooManyChats (``owner`` holds ``chats_per_owner`` open chats
        already)."""
        key = (workspace_id, chat_id)
        while True:
            with self._lock:
                closing = self._closing.get(key)
                if closing is None:
                    return self._get_locked(key, owner, owner_name)
            closing.wait()  # bounded: the close's commit waits at most KB_LOCK_TIMEOUT for its locks

    def _get_locked(self, key: tuple[int, str], owner: str | None, owner_name: str | None = None) -> ChatState:
        """``get`` once ``_lock`` is held and the chat is not being closed."""
        workspace_id, chat_id = key
        state = self._chats.get(key)
        if state is None:
            held = sum(1 for each in self._chats.values() if each.owner == owner)
            if self.chats_per_owner is not None and held >= self.chats_per_owner:
                raise TooManyChats(
                    f"{'this API token holds' if owner else 'callers without a token hold'} {held} open MCP "
                    "conversations, the most kb serve keeps (KB_MCP_CHATS_PER_TOKEN); end one (HTTP DELETE "
                    "of its session: the client's close) or wait until an idle one is closed "
                    "(KB_MCP_CHAT_IDLE_SECONDS)"
                )
            # A chat's calls are serialized by its lock; with a factory each chat also has a
            # KnowledgeBase of its own (its own repositories), so chats never share one.
            kb = self.kb_factory() if self.kb_factory else self.kb
            try:
                # the author: the one kb serve was started with (--author), else the token the
                # chat is the work of, as for a turn of the HTTP API (design §16), else the OS user
                author = self.author or owner_name or default_author()
                turn = kb.turn(workspace_id, turn_id_for_chat(chat_id), author=author, committer=self.committer)
                state = ChatState(
                    workspace_id,
                    chat_id,
                    kb,
                    turn,
                    kb.conversation(workspace_id, chat_id),
                    threading.RLock(),
                    owner=owner,
                )
            except BaseException:  # no chat (a missing workspace, a bad chat id): nothing keeps its kb
                self._release(kb)
                raise
            self._chats[key] = state
        state.last_used = time.monotonic()
        return state

    def commit(self, workspace_id: int, chat_id: str, message: str | None = None):
        """Commit one chat's turn (None when it has nothing to record)."""
        state = self.get(workspace_id, chat_id)
        with state.lock:
            return state.turn.commit(message)

    def close_chat(self, workspace_id: int, chat_id: str) -> None:
        """The client went away: commit the chat's open turn and forget the chat's state here."""
        with self._lock:
            state = self._forget((workspace_id, chat_id))
        if state is not None:
            self._close(state)

    def close_idle(self, idle_seconds: float) -> int:
        """Close, as if their clients had ended them (``close_chat``: the turn committed), the
        chats whose last call is more than ``idle_seconds`` ago and that no call holds now.
        Returns how many were closed. Each is closed on its own: one failing to close is logged,
        and the others are still closed (a call of any of them waits for its close only)."""
        cutoff = time.monotonic() - idle_seconds
        idle: list[ChatState] = []
        with self._lock:
            for key, state in list(self._chats.items()):
                if state.last_used < cutoff and state.lock.acquire(blocking=False):
                    state.lock.release()  # not in a call now; a call arriving later makes a new state
                    self._forget(key)
                    idle.append(state)
        for state in idle:
            log.info(
                "closing MCP chat %s of workspace %s: idle for over %g s",
                state.chat_id,
                state.workspace_id,
                idle_seconds,
            )
            self._close_logged(state)
        return len(idle)

    def _close_logged(self, state: ChatState) -> None:
        """``_close``, a failure logged rather than raised: the caller closes other chats after it."""
        try:
            self._close(state)
        except Exception:  # its worktree stays: the chat's next call or the janitor takes it up
            log.exception("closing MCP chat %s of workspace %s failed", state.chat_id, state.workspace_id)

    def _forget(self, key: tuple[int, str]) -> ChatState | None:
        """Drop a chat's state (the caller holds ``_lock``), marking it closing until ``_close`` ends."""
        state = self._chats.pop(key, None)
        if state is not None:
            self._closing[key] = threading.Event()
        return state

    def _close(self, state: ChatState) -> None:
        """Commit (or, for a revoked token, leave) a forgotten chat's turn, then release its
        KnowledgeBase; a call of the chat waiting in ``get`` then goes on."""
        try:
            self._finish_turn(state)
        finally:
            try:
                self._release(state.kb)
            finally:
                with self._lock:
                    closed = self._closing.pop((state.workspace_id, state.chat_id), None)
                if closed is not None:
                    closed.set()

    def _release(self, kb: KnowledgeBase) -> None:
        """Close a KnowledgeBase ``kb_factory`` made for a chat (``kb_release``); the shared one stays."""
        if self.kb_factory is not None and kb is not self.kb:
            (self.kb_release or (lambda each: each.close()))(kb)

    def _finish_turn(self, state: ChatState) -> None:
        """Commit the turn of a chat being closed, unless its token was revoked since (design §16)."""
        chat_id = state.chat_id
        with state.lock:
            try:
                revoked = (  # a token revoked or expired since: its staged changes are not its to record
                    state.turn.started
                    and state.token_id is not None
                    and self.token_live is not None
                    and not self.token_live(state.token_id)
                )
                if revoked:
                    log.warning(
                        "chat %s's turn is not committed: its API token %s was revoked or expired; the "
                        "janitor removes the worktree after KB_WORKTREE_TTL",
                        chat_id,
                        state.token_id,
                    )
                    state.turn.close()
                    return
                if state.turn.started:
                    result = state.turn.commit("agent turn (MCP client disconnected)")
                    if result is not None:
                        log.info("committed chat %s's turn at disconnect: %s", chat_id, result.revision)
            except KbError as exc:  # the worktree stays; the next commit of the chat or the janitor takes it
                log.warning("could not commit chat %s's turn at disconnect: %s", chat_id, exc)
                state.turn.close()

    def close_all(self) -> None:
        """Commit every open turn (server shutdown); one chat failing to close does not stop the others."""
        with self._lock:
            keys = list(self._chats)
        for key in keys:
            with self._lock:
                state = self._forget(key)
            if state is not None:
                self._close_logged(state)


def build_server(
    kb: KnowledgeBase,
    *,
    workspace_id: int | None,
    author: str | None,
    committer: str | None = None,
    chat_id: str | None = None,
    kb_factory: Callable[[], KnowledgeBase] | None = None,
    kb_release: Callable[[KnowledgeBase], None] | None = None,
    shown: Callable[[str, str | None], str] | None = None,
    chats_per_owner: int | None = None,
) -> tuple[MCPServer, McpSessions]:
    """An MCP server exposing kb's tools for one workspace (stdio) or for the workspace each HTTP
    request names (``workspace_id=None``; ``kb serve`` sets the ``x-kb-workspace`` header).

    Args: ``kb`` an open KnowledgeBase; ``author`` whose changes the turns record ("Name <mail>";
    None: over HTTP the token each chat is the work of, ``McpSessions.get``, else the OS user);
    ``committer`` who records the revisions (None: kb's own identity, ``kb.turns.turn.KB_COMMITTER``);
    ``chat_id`` the conversation of a stdio server (None: a fresh id; ignored over HTTP);
    ``shown`` (an error message, the token's scope or None → the text that caller may read): kb
    serve's rule (``Access.shown_to_scope``); None: the deployment's facts hidden from any scope
    but admin, nothing hidden without one (stdio). ``kb_factory`` / ``kb_release``: a
    KnowledgeBase of its own for each chat, and how to close it when the chat ends;
    ``chats_per_owner``: the open chats one API token may hold (None: no bound; ``McpSessions``).
    Returns the server and its session table (call ``sessions.close_all()`` when the transport
    ends, so open turns are committed).
    """
    sessions = McpSessions(kb, author, committer, kb_factory, kb_release, chats_per_owner)
    resources_lock = threading.Lock()
    default_chat = chat_id or uuid.uuid4().hex
    server = MCPServer(
        "kb",
        title="kb knowledge base",
        version=distribution_version("kb"),
        log_level="WARNING",
        instructions=(
            "A git-native knowledge base of markdown documents under /documents. Use `search` and "
            "`read` to find and read documents (results carry citation handles such as [3]; cite "
            "lines as [3:L12-L14]). Change documents with write/edit/move/remove/mkdir; nothing is "
            "recorded until `commit`, which makes one revision of all your changes (or `abort`)."
        ),
    )

    def shown_here(message: str, scope: str | None) -> str:
        """An error message as the token of ``scope`` may read it: where kb keeps its data only
        for an admin token, stdio or --insecure-no-auth (``scope`` None), as kb serve's errors (design §16)."""
        if shown is not None:
            return shown(message, scope)
        return message if scope in (None, "admin") else hide_facts(message, deployment_facts(kb))

    def chat(ctx: Context, write: bool = False) -> ChatState:
        """The chat of the request (its workspace, turn and conversation). Every refusal, from the
        token's scope to a workspace or storage that cannot be opened, is a ToolError as ``call``
        raises (redacted by ``shown_here``): none reaches the client as an unexplained crash."""
        headers = ctx.headers or {}
        scope = headers.get(TOKEN_SCOPE_HEADER)  # None over stdio and --insecure-no-auth (design §16)
        if write and scope is not None and scope not in ("write", "admin"):
            raise ToolError(
                f"this API token has the {scope} scope; changing documents needs a write token "
                "(kb token create --scope write)"
            )
        try:
            ws = workspace_id
            if ws is None:
                raw = headers.get(WORKSPACE_HEADER)
                if raw is None or not raw.isdigit() or int(raw) < 1:
                    raise InvalidInput("this MCP endpoint needs a workspace in its URL: /mcp/<workspace id>")
                ws = int(raw)
            given = headers.get(CHAT_HEADER) or headers.get(SESSION_HEADER) or default_chat
            owner = headers.get(TOKEN_ID_HEADER)
            state = sessions.get(ws, owned_name(given, owner), owner or None, headers.get(TOKEN_COMMITTER_HEADER))
        except KbError as exc:
            raise ToolError(shown_here(str(exc), scope)) from exc
        state.token_id, state.token_scope = headers.get(TOKEN_ID_HEADER) or None, scope
        if write and (committer := headers.get(TOKEN_COMMITTER_HEADER)):
            state.turn.committer = committer  # the token that changes the turn records it (design §16)
        return state

    def call(fn: Callable[[], Any], state: ChatState) -> Any:
        try:
            with state.lock:  # one call at a time per chat (a turn is one worktree)
                return fn()
        except KbError as exc:
            raise ToolError(shown_here(str(exc), state.token_scope)) from exc
        except ValueError as exc:  # argument checks of the turn API (negative offsets, …)
            raise ToolError(shown_here(str(exc), state.token_scope)) from exc

    @server.tool()
    def search(query: str, ctx: Context, k: int = 5) -> str:
        """Hybrid (semantic + full-text) search of the knowledge base. Returns up to `k` documents as
        <document …> envelopes: each has a citation handle (cite="[n]"), its relevance (score="…",
        higher is better; weak matches fill up to `k`) and excerpts whose numbers are the document's
        true line numbers. Cite what you use as [n], [n:L12] or [n:L12-L14]."""
        state = chat(ctx)
        return call(lambda: "\n".join(e.render() for e in state.conversation.search(query, k=k)) or "no results", state)

    @server.tool()
    def read(path: str, ctx: Context, offset: int = 0, limit: int | None = None) -> str:
        """Read a document (`/documents/...`): lines offset+1 … offset+limit with their true line
        numbers, as an envelope with a citation handle. A document you changed in this turn is
        shown as you left it (not citable until committed). An offset past the document's line
        count is an error that says how many lines it has."""
        state = chat(ctx)

        def run() -> str:
            mine = state.turn.read_bytes(path)
            try:
                committed = state.kb.read(state.workspace_id, path)
            except (DocumentNotFound, IsAFolder):  # not committed there (yet)
                committed = None
            if committed == mine:
                return state.conversation.read(path, offset=offset, limit=limit).render()
            window = state.turn.read(path, offset=offset, limit=limit)
            body = "\n".join(f"{n:>6}  {line}" for n, line in window.lines)
            return (
                f'<document path="{attribute_value(window.path)}" view="uncommitted" lines="{window.total_lines}">'
                f"\n{body}\n</document>"
            )

        return call(run, state)

    @server.tool()
    def ls(ctx: Context, path: str = "/documents") -> list[dict]:
        """List a folder: entries with name, path and kind ("file" or "folder")."""
        state = chat(ctx)
        return call(lambda: json_form(state.turn.ls(path)), state)

    @server.tool()
    def glob(pattern: str, ctx: Context) -> list[str]:
        """Paths matching a glob such as `/documents/**/*.md` (`**` spans folders)."""
        state = chat(ctx)
        return call(lambda: state.turn.glob(pattern), state)

    @server.tool()
    def grep(pattern: str, ctx: Context, path: str = "/documents", ignore_case: bool = False) -> list[dict]:
        """Lines matching a regular expression under `path`, with true line numbers (this turn's view)."""
        state = chat(ctx)
        return call(lambda: json_form(state.turn.grep(pattern, path, ignore_case=ignore_case)), state)

    @server.tool()
    def write(path: str, content: str, ctx: Context) -> dict:
        """Create or replace a document with `content` (UTF-8 markdown). Folders are implied."""
        state = chat(ctx, write=True)
        return call(lambda: json_form(state.turn.write(path, content)), state)

    @server.tool()
    def edit(path: str, old: str, new: str, ctx: Context, replace_all: bool = False) -> dict:
        """Replace the exact text `old` with `new` in a document. Fails when `old` occurs 0 times, or
        more than once without `replace_all`: give more surrounding text to make it unique."""
        state = chat(ctx, write=True)
        return call(lambda: json_form(state.turn.edit(path, old, new, replace_all=replace_all)), state)

    @server.tool()
    def move(source: str, destination: str, ctx: Context, overwrite: bool = False) -> list[list[str]]:
        """Move or rename a document or folder. Refuses an existing destination unless `overwrite`."""
        state = chat(ctx, write=True)
        return call(lambda: json_form(state.turn.move(source, destination, overwrite=overwrite)), state)

    @server.tool()
    def remove(path: str, ctx: Context) -> str:
        """Remove a document. Returns its path."""
        state = chat(ctx, write=True)
        return call(lambda: state.turn.remove(path), state)

    @server.tool()
    def mkdir(path: str, ctx: Context) -> bool:
        """Create an (empty) folder; returns False when it already existed."""
        state = chat(ctx, write=True)
        return call(lambda: state.turn.mkdir(path), state)

    @server.tool()
    def commit(ctx: Context, message: str | None = None) -> dict:
        """Record every change of this turn as ONE revision on top of the current head. Returns the
        revision id and the paths added, modified, removed, moved, and `overwrote` (paths where a
        concurrent change was replaced by yours). Returns {"revision": null} when nothing changed."""
        state = chat(ctx, write=True)

        def run() -> dict:
            # behind a token, a key of the token's own (design §16): an unknown outcome names it,
            # and kb serve's writes/{key} finds only the token's keys (a bare generated one, never)
            key = None if state.token_id is None else owned_name(new_key(), state.token_id)
            try:
                result = state.turn.commit(message, idempotency_key=key)
            except CommitOutcomeUnknown as exc:
                given = exc.idempotency_key.removeprefix(owned_name("", state.token_id))
                settle = (
                    f" Through kb serve, with this token: GET /v1/workspaces/{exc.workspace_id}/writes/"
                    f"{quote(given, safe='')}."
                )
                # the key as kb serve's settle route takes it (it adds the token's prefix itself)
                said = str(exc).replace(exc.idempotency_key, given) + settle if key else str(exc)
                raise ToolError(shown_here(said, state.token_scope)) from exc
            return {"revision": None} if result is None else json_form(result)

        return call(run, state)

    @server.tool()
    def abort(ctx: Context) -> str:
        """Discard every uncommitted change of this turn."""
        state = chat(ctx, write=True)

        def run() -> str:
            state.turn.abort()
            return "turn discarded"

        return call(run, state)

    @server.tool()
    def resolve_citation(citation: str, ctx: Context, follow: bool = False) -> dict:
        """Resolve a citation such as "[3:L12-L14]" to the exact text cited, read at the revision the
        handle was shown from. With `follow`, also say where those lines are at HEAD now:
        unchanged (with their new numbers), changed (both texts) or deleted."""
        state = chat(ctx)
        return call(lambda: json_form(state.conversation.resolve(citation, follow=follow)), state)

    @server.tool()
    def normalize_citations(text: str, ctx: Context, drop_unknown: bool = False) -> dict:
        """Normalize the citations in an answer: canonical [n:Lx-Ly] forms, line ranges clamped to
        each document; citations of handles this chat was never shown are kept as written and
        listed in `unknown` (removed with drop_unknown). Returns the text and its citations; an
        error when the chat has no handles yet (search or read first)."""
        state = chat(ctx)
        return call(lambda: json_form(state.conversation.normalize(text, drop_unknown=drop_unknown)), state)

    # -- documents as resources (kb://workspace/<id>/documents/...) -----------------------
    @server.resource("kb://workspace/{workspace}/documents/{+path}", mime_type="text/markdown")
    def document(workspace: str, path: str, ctx: Context) -> str:
        """A document's markdown at HEAD, of this connection's workspace only (over HTTP the one
        in the URL, which ``kb serve`` checked the token against, design §16)."""
        headers = ctx.headers or {}
        connected = workspace_id
        if connected is None:
            raw = headers.get(WORKSPACE_HEADER, "")
            connected = int(raw) if raw.isdigit() else None
        if not workspace.isdigit() or connected is None or int(workspace) != connected:
            raise ResourceNotFoundError(f"no workspace {workspace} on this connection")
        scope = headers.get(TOKEN_SCOPE_HEADER)
        try:
            with resources_lock:
                data = kb.read(int(workspace), StorePath.parse("/documents/" + unquote(path)).virtual)
        except (DocumentNotFound, IsAFolder) as exc:
            raise ResourceNotFoundError(shown_here(str(exc), scope)) from exc
        except KbError as exc:
            raise ResourceError(shown_here(str(exc), scope)) from exc
        return data.decode("utf-8", errors="replace")

    async def list_documents(ctx, params: PaginatedRequestParams) -> ListResourcesResult:
        headers = getattr(getattr(ctx, "request", None), "headers", None) or {}
        ws = workspace_id
        if ws is None:
            raw = headers.get(WORKSPACE_HEADER, "")
            ws = int(raw) if raw.isdigit() else None
        if ws is None:
            return ListResourcesResult(resources=[])
        try:
            with resources_lock:
                paths = sorted(kb.list_paths(ws))
        except KbError as exc:  # as the tools' errors: redacted for all but an admin token
            raise MCPError(INTERNAL_ERROR, shown_here(str(exc), headers.get(TOKEN_SCOPE_HEADER))) from exc
        start = int(params.cursor) if params.cursor and params.cursor.isdigit() else 0
        page = paths[start : start + RESOURCE_PAGE_SIZE]
        following = start + RESOURCE_PAGE_SIZE
        return ListResourcesResult(
            resources=[
                Resource(uri=document_uri(ws, p), name=p.rsplit("/", 1)[-1], mime_type="text/markdown") for p in page
            ],
            next_cursor=str(following) if following < len(paths) else None,
        )

    async def list_tools(ctx, params: PaginatedRequestParams | None) -> ListToolsResult:
        """The tools this request's token can call: a read token is not offered the turn's
        write tools (``WRITE_TOOLS``), which would only refuse it (design §16)."""
        headers = getattr(getattr(ctx, "request", None), "headers", None) or {}
        scope = headers.get(TOKEN_SCOPE_HEADER)  # None over stdio and --insecure-no-auth: all tools
        tools = await server.list_tools()
        if scope is not None and scope not in ("write", "admin"):
            tools = [tool for tool in tools if tool.name not in WRITE_TOOLS]
        return ListToolsResult(tools=tools)

    server._lowlevel_server.add_request_handler("resources/list", PaginatedRequestParams, list_documents)
    server._lowlevel_server.add_request_handler("tools/list", PaginatedRequestParams, list_tools)
    return server, sessions


def run_stdio(
    kb: KnowledgeBase, *, workspace_id: int, author: str, chat_id: str | None = None, committer: str | None = None
) -> None:
    """Serve kb's MCP tools over stdin/stdout until the client disconnects, then commit the open
    turn (``kb mcp``). stdout carries protocol messages only: the caller routes logs to stderr."""
    import anyio

    server, sessions = build_server(kb, workspace_id=workspace_id, author=author, committer=committer, chat_id=chat_id)
    try:
        anyio.run(server.run_stdio_async)
    finally:
        sessions.close_all()


class WorkspaceRouting:
    """ASGI wrapper that serves ``/mcp/<workspace>[?chat=<id>]`` (``mcp_workspace``) with one MCP
    app: it moves the workspace (and a client-given chat id) from the URL into the headers the
    tools read, and commits a chat's turn when the client ends its session (HTTP DELETE).

    Mounted by ``kb serve`` at ``/mcp``, so a client connects to ``http://host:port/mcp/1``.
    """

    def __init__(self, app, sessions: McpSessions, inner_path: str = "/mcp") -> None:
        self.app = app
        self.sessions = sessions
        self.inner_path = inner_path

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        number = mcp_workspace(path)
        if number is None:
            from starlette.responses import JSONResponse

            message = (
                f"{path[:100]!r} is not an MCP endpoint: connect to /mcp/<workspace id>, e.g. /mcp/1 "
                "(one workspace per connection)"
            )
            body = {"error": "NotFound", "message": message, "cli_message": message}
            await JSONResponse(body, status_code=404)(scope, receive, send)
            return
        workspace = str(number)
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != WORKSPACE_HEADER.encode()]
        headers.append((WORKSPACE_HEADER.encode(), workspace.encode()))
        query = dict(part.split("=", 1) for part in scope.get("query_string", b"").decode().split("&") if "=" in part)
        if "chat" in query and not any(k.lower() == CHAT_HEADER.encode() for k, _ in headers):
            headers.append((CHAT_HEADER.encode(), unquote(query["chat"]).encode()))
        inner = dict(scope, path=self.inner_path, raw_path=self.inner_path.encode(), root_path="", headers=headers)
        await self.app(inner, receive, send)
        if scope.get("method") == "DELETE":
            # as Starlette reads the headers the tools see (latin-1, the first of a repeated
            # header): the chat the tools used, and no UnicodeDecodeError on a chat id not in UTF-8
            names: dict[bytes, str] = {}
            for k, v in headers:
                names.setdefault(k.lower(), v.decode("latin-1"))
            chat_id = names.get(CHAT_HEADER.encode()) or names.get(SESSION_HEADER.encode())
            if chat_id:
                import anyio

                key = owned_name(chat_id, names.get(TOKEN_ID_HEADER.encode()))
                await anyio.to_thread.run_sync(self.sessions.close_chat, int(workspace), key)


def http_app(
    kb: KnowledgeBase,
    *,
    author: str | None,
    committer: str | None = None,
    kb_factory: Callable[[], KnowledgeBase] | None = None,
    kb_release: Callable[[KnowledgeBase], None] | None = None,
    token_live: Callable[[str], bool] | None = None,
    shown: Callable[[str, str | None], str] | None = None,
):
    """The streamable-HTTP MCP app for every workspace, for ``kb serve`` to mount at ``/mcp``.

    ``kb_factory`` gives each chat a KnowledgeBase of its own (the server's threads never share
    one); ``kb`` serves the resources. ``token_live`` (an API token's id → still live?): the
    chat of a token revoked or expired since is not committed at disconnect or shutdown. ``shown``:
    how an error reads for a token's scope (``build_server``; kb serve's ``Access.shown_to_scope``).
    ``kb_release`` closes a chat's KnowledgeBase when the chat ends. ``kb.settings``' MCP bounds
    apply: ``KB_MCP_CHATS_PER_TOKEN`` open chats per token, and a chat idle for
    ``KB_MCP_CHAT_IDLE_SECONDS`` is closed as if its client had ended it (``McpSessions``).
    Returns ``(asgi_app, lifespan)``: run ``lifespan`` (an async context manager) for the server's
    lifetime; it runs the MCP session manager, closes idle chats, and commits every open turn at
    shutdown.
    """
    import contextlib

    import anyio

    settings = kb.settings
    server, sessions = build_server(
        kb,
        workspace_id=None,
        author=author,
        committer=committer,
        kb_factory=kb_factory,
        kb_release=kb_release,
        shown=shown,
        chats_per_owner=settings.mcp_chats_per_token,
    )
    sessions.token_live = token_live
    inner = server.streamable_http_app(streamable_http_path="/mcp")
    idle_seconds = settings.mcp_chat_idle_seconds

    async def close_idle_chats() -> None:
        while True:  # a look every quarter of the idle time, at least once a minute
            await anyio.sleep(min(60.0, idle_seconds / 4))
            try:
                await anyio.to_thread.run_sync(sessions.close_idle, idle_seconds)
            except Exception:  # one chat's failure to close is logged; the next look tries again
                log.exception("closing idle MCP chats failed")

    @contextlib.asynccontextmanager
    async def lifespan():
        try:
            async with server.session_manager.run(), anyio.create_task_group() as reaper:
                reaper.start_soon(close_idle_chats)
                try:
                    yield
                finally:
                    reaper.cancel_scope.cancel()
        finally:
            await anyio.to_thread.run_sync(sessions.close_all)

    return WorkspaceRouting(inner, sessions), lifespan
