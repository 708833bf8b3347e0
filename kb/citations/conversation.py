"""A conversation: the one door through which a chat reads and cites (design §8).

``conv = kb.conversation(workspace_id, chat_id)``; ``conv.search`` and ``conv.read`` register a
handle per document shown (:mod:`kb.citations.registry`) and number the envelopes with it;
``conv.normalize`` rewrites what a model wrote back (:mod:`kb.citations.normalizer`);
``conv.resolve`` turns a citation into the exact text shown, read from the repository at the
handle's recorded revision (``read_as_of``) — chunk rows are never consulted after render — and
with ``follow=True`` says where those lines are at HEAD (:mod:`kb.citations.follow`) after the
document's recorded moves and edits.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kb.citations import registry
from kb.citations.envelope import Envelope
from kb.citations.follow import LineMapping, follow_history
from kb.citations.normalizer import Citation, HandleInfo, NormalizedText, check_text, normalize, parse_citation
from kb.citations.registry import Handle, Showing
from kb.db import database
from kb.db.sql import queries
from kb.errors import DocumentNotFound, InvalidCitation, IsAFolder, UnknownChat, UnknownHandle
from kb.lines import document_lines, line_span
from kb.paths import StorePath

if TYPE_CHECKING:
    from collections.abc import Callable

    from kb.store.knowledge_store import KnowledgeStore

MAX_MOVES_FOLLOWED = 10_000


@dataclass(frozen=True)
class Follow:
    """Where the cited lines are at HEAD: ``status`` (``unchanged`` | ``changed`` | ``deleted``),
    the document's ``path`` at HEAD (None when it is gone), HEAD ``revision``, the line range
    there and those lines (empty when deleted)."""

    status: str
    path: str | None
    revision: str | None
    start: int | None
    end: int | None
    lines: list[tuple[int, str]]

    def as_json(self) -> dict:
        """``{status, path, revision, start, end, lines: [[n, text], ...]}``."""
        return {
            "status": self.status,
            "path": self.path,
            "revision": self.revision,
            "start": self.start,
            "end": self.end,
            "lines": [[n, t] for n, t in self.lines],
        }


@dataclass(frozen=True)
class Resolution:
    """A citation resolved at its handle's revision.

    ``citation``: as resolved (canonical); ``level``: ``lines`` or ``document`` (the whole
    document: a ``[n]`` citation, or a line citation of a handle shown un-numbered —
    ``degraded``); ``lines``: ``(line number, text)`` of the cited lines (every line for the
    document level); ``follow``: set when resolved with ``follow=True``.
    """

    citation: Citation
    handle: Handle
    level: str
    degraded: bool
    lines: list[tuple[int, str]]
    follow: Follow | None = None

    @property
    def text(self) -> str:
        """The cited lines joined with ``\\n``."""
        return "\n".join(t for _, t in self.lines)

    def as_json(self) -> dict:
        """JSON shape of ``kb cite resolve --json``."""
        return {
            "citation": str(self.citation),
            "handle": self.handle.as_json(),
            "level": self.level,
            "degraded": self.degraded,
            "lines": [[n, t] for n, t in self.lines],
            "follow": None if self.follow is None else self.follow.as_json(),
        }

    def render(self) -> str:
        """Human-readable: the cited lines at their revision, then where they are at HEAD."""
        h = self.handle
        head = f"{self.citation} {h.title} — {h.path} @ {h.revision[:12]}"
        if self.degraded:
            head += " (shown un-numbered: resolved to the whole document)"
        out = [head, *(f"{n:>6}  {t}" for n, t in self.lines)]
        f = self.follow
        if f is not None:
            if f.status == "deleted":
                where = f"deleted at HEAD {(f.revision or '')[:12]}" + (
                    f" (document now at {f.path})" if f.path else ""
                )
                out.append(f"now: {where}")
            else:
                out.append(f"now: {f.status} — {f.path} @ {(f.revision or '')[:12]} {line_span(f.start, f.end)}")
                out += [f"{n:>6}  {t}" for n, t in f.lines]
        return "\n".join(out)


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


class Conversation:
    """One chat's reads and citations in one workspace (design §8). Obtain it with
    ``kb.conversation(workspace_id, chat_id)``; it holds no connection between calls."""

    def __init__(
        self,
        store: KnowledgeStore,
        chat_id: str,
        *,
        search: Callable[[str, int], list[Envelope]],
        read_document: Callable[[str, str | None], Envelope],
    ) -> None:
        """``store``: the workspace's store; ``search(query, k)`` and ``read_document(path,
        revision)``: the workspace's hybrid search and full-view read, which live above this layer
        (the facade hands them in, design §18). Raises InvalidChat, WorkspaceNotFound."""
        self.workspace_id = store.workspace_id
        self.chat_id = registry.check_chat_id(chat_id)
        self._store = store
        self._store.require_exists()
        self._database_url = store.database_url
        self._search = search
        self._read_document = read_document

    # -- reading -----------------------------------------------------------------------------
    def search(self, query: str, k: int = 5) -> list[Envelope]:
        """Hybrid search (``kb.search``) whose envelopes carry this chat's handles as ``cite``.

        Returns excerpt envelopes best first; raises InvalidInput like ``kb.search``.
        """
        envelopes = self._search(query, k)
        showings = [self._showing(e) for e in envelopes]
        with database.pooled_transaction(self._database_url) as conn:
            handles = registry.register(conn, self.workspace_id, self.chat_id, showings)
        for envelope, handle in zip(envelopes, handles):
            envelope.cite = handle.n
        return envelopes

    def read(self, path: str, revision: str | None = None, offset: int = 0, limit: int | None = None) -> Envelope:
        """Lines ``offset+1 … offset+limit`` of a document at HEAD or ``revision``, with their true
        line numbers, registered as a numbered handle of this chat (design §8).

        ``offset`` ≥ 0 lines skipped, ``limit`` ≥ 0 most lines shown (None: to the end). The
        envelope's view is ``full`` when every line is shown, else ``window`` with
        ``total_lines``. Raises InvalidInput (OffsetOutOfRange: ``offset`` past the line count),
        InvalidPath, IsAFolder, DocumentNotFound, RevisionNotFound.
        """
        full = self._read_document(path, revision)
        full.content_id = _git_blob_id(self._store.read_as_of(full.revision, full.path))
        envelope = full.window(offset, limit)
        shown = envelope.lines
        showing = Showing(envelope.path, envelope.content_id, envelope.revision, envelope.title, bool(shown))
        with database.pooled_transaction(self._database_url) as conn:
            envelope.cite = registry.register(conn, self.workspace_id, self.chat_id, [showing])[0].n
        return envelope

    def _showing(self, envelope: Envelope) -> Showing:
        """What to register for a search envelope: its blob and a revision that holds that blob at
        that path (the indexed revision, or — when the document moved since — the newest recorded
        revision that wrote it there, or HEAD)."""
        repo = self._store.repository
        repo_path = StorePath.parse(envelope.path).repo_path
        revision = envelope.revision
        if revision is None or repo.lookup(repo.tree_id(revision), repo_path) != envelope.content_id:
            with database.pooled_connection(self._database_url) as conn:
                row = conn.execute(
                    queries["revision_holding_blob"],
                    {
                        "workspace_id": self.workspace_id,
                        "path": repo_path,
                        "content_id": envelope.content_id,
                    },
                ).fetchone()
            head = self._store.head()
            if row is not None:
                revision = row["revision_id"]
            elif head and repo.lookup(repo.tree_id(head), repo_path) == envelope.content_id:
                revision = head
        numbered = any(n is not None for n, _ in envelope.lines)
        return Showing(envelope.path, envelope.content_id, revision or "", envelope.title, numbered)

    # -- the registry ------------------------------------------------------------------------
    def handles(self) -> list[Handle]:
        """Every handle of this chat, by number (empty for a new or forgotten chat)."""
        with database.pooled_connection(self._database_url) as conn:
            return registry.handles(conn, self.workspace_id, self.chat_id)

    def forget(self) -> int:
        """Delete this chat's handles; returns how many numbers it had handed out. A later search
        starts again at [1]."""
        with database.pooled_transaction(self._database_url) as conn:
            return registry.forget(conn, self.workspace_id, self.chat_id)

    def _lines_of(self, handle: Handle) -> list[str]:
        """The document's lines at the handle's revision, read with ``read_as_of`` (design §8). When
        that revision no longer holds the registered blob at that path, the registered blob itself
        (by id) is read — the exact text that was shown."""
        data = None
        if handle.revision:  # empty when no recorded revision held the blob there (see _showing)
            try:
                data = self._store.read_as_of(handle.revision, handle.path)
            except (DocumentNotFound, IsAFolder):
                data = None
        if data is None or _git_blob_id(data) != handle.content_id:
            data = self._store.repository.blob(handle.content_id)
        return document_lines(data)

    # -- citations ---------------------------------------------------------------------------
    def normalize(self, text: str, *, drop_unknown: bool = False) -> NormalizedText:
        """Rewrite the citations in ``text`` canonically against this chat's handles (rules in
        :mod:`kb.citations.normalizer`, design §8).

        Handles the chat does not have are reported in ``unknown`` and kept as written, unless
        ``drop_unknown``. Raises InvalidInput for non-text or text with a lone surrogate
        (``normalizer.check_text``), UnknownChat when the chat has no
        handles at all (a mistyped, forgotten or expired chat: normalizing against it would treat
        every citation as unknown), leaving the text untouched.
        """
        check_text(text)  # before any lookup: a text no answer can carry is the caller's to fix
        known = {h.n: h for h in self.handles()}
        if not known:
            raise UnknownChat(
                f"chat {self.chat_id!r} has no handles in workspace {self.workspace_id} (never shown a "
                "document, forgotten, or expired after KB_CITATION_TTL), so its citations cannot be "
                f"checked; nothing was changed. Check the chat id (`kb cite list --chat {self.chat_id} "
                f"-w {self.workspace_id}`), or search or read as this chat first"
            )
        counts: dict[int, int] = {}

        def lookup(n: int) -> HandleInfo | None:
            handle = known.get(n)
            if handle is None:
                return None
            if n not in counts:
                counts[n] = len(self._lines_of(handle))
            return HandleInfo(handle.numbered, counts[n])

        result = normalize(text, lookup, drop_unknown=drop_unknown)
        if known:
            with database.pooled_transaction(self._database_url) as conn:
                registry.mark_used(conn, self.workspace_id, self.chat_id)
        return result

    def resolve(self, citation: Citation | str, follow: bool = False) -> Resolution:
        """The text a citation names, at its handle's revision (design §8).

        ``citation``: a Citation or a string such as ``"[3:L12-L14]"``. A line citation of a
        handle shown un-numbered resolves to the whole document (``degraded``). With ``follow``
        also maps the lines to HEAD (:class:`Follow`). Raises InvalidCitation (unparsable, or
        lines beyond the document's end), UnknownHandle.
        """
        if isinstance(citation, str):
            citation = parse_citation(citation)
        elif not isinstance(citation, Citation):
            raise InvalidCitation(
                f"expected a Citation or a string such as '[3:L12-L14]', not {type(citation).__name__}"
            )
        with database.pooled_transaction(self._database_url) as conn:
            handle = registry.lookup(conn, self.workspace_id, self.chat_id, citation.handle)
            if handle is not None:
                registry.mark_used(conn, self.workspace_id, self.chat_id)
            if handle is not None and follow:
                head = self._store.head()
                path, blobs = self._versions_since(conn, handle, head)
        if handle is None:
            raise UnknownHandle(
                f"chat {self.chat_id!r} has no handle [{citation.handle}]; list them with "
                f"`kb cite list --chat {self.chat_id} --workspace {self.workspace_id}` (handles expire "
                "after KB_CITATION_TTL)"
            )
        lines = self._lines_of(handle)
        numbered = list(enumerate(lines, start=1))
        if not citation.has_lines or not handle.numbered or not lines:
            resolved = Resolution(Citation(handle.n), handle, "document", citation.has_lines, numbered)
            return resolved if not follow else self._with_follow(resolved, lines, 1, len(lines), head, path, blobs)
        start, end = citation.start, citation.end if citation.end is not None else citation.start
        if start < 1 or end > len(lines) or end < start:
            has = f"{len(lines)} line{'' if len(lines) == 1 else 's'}"
            raise InvalidCitation(
                f"{citation} names {line_span(start, end)} but {handle.path} has {has} at "
                f"{handle.revision[:12]}; normalize the answer first "
                f"(`kb cite normalize FILE --chat {self.chat_id} --workspace {self.workspace_id}`)"
            )
        resolved = Resolution(citation, handle, "lines", False, numbered[start - 1 : end])
        return resolved if not follow else self._with_follow(resolved, lines, start, end, head, path, blobs)

    def _with_follow(
        self,
        resolved: Resolution,
        lines: list[str],
        start: int,
        end: int,
        head: str | None,
        path: str,
        blobs: list[str | None],
    ) -> Resolution:
        """``resolved`` with :class:`Follow`: lines ``start``..``end`` of ``lines`` mapped through the
        document's later versions (``blobs``, see :meth:`_versions_since`) to HEAD."""
        repo = self._store.repository
        versions: list[list[str] | None] = []
        for blob in blobs:  # consecutive equal blobs are read once
            versions.append(
                None
                if blob is None
                else versions[-1]
                if versions and blobs[len(versions) - 1] == blob
                else document_lines(repo.blob(blob))
            )
        final = versions[-1] if versions else lines
        if not lines:  # an empty document: unchanged while it stays empty
            mapping = (
                LineMapping("deleted")
                if final is None
                else (LineMapping("unchanged") if not final else LineMapping("changed", 1, len(final)))
            )
        else:
            mapping = follow_history(lines, versions, start, end)
        shown = [] if mapping.start is None else [(n, final[n - 1]) for n in range(mapping.start, mapping.end + 1)]
        follow = Follow(mapping.status, None if final is None else path, head, mapping.start, mapping.end, shown)
        return Resolution(resolved.citation, resolved.handle, resolved.level, resolved.degraded, resolved.lines, follow)

    def _versions_since(self, conn, handle: Handle, head: str | None) -> tuple[str, list[str | None]]:
        """The document's virtual path at HEAD and its blob ids after the handle's revision, oldest
        first (None: removed), from the recorded path changes (``kb.path_changes``), following
        recorded moves (design §3). When git HEAD holds other content at that path than the last
        recorded change (revisions not yet recorded), HEAD's blob is the last version."""
        path = StorePath.parse(handle.path).repo_path
        blobs: list[str | None] = []
        row = conn.execute(
            queries["revision_seq"], {"workspace_id": self.workspace_id, "revision_id": handle.revision}
        ).fetchone()
        # an unrecorded revision: no history to walk, the blob is compared with HEAD directly
        seq, arrived = (row["seq"] if row else 2**62), False
        for _ in range(MAX_MOVES_FOLLOWED):
            rows = conn.execute(
                queries["document_changes_after"], {"workspace_id": self.workspace_id, "path": path, "after_seq": seq}
            ).fetchall()
            moved = None
            for r in rows:
                if arrived:  # the row that brought the document here; its new_path is the former occupant's
                    arrived = False
                    blobs.append(r["content_id"])
                    continue
                if r["new_path"]:
                    moved = r
                    break
                blobs.append(None if r["change"] in ("removed", "moved_away") else r["content_id"])
            if moved is None:
                break
            path, seq, arrived = moved["new_path"], moved["seq"] - 1, True
        at_head = self._store.repository.lookup(self._store.repository.tree_id(head), path) if head else None
        last = blobs[-1] if blobs else handle.content_id
        if at_head != last:
            blobs.append(at_head)
        return "/" + path, blobs
