-- Named queries of group commit (kb/store/group_commit.py, design §3, §4).

-- name: enqueue_write_intent
-- A writer's staged change set, queued before it waits for the write lock (committed at once,
-- without waiting for a WAL flush: the row is UNLOGGED and lives only while its writer waits).
-- ``ahead``: another live writer's intent was already waiting (then a holder is likely to record
-- this one too, so its writer first waits for that holder instead of queueing to lead).
WITH quick AS (SELECT set_config('synchronous_commit', 'off', true))
INSERT INTO kb.write_intents (workspace_id, paths, payload)
SELECT %(workspace_id)s, %(paths)s, %(payload)s FROM quick
RETURNING id, EXISTS (
    SELECT 1 FROM kb.write_intents i
    WHERE i.workspace_id = %(workspace_id)s AND i.outcome IS NULL
      AND EXISTS (SELECT 1 FROM pg_stat_activity a
                  WHERE a.pid = i.backend_pid
                    AND (a.backend_start IS NULL OR a.backend_start <= i.created_at))) AS ahead;

-- name: claim_write_intents
-- The write lock, tried without waiting (pg_try_advisory_xact_lock, once per statement; true at
-- once for a caller that already holds it), and only when it is held: the caller's own intent
-- (with its outcome, when an earlier holder already recorded it) and every intent still waiting,
-- oldest first, each with those of its paths that are ARTIFACT documents (design §11: plain writes
-- are refused there). No rows: another writer holds the lock. Rows are locked, so a writer
-- withdrawing its intent waits for this holder. An intent whose writer's session has ended (a
-- killed writer) is left out: nothing records it.
SELECT i.id, i.payload, i.outcome,
       coalesce((SELECT array_agg(d.path) FROM kb.documents d
                 WHERE d.workspace_id = i.workspace_id AND d.path = ANY (i.paths)
                   AND d.document_type = 'ARTIFACT'), '{}') AS artifact_paths
FROM kb.write_intents i,
     (SELECT pg_try_advisory_xact_lock(%(namespace)s, %(workspace_id)s) AS locked) l
WHERE l.locked AND i.workspace_id = %(workspace_id)s
  AND (i.id = %(intent_id)s
       OR (i.outcome IS NULL
           AND EXISTS (SELECT 1 FROM pg_stat_activity a
                       WHERE a.pid = i.backend_pid
                         AND (a.backend_start IS NULL OR a.backend_start <= i.created_at))))
ORDER BY i.id
FOR UPDATE OF i;

-- name: forget_dead_write_intents
-- The intents of killed writers (their session has ended), waiting or settled: nobody reads them.
DELETE FROM kb.write_intents i
WHERE i.workspace_id = %(workspace_id)s AND i.id <> %(intent_id)s
  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a
                  WHERE a.pid = i.backend_pid
                    AND (a.backend_start IS NULL OR a.backend_start <= i.created_at));

-- name: settle_write_intents
-- The outcomes of the intents a lock holder recorded for other writers (JSON, one per id).
UPDATE kb.write_intents i
SET outcome = o.outcome
FROM unnest(%(ids)s::bigint[], %(outcomes)s::jsonb[]) AS o (id, outcome)
WHERE i.id = o.id;

-- name: take_settled_write_intent
-- Once the write lock's previous holder is done: the caller's intent with its outcome, removed,
-- when that holder recorded it (no row otherwise).
DELETE FROM kb.write_intents WHERE id = %(intent_id)s AND outcome IS NOT NULL RETURNING outcome;

-- name: begin_transaction
BEGIN;

-- name: commit_transaction
COMMIT;

-- name: rollback_transaction
ROLLBACK;

-- name: take_write_intent
-- A writer removes its own intent once it knows the outcome (NULL while none was recorded).
DELETE FROM kb.write_intents WHERE id = %(intent_id)s RETURNING outcome;

-- name: withdraw_write_intent
-- A writer that gave up waiting removes its intent unless a holder recorded it meanwhile (then
-- nothing is deleted and the outcome is read with take_write_intent).
DELETE FROM kb.write_intents WHERE id = %(intent_id)s AND outcome IS NULL RETURNING id;

-- name: write_lock_session_alive
-- Right before the branch ref moves: one round trip proving the session holding the write lock
-- (a session-scoped advisory lock) is still there; it fails when the session was ended.
SELECT 1 AS alive;
