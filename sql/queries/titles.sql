-- Named queries of documents named by title (kb/store/titles.py, kb/store/projection.py; design §2.2, §5, §6).

-- name: insert_recorded_title
-- Written in the revision's transaction, under the write lock.
INSERT INTO kb.recorded_titles (workspace_id, seq, path, title)
VALUES (%(workspace_id)s, %(seq)s, %(path)s, %(title)s)
ON CONFLICT (workspace_id, seq, path) DO UPDATE SET title = EXCLUDED.title;

-- name: recorded_titles_since
-- Titles recorded after a revision sequence number, oldest first (the projection follows later
-- recorded moves from each and applies the newest title per document).
SELECT seq, path, title FROM kb.recorded_titles
WHERE workspace_id = %(workspace_id)s AND seq > %(after_seq)s
ORDER BY seq, path;

-- name: latest_recorded_title
-- The title last recorded for a path (a document created by title whose row the projection has
-- not written yet).
SELECT title FROM kb.recorded_titles
WHERE workspace_id = %(workspace_id)s AND path = %(path)s
ORDER BY seq DESC
LIMIT 1;

-- name: set_document_title
UPDATE kb.documents SET title = %(title)s, updated_at = now()
WHERE workspace_id = %(workspace_id)s AND path = %(path)s AND title IS DISTINCT FROM %(title)s
RETURNING id;
