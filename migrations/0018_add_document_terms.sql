-- Issue 12 (SPEC §8): a document leg in search, Okapi BM25 over whole documents.
--
-- The chunk leg scores each chunk alone; a query whose words are spread over several sections of
-- a page (the sentence a writer puts around a link says what the whole linked page is for) meets
-- no single chunk well. kb.document_terms holds each indexed document's terms, built from its
-- chunks, with statistics of its own; search fuses the document leg with the chunk leg and the
-- vector leg (kb/search.py; weights chosen on bin/eval_search.py's tune split).
--
-- Existing documents are filled from their chunks at the end of this migration: one pass over
-- kb.chunks, inside the migration's transaction (searches keep running; chunk writes of other
-- indexers wait for the statistics rows).

-- Each indexed document's terms as one tsvector, for the search's document leg: Okapi BM25 over
-- whole documents beside the chunk leg (a query whose words are spread over several sections of
-- a page matches the page better than any one chunk). Built from the document's chunks by
-- kb.refresh_document_terms, so it always says what the chunks say: the terms of the first chunk's
-- context line (title and heading path, weight A) and of every chunk's body (chunks never overlap,
-- so a body term is counted once), each with its frequency. tokens: the document's length in
-- tokens, the context line counted once.
CREATE TABLE kb.document_terms (
    document_id bigint PRIMARY KEY REFERENCES kb.documents (id) ON DELETE CASCADE,
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    tsv tsvector NOT NULL,
    tokens integer NOT NULL
);
CREATE INDEX document_terms_tsv ON kb.document_terms USING gin (workspace_id, tsv) WITH (fastupdate = off);

-- BM25 statistics of whole documents per workspace and text configuration, kept by the trigger
-- below as kb.lexeme_stats / kb.text_stats are for chunks: in how many documents a lexeme occurs,
-- the document count and the sum of document lengths in tokens.
CREATE TABLE kb.document_lexeme_stats (
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    lexeme text NOT NULL,
    document_count integer NOT NULL,
    PRIMARY KEY (workspace_id, text_config, lexeme)
);

CREATE TABLE kb.document_text_stats (
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    document_count bigint NOT NULL,
    token_total bigint NOT NULL,
    PRIMARY KEY (workspace_id, text_config)
);

-- Adds (sign = 1) or removes (sign = -1) the terms of changed documents (parallel arrays), in key
-- order so concurrent indexers cannot deadlock on the statistics rows.
CREATE FUNCTION kb.add_document_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], tokens integer[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH d AS (
        SELECT w AS workspace_id, t AS text_config, v AS tsv, n AS tokens
        FROM unnest(workspace_ids, text_configs, tsvs, tokens) AS changed (w, t, v, n)
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

CREATE FUNCTION kb.count_document_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM kb.add_document_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv),
                                      array_agg(n.tokens), 1)
        FROM new_terms n;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM kb.add_document_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv),
                                      array_agg(o.tokens), -1)
        FROM old_terms o;
    ELSE
        PERFORM kb.add_document_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv),
                                      array_agg(o.tokens), -1),
                kb.add_document_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv),
                                      array_agg(n.tokens), 1)
        FROM old_terms o JOIN new_terms n ON n.document_id = o.document_id
        WHERE (o.tsv, o.workspace_id, o.text_config, o.tokens)
              IS DISTINCT FROM (n.tsv, n.workspace_id, n.text_config, n.tokens);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER document_terms_count_insert AFTER INSERT ON kb.document_terms
    REFERENCING NEW TABLE AS new_terms FOR EACH STATEMENT EXECUTE FUNCTION kb.count_document_terms();
CREATE TRIGGER document_terms_count_update AFTER UPDATE ON kb.document_terms
    REFERENCING OLD TABLE AS old_terms NEW TABLE AS new_terms
    FOR EACH STATEMENT EXECUTE FUNCTION kb.count_document_terms();
CREATE TRIGGER document_terms_count_delete AFTER DELETE ON kb.document_terms
    REFERENCING OLD TABLE AS old_terms FOR EACH STATEMENT EXECUTE FUNCTION kb.count_document_terms();

-- Rebuilds the kb.document_terms rows of the given documents from their chunks (the indexer calls
-- it in the transaction that wrote them); a document without chunks loses its row. One set-based
-- pass over the chunks' postings: a term's frequency is counted (in the first chunk every
-- occurrence, in the others the body's), then written as positions 1..tf, weight A for the
-- title's, so no position limit of a concatenation (16,383) undercounts a long document. A
-- tsvector keeps at most 256 positions per lexeme: a term counts up to 256 times, where BM25 has
-- long saturated. A tsvector holds at most 1 MB: a document whose terms pass that is kept with
-- each term once (its title weight kept), and without its row when even that is too long.
CREATE FUNCTION kb.refresh_document_terms(document_ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    d record;
    built tsvector;
BEGIN
    DELETE FROM kb.document_terms t
    WHERE t.document_id = ANY (document_ids)
      AND NOT EXISTS (SELECT 1 FROM kb.chunks c WHERE c.document_id = t.document_id);
    FOR d IN
        WITH chunks AS (
            SELECT c.document_id, c.workspace_id, coalesce(c.text_config, 'english') AS text_config, c.tsv,
                   row_number() OVER (PARTITION BY c.document_id ORDER BY c.position, c.id) = 1 AS first
            FROM kb.chunks c
            WHERE c.document_id = ANY (document_ids)
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
        )
        SELECT o.document_id, o.workspace_id, o.text_config, sum(t.titled + t.body)::integer AS tokens,
               string_agg(t.quoted || ':' || t.positions, ' ') AS counted,
               string_agg(t.quoted || CASE WHEN t.titled > 0 THEN ':1A' ELSE ':1' END, ' ') AS once
        FROM (SELECT document_id, min(workspace_id) AS workspace_id, min(text_config) AS text_config
              FROM chunks GROUP BY document_id) o
        JOIN terms t USING (document_id)
        GROUP BY o.document_id, o.workspace_id, o.text_config
        ORDER BY o.document_id
    LOOP
        BEGIN
            built := d.counted::tsvector;
        EXCEPTION WHEN program_limit_exceeded THEN
            BEGIN
                built := d.once::tsvector;
            EXCEPTION WHEN program_limit_exceeded THEN
                built := NULL;
            END;
        END;
        IF built IS NULL THEN
            DELETE FROM kb.document_terms WHERE document_id = d.document_id;
        ELSE
            INSERT INTO kb.document_terms AS t (document_id, workspace_id, text_config, tsv, tokens)
            VALUES (d.document_id, d.workspace_id, d.text_config, built, d.tokens)
            ON CONFLICT (document_id) DO UPDATE
            SET workspace_id = excluded.workspace_id, text_config = excluded.text_config,
                tsv = excluded.tsv, tokens = excluded.tokens
            WHERE (t.workspace_id, t.text_config, t.tsv, t.tokens)
                  IS DISTINCT FROM (excluded.workspace_id, excluded.text_config, excluded.tsv, excluded.tokens);
        END IF;
    END LOOP;
END;
$$;

SELECT kb.refresh_document_terms(array_agg(id)) FROM kb.documents
WHERE id IN (SELECT DISTINCT document_id FROM kb.chunks);
