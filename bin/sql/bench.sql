-- Named queries of the benchmarks and the search evaluation (bin/; loaded by tests/support/named_queries.py, design §14). They do not ship with kb.

-- name: bench_delete_workspace_chunks
-- Wipe a workspace's chunk rows (they are disposable, design §1) to time a rebuild from the cache.
DELETE FROM kb.chunks WHERE workspace_id = %(workspace_id)s;

-- name: bench_vector_leg
-- The vector leg of hybrid_search on its own: the workspace's nearest chunks by cosine distance.
SELECT id FROM kb.chunks
WHERE workspace_id = %(workspace_id)s AND embedding IS NOT NULL
ORDER BY embedding <=> %(embedding)s::vector, id
LIMIT %(k)s;

-- name: bench_all_embeddings
SELECT id, embedding::text AS embedding FROM kb.chunks WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: bench_sample_chunks
SELECT text FROM kb.chunks WHERE workspace_id = %(workspace_id)s ORDER BY md5(id::text) LIMIT %(n)s;

-- ---- bin/bench_search.py (design §8) ----

-- name: bench_workspace_documents
SELECT id, path, title, content_id FROM kb.documents WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- name: bench_mark_indexed
UPDATE kb.documents
SET status = 'indexed', indexed_content_id = content_id, indexed_path = path, indexed_revision = revision_id
WHERE workspace_id = %(workspace_id)s;

-- name: bench_create_staging
CREATE TEMP TABLE bench_chunks (
    document_id bigint, workspace_id integer, position integer, text text, context text,
    start_line integer, end_line integer, embedding_model text, embedding vector
) ON COMMIT DROP;

-- name: bench_copy_staging
COPY bench_chunks (document_id, workspace_id, position, text, context, start_line, end_line,
                   embedding_model, embedding) FROM STDIN;

-- name: bench_insert_staged
-- Synthetic chunk rows for the latency benchmark, built as the indexer builds them (same tsv
-- expression, text_config english).
INSERT INTO kb.chunks (document_id, workspace_id, position, text, text_sha256, start_char, end_char,
                       start_line, end_line, token_count, embedding_model, embedding, text_config, tsv)
SELECT document_id, workspace_id, position, text, md5(text), 0, length(text), start_line, end_line,
       NULL, embedding_model, embedding, 'english',
       setweight(to_tsvector('english', context), 'A') || to_tsvector('english', text)
FROM bench_chunks;

-- name: bench_analyze
ANALYZE kb.chunks;

-- name: bench_checkpoint
-- Before timing: write out what loading and the index builds dirtied, so the checkpoint that
-- would otherwise follow does not run during the measured searches.
CHECKPOINT;

-- ---- bin/eval_search.py (design §8) ----

-- name: eval_chunk_documents
SELECT c.id, d.path FROM kb.chunks c JOIN kb.documents d ON d.id = c.document_id
WHERE c.workspace_id = %(workspace_id)s;

-- name: eval_chunk_vectors
-- The workspace's chunk vectors of one model as text ('[x, y, …]'), for the alternatives that
-- need them in numpy (document-mean vectors, vector feedback).
SELECT c.id, d.path, c.embedding::text AS embedding FROM kb.chunks c JOIN kb.documents d ON d.id = c.document_id
WHERE c.workspace_id = %(workspace_id)s AND c.embedding_model = %(model)s AND c.embedding IS NOT NULL
ORDER BY c.id;

-- name: eval_document_paths
SELECT id, path FROM kb.documents WHERE workspace_id = %(workspace_id)s;

-- name: bench_empty_document_leg
-- bin/bench_search.py: the document leg returning nothing, to time the search without it.
SELECT NULL::bigint AS id, NULL::float8 AS score WHERE false;

-- ---- bin/bench_import_index.py ----

-- name: bench_chunk_texts
SELECT text FROM kb.chunks WHERE workspace_id = %(workspace_id)s ORDER BY id;

-- ---- bin/bench_auth.py (design §16) ----

-- name: bench_round_trip
-- The cheapest statement: the floor of one round trip to Postgres, beside the token check.
SELECT 1 AS one;

-- name: bench_forget_embeddings
-- Empty the embedding cache so the next index run embeds every chunk again (bin/bench_index_pipeline.py).
DELETE FROM kb.embedding_cache;

-- ---- bin/bench_seed.py, bin/bench_store.py: a throwaway database per run ----

-- name: bench_drop_database
-- Drop a benchmark's database even with sessions still connected (they are ended).
DROP DATABASE IF EXISTS {database} WITH (FORCE);

-- name: bench_seeded_chunk_texts
-- Every document of a workspace with its chunk texts in order (bin/bench_seed.py: the alignment
-- work alone, without the span fill's writes).
SELECT d.content_id, array_agg(c.text ORDER BY c.position, c.id) FROM kb.documents d
JOIN kb.chunks c ON c.document_id = d.id WHERE d.workspace_id = %(workspace_id)s
GROUP BY d.id, d.content_id;

-- name: bench_forget_spans
-- A workspace's chunks back to no spans, as seeding adopted them (design §9), for the next fill.
UPDATE kb.chunks SET start_char = NULL, end_char = NULL, start_line = NULL, end_line = NULL
WHERE workspace_id = %(workspace_id)s;

-- name: bench_forget_span_fill_skips
DELETE FROM kb.span_fill_skips;

-- name: bench_span_fill_unthrottled
-- The span fill in big batches, without its pause between them.
UPDATE kb.span_fill_control SET batch_documents = 500, throttle_ms = 0, paused = false;

-- name: bench_index_fingerprint
-- What an index run of a workspace stored, one md5 per table (bin/index_fingerprint.py): rows keyed
-- by document path, not by ids or workspace number, so two databases (two kb trees indexing the same
-- corpus) compare equal exactly when every chunk (text, spans, vector, tsvector, token counts),
-- document stamp and status, document-terms row, term statistics row and cached vector is the same.
-- Stamps are compared as the revision's sequence number: two imports of a corpus make the same
-- blobs but commits of their own.
WITH w AS (SELECT %(workspace_id)s::integer AS id),
docs AS (
    SELECT d.id, d.path, ROW(d.path, d.title, d.document_type, d.status, d.content_id, d.indexed_content_id,
               d.indexed_path, r.seq, d.index_error, d.index_attempts)::text AS line
    FROM kb.documents d JOIN w ON d.workspace_id = w.id
    LEFT JOIN kb.revisions r ON r.workspace_id = d.workspace_id AND r.id = d.indexed_revision
),
chunks AS (
    SELECT ROW(docs.path, c.position, c.text, c.text_sha256, c.start_char, c.end_char, c.start_line, c.end_line,
               c.token_count, c.embedding_model, c.embedding::text, c.text_config, c.tsv::text, c.tsv_tokens)::text
               AS line, docs.path, c.position, c.text_sha256, c.embedding_model
    FROM kb.chunks c JOIN docs ON docs.id = c.document_id
)
SELECT 'documents' AS part, count(*) AS rows, md5(string_agg(line, E'\n' ORDER BY path)) AS md5 FROM docs
UNION ALL
SELECT 'chunks', count(*), md5(string_agg(line, E'\n' ORDER BY path, position, line)) FROM chunks
UNION ALL
SELECT 'document_terms', count(*),
       md5(string_agg(ROW(docs.path, t.text_config, t.tsv::text, t.tokens)::text, E'\n' ORDER BY docs.path))
FROM kb.document_terms t JOIN docs ON docs.id = t.document_id
UNION ALL
SELECT 'lexeme_stats', count(*), md5(string_agg(ROW(s.text_config, s.lexeme, s.chunk_count)::text, E'\n'
                                                ORDER BY s.text_config, s.lexeme))
FROM kb.lexeme_stats s JOIN w ON s.workspace_id = w.id
UNION ALL
SELECT 'text_stats', count(*), md5(string_agg(ROW(s.text_config, s.chunk_count, s.token_total)::text, E'\n'
                                              ORDER BY s.text_config))
FROM kb.text_stats s JOIN w ON s.workspace_id = w.id
UNION ALL
SELECT 'document_lexeme_stats', count(*), md5(string_agg(ROW(s.text_config, s.lexeme, s.document_count)::text,
                                                         E'\n' ORDER BY s.text_config, s.lexeme))
FROM kb.document_lexeme_stats s JOIN w ON s.workspace_id = w.id
UNION ALL
SELECT 'document_text_stats', count(*),
       md5(string_agg(ROW(s.text_config, s.document_count, s.token_total)::text, E'\n' ORDER BY s.text_config))
FROM kb.document_text_stats s JOIN w ON s.workspace_id = w.id
UNION ALL
SELECT 'embedding_cache', count(*), md5(string_agg(ROW(e.text_sha256, e.model, e.dim, e.embedding::text)::text,
                                                   E'\n' ORDER BY e.text_sha256, e.model, e.dim))
FROM kb.embedding_cache e
WHERE EXISTS (SELECT FROM chunks c WHERE c.text_sha256 = e.text_sha256 AND c.embedding_model = e.model)
UNION ALL
SELECT 'workspace', count(*), md5(string_agg(ROW(r.seq, ws.revision_count, ws.embedder)::text, E'\n'))
FROM kb.workspaces ws JOIN w ON ws.id = w.id
LEFT JOIN kb.revisions r ON r.workspace_id = ws.id AND r.id = ws.last_indexed_revision;
