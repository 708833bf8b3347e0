-- Named queries of idempotency keys (kb/store/write_keys.py, design §3).

-- name: record_write_keys
-- The keys of revisions recorded in this transaction (under the write lock); a key recorded
-- already keeps its first revision.
INSERT INTO kb.write_keys (workspace_id, key, revision_id)
SELECT %(workspace_id)s, k.key, k.revision_id
FROM unnest(%(keys)s::text[], %(revision_ids)s::text[]) AS k (key, revision_id)
ON CONFLICT (workspace_id, key) DO NOTHING;

-- name: recorded_write_keys
-- The revisions recorded for these keys (only those recorded).
SELECT key, revision_id FROM kb.write_keys
WHERE workspace_id = %(workspace_id)s AND key = ANY (%(keys)s::text[]);

-- name: withdraw_write_intents_of_key
-- A writer settling its write under the lock: its queued intents (any session) that no holder
-- recorded are removed, so nothing records them after it was told "not recorded".
DELETE FROM kb.write_intents
WHERE workspace_id = %(workspace_id)s AND outcome IS NULL AND payload ->> 'key' = %(key)s;
