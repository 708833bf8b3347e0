"""Idempotency keys of writes (design §3).

Every store transaction and turn commit carries a key: the caller's (``kb.transaction(ws,
idempotency_key=...)``, the HTTP ``Idempotency-Key`` header) or one generated per call. The key is

* written into the commit object as the header ``kb-write-key`` (git keeps unknown headers; the
  message stays the caller's), so a revision git has and Postgres lacks — a writer that died
  after the ref moved — is recorded with its key when the store catches up (``record_missing``);
* recorded in ``kb.write_keys`` in the Postgres transaction that records the revision, under the
  write lock.

Under the lock a write whose key is already recorded records nothing and returns the recorded
revision, so a retry after any failure applies the change at most once; and a writer that lost
its connection settles its own write under the lock (catch up, withdraw its queued intent, look
the key up): the answer is then the truth, landed or not.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from kb.db.sql import queries
from kb.errors import InvalidInput

if TYPE_CHECKING:
    from kb.db.database import Connection

COMMIT_HEADER = b"kb-write-key"
"""The commit header holding a revision's idempotency key."""
MAX_KEY_LENGTH = 200


def new_key() -> str:
    """A fresh random key (one per write whose caller gave none)."""
    return uuid.uuid4().hex


def check_key(key: object) -> str:
    """``key`` when it can be stored as an idempotency key: text, 1 to 200 characters, printable
    (no line break, NUL or other control character), with a UTF-8 form (design §3: the fence hashes
    it, git and Postgres store it). Raises InvalidInput saying what is wrong."""
    if not isinstance(key, str):
        raise InvalidInput(f"an idempotency key must be text, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidInput(f"an idempotency key has 1 to {MAX_KEY_LENGTH} characters, not {len(key)}")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise InvalidInput("an idempotency key cannot hold control characters (line breaks, NUL); use e.g. a UUID")
    try:  # a lone surrogate (a non-UTF-8 byte of a command line, a JSON "\ud800") has no UTF-8 form
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            "an idempotency key must be UTF-8 text (it holds a byte that is not); use e.g. a UUID"
        ) from None
    return key


def key_of_commit(commit) -> str | None:
    """The idempotency key a commit object carries (None for commits made without one)."""
    for name, value in getattr(commit, "_extra", ()) or ():
        if name == COMMIT_HEADER and value is not None:
            return value.decode("utf-8", errors="replace")
    return None


def record(conn: Connection, workspace_id: int, pairs: list[tuple[str, str]]) -> None:
    """Record ``[(key, revision id), …]`` in ``conn``'s transaction (the one recording those
    revisions under the write lock); a key recorded already keeps its first revision."""
    if pairs:
        conn.execute(
            queries["record_write_keys"],
            {"workspace_id": workspace_id, "keys": [k for k, _ in pairs], "revision_ids": [r for _, r in pairs]},
        )


def recorded(conn: Connection, workspace_id: int, keys: list[str]) -> dict[str, str]:
    """``{key: revision id}`` of those ``keys`` that are recorded (call under the write lock for
    an answer that stays true)."""
    if not keys:
        return {}
    rows = conn.execute(queries["recorded_write_keys"], {"workspace_id": workspace_id, "keys": list(keys)})
    return {r["key"]: r["revision_id"] for r in rows.fetchall()}


def withdraw_intents(conn: Connection, workspace_id: int, key: str) -> None:
    """Under the write lock: remove the queued intents carrying ``key`` that no holder recorded,
    so that nothing records them after their writer was told the write was not recorded."""
    conn.execute(queries["withdraw_write_intents_of_key"], {"workspace_id": workspace_id, "key": key})
