-- Named queries of bin/stress_library.py: threads sharing one KnowledgeBase (design §4, §14).

-- name: stress_terminate_backends
-- End a share (``fraction``, 0..1) of the other client sessions on kb's database: the pool's
-- connections, a writer waiting for the write lock, an index run (fault injection, design §14).
SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS terminated
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND random() < %(fraction)s;

-- name: stress_recorded_revisions
SELECT id FROM kb.revisions WHERE workspace_id = %(workspace_id)s;
