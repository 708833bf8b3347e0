"""design §7: an index run sends its vectors to Postgres in pgvector's binary form
(kb.db.vector_wire) and reads cached ones back in it; both name exactly the float4s the text form
names."""

from __future__ import annotations

import numpy as np
from support.named_queries import queries

from kb.db import database, vector_wire
from kb.index.embedding import vector_literal


def test_binary_vectors_store_the_float4s_the_text_form_stores(database_url):
    rng = np.random.default_rng(7)
    # float4s, as embedders give them (float64 is rounded once, to the nearest float4: the text
    # form's nine digits rounded some twice, one unit in the last place off)
    vectors = [rng.standard_normal(384).astype(np.float32), np.zeros(3), np.array([1e-30, -3.5, 65504.0, 0.5])]
    with database.connect(database_url, autocommit=True) as conn:
        vector_wire.register(conn)
        vector_wire.register(conn)  # once per connection: a second call changes nothing
        packed = [vector_wire.vector_bytes(v) for v in vectors]
        with conn.cursor(binary=True) as cur:
            rows = cur.execute(queries["test_vectors_binary_as_floats"], {"vectors": packed}).fetchall()
        for vector, row, sent in zip(vectors, rows, packed):
            expected = conn.execute(queries["test_vector_as_floats"], {"literal": vector_literal(vector)}).fetchone()[
                "floats"
            ]
            # float4s both ways (the text result reads them back in their shortest decimal form)
            as_float4 = [np.asarray(floats, dtype=np.float32) for floats in (row["floats"], expected, vector)]
            assert np.array_equal(as_float4[0], as_float4[1]) and np.array_equal(as_float4[0], as_float4[2])
            assert row["vector"] == sent  # read back in binary: the same bytes, unparsed
        wide = rng.standard_normal(384)
        with conn.cursor(binary=True) as cur:
            [row] = cur.execute(queries["test_vectors_binary_as_floats"], {"vectors": [vector_wire.vector_bytes(wide)]})
        assert np.array_equal(np.asarray(row["floats"], dtype=np.float32), wide.astype(np.float32))


def test_odd_floats_travel_exactly_and_nan_or_inf_is_refused_before_postgres(database_url):
    """-0.0, float4 subnormals and float64 input arrive as the float4s they round to; NaN, inf and
    a float64 beyond float4's range are refused with EmbeddingError (not a psycopg error from the
    statement), as is an array that is not a vector."""
    import pytest

    from kb.errors import EmbeddingError

    odd = np.array([-0.0, 1e-45, -1.4e-45, 1.17e-38, 3.4028234e38, 1e-50, 0.1], dtype=np.float64)
    with database.connect(database_url, autocommit=True) as conn:
        vector_wire.register(conn)
        with conn.cursor(binary=True) as cur:
            [row] = cur.execute(queries["test_vectors_binary_as_floats"], {"vectors": [vector_wire.vector_bytes(odd)]})
        back = np.asarray(row["floats"], dtype=np.float32)
        assert back.tobytes() == odd.astype(np.float32).tobytes()  # -0.0 keeps its sign bit
    for bad in ([np.nan, 1.0], [np.inf, 0.0], [1e39, 0.0], [[1.0, 2.0]], [], np.zeros(16001)):
        with pytest.raises(EmbeddingError):
            vector_wire.vector_bytes(np.asarray(bad, dtype=np.float64))


def test_an_embedder_batch_packs_to_the_bytes_of_its_vectors_one_by_one():
    """``vectors_bytes`` (one conversion per batch, what an index run packs with) gives each row
    exactly ``vector_bytes``' bytes, float32 or float64 rows, odd floats included; a row that is
    NaN or inf as a float4 is None, and a batch that is not rows of a vector is refused."""
    import pytest

    from kb.errors import EmbeddingError

    rng = np.random.default_rng(3)
    odd = [-0.0, 1e-45, -1.4e-45, 1.17e-38, 3.4028234e38, 1e-50, 0.1]
    for batch in (rng.standard_normal((40, 384)).astype(np.float32), np.array([odd, odd[::-1]], dtype=np.float64)):
        assert vector_wire.vectors_bytes(batch) == [vector_wire.vector_bytes(row) for row in batch]
    mixed = np.array([[1.0, 2.0], [np.nan, 0.0], [1e39, 0.0], [0.5, -0.5]])
    packed = vector_wire.vectors_bytes(mixed)
    assert packed[0] == vector_wire.vector_bytes(mixed[0]) and packed[3] == vector_wire.vector_bytes(mixed[3])
    assert packed[1] is None and packed[2] is None
    for bad in (np.zeros(3), np.zeros((2, 0)), np.zeros((1, 16001))):
        with pytest.raises(EmbeddingError):
            vector_wire.vectors_bytes(bad)
