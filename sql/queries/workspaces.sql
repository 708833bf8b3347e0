-- Named queries of workspace listing and deletion (kb/workspace/lifecycle.py; design §2.1, §6).

-- name: workspace_summaries
-- One row per workspace with its document count and index state (from the kb.index_lag view),
-- how many recorded revisions the projection has not reached (their documents have no rows yet,
-- so documents_pending cannot count them), and how many of its projection and index jobs a live
-- worker is running (its heartbeat under %(alive_seconds)s s old: a killed worker's job is not
-- running, design §7); its home node and that node's storage id (a workspace homed on another node's storage
-- is listed from Postgres alone).
SELECT l.workspace_id AS id, w.home_node, n.storage_id AS home_storage_id, l.head, l.stamp, l.projected, l.revisions_behind,
       CASE WHEN l.projected IS NULL THEN w.revision_count
            WHEN p.seq IS NULL THEN 0  -- a revision made outside kb, projected before it was recorded
            ELSE w.revision_count - p.seq END AS revisions_unprojected, l.documents, l.documents_pending,
       l.documents_failed, l.documents_quarantined, l.documents_unindexable,
       (SELECT count(*) FROM procrastinate_jobs j
        JOIN procrastinate_workers AS pw ON pw.id = j.worker_id
        WHERE j.status = 'doing' AND split_part(j.queue_name, '@', 1) IN ('projection', 'index')  -- any node's
          AND (j.args ->> 'workspace_id')::int = l.workspace_id
          AND pw.last_heartbeat > now() - make_interval(secs => %(alive_seconds)s::float8)) AS jobs_running
FROM kb.index_lag AS l
JOIN kb.workspaces AS w ON w.id = l.workspace_id
LEFT JOIN kb.nodes AS n ON n.name = w.home_node
LEFT JOIN kb.revisions AS p ON p.workspace_id = l.workspace_id AND p.id = l.projected
ORDER BY l.workspace_id;

-- name: workspace_row_ids
-- The document and folder row ids a deletion announces on kb_events.
SELECT 'document' AS kind, id, path FROM kb.documents WHERE workspace_id = %(workspace_id)s
UNION ALL
SELECT 'folder', id, path FROM kb.folders WHERE workspace_id = %(workspace_id)s
ORDER BY kind, id;

-- name: workspace_running_jobs
SELECT id, task_name FROM procrastinate_jobs
WHERE status = 'doing' AND (args ->> 'workspace_id') = %(workspace_id)s::text
ORDER BY id;

-- name: delete_workspace_jobs
-- Procrastinate's jobs of the workspace (its events cascade). Not the embedding cache: it is
-- content-addressed and shared by every workspace.
DELETE FROM procrastinate_jobs WHERE (args ->> 'workspace_id') = %(workspace_id)s::text RETURNING id;

-- name: delete_workspace
-- Everything the workspace owns in Postgres goes with this row: every kb table referencing
-- kb.workspaces does so ON DELETE CASCADE (documents → chunks, revisions → path_changes by trigger, folders,
-- index_runs, recorded_titles, and what later features add).
DELETE FROM kb.workspaces WHERE id = %(workspace_id)s RETURNING id;

-- name: workspace_vector_index_names
-- The partial HNSW indexes of the workspace (kb/index/vector_index.py names them
-- kb_chunks_hnsw_<ws>_<model hash>), recorded or left over by a killed build.
SELECT indexname AS name FROM pg_indexes
WHERE schemaname = 'kb' AND left(indexname, length(%(prefix)s)) = %(prefix)s
ORDER BY indexname;

-- name: delete_workspace_lexeme_stats
-- BM25 statistics (design §8) have no foreign key to kb.workspaces: the chunk trigger keeps them,
-- so after the cascade removed the chunks their zeroed rows are deleted here.
DELETE FROM kb.lexeme_stats WHERE workspace_id = %(workspace_id)s;

-- name: delete_workspace_text_stats
DELETE FROM kb.text_stats WHERE workspace_id = %(workspace_id)s;

-- name: delete_workspace_document_lexeme_stats
DELETE FROM kb.document_lexeme_stats WHERE workspace_id = %(workspace_id)s;

-- name: delete_workspace_document_text_stats
DELETE FROM kb.document_text_stats WHERE workspace_id = %(workspace_id)s;

-- name: recorded_heads
-- Which of the given (workspace, git HEAD) pairs Postgres has recorded, read after git's heads so
-- that a kb commit in progress (its ref moves just before its transaction commits) is not taken
-- for a revision made outside kb.
SELECT h.workspace_id
FROM unnest(%(workspace_ids)s::int[], %(heads)s::text[]) AS h(workspace_id, head)
WHERE EXISTS (SELECT 1 FROM kb.revisions r WHERE r.workspace_id = h.workspace_id AND r.id = h.head);
