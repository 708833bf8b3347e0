-- Named queries of the index/search benchmark (bin/bench_index.py, SPEC §14).

-- name: bench_delete_workspace_chunks
-- Wipe a workspace's chunk rows (they are disposable, SPEC §1) to time a rebuild from the cache.
DELETE FROM kb.chunks WHERE workspace_id = %(workspace_id)s;

-- name: bench_vector_leg
-- The vector leg of hybrid_search on its own: the workspace's nearest chunks by cosine distance.
SELECT id FROM kb.chunks
WHERE workspace_id = %(workspace_id)s AND embedding IS NOT NULL
ORDER BY embedding <=> %(embedding)s::vector, id
LIMIT %(k)s;

-- name: bench_all_embeddings
SELECT id, embedding::text AS embedding FROM kb.chunks WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: bench_sample_chunks
SELECT text FROM kb.chunks WHERE workspace_id = %(workspace_id)s ORDER BY md5(id::text) LIMIT %(n)s;
