-- Named queries of search (kb/search.py, SPEC §8).

-- name: vector_leg
-- The vector leg: exact nearest chunks of the workspace by cosine distance, vectors of the active
-- model only (another model's vectors live in another space). An exact scan returns its limit
-- whenever the workspace has that many chunks (SPEC §8); vectors are stored inline (STORAGE
-- PLAIN, migration 0007), so the scan reads no TOAST.
SELECT id, embedding <=> %(embedding)s::vector AS distance
FROM kb.chunks
WHERE workspace_id = %(workspace_id)s AND embedding_model = %(model)s AND embedding IS NOT NULL
ORDER BY distance, id
LIMIT %(limit)s;

-- name: lexical_leg
-- The full-text leg, ranked by Okapi BM25 (k1, b) from the term statistics kb.lexeme_stats and
-- kb.text_stats keep per workspace and text configuration. The query is parsed with every
-- configuration the workspace's chunks use, and each parse is scored against the chunks of its
-- configuration with that configuration's document frequencies, chunk count and mean length
-- (in tokens). Only chunks holding a selective term (one in at most selective_chunks chunks or
-- selective_share of them, or the configuration's rarest query term) or all the terms are scored,
-- so a word found in every chunk does not make every chunk a candidate. The term frequency counts
-- every occurrence, one in the context line (title, headings: weight A) as title_weight.
-- Each candidate's tsvector is unnested once and its query terms are looked up in the arrays of
-- its configuration's lexemes and idfs that travel with it: no join with the terms, whose order
-- the planner could not estimate (it unnested every candidate once per query term), and no
-- correlated subquery per candidate; its length is stored in kb.chunks.tsv_tokens (migration 0016).
WITH totals AS (
    SELECT text_config, chunk_count::float8 AS n, token_total::float8 / chunk_count AS avg_length
    FROM kb.text_stats
    WHERE workspace_id = %(workspace_id)s AND chunk_count > 0
),
terms AS MATERIALIZED (
    SELECT t.text_config, q.lexeme, l.chunk_count AS df, t.n, t.avg_length,
           '''' || replace(replace(q.lexeme, '\', '\\'), '''', '''''') || '''' AS quoted,
           ln(1 + (t.n - l.chunk_count + 0.5) / (l.chunk_count + 0.5)) AS idf
    FROM totals t
    CROSS JOIN LATERAL (
        SELECT DISTINCT u.lexeme FROM unnest(to_tsvector(t.text_config::regconfig, %(query)s)) u) q
    JOIN kb.lexeme_stats l
        ON l.workspace_id = %(workspace_id)s AND l.text_config = t.text_config AND l.lexeme = q.lexeme
    WHERE l.chunk_count > 0
),
selectors AS (
    SELECT text_config,
           (string_agg(quoted, ' | ') FILTER (
                WHERE df <= greatest(%(selective_chunks)s, %(selective_share)s * n) OR df = rarest))::tsquery
           || string_agg(quoted, ' & ')::tsquery AS selector,
           array_agg(lexeme ORDER BY lexeme) AS lexemes, array_agg(idf ORDER BY lexeme) AS idfs,
           min(avg_length) AS avg_length
    FROM (SELECT *, min(df) OVER (PARTITION BY text_config) AS rarest FROM terms) s
    GROUP BY text_config
),
candidates AS MATERIALIZED (
    -- the concatenation detoasts each tsvector once, instead of twice below; the ::integer cast
    -- lets the (workspace_id, tsv) GIN index use its workspace column (btree_gin has no int2 = int4)
    SELECT c.id, c.tsv || ''::tsvector AS tsv, c.tsv_tokens, s.lexemes, s.idfs, s.avg_length
    FROM selectors s
    JOIN kb.chunks c
        ON c.workspace_id = %(workspace_id)s::integer AND coalesce(c.text_config, 'english') = s.text_config
    WHERE c.tsv @@ s.selector
)
SELECT c.id,
       sum(c.idfs[array_position(c.lexemes, u.lexeme)] * f.tf * (%(k1)s + 1)
           / (f.tf + %(k1)s * (1 - %(b)s + %(b)s * c.tsv_tokens / c.avg_length)))::float8 AS score
FROM candidates c
CROSS JOIN LATERAL unnest(c.tsv) u
CROSS JOIN LATERAL (
    SELECT greatest(cardinality(u.positions), 1)
           + (%(title_weight)s - 1) * cardinality(array_positions(u.weights, 'A')) AS tf) f
WHERE u.lexeme = ANY (c.lexemes)
GROUP BY c.id
ORDER BY score DESC, c.id
LIMIT %(limit)s;

-- name: search_candidates
-- Both legs in one statement (one round trip): every chunk either leg returned, with its rank in
-- each leg (NULL where that leg did not return it) and what its envelope needs; the text only for
-- chunks without spans (they render un-numbered, SPEC §8). The first placeholder is the exact or
-- the approximate vector leg, the second the lexical_leg query. kb/search.py fuses the ranks.
WITH vector_leg AS MATERIALIZED ({vector_leg}),
text_leg AS MATERIALIZED ({lexical_leg}),
ranks AS (
    SELECT coalesce(v.id, t.id) AS id, v.rank AS vector_rank, t.rank AS text_rank
    FROM (SELECT id, row_number() OVER (ORDER BY distance, id) AS rank FROM vector_leg) v
    FULL JOIN (SELECT id, row_number() OVER (ORDER BY score DESC, id) AS rank FROM text_leg) t
        ON t.id = v.id
)
SELECT r.id AS chunk_id, r.vector_rank, r.text_rank, c.document_id, c.start_line, c.end_line,
       CASE WHEN c.start_line IS NULL THEN c.text END AS text,
       d.path, d.title, d.indexed_content_id, d.indexed_revision
FROM ranks r
JOIN kb.chunks c ON c.id = r.id
JOIN kb.documents d ON d.id = c.document_id;

-- name: leg_envelopes
-- One leg on a connection of its own (kb/search.py runs the vector and the lexical leg side by
-- side when a second pooled connection is free): the leg's chunks (the first placeholder: the
-- exact, approximate or lexical leg) ranked in the leg's order (the second), with what their
-- envelopes need, as search_candidates has them.
WITH leg AS MATERIALIZED ({leg})
SELECT l.id AS chunk_id, row_number() OVER (ORDER BY {order}) AS rank, c.document_id, c.start_line,
       c.end_line, CASE WHEN c.start_line IS NULL THEN c.text END AS text,
       d.path, d.title, d.indexed_content_id, d.indexed_revision
FROM leg l
JOIN kb.chunks c ON c.id = l.id
JOIN kb.documents d ON d.id = c.document_id;

-- name: document_by_path
SELECT id, path, title, document_type, metadata, content_id, status, indexed_revision
FROM kb.documents WHERE workspace_id = %(workspace_id)s AND path = %(path)s;

-- ---- approximate vector indexes (kb/vector_index.py) ----

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
-- How far a workspace's index stamp lags its recorded head (issue 15: search says so): revisions
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
