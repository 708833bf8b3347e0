-- Named queries of `kb status` (kb/knowledge_base.py).

-- name: workspace_counts
SELECT
    (SELECT count(*) FROM kb.documents WHERE workspace_id = %(workspace_id)s) AS documents,
    (SELECT count(*) FROM kb.chunks WHERE workspace_id = %(workspace_id)s) AS chunks,
    (SELECT count(*) FROM kb.documents WHERE workspace_id = %(workspace_id)s AND status = 'failed') AS failed,
    (SELECT count(*) FROM kb.documents WHERE workspace_id = %(workspace_id)s AND status = 'quarantined') AS quarantined,
    (SELECT count(*) FROM kb.documents WHERE workspace_id = %(workspace_id)s AND status = 'unindexable') AS unindexable,
    (SELECT count(*) FROM kb.documents WHERE workspace_id = %(workspace_id)s AND status = 'pending') AS pending;

-- name: problem_documents
SELECT path, status, index_attempts, index_error
FROM kb.documents
WHERE workspace_id = %(workspace_id)s AND status IN ('failed', 'quarantined', 'unindexable')
ORDER BY path
LIMIT 50;
