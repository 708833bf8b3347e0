"""The citation registry in Postgres (design §8): per (workspace, chat), handle n → document.

Tables ``kb.citation_chats`` and ``kb.citation_handles`` (``sql/schema.sql``); queries in
``sql/queries/citations.sql``. A handle is keyed on the document's path and content (blob id):
the same text keeps its number across searches and reads whatever else moved HEAD, changed
content of the same path gets a new number, and a handle first shown un-numbered becomes numbered
once the chat is shown numbered lines of it. Numbers count 1, 2, 3… per chat in order of first
appearance; concurrent registrations in one chat are serialized on the chat row's lock, so no
number is handed out twice. Never a chunk id.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from kb.db.sql import queries
from kb.errors import InvalidChat

if TYPE_CHECKING:
    from kb.db.database import Connection

MAX_CHAT_ID_CHARS = 200


@dataclass(frozen=True)
class Handle:
    """One registered handle: number ``n``, the document's virtual ``path`` and ``content_id``
    (blob id), a ``revision`` holding that blob at that path, its ``title``, and whether the chat
    was shown numbered lines of it."""

    n: int
    path: str
    content_id: str
    revision: str
    title: str
    numbered: bool
    created_at: datetime | None = None

    def as_json(self) -> dict:
        """``{cite: "[n]", n, path, content_id, revision, title, numbered}``."""
        return {
            "cite": f"[{self.n}]",
            "n": self.n,
            "path": self.path,
            "content_id": self.content_id,
            "revision": self.revision,
            "title": self.title,
            "numbered": self.numbered,
        }


@dataclass(frozen=True)
class Showing:
    """One document as shown to a chat, to register: path, blob id, revision holding it, title, and
    whether numbered lines of it were shown."""

    path: str
    content_id: str
    revision: str
    title: str
    numbered: bool


def check_chat_id(chat_id: object) -> str:
    """Return ``chat_id`` when it is a usable chat id: 1–200 characters of text with no control
    characters or lone surrogates. Raises InvalidChat saying what is wrong."""
    if not isinstance(chat_id, str):
        raise InvalidChat(f"a chat id must be text, not {type(chat_id).__name__}")
    if not chat_id.strip():
        raise InvalidChat(
            'the chat id is empty; pass the conversation\'s id, e.g. conversation(1, "support-4711")',
            cli="the chat id is empty; pass the conversation's id, e.g. --chat support-4711",
        )
    if len(chat_id) > MAX_CHAT_ID_CHARS:
        raise InvalidChat(f"the chat id has {len(chat_id)} characters; use at most {MAX_CHAT_ID_CHARS}")
    for ch in chat_id:
        category = unicodedata.category(ch)
        if category == "Cc" or category == "Cs":
            raise InvalidChat(f"the chat id contains the control character {ch!r}; remove it")
    return chat_id


def _handle(row: dict) -> Handle:
    return Handle(
        row["n"],
        "/" + row["path"],
        row["content_id"],
        row["revision"],
        row["title"],
        row["numbered"],
        row.get("created_at"),
    )


def register(conn: Connection, workspace_id: int, chat_id: str, showings: list[Showing]) -> list[Handle]:
    """Handles of ``showings`` in order (existing ones reused, new ones numbered next), in the
    caller's transaction; the chat row stays locked until it ends. Paths are virtual."""
    params = {"workspace_id": workspace_id, "chat_id": chat_id}
    conn.execute(queries["touch_citation_chat"], params)
    handles = []
    for s in showings:
        row = conn.execute(
            queries["register_citation_handle"],
            {
                **params,
                "path": s.path.lstrip("/"),
                "content_id": s.content_id,
                "revision": s.revision,
                "title": s.title,
                "numbered": s.numbered,
            },
        ).fetchone()
        handles.append(_handle(row))
    return handles


def lookup(conn: Connection, workspace_id: int, chat_id: str, n: int) -> Handle | None:
    """Handle ``n`` of the chat, or None."""
    row = conn.execute(
        queries["citation_handle"], {"workspace_id": workspace_id, "chat_id": chat_id, "n": n}
    ).fetchone()
    return None if row is None else _handle(row)


def handles(conn: Connection, workspace_id: int, chat_id: str) -> list[Handle]:
    """Every handle of the chat, by number."""
    rows = conn.execute(queries["citation_handles"], {"workspace_id": workspace_id, "chat_id": chat_id}).fetchall()
    return [_handle(r) for r in rows]


def mark_used(conn: Connection, workspace_id: int, chat_id: str) -> None:
    """Push the chat's expiry back (KB_CITATION_TTL counts from the last use)."""
    conn.execute(queries["mark_citation_chat_used"], {"workspace_id": workspace_id, "chat_id": chat_id})


def forget(conn: Connection, workspace_id: int, chat_id: str) -> int:
    """Delete the chat and its handles; returns how many handles it had handed out (0: unknown chat)."""
    row = conn.execute(queries["forget_citation_chat"], {"workspace_id": workspace_id, "chat_id": chat_id}).fetchone()
    return 0 if row is None else row["handle_count"]


def expire(conn: Connection, ttl_seconds: float) -> int:
    """Delete chats unused for ``ttl_seconds`` seconds (with their handles); returns how many."""
    return conn.execute(queries["expire_citation_chats"], {"ttl_seconds": ttl_seconds}).fetchone()["chats"]
