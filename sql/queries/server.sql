-- Named queries about the Postgres server itself (kb/db/database.py, kb/db/embedded_server.py).

-- name: show_wal_level
SELECT current_setting('wal_level') AS wal_level;

-- name: set_wal_level_logical
-- Takes effect after a restart (kb/db/database.py restarts the embedded server once).
ALTER SYSTEM SET wal_level = 'logical';

-- name: set_shared_buffers
-- A new embedded server's shared_buffers (kb/db/embedded_server.py default_shared_buffers; takes
-- effect after the restart that follows). ALTER SYSTEM takes no parameters: the size is a literal.
ALTER SYSTEM SET shared_buffers = {size};

-- name: database_exists
SELECT 1 AS found FROM pg_database WHERE datname = %(database)s;

-- name: create_database
CREATE DATABASE {database};

-- name: pgvector_available
SELECT default_version FROM pg_available_extensions WHERE name = 'vector';

-- name: database_answers
-- The readiness probe of kb serve (/ready): the database answers a statement.
SELECT 1 AS answers;

-- name: connected_clients
-- Who else is connected to the server (kb db-stop, design §13): client sessions and replication
-- senders (Zero), by application_name (kb's processes name themselves "kb <command> pid N").
SELECT coalesce(nullif(application_name, ''), 'unnamed client') AS client, count(*) AS connections
FROM pg_stat_activity
WHERE backend_type IN ('client backend', 'walsender') AND pid <> pg_backend_pid()
GROUP BY 1 ORDER BY 1;
