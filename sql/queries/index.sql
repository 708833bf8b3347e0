-- Named queries of the derived index (kb/indexer.py, SPEC §7).

-- name: try_index_lock
SELECT pg_try_advisory_lock(%(namespace)s, %(workspace_id)s) AS locked;

-- name: index_unlock
SELECT pg_advisory_unlock(%(namespace)s, %(workspace_id)s);

-- name: documents_to_index
-- Documents whose indexed content lags their projected content, excluding quarantined and
-- unindexable ones (a content change resets those to pending).
SELECT id, path, content_id, index_attempts
FROM kb.documents
WHERE workspace_id = %(workspace_id)s
  AND content_id IS DISTINCT FROM indexed_content_id
  AND status NOT IN ('quarantined', 'unindexable')
ORDER BY id;

-- name: cached_embeddings
SELECT text_sha256, embedding::text AS embedding
FROM kb.embedding_cache
WHERE model = %(model)s AND dim = %(dim)s AND text_sha256 = ANY(%(hashes)s);

-- name: cache_embedding
INSERT INTO kb.embedding_cache (text_sha256, model, dim, embedding)
VALUES (%(text_sha256)s, %(model)s, %(dim)s, %(embedding)s::vector)
ON CONFLICT DO NOTHING;

-- name: document_chunks
SELECT id, position, text_sha256, start_char, end_char, start_line, end_line, embedding_model
FROM kb.chunks WHERE document_id = %(document_id)s ORDER BY position;

-- name: update_chunk_position
UPDATE kb.chunks
SET position = %(position)s, start_char = %(start_char)s, end_char = %(end_char)s,
    start_line = %(start_line)s, end_line = %(end_line)s
WHERE id = %(id)s;

-- name: insert_chunk
INSERT INTO kb.chunks (document_id, workspace_id, position, text, text_sha256, start_char, end_char,
                       start_line, end_line, token_count, embedding_model, embedding, tsv)
VALUES (%(document_id)s, %(workspace_id)s, %(position)s, %(text)s, %(text_sha256)s, %(start_char)s,
        %(end_char)s, %(start_line)s, %(end_line)s, %(token_count)s, %(model)s, %(embedding)s::vector,
        to_tsvector(%(fts_config)s::regconfig, %(title)s || ' ' || %(text)s));

-- name: delete_chunks
DELETE FROM kb.chunks WHERE id = ANY(%(ids)s);

-- name: mark_document_indexed
UPDATE kb.documents
SET status = 'indexed', indexed_content_id = %(content_id)s, indexed_revision = %(revision_id)s,
    index_error = NULL, index_attempts = 0
WHERE id = %(document_id)s AND content_id = %(content_id)s;

-- name: mark_document_unindexable
UPDATE kb.documents
SET status = 'unindexable', indexed_content_id = %(content_id)s, indexed_revision = %(revision_id)s,
    index_error = %(error)s
WHERE id = %(document_id)s AND content_id = %(content_id)s;

-- name: delete_document_chunks
DELETE FROM kb.chunks WHERE document_id = %(document_id)s;

-- name: mark_document_failed
UPDATE kb.documents
SET index_attempts = index_attempts + 1,
    status = CASE WHEN index_attempts + 1 >= %(max_attempts)s THEN 'quarantined' ELSE 'failed' END,
    index_error = %(error)s
WHERE id = %(document_id)s
RETURNING status;

-- name: set_index_stamp
UPDATE kb.workspaces SET last_indexed_revision = %(revision_id)s WHERE id = %(workspace_id)s;

-- name: document_title
SELECT title FROM kb.documents WHERE id = %(document_id)s;

-- name: chunk_vector_dimension
-- The dimension of kb.chunks.embedding as declared (vector(N)), or NULL when undeclared.
SELECT nullif(a.atttypmod, -1) AS dim
FROM pg_attribute a
WHERE a.attrelid = 'kb.chunks'::regclass AND a.attname = 'embedding';

-- name: reset_index_state
-- (issue 5: the minimal reindex; issue 4's richer reindex may replace it.)
-- Make every document of a workspace lag its content so the next index run rebuilds its chunks.
UPDATE kb.documents
SET indexed_content_id = NULL, status = 'pending', index_attempts = 0, index_error = NULL
WHERE workspace_id = %(workspace_id)s AND status <> 'unindexable';
