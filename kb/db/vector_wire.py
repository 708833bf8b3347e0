"""pgvector's binary wire format for the vectors an index run writes and reads (design §7).

An index run writes every chunk's vector twice (the chunk row and the embedding cache). As text
(``[x1,x2,...]``), Python formatted each of them and Postgres parsed each back: on 1,500 tldr
pages (2,927 vectors of 384 floats) 0.12 s of Python CPU to format and about 0.1 s of Postgres CPU
per statement to parse. In pgvector's binary form (what its ``vector_send``/``vector_recv``
exchange: int16 dimensions, int16 zero, then each float4 big-endian) numpy packs a vector in a
microsecond and Postgres copies it in.

``VectorBytes`` holds one vector in that form; ``register(conn)`` teaches a connection to send
it (and lists of it, as ``vector[]``) as a binary parameter — the statement's placeholder must be
binary (``%(name)b``) — and to load a binary ``vector`` column as VectorBytes (a cursor opened
with ``binary=True``), so a cached vector goes back to Postgres unparsed.
"""

from __future__ import annotations

import struct
import weakref
from typing import TYPE_CHECKING, Any

from psycopg.adapt import Dumper, Loader
from psycopg.pq import Format
from psycopg.types import TypeInfo

from kb.errors import ConfigurationError, EmbeddingError

if TYPE_CHECKING:
    import numpy as np

    from kb.db.database import Connection

_HEADER = struct.Struct(">HH")
MAX_DIMENSIONS = 16000
"""pgvector's limit on a vector's dimensions (VECTOR_MAX_DIM)."""


class VectorBytes:
    """One vector in pgvector's binary form (``data``)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VectorBytes) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return f"VectorBytes({len(self.data)} bytes)"


def vector_bytes(vector: np.ndarray) -> VectorBytes:
    """``vector`` (a 1-d array of floats, of at most 16,000 dimensions, pgvector's limit) in
    pgvector's binary form, as float4 (float64 rounded once, to the nearest float4; -0.0 and
    subnormals kept). Raises EmbeddingError when a value is NaN or infinite as a float4 (a float64
    beyond float4's range too: Postgres would refuse the statement carrying it, design §7) or the
    array is not a 1-d vector of 1 to 16,000 values."""
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):
        values = np.asarray(vector, dtype=">f4")
    if values.ndim != 1 or not 0 < values.shape[0] <= MAX_DIMENSIONS:
        raise EmbeddingError(f"a vector must have 1 to {MAX_DIMENSIONS} values, not shape {values.shape}")
    if not np.isfinite(values).all():
        raise EmbeddingError("a vector holds NaN or inf (as float4): pgvector stores finite values only")
    return VectorBytes(_HEADER.pack(values.shape[0], 0) + values.tobytes())


def vectors_bytes(vectors: np.ndarray) -> list[VectorBytes | None]:
    """``vector_bytes`` of each row of a 2-d array (an embedder batch), converted to float4
    together: what an index run packs its fresh vectors with, one numpy conversion per batch
    instead of one per vector (design §7). A row ``vector_bytes`` refuses (NaN or inf as a
    float4) is None; an array that is not 2-d, or whose rows are not 1 to 16,000 values, raises
    EmbeddingError."""
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):
        values = np.asarray(vectors, dtype=">f4")
    if values.ndim != 2 or not 0 < values.shape[1] <= MAX_DIMENSIONS:
        raise EmbeddingError(f"vectors must be rows of 1 to {MAX_DIMENSIONS} values, not shape {values.shape}")
    header = _HEADER.pack(values.shape[1], 0)
    finite = np.isfinite(values).all(axis=1).tolist()
    return [VectorBytes(header + row.tobytes()) if ok else None for row, ok in zip(values, finite)]


class _VectorDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return obj.data


class _VectorLoader(Loader):
    format = Format.BINARY

    def load(self, data: Any) -> VectorBytes:
        return VectorBytes(bytes(data))


_registered: weakref.WeakKeyDictionary[Connection, bool] = weakref.WeakKeyDictionary()


def register(conn: Connection) -> None:
    """Let ``conn`` send VectorBytes (and lists of them) as binary ``vector`` / ``vector[]``
    parameters and load binary ``vector`` columns as VectorBytes. One catalog query the first time
    per connection, none after. Raises ConfigurationError when pgvector's type cannot be found."""
    if conn in _registered:
        return
    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        raise ConfigurationError("pgvector's vector type is not installed in this database (CREATE EXTENSION vector)")
    info.register(conn)  # the array type too, so a list of VectorBytes is sent as vector[]
    conn.adapters.register_dumper(VectorBytes, type("VectorDumper", (_VectorDumper,), {"oid": info.oid}))
    conn.adapters.register_loader(info.oid, _VectorLoader)
    _registered[conn] = True
