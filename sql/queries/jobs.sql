-- Named queries over Procrastinate's job table (kb/jobs.py, kb/store.py).

-- name: defer_job
-- Defer a job inside the caller's transaction (the revision's own, SPEC §3). A waiting job with
-- the same queueing lock already covers it (jobs converge to HEAD), so a conflict is a no-op.
-- delay_seconds > 0 schedules it for later (a retry's backoff).
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, queueing_lock, args, scheduled_at)
VALUES (%(queue)s, %(task)s, 0, %(lock)s, %(queueing_lock)s, %(args)s,
        CASE WHEN %(delay_seconds)s::float8 > 0
             THEN now() + make_interval(secs => %(delay_seconds)s::float8) END)
ON CONFLICT (queueing_lock) WHERE status = 'todo' DO NOTHING
RETURNING id;

-- name: job_counts
SELECT queue_name AS queue, status::text AS status, count(*) AS jobs
FROM procrastinate_jobs
WHERE %(workspace_id)s::int IS NULL OR (args ->> 'workspace_id')::int = %(workspace_id)s::int
GROUP BY queue_name, status
ORDER BY queue_name, status;

-- name: jobs_pending
SELECT count(*) AS pending FROM procrastinate_jobs WHERE status IN ('todo', 'doing');
