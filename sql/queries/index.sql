-- Named queries of the derived index (kb/index/indexer.py, design §7).

-- name: try_index_lock
-- Held until the lock connection's transaction ends (kb/index/indexer.py _index_lock).
SELECT pg_try_advisory_xact_lock(%(namespace)s, %(workspace_id)s) AS locked;

-- name: lock_workspace_chunks
-- The workspace's chunk lock (kb/db/locks.py chunk_lock: level 2 of the lock order written there).
SELECT pg_advisory_xact_lock(%(namespace)s, %(workspace_id)s);

-- name: lock_indexed_document
-- The row of the document an index run is about to write, locked after the chunk lock and before
-- its chunks (kb/db/locks.py lock order), with what it holds now: a projection (or the artifact
-- layer) may have deleted, moved or changed it since the run read it (no row: deleted).
SELECT id, content_id, path FROM kb.documents WHERE id = %(document_id)s FOR NO KEY UPDATE;

-- name: lock_indexed_documents
-- lock_indexed_document for a batch of documents written in one transaction (kb/index/indexer.py),
-- in id order so two lockers of overlapping batches never wait on each other in a cycle.
SELECT id, content_id, path FROM kb.documents WHERE id = ANY(%(document_ids)s::bigint[])
ORDER BY id FOR NO KEY UPDATE;

-- name: documents_to_index
-- Documents whose indexed content lags their projected content, excluding quarantined and
-- unindexable ones (a content change resets those to pending).
SELECT id, path, title, content_id, index_attempts
FROM kb.documents
WHERE workspace_id = %(workspace_id)s
  AND content_id IS DISTINCT FROM indexed_content_id
  AND status NOT IN ('quarantined', 'unindexable')
ORDER BY id;

-- name: cached_embeddings
-- Read with a binary cursor by the indexer: the vectors in pgvector's binary form (kb.db.vector_wire).
SELECT text_sha256, embedding
FROM kb.embedding_cache
WHERE model = %(model)s AND dim = %(dim)s AND text_sha256 = ANY(%(hashes)s);

-- name: cache_embeddings
-- Vectors of one embedder batch in one statement (parallel arrays of hashes and vectors, the
-- vectors a binary parameter: kb.db.vector_wire), in key order, so runs caching the same texts at
-- once take the keys in one order.
INSERT INTO kb.embedding_cache (text_sha256, model, dim, embedding)
SELECT c.text_sha256, %(model)s, %(dim)s, c.embedding
FROM unnest(%(text_sha256s)s::text[], %(embeddings)b::vector[]) AS c (text_sha256, embedding)
ORDER BY c.text_sha256
ON CONFLICT DO NOTHING;

-- name: insert_chunks
-- Chunk rows of a document or a batch of documents in one statement (one element per chunk in each
-- column): the statement-level triggers that count terms (kb.count_chunk_terms) then run once
-- per batch, not once per chunk (kb/index/indexer.py). text_sha256 is the sha256 of the text
-- embedded (context line + chunk text, kb.chunk_context). tsv: the context line (title and heading
-- path) with weight A, the chunk text with weight D, both as kb.languages.lexical_text prepared
-- them (CJK bigrams), in the document's configuration. The columns but the vectors are JSON arrays
-- (kb.store.history.json_column: psycopg dumps a Python list into an array value by value in
-- Python, ~6 ms a 122-chunk batch on the index writer, against under 1 ms for json.dumps); the
-- vectors are a binary parameter (pgvector's binary form, kb.db.vector_wire). ROWS FROM zips them
-- by position, and the rows are inserted in that order.
INSERT INTO kb.chunks (document_id, workspace_id, position, text, text_sha256, start_char, end_char,
                       start_line, end_line, token_count, embedding_model, embedding, text_config, tsv)
SELECT c.document_id::bigint, c.workspace_id::integer, c.position::integer, c.text, c.text_sha256,
       c.start_char::integer, c.end_char::integer, c.start_line::integer, c.end_line::integer,
       c.token_count::integer, c.model, c.embedding, c.text_config,
       setweight(to_tsvector(c.text_config::regconfig, c.lexical_context), 'A')
       || to_tsvector(c.text_config::regconfig, c.lexical_text)
FROM ROWS FROM (json_array_elements_text(%(document_ids)s::json), json_array_elements_text(%(workspace_ids)s::json),
                json_array_elements_text(%(positions)s::json), json_array_elements_text(%(texts)s::json),
                json_array_elements_text(%(text_sha256s)s::json), json_array_elements_text(%(start_chars)s::json),
                json_array_elements_text(%(end_chars)s::json), json_array_elements_text(%(start_lines)s::json),
                json_array_elements_text(%(end_lines)s::json), json_array_elements_text(%(token_counts)s::json),
                json_array_elements_text(%(models)s::json), unnest(%(embeddings)b::vector[]),
                json_array_elements_text(%(text_configs)s::json), json_array_elements_text(%(lexical_contexts)s::json),
                json_array_elements_text(%(lexical_texts)s::json))
     WITH ORDINALITY AS c (document_id, workspace_id, position, text, text_sha256, start_char, end_char,
                           start_line, end_line, token_count, model, embedding, text_config,
                           lexical_context, lexical_text, n)
ORDER BY c.n;

-- name: update_chunk_positions
-- New positions and spans of reused chunk rows, in one statement (parallel arrays).
UPDATE kb.chunks k
SET position = u.position, start_char = u.start_char, end_char = u.end_char,
    start_line = u.start_line, end_line = u.end_line
FROM unnest(%(ids)s::bigint[], %(positions)s::integer[], %(start_chars)s::integer[], %(end_chars)s::integer[],
            %(start_lines)s::integer[], %(end_lines)s::integer[])
     AS u (id, position, start_char, end_char, start_line, end_line)
WHERE k.id = u.id;

-- name: delete_chunks
DELETE FROM kb.chunks WHERE id = ANY(%(ids)s);

-- name: refresh_document_terms
-- After a document's chunks changed: its whole-document terms for the document leg (migration 0018).
SELECT kb.refresh_document_terms(%(document_ids)s::bigint[]);

-- name: mark_document_indexed
-- The document's chunks are written (status 'indexed', error NULL) or it is kept out of the index
-- with a reason (status 'unindexable', error the reason). Only while the row still holds what was
-- indexed, at the path it had (the run checked it under the chunk lock: lock_indexed_document).
-- The stamp (indexed_path, indexed_revision) is a search envelope's citation (design §8) and must
-- name this content: the revision is the later of the workspace's projected revision (under the
-- chunk lock no projection is half done, so every projected row is as that revision has it) and
-- the revision that wrote the row's content (the artifact layer writes its rows ahead of the
-- projection); never the revision the run itself projected, which predates rows a later
-- projection brought in. %(revision_id)s only when neither is known.
UPDATE kb.documents d
SET status = %(status)s, indexed_content_id = %(content_id)s, indexed_path = d.path,
    indexed_revision = coalesce(
        CASE WHEN projected.seq IS NULL
                  OR (SELECT seq FROM kb.revisions WHERE workspace_id = d.workspace_id AND id = d.revision_id)
                     > projected.seq
             THEN d.revision_id ELSE w.last_projected_revision END,
        %(revision_id)s),
    index_error = %(error)s,
    index_attempts = CASE WHEN %(status)s::text = 'indexed' THEN 0 ELSE d.index_attempts END
FROM kb.workspaces w
LEFT JOIN kb.revisions projected ON projected.workspace_id = w.id AND projected.id = w.last_projected_revision
WHERE w.id = d.workspace_id
  AND d.id = %(document_id)s AND d.content_id = %(content_id)s AND d.path = %(path)s;

-- name: mark_documents_indexed
-- mark_document_indexed for a batch of documents written in one transaction (kb/index/indexer.py),
-- in one statement: parallel arrays of ids, contents, paths, statuses and errors (one element per
-- document, the rows already locked by lock_indexed_documents); the same stamp and conditions.
UPDATE kb.documents d
SET status = m.status, indexed_content_id = m.content_id, indexed_path = d.path,
    indexed_revision = coalesce(
        CASE WHEN projected.seq IS NULL
                  OR (SELECT seq FROM kb.revisions WHERE workspace_id = d.workspace_id AND id = d.revision_id)
                     > projected.seq
             THEN d.revision_id ELSE w.last_projected_revision END,
        %(revision_id)s),
    index_error = m.error,
    index_attempts = CASE WHEN m.status = 'indexed' THEN 0 ELSE d.index_attempts END
FROM kb.workspaces w
LEFT JOIN kb.revisions projected ON projected.workspace_id = w.id AND projected.id = w.last_projected_revision,
     unnest(%(document_ids)s::bigint[], %(content_ids)s::text[], %(paths)s::text[], %(statuses)s::text[],
            %(errors)s::text[]) AS m (document_id, content_id, path, status, error)
WHERE w.id = d.workspace_id
  AND d.id = m.document_id AND d.content_id = m.content_id AND d.path = m.path;

-- name: delete_document_chunks
DELETE FROM kb.chunks WHERE document_id = %(document_id)s;

-- name: mark_document_failed
UPDATE kb.documents
SET index_attempts = index_attempts + 1,
    status = CASE WHEN index_attempts + 1 >= %(max_attempts)s THEN 'quarantined' ELSE 'failed' END,
    quarantined_at = CASE WHEN index_attempts + 1 >= %(max_attempts)s THEN now() ELSE quarantined_at END,
    index_error = %(error)s
WHERE id = %(document_id)s
RETURNING status;

-- name: set_index_stamp
UPDATE kb.workspaces SET last_indexed_revision = %(revision_id)s WHERE id = %(workspace_id)s;

-- name: chunk_vector_dimension
-- The dimension of kb.chunks.embedding as declared (vector(N)), or NULL when undeclared.
SELECT nullif(a.atttypmod, -1) AS dim
FROM pg_attribute a
WHERE a.attrelid = 'kb.chunks'::regclass AND a.attname = 'embedding';

-- ---- (design §7) reindex, progress rows, sweeps ------------------------------------------------

-- name: documents_to_reindex
-- Every document of the workspace after the resume cursor, in id order (design §7 reindex).
SELECT id, path, title, content_id, index_attempts
FROM kb.documents
WHERE workspace_id = %(workspace_id)s AND id > %(after_id)s
ORDER BY id;

-- name: chunks_of_documents
-- A document's chunk rows, with whether the row's tsvector is of the current CJK segmentation
-- (cjk_current, kb.languages.lexical_text: a run's bigrams and its characters): false when the
-- first character of a CJK run of two or more lacks its lexeme, as in a row an earlier kb wrote
-- with bigrams alone; the indexer then writes the row again (its vector from the cache). The
-- character class is kb.languages' _CJK_RUN; a character the row's configuration makes no lexeme
-- of (the katakana middle dot) is not missing.
SELECT id, document_id, position, text_sha256, start_char, end_char, start_line, end_line,
       embedding_model, text_config,
       NOT EXISTS (
           SELECT 1
           FROM regexp_matches(c.text,
               '([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af])[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+',
               'g') m
           CROSS JOIN LATERAL unnest(to_tsvector(coalesce(c.text_config, 'english')::regconfig, m[1])) u
           WHERE NOT c.tsv @@ quote_literal(u.lexeme)::tsquery) AS cjk_current
FROM kb.chunks c WHERE c.document_id = ANY(%(document_ids)s) ORDER BY c.document_id, c.position;

-- name: documents_still_failed
SELECT count(*) AS failed, coalesce(max(index_attempts), 0) AS attempts
FROM kb.documents WHERE workspace_id = %(workspace_id)s AND status = 'failed';

-- name: running_index_run
SELECT * FROM kb.index_runs
WHERE workspace_id = %(workspace_id)s AND kind = %(kind)s AND status = 'running'
ORDER BY id DESC LIMIT 1;

-- name: interrupt_index_runs
-- Runs left 'running' by a killed process (the caller holds the index lock, so none is alive).
UPDATE kb.index_runs SET status = 'interrupted', updated_at = now()
WHERE workspace_id = %(workspace_id)s AND status = 'running' AND id <> %(keep_id)s;

-- name: start_index_run
INSERT INTO kb.index_runs (workspace_id, kind, target_revision, documents_total)
VALUES (%(workspace_id)s, %(kind)s, %(target_revision)s, %(documents_total)s)
RETURNING *;

-- name: resume_index_run
UPDATE kb.index_runs
SET target_revision = %(target_revision)s, documents_total = %(documents_total)s,
    resumed_count = resumed_count + 1, updated_at = now()
WHERE id = %(id)s
RETURNING *;

-- name: update_index_run
UPDATE kb.index_runs
SET documents_done = %(documents_done)s, documents_total = %(documents_total)s,
    documents_failed = %(documents_failed)s,
    cursor_document_id = %(cursor_document_id)s, chunks_written = %(chunks_written)s,
    chunks_reused = %(chunks_reused)s, embeddings_computed = %(embeddings_computed)s,
    embeddings_cached = %(embeddings_cached)s, updated_at = now()
WHERE id = %(id)s;

-- name: finish_index_run
UPDATE kb.index_runs SET status = 'finished', finished_at = now(), updated_at = now()
WHERE id = %(id)s;

-- name: index_lag
SELECT * FROM kb.index_lag
WHERE %(workspace_id)s::int IS NULL OR workspace_id = %(workspace_id)s::int
ORDER BY workspace_id;

-- name: job_health
SELECT * FROM kb.job_health ORDER BY queue;

-- name: quarantined_documents
SELECT path, index_attempts, index_error
FROM kb.documents
WHERE workspace_id = %(workspace_id)s AND status = 'quarantined'
ORDER BY path;

-- name: interrupt_index_runs_of_kind
UPDATE kb.index_runs SET status = 'interrupted', updated_at = now()
WHERE workspace_id = %(workspace_id)s AND kind = %(kind)s AND status = 'running' AND id <> %(keep_id)s;

-- name: prune_index_runs
-- Finished or interrupted run rows older than the retention, except each workspace's latest run.
DELETE FROM kb.index_runs r
WHERE r.status <> 'running'
  AND r.updated_at < now() - make_interval(hours => %(hours)s)
  AND r.id <> (SELECT max(id) FROM kb.index_runs l WHERE l.workspace_id = r.workspace_id);

-- name: retry_quarantined_documents
-- Quarantined documents get one more attempt (design §7) once the embedder answers again,
-- at most every retry_seconds: a document failing again is quarantined again at once.
UPDATE kb.documents
SET status = 'failed', index_attempts = greatest(%(max_attempts)s - 1, 0)
WHERE workspace_id = %(workspace_id)s AND status = 'quarantined'
  AND (quarantined_at IS NULL OR quarantined_at <= now() - make_interval(secs => %(retry_seconds)s::float8))
RETURNING id;

-- name: retry_documents
-- A person's retry (the operator's view, design §17): failed or quarantined documents of a
-- workspace (all, or the given paths) start again as pending with no attempts counted.
UPDATE kb.documents
SET status = 'pending', index_attempts = 0, index_error = NULL, quarantined_at = NULL
WHERE workspace_id = %(workspace_id)s AND status IN ('failed', 'quarantined')
  AND (%(paths)s::text[] IS NULL OR path = ANY(%(paths)s::text[]))
RETURNING path;

-- name: failed_documents
-- Failed and quarantined documents of every workspace with their reasons (the operator's view).
SELECT workspace_id, path, status, index_attempts, index_error
FROM kb.documents
WHERE status IN ('failed', 'quarantined')
ORDER BY workspace_id, path
LIMIT %(limit)s;

-- name: index_session
-- An index run's connections commit without waiting for their WAL to reach disk (design §7): a
-- batch's commit then costs no fsync. Only a Postgres crash can lose such commits, and only the
-- last few, as a whole (WAL is written in order): their documents lag again and the next run
-- indexes them. The run's last transaction (durable_commit) waits for the flush, which makes every
-- earlier commit of the run durable with it.
SET synchronous_commit TO off;

-- name: durable_commit
-- This transaction's commit waits for the WAL flush (see index_session).
SET LOCAL synchronous_commit TO on;

-- name: defer_term_stats
-- An index run that writes most of the workspace counts its term statistics once at its end
-- (migration 0029): from this row's commit on the triggers leave the workspace out.
INSERT INTO kb.deferred_term_stats (workspace_id) VALUES (%(workspace_id)s) ON CONFLICT DO NOTHING;

-- name: term_stats_deferred
SELECT EXISTS (SELECT 1 FROM kb.deferred_term_stats WHERE workspace_id = %(workspace_id)s) AS deferred;

-- name: recount_term_stats
-- The workspace's term statistics counted afresh, its deferral ended (the caller holds the chunk lock).
SELECT kb.recount_term_stats(%(workspace_id)s);

-- name: recount_chunk_term_stats
-- The chunk half of recount_term_stats (kb.text_stats, kb.lexeme_stats), run by the connection that
-- holds the workspace's chunk lock while another runs the document half (migration 0032).
SELECT kb.recount_chunk_term_stats(%(workspace_id)s);

-- name: recount_document_term_stats
-- The document half of recount_term_stats (kb.document_text_stats, kb.document_lexeme_stats), on a
-- second connection while the chunk lock's holder runs the chunk half (migration 0032).
SELECT kb.recount_document_term_stats(%(workspace_id)s);

-- name: end_term_stats_deferral
-- Once both halves are counted: the triggers count the workspace's changes again (migration 0029).
DELETE FROM kb.deferred_term_stats WHERE workspace_id = %(workspace_id)s;

-- name: deferred_term_stats_workspaces
-- Workspaces whose term statistics are deferred: a running bulk index run, or one that died (the
-- sweep recounts those whose index lock is free).
SELECT workspace_id FROM kb.deferred_term_stats ORDER BY workspace_id;

-- name: workspace_index_backlog
-- A workspace's documents, and those whose indexed content lags their content (never indexed, or
-- changed since): what decides whether an index run defers the term statistics (kb/index/indexer.py).
SELECT count(*) AS documents, count(*) FILTER (WHERE content_id IS DISTINCT FROM indexed_content_id) AS lagging
FROM kb.documents WHERE workspace_id = %(workspace_id)s;
