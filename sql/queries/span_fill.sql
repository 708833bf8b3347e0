-- Named queries of the span fill (kb/legacy/span_fill.py, design §9).

-- name: span_fill_control
SELECT paused, batch_documents, throttle_ms, updated_at FROM kb.span_fill_control;

-- name: set_span_fill_paused
UPDATE kb.span_fill_control SET paused = %(paused)s, updated_at = now() RETURNING *;

-- name: span_fill_workspaces
-- Flipped workspaces with chunks lacking spans, most used first (most revisions, then most
-- documents), optionally one workspace.
SELECT w.id AS workspace_id
FROM kb.workspaces w
JOIN kb.seeds s ON s.workspace_id = w.id AND s.flipped
WHERE (%(workspace_id)s::int IS NULL OR w.id = %(workspace_id)s::int)
  AND EXISTS (SELECT 1 FROM kb.chunks c WHERE c.workspace_id = w.id AND c.start_line IS NULL)
ORDER BY w.revision_count DESC,
         (SELECT count(*) FROM kb.documents d WHERE d.workspace_id = w.id) DESC, w.id;

-- name: span_fill_batch
-- The next documents (id order, after the cursor) with chunks lacking spans, indexed at their
-- current content, and not skipped as stale at that content.
SELECT d.id, d.content_id
FROM kb.documents d
WHERE d.workspace_id = %(workspace_id)s AND d.id > %(after_id)s
  AND d.content_id IS NOT NULL AND d.content_id = d.indexed_content_id
  AND EXISTS (SELECT 1 FROM kb.chunks c WHERE c.document_id = d.id AND c.start_line IS NULL)
  AND NOT EXISTS (SELECT 1 FROM kb.span_fill_skips k WHERE k.document_id = d.id AND k.content_id = d.content_id)
ORDER BY d.id
LIMIT %(limit)s;

-- name: span_fill_chunks
SELECT id, document_id, position, text, start_line FROM kb.chunks
WHERE document_id = ANY(%(document_ids)s)
ORDER BY document_id, position, id;

-- name: fill_spans
-- One statement per batch. A row is filled only while it still has no span and its document is
-- still indexed at the content the spans were aligned against (no confidently wrong line number).
UPDATE kb.chunks c
SET start_char = u.start_char, end_char = u.end_char, start_line = u.start_line, end_line = u.end_line
FROM (SELECT unnest(%(ids)s::bigint[]) AS id, unnest(%(start_chars)s::int[]) AS start_char,
             unnest(%(end_chars)s::int[]) AS end_char, unnest(%(start_lines)s::int[]) AS start_line,
             unnest(%(end_lines)s::int[]) AS end_line, unnest(%(content_ids)s::text[]) AS content_id) u,
     kb.documents d
WHERE c.id = u.id AND c.start_line IS NULL AND d.id = c.document_id
  AND d.content_id = u.content_id AND d.indexed_content_id = u.content_id;

-- name: skip_stale_document
-- Not for a document deleted since the batch was read (its row is gone: nothing to skip). The
-- batch holds the chunk lock (kb/db/locks.py), so no projection deletes it between check and insert.
INSERT INTO kb.span_fill_skips (document_id, workspace_id, content_id, reason)
SELECT %(document_id)s, %(workspace_id)s, %(content_id)s, %(reason)s
WHERE EXISTS (SELECT 1 FROM kb.documents WHERE id = %(document_id)s)
ON CONFLICT (document_id) DO UPDATE
SET content_id = EXCLUDED.content_id, reason = EXCLUDED.reason, skipped_at = now();

-- name: start_span_fill_run
INSERT INTO kb.span_fill_runs (workspace_id) VALUES (%(workspace_id)s) RETURNING id;

-- name: interrupt_span_fill_runs
-- Runs left 'running' by a killed process (the caller runs under the span-fill job lock).
UPDATE kb.span_fill_runs SET status = 'interrupted', updated_at = now()
WHERE workspace_id = %(workspace_id)s AND status = 'running' AND id <> %(keep_id)s;

-- name: update_span_fill_run
UPDATE kb.span_fill_runs
SET documents_filled = documents_filled + %(filled)s, documents_stale = documents_stale + %(stale)s,
    chunks_filled = chunks_filled + %(chunks)s, batches = batches + 1, updated_at = now()
WHERE id = %(id)s;

-- name: finish_span_fill_run
UPDATE kb.span_fill_runs SET status = %(status)s, finished_at = now(), updated_at = now()
WHERE id = %(id)s;

-- name: span_backlog
SELECT * FROM kb.span_backlog
WHERE %(workspace_id)s::int IS NULL OR workspace_id = %(workspace_id)s::int
ORDER BY workspace_id;

-- name: defer_span_fill
-- Queue one span-fill run now (the periodic task's own arguments), coalesced with a waiting one.
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, queueing_lock, args)
VALUES ('span_fill', %(task)s, 0, 'span-fill', 'span-fill', %(args)s)
ON CONFLICT (queueing_lock) WHERE status = 'todo' DO NOTHING
RETURNING id;
