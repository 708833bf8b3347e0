-- design §7, §8, §14: an index run that writes most of a workspace (its first index, a large import)
-- counts the BM25 term statistics once at its end instead of once per batch. Per batch,
-- kb.add_chunk_terms and kb.add_document_terms upsert every distinct lexeme of the batch, so a
-- lexeme is upserted again by every batch it occurs in (bin/bench_index_pipeline.py, 1,500 tldr
-- pages: 24,523 upserts into each of the two lexeme tables for 11,663 lexemes, 0.46 s of the run's
-- 1.16 s of Postgres CPU, against 0.1 s for counting the workspace once).
--
-- A row here says that the workspace's statistics (kb.lexeme_stats, kb.text_stats,
-- kb.document_lexeme_stats, kb.document_text_stats) are not kept by the triggers: a run inserted it
-- before its first batch and kb.recount_term_stats counts them afresh and deletes it, under the
-- chunk lock, when the run finishes. A run that dies leaves the row: the workspace's next index run,
-- or the sweep when no run holds the index lock, recounts (kb/index/indexer.py, kb/jobs/sweep.py).
CREATE TABLE kb.deferred_term_stats (
    workspace_id integer PRIMARY KEY REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    deferred_at timestamptz NOT NULL DEFAULT now()
);

-- Adds (sign = 1) or removes (sign = -1) the terms of changed chunks (parallel arrays); upserts in key order,
-- so concurrent writers cannot deadlock on the statistics rows. Chunks of a workspace whose counting
-- is deferred (kb.deferred_term_stats) are left out: its run counts them all at its end.
CREATE OR REPLACE FUNCTION kb.add_chunk_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH c AS (
        SELECT w AS workspace_id, coalesce(t, 'english') AS text_config, v AS tsv
        FROM unnest(workspace_ids, text_configs, tsvs) AS changed (w, t, v)
        WHERE NOT EXISTS (SELECT 1 FROM kb.deferred_term_stats d WHERE d.workspace_id = changed.w)
    ),
    lexemes AS (
        INSERT INTO kb.lexeme_stats AS s (workspace_id, text_config, lexeme, chunk_count)
        SELECT c.workspace_id, c.text_config, u.lexeme, sign * count(*) FROM c, unnest(c.tsv) u
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (workspace_id, text_config, lexeme) DO UPDATE SET chunk_count = s.chunk_count + excluded.chunk_count
    )
    INSERT INTO kb.text_stats AS s (workspace_id, text_config, chunk_count, token_total)
    SELECT workspace_id, text_config, sign * count(*), sign * sum(kb.tsvector_tokens(tsv)) FROM c
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (workspace_id, text_config) DO UPDATE
    SET chunk_count = s.chunk_count + excluded.chunk_count,
        token_total = s.token_total + excluded.token_total;
$$;

-- Adds (sign = 1) or removes (sign = -1) the terms of changed documents (parallel arrays), in key
-- order so concurrent indexers cannot deadlock on the statistics rows. Documents of a workspace
-- whose counting is deferred (kb.deferred_term_stats) are left out, as in kb.add_chunk_terms.
CREATE OR REPLACE FUNCTION kb.add_document_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], tokens integer[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH d AS (
        SELECT w AS workspace_id, t AS text_config, v AS tsv, n AS tokens
        FROM unnest(workspace_ids, text_configs, tsvs, tokens) AS changed (w, t, v, n)
        WHERE NOT EXISTS (SELECT 1 FROM kb.deferred_term_stats s WHERE s.workspace_id = changed.w)
    ),
    lexemes AS (
        INSERT INTO kb.document_lexeme_stats AS s (workspace_id, text_config, lexeme, document_count)
        SELECT d.workspace_id, d.text_config, u.lexeme, sign * count(*) FROM d, unnest(d.tsv) u
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (workspace_id, text_config, lexeme) DO UPDATE
        SET document_count = s.document_count + excluded.document_count
    )
    INSERT INTO kb.document_text_stats AS s (workspace_id, text_config, document_count, token_total)
    SELECT workspace_id, text_config, sign * count(*), sign * sum(tokens) FROM d
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (workspace_id, text_config) DO UPDATE
    SET document_count = s.document_count + excluded.document_count,
        token_total = s.token_total + excluded.token_total;
$$;

-- Counts a workspace's term statistics afresh from its chunks and kb.document_terms rows (what the
-- triggers keep, counted once) and ends their deferral. The caller holds the workspace's chunk
-- lock, so no chunk or document_terms row of it changes meanwhile.
CREATE FUNCTION kb.recount_term_stats(ws integer) RETURNS void LANGUAGE sql AS $$
    DELETE FROM kb.lexeme_stats WHERE workspace_id = ws;
    DELETE FROM kb.text_stats WHERE workspace_id = ws;
    DELETE FROM kb.document_lexeme_stats WHERE workspace_id = ws;
    DELETE FROM kb.document_text_stats WHERE workspace_id = ws;
    INSERT INTO kb.lexeme_stats (workspace_id, text_config, lexeme, chunk_count)
    SELECT ws, coalesce(c.text_config, 'english'), u.lexeme, count(*)
    FROM kb.chunks c, unnest(c.tsv) u WHERE c.workspace_id = ws
    GROUP BY 2, 3 ORDER BY 2, 3;
    INSERT INTO kb.text_stats (workspace_id, text_config, chunk_count, token_total)
    SELECT ws, coalesce(c.text_config, 'english'), count(*), sum(c.tsv_tokens)
    FROM kb.chunks c WHERE c.workspace_id = ws
    GROUP BY 2 ORDER BY 2;
    INSERT INTO kb.document_lexeme_stats (workspace_id, text_config, lexeme, document_count)
    SELECT ws, t.text_config, u.lexeme, count(*)
    FROM kb.document_terms t, unnest(t.tsv) u WHERE t.workspace_id = ws
    GROUP BY 2, 3 ORDER BY 2, 3;
    INSERT INTO kb.document_text_stats (workspace_id, text_config, document_count, token_total)
    SELECT ws, t.text_config, count(*), sum(t.tokens)
    FROM kb.document_terms t WHERE t.workspace_id = ws
    GROUP BY 2 ORDER BY 2;
    DELETE FROM kb.deferred_term_stats WHERE workspace_id = ws;
$$;
