-- Named queries of search (kb/search/hybrid.py, design §8).

-- name: vector_leg
-- The vector leg: exact nearest chunks of the workspace by cosine distance, vectors of the active
-- model only (another model's vectors live in another space). An exact scan returns its limit
-- whenever the workspace has that many chunks (design §8); vectors are stored inline (STORAGE
-- PLAIN, migration 0007), so the scan reads no TOAST.
SELECT id, embedding <=> %(embedding)s::vector AS distance
FROM kb.chunks
WHERE workspace_id = %(workspace_id)s AND embedding_model = %(model)s AND embedding IS NOT NULL
ORDER BY distance, id
LIMIT %(limit)s;

-- name: lexical_leg
-- A full-text leg, ranked by Okapi BM25 (k1, b) from term statistics kept per workspace and text
-- configuration. kb/search/hybrid.py fills in what it ranks: chunks (kb.chunks with kb.lexeme_stats and
-- kb.text_stats) or whole documents (kb.document_terms with kb.document_lexeme_stats and
-- kb.document_text_stats, migration 0018); {units}, {unit_id} and {length} name the ranked table,
-- its id and its length in tokens, {lexeme_stats}, {text_stats} and {count} its statistics.
-- The query is parsed with every configuration the workspace's units use, and each parse is scored
-- against the units of its configuration with that configuration's frequencies, unit count and
-- mean length (in tokens). Only units holding a selective term (one in at most selective_units
-- units or selective_share of them, or the configuration's rarest query term) or all the terms are
-- scored, so a word found everywhere does not make every unit a candidate. A long query keeps its
-- max_terms rarest terms per configuration (a 4,000-character Chinese query is ~4,000 bigrams: a
-- tsquery of thousands of alternatives took seconds per leg). The term frequency
-- counts every occurrence, one in the context line (title, headings: weight A) as title_weight.
-- Each candidate's query terms are unnested once and looked up in the arrays of its
-- configuration's lexemes and idfs that travel with it: no join with the terms, whose order the
-- planner could not estimate (it unnested every candidate once per query term), and no
-- correlated subquery per candidate; lengths are stored (kb.chunks.tsv_tokens, migration 0016).
WITH totals AS (
    SELECT text_config, {count}::float8 AS n, token_total::float8 / {count} AS avg_length
    FROM {text_stats}
    WHERE workspace_id = %(workspace_id)s AND {count} > 0
),
terms AS MATERIALIZED (
    SELECT t.text_config, q.lexeme, l.{count} AS df, t.n, t.avg_length,
           '''' || replace(replace(q.lexeme, '\', '\\'), '''', '''''') || '''' AS quoted,
           ln(1 + (t.n - l.{count} + 0.5) / (l.{count} + 0.5)) AS idf
    FROM totals t
    CROSS JOIN LATERAL (
        SELECT DISTINCT u.lexeme FROM unnest(to_tsvector(t.text_config::regconfig, %(query)s)) u) q
    CROSS JOIN LATERAL (
        -- one primary-key probe per query term, whatever the statistics say: as a plain join the
        -- planner, before the statistics table was first analyzed (after a bulk index run), read
        -- all of the workspace's lexemes and unnested the query once for each (7,771 rows, 108 ms
        -- for one search); LIMIT keeps the subquery from being flattened into such a join
        SELECT l.{count} FROM {lexeme_stats} l
        WHERE l.workspace_id = %(workspace_id)s AND l.text_config = t.text_config AND l.lexeme = q.lexeme
        LIMIT 1) l
    WHERE l.{count} > 0
),
selectors AS (
    SELECT text_config,
           (string_agg(quoted, ' | ') FILTER (
                WHERE df <= greatest(%(selective_units)s, %(selective_share)s * n) OR df = rarest))::tsquery
           || string_agg(quoted, ' & ')::tsquery AS selector,
           array_agg(lexeme ORDER BY lexeme) AS lexemes, array_agg(idf ORDER BY lexeme) AS idfs,
           min(avg_length) AS avg_length
    FROM (SELECT *, min(df) OVER (PARTITION BY text_config) AS rarest,
                 row_number() OVER (PARTITION BY text_config ORDER BY df, lexeme) AS rarity
          FROM terms) s
    WHERE rarity <= %(max_terms)s
    GROUP BY text_config
),
candidates AS MATERIALIZED (
    -- each candidate keeps only its query terms, cut out in C: the unnest below then builds rows
    -- for a few terms instead of the whole tsvector (a document's can hold thousands). setweight
    -- marks the query terms' positions, ts_filter keeps the marked ones: title positions (weight
    -- A) become C, body positions (D) become B, and the two are joined again, so a term keeps
    -- every position and which of them were the title's. kb writes only weights A and D (the
    -- indexer, the seed and kb.refresh_document_terms), and every lexeme with a position. Before,
    -- ts_delete of everything else (tsvector_to_array of the rest: a text per lexeme) took 4×
    -- as long per candidate; the document leg's p95 fell by about a third on
    -- bin/bench_search.py's 10,000-chunk workspace, with the same ids and scores.
    -- concatenation detoasts the tsvector once for every use; the ::integer cast lets the
    -- (workspace_id, tsv) GIN index use its workspace column (btree_gin has no int2 = int4).
    -- The units are a subquery per configuration that cannot be flattened (OFFSET 0), so the
    -- selector is always an index condition: as a plain join, with unanalyzed statistics the
    -- planner hashed the selectors and read every unit of the workspace through the index,
    -- testing the selector on each
    SELECT c.id,
           ts_filter(setweight(ts_filter(c.tsv, '{{a}}'), 'C', s.lexemes), '{{c}}')
           || ts_filter(setweight(ts_filter(c.tsv, '{{d}}'), 'B', s.lexemes), '{{b}}') AS tsv,
           c.length, s.lexemes, s.idfs, s.avg_length
    FROM selectors s
    CROSS JOIN LATERAL (
        SELECT u.{unit_id} AS id, u.tsv || ''::tsvector AS tsv, u.{length} AS length
        FROM {units} u
        WHERE u.workspace_id = %(workspace_id)s::integer AND coalesce(u.text_config, 'english') = s.text_config
          AND u.tsv @@ s.selector
        OFFSET 0) c
)
SELECT c.id,
       sum(c.idfs[array_position(c.lexemes, u.lexeme)] * f.tf * (%(k1)s + 1)
           / (f.tf + %(k1)s * (1 - %(b)s + %(b)s * c.length / c.avg_length)))::float8 AS score
FROM candidates c
CROSS JOIN LATERAL unnest(c.tsv) u
CROSS JOIN LATERAL (
    SELECT greatest(cardinality(u.positions), 1)
           + (%(title_weight)s - 1) * cardinality(array_positions(u.weights, 'C')) AS tf) f
WHERE u.lexeme = ANY (c.lexemes)
GROUP BY c.id
ORDER BY score DESC, c.id
LIMIT %(limit)s;

-- name: search_candidates
-- The three legs in one statement (one round trip). Chunk rows: every chunk a chunk leg returned,
-- with its rank in each (NULL where that leg did not return it) and what its envelope needs, the
-- text only for chunks without spans (they render un-numbered, design §8). Document rows (chunk_id
-- NULL): every document the document leg returned, with its rank and envelope fields. The
-- placeholders are the exact or approximate vector leg, the chunk leg and the document leg
-- (lexical_leg filled for chunks and for documents). kb/search/hybrid.py fuses the ranks. An envelope
-- cites (indexed_path, indexed_revision): where the indexed content is, even when a later commit
-- moved the document and the index has not caught up (design §8, migration 0019); a document with
-- chunks but no indexed content (left by an index run that raced a projection before the run
-- checked its row under the chunk lock) has nothing to cite and is left out.
WITH vector_leg AS MATERIALIZED ({vector_leg}),
text_leg AS MATERIALIZED ({lexical_leg}),
document_leg AS MATERIALIZED ({document_leg}),
ranks AS (
    SELECT coalesce(v.id, t.id) AS id, v.rank AS vector_rank, t.rank AS text_rank
    FROM (SELECT id, row_number() OVER (ORDER BY distance, id) AS rank FROM vector_leg) v
    FULL JOIN (SELECT id, row_number() OVER (ORDER BY score DESC, id) AS rank FROM text_leg) t
        ON t.id = v.id
)
SELECT r.id AS chunk_id, r.vector_rank, r.text_rank, NULL::bigint AS document_rank, c.document_id,
       c.start_line, c.end_line, CASE WHEN c.start_line IS NULL THEN c.text END AS text,
       coalesce(d.indexed_path, d.path) AS path, d.title, d.indexed_content_id, d.indexed_revision
FROM ranks r
JOIN kb.chunks c ON c.id = r.id
JOIN kb.documents d ON d.id = c.document_id AND d.indexed_content_id IS NOT NULL
UNION ALL
SELECT NULL, NULL, NULL, row_number() OVER (ORDER BY l.score DESC, l.id), d.id, NULL, NULL, NULL,
       coalesce(d.indexed_path, d.path) AS path, d.title, d.indexed_content_id, d.indexed_revision
FROM document_leg l
JOIN kb.documents d ON d.id = l.id AND d.indexed_content_id IS NOT NULL;

-- name: excerpt_chunks
-- For documents the document leg ranked but no chunk leg returned a chunk of: each document's chunk
-- holding the most distinct terms of the query (parsed once per configuration; counted in C as
-- what ts_delete of the query terms removes, not by a comparison per lexeme of every chunk, which
-- took seconds for a long query over a long page), the first such chunk on a tie, with what its
-- envelope needs (as search_candidates has it).
WITH configs AS (
    SELECT cfg, tsvector_to_array(to_tsvector(cfg::regconfig, %(query)s)) AS lexemes
    FROM (SELECT DISTINCT coalesce(text_config, 'english') AS cfg FROM kb.chunks
          WHERE document_id = ANY (%(document_ids)s)) s
)
SELECT DISTINCT ON (c.document_id)
       c.id AS chunk_id, c.document_id, c.start_line, c.end_line,
       CASE WHEN c.start_line IS NULL THEN c.text END AS text,
       coalesce(d.indexed_path, d.path) AS path, d.title, d.indexed_content_id, d.indexed_revision
FROM kb.chunks c
JOIN configs q ON q.cfg = coalesce(c.text_config, 'english')
JOIN kb.documents d ON d.id = c.document_id AND d.indexed_content_id IS NOT NULL
CROSS JOIN LATERAL (SELECT length(c.tsv) - length(ts_delete(c.tsv, q.lexemes)) AS held) m
WHERE c.document_id = ANY (%(document_ids)s)
ORDER BY c.document_id, m.held DESC, c.position, c.id;

-- name: document_by_path
SELECT id, path, title, document_type, metadata, content_id, status, indexed_revision
FROM kb.documents WHERE workspace_id = %(workspace_id)s AND path = %(path)s;

-- ---- approximate vector indexes (kb/index/vector_index.py) ----

-- name: vector_leg_approximate
-- The vector leg through the workspace's partial HNSW index; the workspace, model and dimension
-- are literals so the planner matches the index predicate (never a generic plan).
SELECT id, embedding::halfvec({dim}) <=> %(embedding)s::halfvec({dim}) AS distance
FROM kb.chunks
WHERE workspace_id = {workspace_id} AND embedding_model = {model} AND embedding IS NOT NULL
ORDER BY distance
LIMIT %(limit)s;

-- name: hnsw_scan_settings
-- Local to the search's transaction: keep ef_search candidates, and let pgvector ≥ 0.8 scan on
-- (in distance order) until the limit is met.
SELECT set_config('hnsw.ef_search', %(ef_search)s, true),
       set_config('hnsw.iterative_scan', 'strict_order', true);

-- name: hnsw_session_settings
-- The same for the session of one of kb's pooled connections (kb/index/vector_index.py
-- session_scan_settings): set once per connection, so a search through the HNSW index needs no
-- transaction of its own.
SELECT set_config('hnsw.ef_search', %(ef_search)s, false),
       set_config('hnsw.iterative_scan', 'strict_order', false);

-- name: recorded_vector_index
SELECT index_name, dim FROM kb.vector_indexes
WHERE workspace_id = %(workspace_id)s AND model = %(model)s;

-- name: pgvector_version
SELECT extversion FROM pg_extension WHERE extname = 'vector';

-- name: workspace_model_chunks
SELECT count(*) AS n FROM kb.chunks
WHERE workspace_id = %(workspace_id)s AND embedding_model = %(model)s AND embedding IS NOT NULL;

-- name: create_vector_index
CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON kb.chunks
USING hnsw ((embedding::halfvec({dim})) halfvec_cosine_ops)
WHERE workspace_id = {workspace_id} AND embedding_model = {model} AND embedding IS NOT NULL;

-- name: drop_vector_index
DROP INDEX CONCURRENTLY IF EXISTS {name};

-- name: vector_index_valid
SELECT coalesce(bool_and(i.indisvalid), false) AS valid
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname = %(name)s AND c.relnamespace = 'kb'::regnamespace;

-- name: record_vector_index
INSERT INTO kb.vector_indexes (workspace_id, model, index_name, dim)
VALUES (%(workspace_id)s, %(model)s, %(index_name)s, %(dim)s)
ON CONFLICT (workspace_id, model) DO UPDATE SET index_name = excluded.index_name, dim = excluded.dim,
    built_at = now();

-- name: forget_vector_index
DELETE FROM kb.vector_indexes WHERE workspace_id = %(workspace_id)s AND model = %(model)s;

-- name: workspace_chunk_total
-- Chunks of a workspace from the term statistics (no scan of kb.chunks).
SELECT coalesce(sum(chunk_count), 0) AS n FROM kb.text_stats WHERE workspace_id = %(workspace_id)s;

-- name: workspace_has_vector_index
SELECT count(*) > 0 AS any FROM kb.vector_indexes WHERE workspace_id = %(workspace_id)s;

-- name: index_freshness
-- How far a workspace's index stamp lags its recorded head (design §13: search says so): revisions
-- not yet indexed and the documents they touch, plus projected documents still pending.
SELECT w.revision_count - coalesce(s.seq, 0) AS revisions_behind,
       (SELECT count(*) FROM (
            SELECT c.path FROM kb.path_changes AS c
            WHERE c.workspace_id = w.id AND c.seq > coalesce(s.seq, 0)
            UNION
            SELECT d.path FROM kb.documents AS d WHERE d.workspace_id = w.id AND d.status = 'pending'
        ) AS p) AS documents_pending
FROM kb.workspaces AS w
LEFT JOIN kb.revisions AS s ON s.workspace_id = w.id AND s.id = w.last_indexed_revision
WHERE w.id = %(workspace_id)s;
