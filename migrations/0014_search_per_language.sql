-- Issue 12 (SPEC §7, §8): search per language. First, the text-search configuration of documents
-- in a language Postgres has no stemmer for (Japanese and Chinese after kb.languages' CJK bigrams,
-- Vietnamese, Czech, Polish,
-- …): `simple` with accents folded by the unaccent dictionary, so "café" meets "cafe" and
-- "Việt" meets "Viet". kb.languages.FALLBACK_CONFIG names it.
--
-- The configuration always exists. Accents fold only where the unaccent extension is available
-- and kb's role may create it (unaccent is a trusted extension: the database owner may, Postgres
-- 13+); elsewhere kb.simple_unaccent is a plain copy of `simple` and search still works. The
-- extension lives wherever the server puts it (the first schema of the search path) or was put
-- before; the mapping names its dictionary by schema, and a configuration keeps the dictionary's
-- identity, so no session needs that schema on its search path.
CREATE TEXT SEARCH CONFIGURATION kb.simple_unaccent (COPY = pg_catalog.simple);

DO $$
DECLARE
    dictionary text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'unaccent') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS unaccent;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'kb.simple_unaccent does not fold accents: this role may not create the unaccent extension';
        END;
    END IF;
    SELECT format('%I.%I', n.nspname, d.dictname) INTO dictionary
    FROM pg_ts_dict d
    JOIN pg_namespace n ON n.oid = d.dictnamespace
    JOIN pg_depend dep ON dep.classid = 'pg_ts_dict'::regclass AND dep.objid = d.oid AND dep.deptype = 'e'
    JOIN pg_extension e ON e.oid = dep.refobjid AND e.extname = 'unaccent'
    WHERE d.dictname = 'unaccent';
    IF dictionary IS NOT NULL THEN
        EXECUTE format('ALTER TEXT SEARCH CONFIGURATION kb.simple_unaccent ALTER MAPPING FOR '
                       'word, hword, hword_part, numword, numhword, hword_numpart WITH %s, simple',
                       dictionary);
    END IF;
END;
$$;

-- BM25 statistics per text configuration. A workspace's documents may be in several languages,
-- each indexed with its own configuration; a query is parsed with each of them and each parse
-- must be scored against the chunks of that configuration, with that configuration's document
-- frequencies: counted together, `the` (a stop word in `english`, kept by `simple`) looked rare
-- in an English workspace with a few `simple` chunks and pulled those chunks to the top of
-- every query. Chunk lengths are counted in tokens (positions), the length Okapi BM25 means,
-- instead of distinct lexemes.
CREATE FUNCTION kb.tsvector_tokens(tsv tsvector) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(sum(greatest(cardinality(u.positions), 1)), 0)::bigint FROM unnest(tsv) u;
$$;

TRUNCATE kb.lexeme_stats, kb.text_stats;
ALTER TABLE kb.lexeme_stats DROP CONSTRAINT lexeme_stats_pkey;
ALTER TABLE kb.lexeme_stats ADD COLUMN text_config text NOT NULL;
ALTER TABLE kb.lexeme_stats ADD PRIMARY KEY (workspace_id, text_config, lexeme);
ALTER TABLE kb.text_stats RENAME COLUMN lexeme_total TO token_total;

CREATE OR REPLACE FUNCTION kb.add_chunk_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH c AS (
        SELECT w AS workspace_id, coalesce(t, 'english') AS text_config, v AS tsv
        FROM unnest(workspace_ids, text_configs, tsvs) AS changed (w, t, v)
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

-- The statistics of the chunks that exist now (new rows go through the trigger).
INSERT INTO kb.lexeme_stats (workspace_id, text_config, lexeme, chunk_count)
SELECT c.workspace_id, coalesce(c.text_config, 'english'), u.lexeme, count(*)
FROM kb.chunks c, unnest(c.tsv) u GROUP BY 1, 2, 3;
INSERT INTO kb.text_stats (workspace_id, text_config, chunk_count, token_total)
SELECT workspace_id, coalesce(text_config, 'english'), count(*), sum(kb.tsvector_tokens(tsv))
FROM kb.chunks GROUP BY 1, 2;
