"""Which stored documents the index can take (design §7): the one rule, shared by the indexer
(which marks the others ``unindexable``) and ``kb import`` (which names them when they come in).

A document kb cannot index stays in git untouched — readable, citable, in history — but search
never finds it: its bytes are not UTF-8 text Postgres can hold, or it is larger than
``KB_MAX_INDEX_BYTES``.
"""

from __future__ import annotations

from kb.errors import UnindexableDocument


def decode_document(data: bytes, max_bytes: int | None = None) -> str:
    """Decode a blob as UTF-8 text; raises UnindexableDocument for NUL bytes, invalid UTF-8, or
    more than ``max_bytes`` bytes (``KB_MAX_INDEX_BYTES``: a 50 MB document would cut ~100,000
    chunks and take gigabytes of memory in one worker; it stays in git, readable and citable)."""
    if max_bytes is not None and len(data) > max_bytes:
        raise UnindexableDocument(
            f"{len(data):,} bytes is more than KB_MAX_INDEX_BYTES ({max_bytes:,}); split the document "
            "or raise the limit"
        )
    if b"\x00" in data:
        raise UnindexableDocument("contains NUL bytes (Postgres text cannot hold them)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnindexableDocument(f"not valid UTF-8 (byte {exc.start}); save it as UTF-8") from None


def unindexable_reason(data: bytes, max_bytes: int | None = None) -> str | None:
    """Why the index will not take a document with these bytes, or None when it will
    (``decode_document``'s rule). Raises nothing."""
    try:
        decode_document(data, max_bytes)
    except UnindexableDocument as exc:
        return str(exc)
    return None
