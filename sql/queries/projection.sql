-- Named queries of the projection (kb/store/projection.py): documents and folders rows from git (design §6).

-- name: lock_projection
SELECT pg_advisory_xact_lock(%(namespace)s, %(workspace_id)s);

-- name: revision_seq
SELECT seq FROM kb.revisions WHERE workspace_id = %(workspace_id)s AND id = %(revision_id)s;

-- name: document_paths
SELECT id, path, content_id, document_type FROM kb.documents WHERE workspace_id = %(workspace_id)s;

-- name: document_rows_at
-- The rows at some paths (an incremental projection loads only the paths a diff or a move touched).
SELECT id, path, content_id, document_type
FROM kb.documents WHERE workspace_id = %(workspace_id)s AND path = ANY(%(paths)s);

-- name: recorded_moves_since
-- Document moves the store recorded after a sequence number, oldest revision first (design §6: a
-- recorded move keeps the document id; no similarity rename detection).
SELECT seq, revision_id, old_path, path AS new_path
FROM kb.path_changes
WHERE workspace_id = %(workspace_id)s AND change = 'moved' AND seq > %(after_seq)s
ORDER BY seq, path;

-- name: move_document
-- A path-keyed type (NOTE, ARTIFACT) gets the hash of its new path (design §2.4); others keep theirs.
UPDATE kb.documents
SET path = %(new_path)s,
    unique_identifier_hash = coalesce(%(uid_hash)s::text, unique_identifier_hash),
    updated_at = now()
WHERE workspace_id = %(workspace_id)s AND path = %(old_path)s
RETURNING id;

-- name: upsert_documents
-- A new file becomes a NOTE titled from its file name; an existing row keeps its type, metadata
-- and title (they are Postgres' own, design §1). A content change resets the index state. One
-- statement for up to kb.store.projection.STATEMENT_ROWS of the run's changed files (parallel
-- columns, one element per file, paths distinct), taken in their order: new rows get their ids in
-- that order and existing rows are locked in it. The columns are JSON arrays (kb.store.history.json_column): psycopg dumps a list
-- into an array value by value in Python, ~8 ms of a 1,500-file projection, the serial start of a
-- first index run, against ~1 ms.
INSERT INTO kb.documents (workspace_id, path, title, document_type, unique_identifier_hash,
                          content_id, revision_id)
SELECT %(workspace_id)s, u.path, u.title, 'NOTE', u.uid_hash, u.content_id, %(revision_id)s
FROM ROWS FROM (json_array_elements_text(%(paths)s::json), json_array_elements_text(%(titles)s::json),
                json_array_elements_text(%(uid_hashes)s::json), json_array_elements_text(%(content_ids)s::json))
     WITH ORDINALITY AS u (path, title, uid_hash, content_id, n)
ORDER BY u.n
ON CONFLICT (workspace_id, path) DO UPDATE
SET content_id = EXCLUDED.content_id,
    revision_id = EXCLUDED.revision_id,
    status = CASE WHEN kb.documents.content_id IS DISTINCT FROM EXCLUDED.content_id
                  THEN 'pending' ELSE kb.documents.status END,
    index_attempts = CASE WHEN kb.documents.content_id IS DISTINCT FROM EXCLUDED.content_id
                          THEN 0 ELSE kb.documents.index_attempts END,
    updated_at = now()
WHERE kb.documents.content_id IS DISTINCT FROM EXCLUDED.content_id
RETURNING id, path, content_id, document_type, (xmax = 0) AS inserted;

-- name: delete_document
DELETE FROM kb.documents WHERE workspace_id = %(workspace_id)s AND path = %(path)s RETURNING id, path;

-- name: folder_paths
SELECT id, path FROM kb.folders WHERE workspace_id = %(workspace_id)s;

-- name: insert_folder
INSERT INTO kb.folders (workspace_id, path, name, parent_path)
VALUES (%(workspace_id)s, %(path)s, %(name)s, %(parent_path)s)
ON CONFLICT (workspace_id, path) DO NOTHING
RETURNING id;

-- name: move_folder
UPDATE kb.folders SET path = %(new_path)s, name = %(name)s, parent_path = %(parent_path)s
WHERE workspace_id = %(workspace_id)s AND path = %(old_path)s
RETURNING id;

-- name: delete_folder
DELETE FROM kb.folders WHERE workspace_id = %(workspace_id)s AND path = %(path)s RETURNING id;

-- name: moved_documents_indexed_at
-- Moved documents whose indexed content is the content they have at the projected revision (a
-- move without an edit is not re-indexed) are stamped as indexed at that revision: a search
-- envelope's (path, revision) must name the document where it is, and with the old stamp the new
-- path did not exist at that revision (`kb read PATH --revision REV` failed). Their chunks' line
-- spans stay right: the blob is the same.
UPDATE kb.documents
SET indexed_revision = %(revision_id)s, indexed_path = path
WHERE workspace_id = %(workspace_id)s AND id = ANY (%(ids)s)
  AND indexed_content_id = content_id AND indexed_revision IS DISTINCT FROM %(revision_id)s;

-- name: set_projected_revision
UPDATE kb.workspaces SET last_projected_revision = %(revision_id)s WHERE id = %(workspace_id)s;

-- name: notify_event
-- A change event (design §5, §6); delivered to listeners when the projection's transaction commits.
SELECT pg_notify(%(channel)s, %(payload)s);

-- name: notify_events
-- Change events (design §5, §6) in one statement, in the order given (a JSON array of payload
-- texts, kb.store.history.json_column), up to kb.store.projection.STATEMENT_ROWS of them: a
-- projection of a 1,500-file import sent 1,500 statements, ~35 ms of an index run's serial start
-- against ~9 ms. Delivered when the transaction commits.
SELECT count(pg_notify(%(channel)s, e.payload)) AS sent
FROM json_array_elements_text(%(payloads)s::json) AS e (payload);

-- name: listen_events
-- Hear the change events (the pages' live updates, design §17).
LISTEN kb_events;
