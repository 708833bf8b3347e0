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
