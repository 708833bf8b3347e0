-- Named queries of the publication check (kb/db/publication.py, design §6).

-- name: publication_capabilities
-- What the connected role and server allow: column lists need Postgres 15; creating a publication
-- over kb's tables needs CREATE on the database and ownership of the tables (or superuser).
SELECT current_setting('server_version_num')::int AS server_version_num,
       current_setting('wal_level') AS wal_level,
       current_setting('max_replication_slots')::int AS max_replication_slots,
       current_setting('max_wal_senders')::int AS max_wal_senders,
       current_user AS role,
       has_database_privilege(current_database(), 'CREATE') AS can_create,
       (SELECT coalesce(bool_and(pg_has_role(current_user, c.relowner, 'USAGE')), false)
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'kb' AND c.relname IN ('documents', 'folders')) AS owns_tables,
       EXISTS (SELECT 1 FROM pg_publication WHERE pubname = %(name)s) AS exists;

-- name: publication_tables
SELECT schemaname || '.' || tablename AS table_name, attnames
FROM pg_publication_tables WHERE pubname = %(name)s ORDER BY 1;
