-- Named queries of the test suite (loaded by tests/support/named_queries.py). They do not ship with kb.

-- ---- (design §7) reads of the derived index for tests ----------------------------------------

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

-- name: test_workspace_vector_dims
-- Each workspace's vector dimensions (migration 0024: an untyped column, one model per workspace).
SELECT workspace_id, min(vector_dims(embedding)) AS low, max(vector_dims(embedding)) AS high
FROM kb.chunks GROUP BY workspace_id ORDER BY workspace_id;

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

-- ---- (design §14) Postgres going away under a writer -------------------------------------------

-- name: test_advisory_lock_waiters
-- Any session waiting for an advisory lock (one row, or none).
SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted LIMIT 1;

-- name: test_write_lock_holders
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND classid = %(namespace)s AND objid = %(workspace_id)s AND granted;

-- name: test_terminate_backend
SELECT pg_terminate_backend(%(pid)s) AS terminated;
-- ---- (design §8) citations -----------------------------------------------------------------------

-- name: test_truncate_chunks
-- Resolution must never need chunk rows after render (design §8).
TRUNCATE kb.chunks;

-- name: test_null_chunk_spans
-- Chunks of one document as legacy rows without spans (design §9): they render un-numbered.
UPDATE kb.chunks c SET start_line = NULL, end_line = NULL
FROM kb.documents d
WHERE d.id = c.document_id AND d.workspace_id = %(workspace_id)s AND d.path = %(path)s;

-- name: test_quarantine_document
-- One document as the indexer leaves it after its last attempt failed (design §7), due for a retry.
UPDATE kb.documents SET status = 'quarantined', quarantined_at = NULL
WHERE workspace_id = %(workspace_id)s AND path = %(path)s;

-- name: test_expire_api_token
UPDATE kb.api_tokens SET expires_at = now() - interval '1 second' WHERE name = %(name)s;

-- name: test_age_citation_chat
UPDATE kb.citation_chats SET last_used_at = now() - make_interval(days => %(days)s)
WHERE workspace_id = %(workspace_id)s AND chat_id = %(chat_id)s;
-- ---- design §8 (tests/test_search_ranking.py) ----

-- name: test_lexeme_stats
SELECT text_config, lexeme, chunk_count FROM kb.lexeme_stats
WHERE workspace_id = %(workspace_id)s AND chunk_count <> 0;

-- name: test_lexeme_recount
SELECT coalesce(c.text_config, 'english') AS text_config, u.lexeme, count(*) AS chunk_count
FROM kb.chunks c, unnest(c.tsv) u
WHERE c.workspace_id = %(workspace_id)s GROUP BY 1, 2;

-- name: test_text_stats_check
SELECT (SELECT coalesce(sum(chunk_count), 0) FROM kb.text_stats WHERE workspace_id = %(workspace_id)s) AS kept_chunks,
       (SELECT coalesce(sum(token_total), 0) FROM kb.text_stats WHERE workspace_id = %(workspace_id)s) AS kept_length,
       (SELECT count(*) FROM kb.chunks WHERE workspace_id = %(workspace_id)s) AS chunks,
       (SELECT coalesce(sum(cardinality(u.positions)), 0) FROM kb.chunks c, unnest(c.tsv) u
        WHERE c.workspace_id = %(workspace_id)s) AS length;

-- name: test_chunk_configs
SELECT DISTINCT d.path, c.text_config FROM kb.chunks c JOIN kb.documents d ON d.id = c.document_id
WHERE c.workspace_id = %(workspace_id)s;

-- name: test_vector_index_exists
SELECT relname FROM pg_class WHERE relname = %(name)s AND relnamespace = 'kb'::regnamespace;

-- name: test_vector_distances
SELECT id, (embedding <=> %(embedding)s::vector)::float8 AS distance FROM kb.chunks
WHERE workspace_id = %(workspace_id)s;
-- ---- (design §13) session settings, document identity ------------------------------------------

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

-- ---- (design §11) artifacts and remotes ----

-- name: test_push_jobs
SELECT id, queue_name, lock, queueing_lock, status::text AS status, attempts
FROM procrastinate_jobs WHERE task_name = 'kb.push_remote' ORDER BY id;

-- name: test_set_document_type
UPDATE kb.documents SET document_type = %(document_type)s
WHERE workspace_id = %(workspace_id)s AND path = %(path)s;

-- name: test_text_tables
-- Every table of kb's schema and Procrastinate's (the credential-leak scan reads them all).
SELECT schemaname, tablename FROM pg_tables
WHERE schemaname = 'kb' OR tablename LIKE 'procrastinate%'
ORDER BY 1, 2;
-- ---- (design §7) job locks and delayed jobs ------------------------------------------------------

-- name: test_job_lock
SELECT lock, queueing_lock FROM procrastinate_jobs WHERE id = %(id)s;

-- name: test_job_status
SELECT status::text AS status FROM procrastinate_jobs WHERE id = %(id)s;

-- name: test_make_job_due
UPDATE procrastinate_jobs SET scheduled_at = now() WHERE id = %(id)s;

-- name: test_mark_job_doing
UPDATE procrastinate_jobs SET status = 'doing' WHERE id = %(id)s;

-- name: test_fetch_job
SELECT id FROM procrastinate_fetch_job_v2(%(queues)s::varchar[], NULL);

-- name: test_fetch_job_as_worker
-- Fetch a job as a worker does: registered (a fresh heartbeat), then Procrastinate's fetch.
SELECT id FROM procrastinate_fetch_job_v2(%(queues)s::varchar[],
                                          (SELECT worker_id FROM procrastinate_register_worker_v1()));

-- name: test_fail_documents
UPDATE kb.documents SET status = 'failed', index_attempts = 2, index_error = 'test: embedder down'
WHERE workspace_id = %(workspace_id)s;

-- name: test_defer_locked_later
-- A delayed job carrying a lock, as code outside kb could defer it (Procrastinate's own API).
INSERT INTO procrastinate_jobs (queue_name, task_name, priority, lock, args, scheduled_at)
VALUES ('index', 'kb.index_changes', 0, %(lock)s, '{"workspace_id": 1}', now() + interval '10 minutes')
RETURNING id;

-- name: test_unaccent_folds
SELECT to_tsvector('kb.simple_unaccent', 'Příliš') = to_tsvector('simple', 'prilis') AS folds;

-- name: test_write_intent_sequence
-- The intent id sequence: the last id handed out and whether it is logged ('p') or unlogged ('u').
SELECT s.last_value, c.relpersistence AS persistence
FROM kb.write_intents_id_seq s, pg_class c
WHERE c.oid = 'kb.write_intents_id_seq'::regclass;

-- name: test_chunk_postings
-- Every lexeme of every chunk of a workspace with its positions and weights (a reference BM25).
SELECT c.id, c.document_id, c.position, coalesce(c.text_config, 'english') AS text_config, u.lexeme,
       u.positions, u.weights
FROM kb.chunks c, unnest(c.tsv) u
WHERE c.workspace_id = %(workspace_id)s;

-- name: test_query_lexemes
SELECT DISTINCT u.lexeme FROM unnest(to_tsvector(%(config)s::regconfig, %(text)s)) u;

-- name: test_document_lexeme_stats
SELECT text_config, lexeme, document_count FROM kb.document_lexeme_stats
WHERE workspace_id = %(workspace_id)s AND document_count <> 0;

-- name: test_document_lexeme_recount
SELECT t.text_config, u.lexeme, count(*) AS document_count
FROM kb.document_terms t, unnest(t.tsv) u
WHERE t.workspace_id = %(workspace_id)s GROUP BY 1, 2;

-- name: test_document_terms_check
-- kb.document_terms against the chunks: one row per document with chunks, its tokens the first
-- chunk's length and the other chunks' body tokens (weight D); and kb.document_text_stats against
-- the rows.
WITH ranked AS (
    SELECT document_id, tsv, tsv_tokens,
           row_number() OVER (PARTITION BY document_id ORDER BY position, id) = 1 AS first
    FROM kb.chunks WHERE workspace_id = %(workspace_id)s
),
expected AS (
    SELECT document_id,
           sum(CASE WHEN first THEN tsv_tokens
                    ELSE (SELECT coalesce(sum(cardinality(array_positions(u.weights, 'D'))), 0)
                          FROM unnest(tsv) u) END) AS tokens
    FROM ranked GROUP BY document_id
)
SELECT (SELECT count(*) FROM expected) AS documents_with_chunks,
       (SELECT count(*) FROM kb.document_terms WHERE workspace_id = %(workspace_id)s) AS rows,
       (SELECT count(*) FROM expected e JOIN kb.document_terms t USING (document_id)
        WHERE t.tokens = e.tokens) AS rows_matching,
       (SELECT coalesce(sum(document_count), 0) FROM kb.document_text_stats
        WHERE workspace_id = %(workspace_id)s) AS kept_documents,
       (SELECT coalesce(sum(token_total), 0) FROM kb.document_text_stats
        WHERE workspace_id = %(workspace_id)s) AS kept_length,
       (SELECT coalesce(sum(tokens), 0) FROM kb.document_terms WHERE workspace_id = %(workspace_id)s) AS length;

-- name: test_undo_migration_0018
-- A database as it was before migration 0018 (tests/test_search_ranking.py: the upgrade fills
-- kb.document_terms from the chunks already indexed).
DROP TABLE kb.document_terms, kb.document_lexeme_stats, kb.document_text_stats;
DROP FUNCTION kb.refresh_document_terms(bigint[]);
DROP FUNCTION kb.count_document_terms();
DROP FUNCTION kb.add_document_terms(integer[], text[], tsvector[], integer[], integer);
DELETE FROM kb.schema_migrations WHERE name = '0018_add_document_terms.sql';

-- ---- concurrency of projection and indexing (kb.locks chunk lock) ----------------------------

-- name: test_hold_document_terms
-- Hold a document's kb.document_terms row from a side connection: an index run refreshing that
-- document's terms waits here, inside the transaction that already wrote its chunks.
SELECT document_id FROM kb.document_terms WHERE document_id = %(document_id)s FOR UPDATE;

-- name: test_hold_index_run
-- Hold an index run row from a side connection: a new index_changes run, interrupting it, waits
-- here after it has read the documents it will index.
SELECT id FROM kb.index_runs WHERE id = %(id)s FOR UPDATE;

-- name: test_left_running_index_run
-- An index_changes run row left 'running' (as a killed worker leaves it).
INSERT INTO kb.index_runs (workspace_id, kind, target_revision) VALUES (%(workspace_id)s, 'index_changes', NULL)
RETURNING id;

-- name: test_backends_blocked_by
-- Backends of this database waiting for a lock held by one of %(pids)s.
SELECT pid, wait_event_type, pg_blocking_pids(pid) AS blockers
FROM pg_stat_activity
WHERE datname = current_database() AND pg_blocking_pids(pid) && %(pids)s::int[];

-- name: test_document_id
SELECT id FROM kb.documents WHERE workspace_id = %(workspace_id)s AND path = %(path)s;

-- name: test_hold_document_text_stats
-- Hold a workspace's whole-document statistics rows from a side connection: a projection deleting
-- an indexed document waits here, after its cascaded chunk delete updated kb.text_stats.
SELECT workspace_id FROM kb.document_text_stats WHERE workspace_id = %(workspace_id)s FOR UPDATE;

-- name: test_stale_chunk_texts
-- A document's chunks no longer match its content (the span fill skips it as stale).
UPDATE kb.chunks c SET text = 'text this document no longer holds'
FROM kb.documents d
WHERE d.id = c.document_id AND d.workspace_id = %(workspace_id)s AND d.path = %(path)s;

-- name: test_workspace_exists
SELECT EXISTS (SELECT 1 FROM kb.workspaces WHERE id = %(workspace_id)s) AS present;

-- name: test_planner_without_nested_loops
-- tests/test_search_ranking.py: the planner told to avoid nested loops (for this transaction), as
-- it did by itself when wrong statistics made a join look cheaper, and sequential scans (a test's
-- tables are tiny): a statement must keep its index lookups even then.
SELECT set_config('enable_nestloop', 'off', true), set_config('enable_seqscan', 'off', true);

-- name: test_lock_chunks_exclusively
-- tests/test_workspaces.py: an administrator's lock that every search waits behind.
LOCK TABLE kb.chunks IN ACCESS EXCLUSIVE MODE;

-- name: test_cancel_backend
SELECT pg_cancel_backend(%(pid)s) AS canceled;

-- name: test_unnormalized_tsvectors
-- tests/test_search_ranking.py: the chunk tsvectors an earlier kb wrote for a workspace, from the
-- title and text as stored (before kb.languages.lexical_text normalized them to Unicode form C).
UPDATE kb.chunks c
SET tsv = setweight(to_tsvector(c.text_config::regconfig, d.title), 'A') || to_tsvector(c.text_config::regconfig, c.text)
FROM kb.documents d
WHERE d.id = c.document_id AND c.workspace_id = %(workspace_id)s;

-- name: test_chunk_texts
SELECT id, text, text_config FROM kb.chunks WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: test_set_chunk_tsvector
-- tests/test_search_ranking.py: a chunk's tsvector as an earlier kb wrote it (its text given
-- already segmented, e.g. CJK runs as bigrams alone).
UPDATE kb.chunks SET tsv = to_tsvector(text_config::regconfig, %(lexical)s) WHERE id = %(id)s;

-- name: test_refresh_workspace_document_terms
SELECT kb.refresh_document_terms(ARRAY(SELECT id FROM kb.documents WHERE workspace_id = %(workspace_id)s));

-- name: test_set_workspace_head
-- Postgres' recorded head of a workspace, set as a reader that queried just before a commit saw it.
UPDATE kb.workspaces SET head_revision = %(head)s WHERE id = %(workspace_id)s;

-- ---- the test server: a database per test, copied from a template ----

-- name: show_shared_buffers
SELECT pg_size_bytes(current_setting('shared_buffers')) AS shared_buffers_bytes;

-- name: create_database_from_template
CREATE DATABASE {database} TEMPLATE {template};

-- name: terminate_connections
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = %(database)s AND pid <> pg_backend_pid();

-- name: drop_database
DROP DATABASE IF EXISTS {database};

-- ---- write outcomes (design §3): a writer's session killed while a leader records its draft ----

-- name: test_write_intents
SELECT id, backend_pid, payload, outcome FROM kb.write_intents WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: test_hold_workspace_row
-- Hold the workspace row from a side connection: a group-commit leader waits here with its group
-- claimed, before its ref moves.
SELECT id FROM kb.workspaces WHERE id = %(workspace_id)s FOR UPDATE;

-- name: test_document_ids_of
SELECT path, id FROM kb.documents WHERE workspace_id = %(workspace_id)s ORDER BY path;

-- name: test_forget_repository_identity
-- A workspace as it was before repository identities existed.
UPDATE kb.workspaces SET repository_id = NULL WHERE id = %(workspace_id)s;

-- ---- (design §15) nodes ------------------------------------------------------------------------

-- name: test_node_jobs
-- Every job with its queue and workspace (which node's queue a job went to).
SELECT id, queue_name, task_name, status::text AS status, (args ->> 'workspace_id')::int AS workspace_id
FROM procrastinate_jobs ORDER BY id;

-- name: test_age_node_heartbeat
-- A node whose last heartbeat was %(seconds)s seconds ago (it stopped, or its host is gone).
UPDATE kb.nodes SET heartbeat_at = now() - make_interval(secs => %(seconds)s::float8) WHERE name = %(name)s;

-- name: test_forget_home_node
-- A workspace as it was before nodes existed (no home node).
UPDATE kb.workspaces SET home_node = NULL WHERE id = %(workspace_id)s;

-- name: test_api_token_rows
SELECT * FROM kb.api_tokens ORDER BY id;

-- name: test_terminate_other_backends
-- Every other session of this database (the pools' idle connections).
SELECT count(pg_terminate_backend(pid)) AS terminated FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend';

-- name: test_pack_jobs
-- kb.pack_repository jobs (tests/test_maintenance.py), oldest first.
SELECT status::text FROM procrastinate_jobs WHERE task_name = 'kb.pack_repository' ORDER BY id;

-- name: test_create_chunk_refusal
-- A row trigger that refuses any chunk whose text holds 'REFUSED BY POSTGRES' (tests/test_index_convergence.py):
-- a document Postgres itself will not take, in a batch with documents it takes.
CREATE FUNCTION kb.test_refuse_chunk() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.text LIKE '%REFUSED BY POSTGRES%' THEN
        RAISE EXCEPTION 'chunk refused by a test trigger';
    END IF;
    RETURN NEW;
END;
$$;

-- name: test_install_chunk_refusal
CREATE TRIGGER test_refuse_chunk BEFORE INSERT ON kb.chunks FOR EACH ROW EXECUTE FUNCTION kb.test_refuse_chunk();

-- name: test_documents_in_id_order
-- A workspace's documents in the order an index run takes them (tests/test_index_pipeline.py).
SELECT id, path, status, content_id, indexed_content_id FROM kb.documents
WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: test_vector_as_floats
-- A vector literal as pgvector stores it, read back as float4s (tests/test_embedders.py).
SELECT %(literal)s::vector::real[] AS floats;

-- name: test_path_changes_without_revision
-- Path-change rows whose revision row is missing (none may be: kb.store.history.record_changes_ahead).
SELECT c.workspace_id, c.revision_id, c.path FROM kb.path_changes AS c
LEFT JOIN kb.revisions AS r ON r.workspace_id = c.workspace_id AND r.id = c.revision_id
WHERE r.id IS NULL;

-- name: test_synchronous_commit
-- The session's synchronous_commit (tests/test_pgbouncer.py: what a pooled server connection kept).
SHOW synchronous_commit;

-- name: test_vectors_binary_as_floats
-- Vectors sent in pgvector's binary form (kb.db.vector_wire), read back as float4s and sent back
-- unchanged (tests/test_vector_wire.py).
SELECT v::real[] AS floats, v AS vector FROM unnest(%(vectors)b::vector[]) AS v;

-- name: test_hold_advisory_lock
-- Held by a test in its open transaction, so a job that needs it waits (design §7 outage tests).
SELECT pg_advisory_xact_lock(%(namespace)s, %(workspace_id)s);

-- name: test_jobs_doing
SELECT id, task_name FROM procrastinate_jobs WHERE status = 'doing' ORDER BY id;

-- name: test_document_stamps
-- What mark_document_indexed / mark_documents_indexed set on a workspace's documents
-- (tests/test_index_pipeline.py).
SELECT id, status, indexed_content_id, indexed_path, indexed_revision, index_error, index_attempts
FROM kb.documents WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: test_set_index_attempts
UPDATE kb.documents SET status = 'failed', index_attempts = %(attempts)s, index_error = 'earlier'
WHERE id = %(document_id)s;

-- name: test_document_stamps_by_path
-- A workspace's documents with their content and index state (tests/test_projection.py).
SELECT id, path, title, content_id, status, index_attempts FROM kb.documents WHERE workspace_id = %(workspace_id)s;

-- name: test_document_terms_reference
-- A workspace's document terms as kb.refresh_document_terms built them before migration 0031 (a
-- term's positions by generate_series and string_agg, the terms joined with their document before
-- the aggregate): the tsvector, as text, and the length each document's row must hold.
WITH chunks AS (
    SELECT c.document_id, c.workspace_id, coalesce(c.text_config, 'english') AS text_config, c.tsv,
           row_number() OVER (PARTITION BY c.document_id ORDER BY c.position, c.id) = 1 AS first
    FROM kb.chunks c
    WHERE c.workspace_id = %(workspace_id)s
),
counts AS (
    SELECT ch.document_id, u.lexeme,
           sum(CASE WHEN ch.first THEN cardinality(array_positions(u.weights, 'A')) ELSE 0 END) AS titled,
           sum(CASE WHEN ch.first
                    THEN greatest(cardinality(u.positions), 1) - cardinality(array_positions(u.weights, 'A'))
                    ELSE cardinality(array_positions(u.weights, 'D')) END) AS body
    FROM chunks ch, unnest(ch.tsv) u
    GROUP BY ch.document_id, u.lexeme
),
terms AS (
    SELECT document_id, titled, body,
           '''' || replace(replace(lexeme, '\', '\\'), '''', '''''') || '''' AS quoted,
           CASE WHEN titled + body = 1 THEN CASE WHEN titled = 1 THEN '1A' ELSE '1' END
                ELSE (SELECT string_agg(p::text || CASE WHEN p <= titled THEN 'A' ELSE '' END, ',' ORDER BY p)
                      FROM generate_series(1, least(titled + body, 256)) p) END AS positions
    FROM counts
    WHERE titled + body > 0
),
summed AS (
    SELECT o.document_id, sum(t.titled + t.body)::integer AS tokens,
           string_agg(t.quoted || ':' || t.positions, ' ') AS counted,
           string_agg(t.quoted || CASE WHEN t.titled > 0 THEN ':1A' ELSE ':1' END, ' ') AS once
    FROM (SELECT DISTINCT document_id FROM chunks) o
    JOIN terms t USING (document_id)
    GROUP BY o.document_id
)
SELECT document_id, kb.document_terms_vector(counted, once)::text AS tsv, tokens FROM summed ORDER BY document_id;

-- name: test_document_terms_rows
SELECT document_id, tsv::text AS tsv, tokens FROM kb.document_terms
WHERE workspace_id = %(workspace_id)s ORDER BY document_id;

-- ---- rows as a test reads them back (tests/test_projection.py, test_zero.py, test_replication.py) ----

-- name: test_table_rows_by_id
-- The given {columns} of a table, ordered by id (the published columns, as a subscriber holds them).
SELECT {columns} FROM {table} ORDER BY id;

-- name: test_document_rows
SELECT id, path, title, document_type, metadata, content_id FROM kb.documents WHERE workspace_id = %(workspace_id)s;

-- name: test_folder_rows
SELECT id, path, name, parent_path FROM kb.folders WHERE workspace_id = %(workspace_id)s;

-- name: test_document_titles
SELECT path, title FROM kb.documents WHERE workspace_id = %(workspace_id)s;

-- name: test_insert_uploaded_file_row
-- A FILE row written straight into kb.documents, as an upload path outside kb's writers once did
-- (tests/test_projection.py: the projection must adopt it, not duplicate it).
INSERT INTO kb.documents (workspace_id, path, title, document_type, metadata)
VALUES (1, '/documents/Uploads/report.md', 'Q3 report', 'FILE', '{"source": "upload"}');

-- name: test_make_guide_a_file
-- One imported document turned into a FILE with metadata, which a rebuilt projection must keep.
UPDATE kb.documents SET document_type = 'FILE', metadata = '{"k": 1}' WHERE path = '/documents/Guides/doc 0.md';

-- name: test_wipe_workspace_chunks
-- A workspace's chunk rows gone (derived data, design §1: a reindex brings them back).
DELETE FROM kb.chunks WHERE workspace_id = %(workspace_id)s;

-- name: test_wipe_workspace_folders
-- A workspace's folder rows gone (a projection rebuild brings them back).
DELETE FROM kb.folders WHERE workspace_id = %(workspace_id)s;

-- name: test_chunk_spans_in_path_order
-- Every chunk's span and text digest, by document path and position (what a rebuild must keep).
SELECT d.path, c.position, c.start_char, c.end_char, c.start_line, c.end_line, c.text_sha256
FROM kb.chunks c JOIN kb.documents d ON d.id = c.document_id
WHERE c.workspace_id = %(workspace_id)s ORDER BY d.path, c.position;

-- ---- (design §10) seeding from a legacy knowledge base (tests/test_seed.py, test_seed_cli.py,
-- test_span_fill.py, tests/support/legacy_source.py) ----

-- name: test_legacy_insert_folder
INSERT INTO legacy.folders (workspace_id, parent_id, name, position, created_at)
VALUES (%(workspace_id)s, %(parent_id)s, %(name)s, %(position)s, %(created_at)s)
RETURNING id;

-- name: test_legacy_insert_document
INSERT INTO legacy.documents (workspace_id, folder_id, title, document_type, document_metadata, content,
                              source_markdown, content_hash, unique_identifier_hash, status, created_by_id,
                              created_at, updated_at)
VALUES (%(workspace_id)s, %(folder_id)s, %(title)s, %(document_type)s, %(document_metadata)s, %(content)s,
        %(source_markdown)s, %(content_hash)s, %(unique_identifier_hash)s, %(status)s, %(created_by_id)s,
        %(created_at)s, %(updated_at)s)
RETURNING id;

-- name: test_legacy_insert_chunk
INSERT INTO legacy.chunks (document_id, position, content, embedding, created_at)
VALUES (%(document_id)s, %(position)s, %(content)s, %(embedding)s::vector, %(created_at)s);

-- name: test_legacy_add_metadata
-- Merge keys into a legacy document's metadata (e.g. the virtual_path marker of an older export).
UPDATE legacy.documents SET document_metadata = document_metadata || %(metadata)s WHERE id = %(document_id)s;

-- name: test_legacy_record_meta
-- The legacy set's model and chunker, as the legacy system kept them in legacy.meta.
INSERT INTO legacy.meta VALUES ('embedding_model', %(model)s), ('chunker', 'legacy-paragraph-800')
ON CONFLICT (key) DO UPDATE SET value = excluded.value;

-- name: test_legacy_counts
SELECT (SELECT count(*) FROM legacy.documents WHERE workspace_id = %(workspace_id)s),
       (SELECT count(*) FROM legacy.folders WHERE workspace_id = %(workspace_id)s),
       (SELECT count(*) FROM legacy.chunks c JOIN legacy.documents d ON d.id = c.document_id
        WHERE d.workspace_id = %(workspace_id)s);

-- name: test_legacy_documents
SELECT id, title, document_type, document_metadata, content, source_markdown, status, created_at
FROM legacy.documents WHERE workspace_id = %(workspace_id)s;

-- name: test_seeded_documents
-- A workspace's documents with the legacy id each was seeded from (NULL for kb's own).
SELECT d.*, l.legacy_id FROM kb.documents d LEFT JOIN kb.legacy_documents l ON l.document_id = d.id
WHERE d.workspace_id = %(workspace_id)s;

-- name: test_adopted_chunk_summary
-- What seeding adopted into a workspace: chunk count, how many have spans, and the model.
SELECT count(*) AS n, count(start_line) AS spanned, count(start_char) AS chars, min(embedding_model) AS model
FROM kb.chunks WHERE workspace_id = %(workspace_id)s;

-- name: test_first_chunk_vectors
SELECT text, embedding::text AS e FROM kb.chunks WHERE workspace_id = %(workspace_id)s ORDER BY id LIMIT %(n)s;

-- name: test_count_cached_embeddings
SELECT count(*) AS n FROM kb.embedding_cache;

-- name: test_legacy_first_ready_note
-- The first legacy note of a workspace with markdown (the one a reseed test edits).
SELECT id FROM legacy.documents
WHERE workspace_id = %(workspace_id)s AND status = 'ready' AND source_markdown IS NOT NULL AND document_type = 'NOTE'
ORDER BY id LIMIT 1;

-- name: test_legacy_last_ready_note_in_a_folder
-- The last legacy note in a folder with non-empty markdown, other than %(other_id)s (the one a
-- reseed test retitles).
SELECT id, title FROM legacy.documents
WHERE workspace_id = %(workspace_id)s AND status = 'ready' AND id <> %(other_id)s AND document_type = 'NOTE'
  AND folder_id IS NOT NULL AND source_markdown <> ''
ORDER BY id DESC LIMIT 1;

-- name: test_legacy_markdown
SELECT source_markdown FROM legacy.documents WHERE id = %(id)s;

-- name: test_legacy_append_edit
-- A legacy note edited after seeding: a line appended.
UPDATE legacy.documents SET source_markdown = source_markdown || E'edited\n' WHERE id = %(id)s;

-- name: test_legacy_set_markdown
UPDATE legacy.documents SET source_markdown = %(source_markdown)s WHERE id = %(id)s;

-- name: test_legacy_set_title
UPDATE legacy.documents SET title = %(title)s WHERE id = %(id)s;

-- name: test_legacy_insert_empty_folder
-- A legacy folder holding nothing, its name unsafe for a path (seeding keeps it as a .keep file).
INSERT INTO legacy.folders (workspace_id, name, created_at) VALUES (%(workspace_id)s, 'Empty: folder', now())
RETURNING id;

-- name: test_legacy_delete_folder
DELETE FROM legacy.folders WHERE id = %(id)s;

-- name: test_count_workspace_chunks
SELECT count(*) FROM kb.chunks WHERE workspace_id = %(workspace_id)s;

-- name: test_count_chunks_without_spans
SELECT count(*) FROM kb.chunks WHERE workspace_id = %(workspace_id)s AND start_line IS NULL;

-- name: test_document_status_counts
SELECT status, count(*) FROM kb.documents WHERE workspace_id = %(workspace_id)s GROUP BY 1;

-- name: test_first_document_paths
SELECT path FROM kb.documents WHERE workspace_id = %(workspace_id)s ORDER BY id LIMIT %(n)s;

-- name: test_delete_document_row
-- A document's row gone while its file stays (drift the check repairs, design §7).
DELETE FROM kb.documents WHERE path = %(path)s;

-- name: test_corrupt_document_content_ids
-- A document row whose content ids match no blob (drift the check repairs).
UPDATE kb.documents SET content_id = repeat('0', 40), indexed_content_id = repeat('0', 40) WHERE path = %(path)s;

-- name: test_corrupt_indexed_content_id
-- A document row claiming an index of content it does not hold (drift the check repairs).
UPDATE kb.documents SET indexed_content_id = repeat('1', 40) WHERE path = %(path)s;

-- name: test_count_documents_at
SELECT count(*) FROM kb.documents WHERE workspace_id = %(workspace_id)s AND path = ANY(%(paths)s);

-- name: test_chunk_rows_of
SELECT c.* FROM kb.chunks c JOIN kb.documents d ON d.id = c.document_id
WHERE d.workspace_id = %(workspace_id)s AND d.path = %(path)s
ORDER BY c.position, c.id;

-- name: test_count_span_fill_skips
SELECT count(*) FROM kb.span_fill_skips WHERE workspace_id = %(workspace_id)s;

-- name: test_count_skipped_chunks
-- Chunks of the documents the span fill skipped as stale (they keep no spans).
SELECT count(*) FROM kb.chunks c JOIN kb.span_fill_skips k USING (document_id);

-- name: test_count_fillable_chunks_without_spans
-- Chunks of a workspace still without spans, not counting the skipped stale documents' (0 once a fill finished).
SELECT count(*) FROM kb.chunks c
WHERE c.workspace_id = %(workspace_id)s AND c.start_line IS NULL
  AND c.document_id NOT IN (SELECT document_id FROM kb.span_fill_skips);

-- name: test_span_fill_most_batches
SELECT coalesce(max(batches), 0) FROM kb.span_fill_runs;

-- name: test_span_fill_run_statuses
SELECT status FROM kb.span_fill_runs ORDER BY id;

-- name: test_job_list
SELECT id, task_name, status::text, attempts FROM procrastinate_jobs ORDER BY id;

-- The span fill's control row as a DBA sets it with psql (design §9, docs/migration.md); the tests
-- pass these to the real psql client.

-- name: test_span_fill_batches_of_4_every_150ms
UPDATE kb.span_fill_control SET batch_documents = 4, throttle_ms = 150;

-- name: test_span_fill_pause
UPDATE kb.span_fill_control SET paused = true;

-- name: test_span_fill_resume_in_batches_of_5
UPDATE kb.span_fill_control SET paused = false, batch_documents = 5, throttle_ms = 0;

-- name: test_span_fill_batches_of_3_every_300ms
UPDATE kb.span_fill_control SET batch_documents = 3, throttle_ms = 300;

-- name: test_span_fill_batches_of_50
UPDATE kb.span_fill_control SET batch_documents = 50, throttle_ms = 0;

-- ---- (design §3) write outcomes under connection kills (tests/support/outcome_stress.py) ----

-- name: test_terminate_client_backends
-- Every other client session of this database, one row per session ended.
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend';

-- name: test_terminate_busy_client_backends
-- The other client sessions of this database inside a transaction, one row per session ended.
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND xact_start IS NOT NULL;

-- ---- roles, publications, subscriptions, server settings (tests/test_session_settings.py,
-- test_replication.py, test_cli_startup.py, test_embedded_server.py; {identifiers} and {values}
-- filled with psycopg.sql) ----

-- name: test_drop_role_if_exists
DROP ROLE IF EXISTS {role};

-- name: test_create_login_role
CREATE ROLE {role} LOGIN;

-- name: test_create_superuser_role
CREATE ROLE {role} LOGIN SUPERUSER;

-- name: test_drop_owned_and_role
-- A role and everything it owns or was granted in this database.
DROP OWNED BY {role};
DROP ROLE {role};

-- name: test_set_role_default
-- A session default a role's every connection starts with (ALTER ROLE … SET, design §13).
ALTER ROLE {role} SET {setting} = {value};

-- name: test_set_database_default
-- A session default every connection to a database starts with (ALTER DATABASE … SET, design §13).
ALTER DATABASE {database} SET {setting} = {value};

-- name: test_schema_kb_first_on_search_path
-- A database prepared under someone else's search_path: schema kb exists and comes first, so
-- unqualified names created next land in it (tests/test_session_settings.py).
CREATE SCHEMA kb;
SET search_path = kb, public;

-- name: test_subscribe
-- Subscribe this server to a publication of the server at {connection} (a conninfo literal).
CREATE SUBSCRIPTION kb_test_sub CONNECTION {connection} PUBLICATION {publication};

-- name: test_unsubscribe
-- Dropping the subscription drops the publisher's replication slot too.
DROP SUBSCRIPTION IF EXISTS kb_test_sub;

-- name: test_drop_publication
DROP PUBLICATION {publication};

-- name: test_count_publications
SELECT count(*) AS n FROM pg_publication WHERE pubname = %(name)s;

-- name: test_kb_schema_present
SELECT to_regclass('kb.documents') IS NOT NULL AS present;

-- name: test_edit_first_migration_checksum
-- The ledger row of kb's first migration as if its file had been edited after it was applied.
UPDATE kb.schema_migrations SET checksum = 'edited'
WHERE name = (SELECT min(name) FROM kb.schema_migrations WHERE name NOT LIKE 'procrastinate/%');

-- name: test_count_application_sessions
SELECT count(*) FROM pg_stat_activity WHERE application_name = %(application)s;

-- name: test_open_a_transaction
-- Any statement: on a connection outside autocommit it leaves a transaction open.
SELECT 1 AS one;

-- name: test_set_server_port
-- The server's port for its next start (ALTER SYSTEM takes no parameters: {port} is a literal).
ALTER SYSTEM SET port = {port};

-- name: test_listen_on_all_addresses
-- The server listening on every address from its next start.
ALTER SYSTEM SET listen_addresses = '*';

-- name: test_server_port
SELECT current_setting('port') AS port;

-- name: test_drop_database_force
-- Drop a database even with sessions connected (they are ended).
DROP DATABASE {database} WITH (FORCE);

-- ---- workspaces and their rows (tests/test_workspaces.py, test_group_commit.py, test_remotes.py,
-- test_create_by_title.py, test_migrations.py) ----

-- name: test_tables_with_workspace_id
-- Every base table of schema kb with a workspace_id column (tables later features add included).
SELECT table_name FROM information_schema.columns
WHERE table_schema = 'kb' AND column_name = 'workspace_id' AND table_name IN
      (SELECT table_name FROM information_schema.tables WHERE table_schema = 'kb' AND table_type = 'BASE TABLE');

-- name: test_count_workspace_rows
-- Rows of one workspace in the kb table {table}.
SELECT count(*) FROM kb.{table} WHERE workspace_id = %(workspace_id)s;

-- name: test_count_workspace_row
SELECT count(*) FROM kb.workspaces WHERE id = %(workspace_id)s;

-- name: test_count_workspace_jobs
SELECT count(*) FROM procrastinate_jobs WHERE args ->> 'workspace_id' = %(workspace_id)s;

-- name: test_count_vector_indexes
-- kb's per-workspace HNSW indexes (a deleted workspace's must be gone).
SELECT count(*) AS n FROM pg_indexes WHERE indexname LIKE 'kb_chunks_hnsw%';

-- name: test_count_write_intents
SELECT count(*) AS n FROM kb.write_intents;

-- name: test_table_rows_as_text
-- Every row of the table {table}, each as text (tests/test_remotes.py: the credential-leak scan).
SELECT t::text FROM {table} t;

-- name: test_schema_catalog
-- kb's schema as comparable text, one row per column, index, constraint, view, function and text
-- search configuration mapping (tests/test_migrations.py: schema.sql against the migrations applied).
SELECT 'column' AS kind, table_schema || '.' || table_name || '.' || column_name || ' ' || data_type
       || ' ' || coalesce(udt_name, '') || ' null=' || is_nullable || ' default=' || coalesce(column_default, '')
FROM information_schema.columns WHERE table_schema = 'kb'
UNION ALL
SELECT 'index', schemaname || '.' || indexname || ' ' || indexdef FROM pg_indexes WHERE schemaname = 'kb'
UNION ALL
SELECT 'constraint', conrelid::regclass::text || ' ' || pg_get_constraintdef(oid)
FROM pg_constraint WHERE connamespace = 'kb'::regnamespace
UNION ALL
SELECT 'view', schemaname || '.' || viewname || ' ' || definition FROM pg_views WHERE schemaname = 'kb'
UNION ALL
SELECT 'function', p.oid::regprocedure::text || ' ' || pg_get_functiondef(p.oid)
FROM pg_proc p WHERE p.pronamespace = 'kb'::regnamespace
UNION ALL
SELECT 'text search configuration', c.cfgname || ' ' || m.maptokentype || ' ' || m.mapseqno || ' '
       || m.mapdict::regdictionary::text
FROM pg_ts_config c JOIN pg_ts_config_map m ON m.mapcfg = c.oid WHERE c.cfgnamespace = 'kb'::regnamespace
ORDER BY 1, 2;

-- ---- query plans (tests/test_search_ranking.py); no final semicolon: {statement} is a whole
-- statement, with or without its own ----

-- name: test_explain
EXPLAIN {statement}

-- name: test_explain_json
EXPLAIN (FORMAT JSON) {statement}

-- name: test_fail_document_stats_inserts
-- Every insert into kb.document_text_stats fails (a real Postgres error): the document half of a
-- bulk run's recount cannot finish (tests/test_index_term_stats.py).
CREATE FUNCTION kb.test_refuse_document_stats() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'test: document statistics refused';
END;
$$;
CREATE TRIGGER test_refuse_document_stats BEFORE INSERT ON kb.document_text_stats
    FOR EACH ROW EXECUTE FUNCTION kb.test_refuse_document_stats();

-- name: test_allow_document_stats_inserts
DROP TRIGGER test_refuse_document_stats ON kb.document_text_stats;
DROP FUNCTION kb.test_refuse_document_stats();

-- name: test_expire_token
-- Ends the lifetime of the live token named %(name)s a minute ago (a token list's expired row).
UPDATE kb.api_tokens SET expires_at = now() - interval '1 minute'
WHERE name = %(name)s AND revoked_at IS NULL;

-- name: test_job_heartbeat_age
-- Seconds since the last heartbeat of the worker running job %(job_id)s (NULL: no worker row).
SELECT j.id, j.status::text AS status, j.worker_id,
       extract(epoch FROM now() - w.last_heartbeat)::float8 AS heartbeat_age
FROM procrastinate_jobs AS j LEFT JOIN procrastinate_workers AS w ON w.id = j.worker_id
WHERE j.id = %(job_id)s;

-- name: test_terminate_application
-- End every session of one kb process, named by its application_name ("kb import pid N").
SELECT count(pg_terminate_backend(pid)) AS terminated FROM pg_stat_activity WHERE application_name = %(name)s;
