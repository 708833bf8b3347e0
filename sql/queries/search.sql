-- Named queries of search (kb/search.py, SPEC §8).

-- name: hybrid_search
-- One query embedding; a vector leg (exact scan within the workspace, so it always returns its
-- limit when the workspace has that many chunks) and a full-text leg (OR of the query's lexemes);
-- one reciprocal-rank fusion with k = %(rrf_k)s over both.
WITH vector_leg AS (
    SELECT id, row_number() OVER (ORDER BY embedding <=> %(embedding)s::vector, id) AS rank
    FROM (
        SELECT id, embedding FROM kb.chunks
        WHERE workspace_id = %(workspace_id)s AND embedding IS NOT NULL
          AND embedding_model = %(model)s  -- vectors of another model live in another space
        ORDER BY embedding <=> %(embedding)s::vector, id
        LIMIT %(leg_limit)s
    ) nearest
),
text_query AS (
    SELECT CASE WHEN numnode(q) = 0 THEN NULL
                ELSE replace(q::text, ' & ', ' | ')::tsquery END AS q
    FROM plainto_tsquery(%(fts_config)s::regconfig, %(query)s) AS q
),
text_leg AS (
    SELECT id, row_number() OVER (ORDER BY score DESC, id) AS rank
    FROM (
        SELECT c.id, ts_rank_cd(c.tsv, t.q) AS score
        FROM kb.chunks c, text_query t
        WHERE c.workspace_id = %(workspace_id)s AND t.q IS NOT NULL AND c.tsv @@ t.q
        ORDER BY score DESC, c.id
        LIMIT %(leg_limit)s
    ) matched
),
fused AS (
    SELECT id, sum(1.0 / (%(rrf_k)s + rank)) AS score
    FROM (SELECT id, rank FROM vector_leg UNION ALL SELECT id, rank FROM text_leg) legs
    GROUP BY id
)
SELECT c.id AS chunk_id, c.document_id, c.position, c.text, c.start_line, c.end_line,
       d.path, d.title, d.indexed_content_id, d.indexed_revision, f.score::float8 AS score
FROM fused f
JOIN kb.chunks c ON c.id = f.id
JOIN kb.documents d ON d.id = c.document_id
ORDER BY f.score DESC, c.id
LIMIT %(limit)s;

-- name: document_by_path
SELECT id, path, title, document_type, metadata, content_id, status, indexed_revision
FROM kb.documents WHERE workspace_id = %(workspace_id)s AND path = %(path)s;
