-- Named queries of git remotes (kb/workspace/remotes.py, design §13).

-- name: insert_remote
INSERT INTO kb.remotes (workspace_id, url, branch) VALUES (%(workspace_id)s, %(url)s, %(branch)s)
ON CONFLICT (workspace_id) DO NOTHING
RETURNING workspace_id;

-- name: remote_status
SELECT * FROM kb.remote_status WHERE workspace_id = %(workspace_id)s;

-- name: delete_remote
DELETE FROM kb.remotes WHERE workspace_id = %(workspace_id)s RETURNING workspace_id;

-- name: record_push_success
UPDATE kb.remotes
SET last_pushed_revision = %(revision)s, last_pushed_at = now(), last_push_error = NULL,
    last_push_attempt_at = now(), push_failures = 0
WHERE workspace_id = %(workspace_id)s AND url = %(url)s AND branch = %(branch)s;

-- name: record_push_failure
UPDATE kb.remotes
SET last_push_error = %(error)s, last_push_attempt_at = now(), push_failures = push_failures + 1
WHERE workspace_id = %(workspace_id)s AND url = %(url)s AND branch = %(branch)s;

-- name: defer_push_if_remote
-- Deferred in every revision's transaction (design §13): only for a workspace with a remote, and
-- coalesced — no job is added while one is waiting (it pushes the then-current HEAD). The lock
-- "push:N" serializes pushes of a workspace and is never the workspace's job lock. The queue is
-- the home node's (design §15).
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, args)
SELECT kb.node_queue('push', %(workspace_id)s::int), 'kb.push_remote', 0, 'push:' || %(workspace_id)s::int,
       jsonb_build_object('workspace_id', %(workspace_id)s::int)
WHERE EXISTS (SELECT 1 FROM kb.remotes WHERE workspace_id = %(workspace_id)s::int)
  AND NOT EXISTS (SELECT 1 FROM procrastinate_jobs
                  WHERE lock = 'push:' || %(workspace_id)s::int AND status = 'todo')
RETURNING id;

-- name: remotes_to_push
-- Remotes behind the recorded head with no push job waiting or running, whose backoff after
-- consecutive failures (30 s doubling, at most 1 h) has passed: the sweep re-defers them.
SELECT s.workspace_id
FROM kb.remote_status s
WHERE s.behind AND s.head IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM procrastinate_jobs j
                  WHERE j.lock = 'push:' || s.workspace_id AND j.status IN ('todo', 'doing'))
  AND (s.last_push_attempt_at IS NULL OR s.push_failures = 0
       OR s.last_push_attempt_at <= now() - make_interval(secs => least(3600, 30 * 2 ^ least(s.push_failures - 1, 20))))
ORDER BY s.workspace_id;
