-- Named queries of the store (kb/store/knowledge_store.py): workspaces, revisions, per-path history (design §3).

-- name: ensure_workspace
-- A new workspace is homed on the node that creates it (design §15), whose row is registered here
-- if this is its first act (a CLI `kb import` before any serve or worker ran on the node).
WITH node AS (
    INSERT INTO kb.nodes (name, storage_root, storage_id)
    VALUES (%(node)s, %(storage_root)s, %(storage_id)s)
    ON CONFLICT (name) DO NOTHING
)
INSERT INTO kb.workspaces (id, home_node) VALUES (%(workspace_id)s, %(node)s)
ON CONFLICT (id) DO NOTHING
RETURNING id;

-- name: get_workspace
SELECT * FROM kb.workspaces WHERE id = %(workspace_id)s;

-- name: list_workspaces
SELECT * FROM kb.workspaces ORDER BY id;

-- name: lock_workspace_write_bounded
-- The write lock in one statement: bound the wait (lock_timeout, text such as '10000ms'), take the
-- lock, then unbound the transaction's later statements again (the list is evaluated in order).
SELECT set_config('lock_timeout', %(timeout)s, true) AS bounded,
       pg_advisory_xact_lock(%(namespace)s, %(workspace_id)s) AS locked,
       set_config('lock_timeout', '0', true) AS unbounded;

-- name: record_revisions
-- Consecutive revisions in one statement (group commit, design §14): their rows, all their path
-- changes (each tagged with its revision), and the workspace's recorded head = the last of them.
WITH revisions AS (
    INSERT INTO kb.revisions (workspace_id, id, seq, parent_id, author, committer, message, committed_at)
    SELECT %(workspace_id)s, r.id, r.seq, r.parent_id, r.author, r.committer, r.message, to_timestamp(r.committed_at)
    FROM unnest(%(ids)s::text[], %(seqs)s::bigint[], %(parent_ids)s::text[], %(authors)s::text[],
                %(committers)s::text[], %(messages)s::text[], %(committed_ats)s::bigint[])
         AS r (id, seq, parent_id, author, committer, message, committed_at)
), changes AS (
    INSERT INTO kb.path_changes (workspace_id, revision_id, seq, path, change, old_path, new_path, content_id)
    SELECT %(workspace_id)s, c.revision_id, c.seq::bigint, c.path, c.change, c.old_path, c.new_path, c.content_id
    -- the changes' columns are JSON arrays (kb.store.history.json_column: a folder rename has
    -- thousands of rows, and psycopg's array dumping is Python); ROWS FROM zips them by position
    FROM ROWS FROM (json_array_elements_text(%(change_revisions)s::json), json_array_elements_text(%(change_seqs)s::json),
                    json_array_elements_text(%(paths)s::json), json_array_elements_text(%(changes)s::json),
                    json_array_elements_text(%(old_paths)s::json), json_array_elements_text(%(new_paths)s::json),
                    json_array_elements_text(%(content_ids)s::json))
         AS c (revision_id, seq, path, change, old_path, new_path, content_id)
)
UPDATE kb.workspaces
SET head_revision = %(head)s, revision_count = %(head_seq)s
WHERE id = %(workspace_id)s;

-- name: record_path_changes_ahead
-- A big revision's path changes (a folder rename: two rows per document), inserted in the writer's
-- transaction before it takes the write lock, in the lock's round trip (kb.store.history.
-- record_changes_ahead, design §14); record_revisions then inserts the revision's row without them,
-- or forget_path_changes removes them when the revision was not the one recorded.
INSERT INTO kb.path_changes (workspace_id, revision_id, seq, path, change, old_path, new_path, content_id)
SELECT %(workspace_id)s, %(revision_id)s, %(seq)s, c.path, c.change, c.old_path, c.new_path, c.content_id
FROM ROWS FROM (json_array_elements_text(%(paths)s::json), json_array_elements_text(%(changes)s::json),
                json_array_elements_text(%(old_paths)s::json), json_array_elements_text(%(new_paths)s::json),
                json_array_elements_text(%(content_ids)s::json))
     AS c (path, change, old_path, new_path, content_id);

-- name: forget_path_changes
-- The path changes record_path_changes_ahead inserted for a revision that was not recorded.
DELETE FROM kb.path_changes WHERE workspace_id = %(workspace_id)s AND revision_id = %(revision_id)s;

-- name: revision_exists
SELECT seq, committed_at FROM kb.revisions WHERE workspace_id = %(workspace_id)s AND id = %(revision_id)s;

-- name: workspace_history
SELECT r.id, r.seq, r.parent_id, r.author, r.committer, r.message, r.committed_at,
       coalesce(array_agg(c.path ORDER BY c.path) FILTER (WHERE c.path IS NOT NULL), '{}') AS paths,
       coalesce(array_agg(c.change ORDER BY c.path) FILTER (WHERE c.path IS NOT NULL), '{}') AS kinds,
       coalesce(array_agg(c.old_path ORDER BY c.path) FILTER (WHERE c.path IS NOT NULL), '{}') AS old_paths,
       coalesce(array_agg(c.new_path ORDER BY c.path) FILTER (WHERE c.path IS NOT NULL), '{}') AS new_paths,
       coalesce(array_agg(c.content_id ORDER BY c.path) FILTER (WHERE c.path IS NOT NULL), '{}') AS content_ids
FROM kb.revisions r
LEFT JOIN kb.path_changes c ON c.workspace_id = r.workspace_id AND c.revision_id = r.id
WHERE r.workspace_id = %(workspace_id)s
GROUP BY r.workspace_id, r.id
ORDER BY r.seq DESC
LIMIT %(limit)s;

-- name: path_history
-- Rows touching one path, newest first, at or below a sequence number (moves are followed by
-- the caller, which re-queries with old_path below the move's seq).
SELECT r.id, r.seq, r.parent_id, r.author, r.committer, r.message, r.committed_at,
       c.path, c.change, c.old_path, c.new_path, c.content_id
FROM kb.path_changes c
JOIN kb.revisions r ON r.workspace_id = c.workspace_id AND r.id = c.revision_id
WHERE c.workspace_id = %(workspace_id)s AND c.path = %(path)s AND c.seq <= %(max_seq)s
ORDER BY c.seq DESC
LIMIT %(limit)s;

-- name: revision_changes
SELECT path, change, old_path, new_path, content_id
FROM kb.path_changes
WHERE workspace_id = %(workspace_id)s AND revision_id = %(revision_id)s
ORDER BY path;

-- ---- the repository guard (kb/store/repository_guard.py, design §3) ----------------------------

-- name: revision_row
-- One recorded revision (the revision page, design §17); its changes come from revision_changes.
SELECT id, seq, parent_id, author, committer, message, committed_at
FROM kb.revisions
WHERE workspace_id = %(workspace_id)s AND id = %(revision_id)s;

-- name: set_repository_identity
-- A workspace adopts its repository's identity (first check after creation or upgrade).
UPDATE kb.workspaces SET repository_id = %(repository_id)s
WHERE id = %(workspace_id)s AND repository_id IS NULL;

-- name: short_lock_timeout
SET lock_timeout = '2s';

-- name: mark_workspace_diverged
-- Why the workspace's repository cannot be converged (committed on its own connection).
UPDATE kb.workspaces SET diverged = %(reason)s WHERE id = %(workspace_id)s;

-- name: clear_workspace_diverged
UPDATE kb.workspaces SET diverged = NULL WHERE id = %(workspace_id)s AND diverged IS NOT NULL;

-- name: record_repository_identity
-- A repository kb just created: the workspace records its identity (replacing one of a repository
-- that is gone: only when Postgres recorded no revision, see KnowledgeStore.create).
UPDATE kb.workspaces SET repository_id = %(repository_id)s, diverged = NULL WHERE id = %(workspace_id)s;
