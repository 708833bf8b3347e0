-- Named queries of per-workspace embedding models (kb/index/models.py, kb/index/model_switch.py; design §7).

-- name: workspace_embedder
-- The model a workspace's vectors and queries use (NULL: not chosen yet) and the one a running
-- switch re-embeds it into (NULL: none).
SELECT embedder, next_embedder FROM kb.workspaces WHERE id = %(workspace_id)s;

-- name: pin_workspace_embedder
-- Record a workspace's model where none is recorded yet (auto's choice at the first index run, a
-- seed's legacy model); returns the model recorded now or before.
WITH pinned AS (
    UPDATE kb.workspaces SET embedder = %(embedder)s WHERE id = %(workspace_id)s AND embedder IS NULL
    RETURNING embedder
)
SELECT embedder FROM pinned
UNION ALL
SELECT embedder FROM kb.workspaces WHERE id = %(workspace_id)s AND NOT EXISTS (SELECT 1 FROM pinned);

-- name: start_model_switch
-- A switch's target (kb workspace set-model); returns the model the workspace uses meanwhile.
UPDATE kb.workspaces SET next_embedder = %(embedder)s WHERE id = %(workspace_id)s RETURNING embedder;

-- name: workspace_languages_sample
-- The indexed or projected content of up to %(limit)s documents, for auto's language count.
SELECT coalesce(indexed_content_id, content_id) AS content_id
FROM kb.documents
WHERE workspace_id = %(workspace_id)s AND coalesce(indexed_content_id, content_id) IS NOT NULL
ORDER BY id
LIMIT %(limit)s;

-- name: documents_to_reembed
-- Documents of the workspace holding chunks whose vectors are not of %(model)s yet, with the
-- content their chunks were cut from; with %(uncached)s only those whose new vector is not in the
-- embedding cache either.
SELECT d.id, d.path, d.title, d.indexed_content_id AS content_id
FROM kb.documents AS d
WHERE d.workspace_id = %(workspace_id)s AND d.indexed_content_id IS NOT NULL
  AND EXISTS (
    SELECT 1 FROM kb.chunks AS c
    WHERE c.document_id = d.id AND c.embedding_model <> %(model)s
      AND (NOT %(uncached)s OR NOT EXISTS (
        SELECT 1 FROM kb.embedding_cache AS e
        WHERE e.text_sha256 = c.text_sha256 AND e.model = %(model)s AND e.dim = %(dim)s)))
ORDER BY d.id;

-- name: swap_chunk_vectors
-- The switch's last step: every chunk of the workspace whose vector of %(model)s is cached takes it.
UPDATE kb.chunks AS c
SET embedding = e.embedding, embedding_model = %(model)s
FROM kb.embedding_cache AS e
WHERE c.workspace_id = %(workspace_id)s AND c.embedding_model <> %(model)s
  AND e.text_sha256 = c.text_sha256 AND e.model = %(model)s AND e.dim = %(dim)s;

-- name: drop_unswapped_chunks
-- Chunks left without a vector of %(model)s (their text failed to embed): deleted, and their
-- documents set to lag (indexed_content_id NULL) so the next index run embeds them again.
WITH gone AS (
    DELETE FROM kb.chunks
    WHERE workspace_id = %(workspace_id)s AND embedding_model <> %(model)s
    RETURNING document_id
)
UPDATE kb.documents SET indexed_content_id = NULL, status = 'pending'
WHERE id IN (SELECT document_id FROM gone)
RETURNING id;

-- name: finish_model_switch
UPDATE kb.workspaces SET embedder = %(embedder)s, next_embedder = NULL WHERE id = %(workspace_id)s;

-- name: workspace_vector_models
-- Chunks per model in a workspace (the switch's end state: one model).
SELECT embedding_model AS model, count(*) AS n FROM kb.chunks
WHERE workspace_id = %(workspace_id)s GROUP BY embedding_model ORDER BY embedding_model;
