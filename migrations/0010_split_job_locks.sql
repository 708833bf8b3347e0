-- Issue 19: projection and indexing stop sharing the lock "ws:N", and a job scheduled for later
-- holds no lock (Procrastinate's fetch treats a waiting job as holding its lock even before its
-- scheduled_at, so a delayed retry held back every due job of its workspace for up to 10 minutes).
-- Waiting jobs deferred before this migration get the new locks; already-running ones keep theirs
-- until they finish. Data only, no DDL: a plain UPDATE of the few waiting rows.
UPDATE procrastinate_jobs
SET lock = CASE
        WHEN scheduled_at > now() THEN NULL
        WHEN queue_name = 'projection' THEN 'projection:' || (args ->> 'workspace_id')
        ELSE 'index:' || (args ->> 'workspace_id')
    END
WHERE status = 'todo' AND lock LIKE 'ws:%';
