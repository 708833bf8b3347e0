-- Named queries of the drift check (kb/legacy/drift.py).

-- name: drift_workspaces
SELECT w.id AS workspace_id, w.last_projected_revision
FROM kb.workspaces w JOIN kb.seeds s ON s.workspace_id = w.id
WHERE (%(workspace_id)s::int IS NULL AND s.flipped) OR w.id = %(workspace_id)s::int
ORDER BY w.id;

-- name: drift_document_rows
SELECT id, path, content_id, indexed_content_id, status FROM kb.documents
WHERE workspace_id = %(workspace_id)s;

-- name: clear_drift_findings
DELETE FROM kb.drift_findings WHERE workspace_id = %(workspace_id)s;

-- name: record_drift_finding
INSERT INTO kb.drift_findings (workspace_id, checked_revision, kind, path, detail, repaired)
VALUES (%(workspace_id)s, %(checked_revision)s, %(kind)s, %(path)s, %(detail)s, %(repaired)s);

-- name: requeue_documents
-- A document marked indexed at content it no longer has: back to pending for the index job.
UPDATE kb.documents SET status = 'pending', indexed_content_id = NULL, index_attempts = 0
WHERE id = ANY(%(ids)s);

-- name: drift_report
SELECT * FROM kb.drift_report
WHERE %(workspace_id)s::int IS NULL OR workspace_id = %(workspace_id)s::int
ORDER BY workspace_id, kind;
