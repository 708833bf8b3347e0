-- Named queries the test suite reads the derived index and the job queue with (issue 4).

-- ---- issue 4: reads of the derived index for tests ----------------------------------------

-- name: test_chunk_set
SELECT d.path, c.id, c.position, c.text, c.text_sha256, c.start_char, c.end_char, c.start_line,
       c.end_line, c.embedding_model
FROM kb.chunks c JOIN kb.documents d ON d.id = c.document_id
WHERE c.workspace_id = %(workspace_id)s
ORDER BY d.path, c.position;

-- name: test_document_states
SELECT path, status, index_attempts, index_error, content_id, indexed_content_id
FROM kb.documents WHERE workspace_id = %(workspace_id)s ORDER BY path;

-- name: test_index_runs
SELECT * FROM kb.index_runs WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: test_jobs
SELECT id, task_name, status::text AS status, attempts, args, queueing_lock,
       scheduled_at > now() AS scheduled_later
FROM procrastinate_jobs ORDER BY id;

-- name: test_index_lag
SELECT * FROM kb.index_lag WHERE workspace_id = %(workspace_id)s;

-- name: test_job_health
SELECT * FROM kb.job_health ORDER BY queue;

-- name: delete_finished_jobs_for_tests
DELETE FROM procrastinate_jobs WHERE status <> 'doing';

-- name: delete_todo_jobs_for_tests
DELETE FROM procrastinate_jobs WHERE status = 'todo';

-- ---- connection pool tests ------------------------------------------------------------------

-- name: test_backend_pid
SELECT pg_backend_pid() AS pid;

-- name: test_create_pool_probe
CREATE TABLE pool_probe (n int);

-- name: test_insert_pool_probe
INSERT INTO pool_probe VALUES (1);

-- name: test_count_pool_probe
SELECT count(*) AS n FROM pool_probe;

-- ---- issue 14: session settings, document identity ------------------------------------------

-- name: test_session_settings
SELECT current_setting('search_path') AS search_path, current_setting('TimeZone') AS "TimeZone",
       current_setting('DateStyle') AS "DateStyle",
       current_setting('default_transaction_isolation') AS default_transaction_isolation,
       current_setting('transaction_isolation') AS transaction_isolation,
       current_setting('statement_timeout') AS statement_timeout,
       current_setting('lock_timeout') AS lock_timeout;

-- name: test_procrastinate_schemas
SELECT DISTINCT n.nspname AS schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname LIKE 'procrastinate%%' ORDER BY 1;

-- name: test_document_ids
SELECT path, id FROM kb.documents WHERE workspace_id = %(workspace_id)s ORDER BY path;
