-- Named queries of the migration runner (kb/db/migrations.py).

-- name: create_ledger
CREATE SCHEMA IF NOT EXISTS kb;
CREATE TABLE IF NOT EXISTS kb.schema_migrations (
    name text PRIMARY KEY,
    checksum text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: lock_migrations
SELECT pg_advisory_xact_lock(%(namespace)s, 0);

-- name: applied_migrations
SELECT name, checksum FROM kb.schema_migrations ORDER BY name;

-- name: record_migration
INSERT INTO kb.schema_migrations (name, checksum) VALUES (%(name)s, %(checksum)s);

-- name: procrastinate_schemas
-- Every schema holding Procrastinate's job table (kb expects exactly kb.database.JOB_QUEUE_SCHEMA).
SELECT n.nspname AS schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'procrastinate_jobs' AND c.relkind IN ('r', 'p') ORDER BY n.nspname;

-- name: schema_state
-- One read for KnowledgeBase.open's "is anything to do?" check (design §13): the ledger's rows as
-- {name: checksum} when the ledger exists (NULL otherwise), whether Procrastinate's job table is in
-- the job-queue schema, pgvector is installed in this database, and the publication exists.
SELECT (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'kb' AND c.relname = 'schema_migrations') IS NOT NULL AS has_ledger,
       EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = %(job_schema)s AND c.relname = 'procrastinate_jobs'
                 AND c.relkind IN ('r', 'p')) AS has_job_queue,
       EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector') AS has_vector,
       EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %(publication)s) AS has_publication;
