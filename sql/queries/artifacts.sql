-- Named queries of artifacts (kb/store/artifact_rows.py, kb/workspace/artifacts.py, design §11).

-- name: artifact_documents_at
-- ARTIFACT document rows at some virtual paths (the store's guard: plain writes are refused). The
-- paths are a JSON array (kb.store.history.json_column): a folder rename's thousands of them, under
-- the write lock.
SELECT d.id, d.path, a.generation
FROM kb.documents d
LEFT JOIN kb.artifacts a ON a.document_id = d.id
WHERE d.workspace_id = %(workspace_id)s AND d.path = ANY(ARRAY(SELECT json_array_elements_text(%(paths)s::json)))
  AND d.document_type = 'ARTIFACT';

-- name: claim_artifact_document
-- The document row of a new artifact, written in its revision's transaction: a claim (no
-- content_id) that projection fills in and never demotes (design §6).
INSERT INTO kb.documents (workspace_id, path, title, document_type, unique_identifier_hash)
VALUES (%(workspace_id)s, %(path)s, %(title)s, 'ARTIFACT', %(uid_hash)s)
ON CONFLICT (workspace_id, path) DO UPDATE
SET document_type = 'ARTIFACT', title = EXCLUDED.title,
    unique_identifier_hash = EXCLUDED.unique_identifier_hash, content_id = NULL, updated_at = now()
RETURNING id;

-- name: upsert_artifact
INSERT INTO kb.artifacts (document_id, workspace_id, format, generation)
VALUES (%(document_id)s, %(workspace_id)s, %(format)s, %(generation)s)
ON CONFLICT (document_id) DO UPDATE
SET format = EXCLUDED.format, generation = EXCLUDED.generation, updated_at = now();

-- name: artifact_for_update
-- An artifact's document row and sidecar (NULL generation: an ARTIFACT row without sidecar).
SELECT d.id, d.workspace_id, d.path, d.title, d.document_type, a.format, a.generation,
       a.created_at, a.updated_at
FROM kb.documents d
LEFT JOIN kb.artifacts a ON a.document_id = d.id
WHERE d.workspace_id = %(workspace_id)s AND d.id = %(document_id)s
FOR UPDATE OF d;

-- name: get_artifact
SELECT d.id, d.workspace_id, d.path, d.title, d.document_type, d.revision_id, a.format,
       a.generation, a.created_at, a.updated_at
FROM kb.documents d
LEFT JOIN kb.artifacts a ON a.document_id = d.id
WHERE d.workspace_id = %(workspace_id)s AND d.id = %(document_id)s;

-- name: list_artifacts
SELECT d.id, d.workspace_id, d.path, d.title, d.document_type, d.revision_id, a.format,
       a.generation, a.created_at, a.updated_at
FROM kb.documents d
LEFT JOIN kb.artifacts a ON a.document_id = d.id
WHERE d.workspace_id = %(workspace_id)s AND d.document_type = 'ARTIFACT'
ORDER BY d.path;

-- name: artifact_files
SELECT document_id, role, size, sha256
FROM kb.artifact_files
WHERE document_id = ANY(%(document_ids)s)
ORDER BY document_id, role;

-- name: delete_artifact_files
DELETE FROM kb.artifact_files WHERE document_id = %(document_id)s RETURNING sha256;

-- name: insert_artifact_file
INSERT INTO kb.artifact_files (document_id, workspace_id, role, size, sha256)
VALUES (%(document_id)s, %(workspace_id)s, %(role)s, %(size)s, %(sha256)s);

-- name: bump_artifact_generations
-- revert/restore of artifacts (design §11): a sidecar-less ARTIFACT row starts at generation 1.
INSERT INTO kb.artifacts (document_id, workspace_id, format, generation)
SELECT d.id, d.workspace_id, 'markdown', 2
FROM kb.documents d
WHERE d.workspace_id = %(workspace_id)s AND d.id = ANY(%(document_ids)s)
ON CONFLICT (document_id) DO UPDATE
SET generation = kb.artifacts.generation + 1, updated_at = now();

-- name: delete_artifact_document
-- The document row goes with its artifact (sidecar and file rows cascade).
DELETE FROM kb.documents WHERE workspace_id = %(workspace_id)s AND id = %(document_id)s;

-- name: delete_artifact_document_at
DELETE FROM kb.documents
WHERE workspace_id = %(workspace_id)s AND path = %(path)s AND document_type = 'ARTIFACT'
RETURNING id;

-- name: request_blob_purges
-- Blobs no artifact of the workspace references any more get a purge entry (kept until removed).
INSERT INTO kb.artifact_blob_purges (workspace_id, sha256)
SELECT %(workspace_id)s, s
FROM unnest(%(shas)s::text[]) AS s
WHERE NOT EXISTS (SELECT 1 FROM kb.artifact_files f WHERE f.workspace_id = %(workspace_id)s AND f.sha256 = s)
ON CONFLICT (workspace_id, sha256) DO NOTHING;

-- name: pending_blob_purges
SELECT sha256, attempts, last_error FROM kb.artifact_blob_purges
WHERE workspace_id = %(workspace_id)s ORDER BY requested_at, sha256;

-- name: workspaces_with_blob_purges
SELECT DISTINCT workspace_id FROM kb.artifact_blob_purges ORDER BY workspace_id;

-- name: blob_referenced
SELECT EXISTS (
    SELECT 1 FROM kb.artifact_files WHERE workspace_id = %(workspace_id)s AND sha256 = %(sha256)s
) AS referenced;

-- name: finish_blob_purge
DELETE FROM kb.artifact_blob_purges WHERE workspace_id = %(workspace_id)s AND sha256 = %(sha256)s;

-- name: fail_blob_purge
UPDATE kb.artifact_blob_purges SET attempts = attempts + 1, last_error = %(error)s
WHERE workspace_id = %(workspace_id)s AND sha256 = %(sha256)s;

-- name: workspace_artifact_files
SELECT f.document_id, d.path, f.role, f.size, f.sha256
FROM kb.artifact_files f JOIN kb.documents d ON d.id = f.document_id
WHERE f.workspace_id = %(workspace_id)s
ORDER BY d.path, f.role;
