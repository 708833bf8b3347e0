-- Issue 12 (SPEC §7, §8): fast, weighted, multilingual search.
-- Catalog-only changes to kb.chunks (SET STORAGE, a nullable column without default, a trigger);
-- two new tables filled from the existing chunks. Nothing existing is rewritten.

-- Vectors (1.5 kB) stay in the heap row instead of TOAST, so the exact scan reads no TOAST pages.
-- New rows only: rows written before this migration move inline when they are rewritten, which
-- the next `kb reindex` does for every chunk (what a chunk embeds changed with this issue: title and
-- heading path, so every text_sha256 differs).
ALTER TABLE kb.chunks ALTER COLUMN embedding SET STORAGE PLAIN;

-- The text-search configuration the chunk's tsv was built with (per document language);
-- NULL on rows written before this migration (they were built with 'english').
ALTER TABLE kb.chunks ADD COLUMN text_config text;

-- BM25 term statistics per workspace, kept by the trigger below: in how many chunks a lexeme
-- occurs, and per text configuration the chunk count and the sum of tsvector lengths.
CREATE TABLE kb.lexeme_stats (
    workspace_id integer NOT NULL,
    lexeme text NOT NULL,
    chunk_count integer NOT NULL,
    PRIMARY KEY (workspace_id, lexeme)
);

CREATE TABLE kb.text_stats (
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    chunk_count bigint NOT NULL,
    lexeme_total bigint NOT NULL,
    PRIMARY KEY (workspace_id, text_config)
);

-- Adds (sign = 1) or removes (sign = -1) the terms of changed chunks (parallel arrays); upserts in key order,
-- so concurrent writers cannot deadlock on the statistics rows.
CREATE FUNCTION kb.add_chunk_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH c AS (
        SELECT w AS workspace_id, coalesce(t, 'english') AS text_config, v AS tsv
        FROM unnest(workspace_ids, text_configs, tsvs) AS changed (w, t, v)
    ),
    lexemes AS (
        INSERT INTO kb.lexeme_stats AS s (workspace_id, lexeme, chunk_count)
        SELECT c.workspace_id, u.lexeme, sign * count(*) FROM c, unnest(c.tsv) u
        GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (workspace_id, lexeme) DO UPDATE SET chunk_count = s.chunk_count + excluded.chunk_count
    )
    INSERT INTO kb.text_stats AS s (workspace_id, text_config, chunk_count, lexeme_total)
    SELECT workspace_id, text_config, sign * count(*), sign * sum(length(tsv)) FROM c
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (workspace_id, text_config) DO UPDATE
    SET chunk_count = s.chunk_count + excluded.chunk_count,
        lexeme_total = s.lexeme_total + excluded.lexeme_total;
$$;

-- Statement-level trigger over the transition tables: inserted chunks add their terms, deleted
-- ones remove them, an update counts only rows whose tsv, workspace or configuration changed.
CREATE FUNCTION kb.count_chunk_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM kb.add_chunk_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv), 1)
        FROM new_chunks n;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM kb.add_chunk_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv), -1)
        FROM old_chunks o;
    ELSE
        PERFORM kb.add_chunk_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv), -1),
                kb.add_chunk_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv), 1)
        FROM old_chunks o JOIN new_chunks n ON n.id = o.id
        WHERE (o.tsv, o.workspace_id, o.text_config) IS DISTINCT FROM (n.tsv, n.workspace_id, n.text_config);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER chunks_count_terms_insert AFTER INSERT ON kb.chunks
    REFERENCING NEW TABLE AS new_chunks FOR EACH STATEMENT EXECUTE FUNCTION kb.count_chunk_terms();
CREATE TRIGGER chunks_count_terms_update AFTER UPDATE ON kb.chunks
    REFERENCING OLD TABLE AS old_chunks NEW TABLE AS new_chunks
    FOR EACH STATEMENT EXECUTE FUNCTION kb.count_chunk_terms();
CREATE TRIGGER chunks_count_terms_delete AFTER DELETE ON kb.chunks
    REFERENCING OLD TABLE AS old_chunks FOR EACH STATEMENT EXECUTE FUNCTION kb.count_chunk_terms();

-- Partial HNSW indexes built per large workspace by the job kb.maintain_vector_index
-- (kb/vector_index.py); search uses only the indexes recorded here (built and valid).
CREATE TABLE kb.vector_indexes (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    model text NOT NULL,
    index_name text NOT NULL,
    dim integer NOT NULL,
    built_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, model)
);

-- The statistics of the chunks that exist now (a read of kb.chunks; new rows go through the
-- trigger, which was created first in this same transaction).
INSERT INTO kb.lexeme_stats (workspace_id, lexeme, chunk_count)
SELECT c.workspace_id, u.lexeme, count(*) FROM kb.chunks c, unnest(c.tsv) u GROUP BY 1, 2;
INSERT INTO kb.text_stats (workspace_id, text_config, chunk_count, lexeme_total)
SELECT workspace_id, coalesce(text_config, 'english'), count(*), sum(length(tsv))
FROM kb.chunks GROUP BY 1, 2;
