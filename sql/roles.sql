-- Optional least-privilege roles for kb's database (design §16, docs/access.md). Run it as the
-- owner of kb's schema (the role that ran the migrations), in kb's database, after `kb init`:
--
--     psql "$(kb db-url)" -f sql/roles.sql
--
-- and again after each upgrade (it only adds grants; re-running it is harmless). Roles are
-- cluster-wide: the three are created NOLOGIN once per server (several databases share them);
-- the grants are per database. Give people and services LOGIN roles that are members:
--
--     CREATE ROLE support_search LOGIN PASSWORD '…' IN ROLE kb_reader;
--
-- kb_reader   SELECT on kb's tables and views (documents, chunks, revisions, the operator views
--             …) except the API-token digests; enough for a search, nothing it can change.
-- kb_writer   what kb's processes need (kb serve, kb worker, the CLI's writes): read and write
--             every kb table and Procrastinate's job tables, use their sequences, TEMP tables
--             (the legacy seed). Not granted: DDL. Migrations (`kb migrate`, `kb init`) and the
--             HNSW vector indexes of large workspaces (CREATE INDEX needs the table's owner) stay
--             with the owner; run `kb worker --queue maintenance` as the owner, or accept exact
--             scans (design §8).
-- kb_operator kb_reader, plus the job queue (retry, cancel, delete jobs: SELECT/UPDATE/DELETE on
--             Procrastinate's tables), span-fill control and the views for DBAs.

DO $$
DECLARE
    name text;
BEGIN
    FOREACH name IN ARRAY ARRAY['kb_reader', 'kb_writer', 'kb_operator'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', name);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- created already (by another database's run, or concurrently)
        END;
    END LOOP;
    BEGIN
        GRANT kb_reader TO kb_operator;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL;
    END;
END
$$;

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO kb_reader, kb_writer, kb_operator', current_database());
    EXECUTE format('GRANT TEMPORARY ON DATABASE %I TO kb_writer', current_database());
END
$$;

-- kb_reader: everything kb shows, nothing it stores; never the token digests.
GRANT USAGE ON SCHEMA kb TO kb_reader, kb_writer;
GRANT SELECT ON ALL TABLES IN SCHEMA kb TO kb_reader;
REVOKE SELECT ON kb.api_tokens FROM kb_reader;

-- kb_writer: kb's processes.
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA kb TO kb_writer;
GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA kb TO kb_writer;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA kb TO kb_writer, kb_reader;
-- tables migrations add later: the same, when the owner creates them
ALTER DEFAULT PRIVILEGES IN SCHEMA kb GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO kb_writer;
ALTER DEFAULT PRIVILEGES IN SCHEMA kb GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO kb_writer;

-- kb_operator: span-fill control (design §9).
GRANT INSERT, UPDATE, DELETE ON kb.span_fill_control TO kb_operator;

-- Procrastinate's job queue, in whatever schema it lives (public by default): the writer runs
-- jobs; the operator inspects, retries and cancels them.
DO $$
DECLARE
    object record;
BEGIN
    FOR object IN
        SELECT n.nspname, c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relname LIKE 'procrastinate\_%' AND c.relkind IN ('r', 'v', 'S', 'p')
    LOOP
        EXECUTE format('GRANT USAGE ON SCHEMA %I TO kb_writer, kb_operator', object.nspname);
        IF object.relkind = 'S' THEN
            EXECUTE format('GRANT USAGE, SELECT, UPDATE ON SEQUENCE %I.%I TO kb_writer, kb_operator',
                           object.nspname, object.relname);
        ELSE
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.%I TO kb_writer', object.nspname, object.relname);
            EXECUTE format('GRANT SELECT, UPDATE, DELETE ON %I.%I TO kb_operator', object.nspname, object.relname);
        END IF;
    END LOOP;
END
$$;
