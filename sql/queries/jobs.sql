-- Named queries over Procrastinate's job table (kb/jobs/tasks.py, kb/store/knowledge_store.py).

-- name: defer_job
-- Defer a job inside the caller's transaction (the revision's own, design §3). A waiting job with
-- the same queueing lock already covers it (jobs converge to HEAD), so a conflict is a no-op.
-- delay_seconds > 0 schedules it for later (a retry's backoff). The queue is the workspace's home
-- node's ('index@a'), or the node-free one while it has none (design §15).
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, queueing_lock, args, scheduled_at)
VALUES (kb.node_queue(%(queue)s, %(workspace_id)s::int), %(task)s, 0, %(lock)s, %(queueing_lock)s, %(args)s,
        CASE WHEN %(delay_seconds)s::float8 > 0
             THEN now() + make_interval(secs => %(delay_seconds)s::float8) END)
ON CONFLICT (queueing_lock) WHERE status = 'todo' DO NOTHING
RETURNING id;

-- name: defer_convergence_jobs
-- The projection and index jobs of a revision in one statement (kb/store/knowledge_store.py defer_convergence):
-- each is a no-op when a waiting job with its queueing lock already covers it. Both go to the
-- workspace's home node's queues (design §15).
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, queueing_lock, args)
VALUES (kb.node_queue('projection', %(workspace_id)s::int), %(projection_task)s, 0, %(projection_lock)s,
        %(projection_queueing_lock)s, %(args)s),
       (kb.node_queue('index', %(workspace_id)s::int), %(index_task)s, 0, %(index_lock)s,
        %(index_queueing_lock)s, %(args)s)
ON CONFLICT (queueing_lock) WHERE status = 'todo' DO NOTHING;

-- name: job_counts
SELECT queue_name AS queue, status::text AS status, count(*) AS jobs
FROM procrastinate_jobs
WHERE %(workspace_id)s::int IS NULL OR (args ->> 'workspace_id')::int = %(workspace_id)s::int
GROUP BY queue_name, status
ORDER BY queue_name, status;

-- name: due_jobs
-- Waiting jobs that are due now on the given queues, each with the job that holds it back, if
-- any (kb/jobs/worker.py, `kb status`): Procrastinate's fetch skips a job while another job with its
-- lock is running, or is waiting with a higher priority or an earlier id — even one scheduled later.
SELECT j.id, j.task_name AS task, j.queue_name AS queue, j.lock, (j.args ->> 'workspace_id')::int AS workspace_id,
       b.id AS blocker_id, b.task_name AS blocker_task, b.status::text AS blocker_status,
       b.scheduled_at AS blocker_scheduled_at,
       (b.id IS NOT NULL AND b.status = 'todo' AND b.scheduled_at > now()) AS blocked_by_later
FROM procrastinate_jobs AS j
LEFT JOIN LATERAL (
    SELECT o.id, o.task_name, o.status, o.scheduled_at
    FROM procrastinate_jobs AS o
    WHERE j.lock IS NOT NULL AND o.lock = j.lock AND o.id <> j.id
      AND (o.status = 'doing'
           OR (o.status = 'todo' AND (o.priority > j.priority OR (o.priority = j.priority AND o.id < j.id))))
    ORDER BY (o.status = 'doing') DESC, o.id
    LIMIT 1
) AS b ON true
WHERE j.status = 'todo' AND (j.scheduled_at IS NULL OR j.scheduled_at <= now())
  AND (%(queues)s::text[] IS NULL OR j.queue_name = ANY(%(queues)s::text[]))
ORDER BY j.id;

-- name: scheduled_jobs
-- Waiting jobs scheduled for later (a retry's backoff), soonest first.
SELECT id, task_name AS task, queue_name AS queue, lock, queueing_lock,
       (args ->> 'workspace_id')::int AS workspace_id, args ->> 'task' AS defers_task,
       scheduled_at, scheduled_at - now() AS due_in
FROM procrastinate_jobs
WHERE status = 'todo' AND scheduled_at > now() AND (%(queues)s::text[] IS NULL OR queue_name = ANY(%(queues)s::text[]))
ORDER BY scheduled_at, id;

-- name: queue_summary
-- Per queue (the operator's view, design §17): jobs waiting and due, running, failed, waiting but
-- scheduled for later, and how long the oldest due job has waited (since it was deferred or due).
SELECT j.queue_name AS queue,
       count(*) FILTER (WHERE j.status = 'todo' AND (j.scheduled_at IS NULL OR j.scheduled_at <= now())) AS waiting,
       count(*) FILTER (WHERE j.status = 'doing') AS running,
       count(*) FILTER (WHERE j.status = 'failed') AS failed,
       count(*) FILTER (WHERE j.status = 'todo' AND j.scheduled_at > now()) AS scheduled,
       extract(epoch FROM now() - min(coalesce(j.scheduled_at, e.deferred_at))
           FILTER (WHERE j.status = 'todo' AND (j.scheduled_at IS NULL OR j.scheduled_at <= now())))::float8
           AS oldest_waiting_seconds
FROM procrastinate_jobs AS j
LEFT JOIN LATERAL (
    SELECT min(ev.at) AS deferred_at
    FROM procrastinate_events AS ev
    WHERE ev.job_id = j.id AND j.status = 'todo' AND ev.type = 'deferred'
) AS e ON true
GROUP BY j.queue_name
ORDER BY j.queue_name;

-- name: live_workers
-- Workers that sent a heartbeat within the last %(seconds)s seconds (`kb import` says one will index);
-- the row of a killed worker stays until a worker starting prunes it, with its heartbeat ageing.
SELECT count(*) AS workers FROM procrastinate_workers
WHERE last_heartbeat > now() - make_interval(secs => %(seconds)s::float8);

-- name: covering_job
-- A waiting job with the queueing lock of job %(job_id)s, if any: it does that job's work (kb's jobs
-- converge, design §7), so the job cannot go back to todo (the queueing lock is unique among them).
SELECT id FROM procrastinate_jobs
WHERE queueing_lock = %(queueing_lock)s AND status = 'todo' AND id <> %(job_id)s
ORDER BY id LIMIT 1;
