-- design §7, §14: kb.refresh_document_terms wrote each document's kb.document_terms row with a
-- statement of its own, so the statement-level statistics trigger (kb.count_document_terms) ran
-- once per document: half of an index run's time in Postgres once the indexer wrote a batch of
-- documents per transaction. The same rows, computed the same way, are now written by one
-- statement per call; the 1 MB fallback moves into kb.document_terms_vector.
-- A document's terms as a tsvector (kb.refresh_document_terms): ``counted`` (each term with its
-- frequency), or ``once`` (each term once) when that passes a tsvector's 1 MB, or NULL when even
-- that does.
CREATE FUNCTION kb.document_terms_vector(counted text, once text) RETURNS tsvector LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    BEGIN
        RETURN counted::tsvector;
    EXCEPTION WHEN program_limit_exceeded THEN
        BEGIN
            RETURN once::tsvector;
        EXCEPTION WHEN program_limit_exceeded THEN
            RETURN NULL;
        END;
    END;
END;
$$;

-- Rebuilds the kb.document_terms rows of the given documents from their chunks (the indexer calls
-- it in the transaction that wrote them, for a whole batch of documents); a document without
-- chunks loses its row. One set-based pass over the chunks' postings: a term's frequency is
-- counted (in the first chunk every occurrence, in the others the body's), then written as
-- positions 1..tf, weight A for the title's, so no position limit of a concatenation (16,383)
-- undercounts a long document. A tsvector keeps at most 256 positions per lexeme: a term counts up
-- to 256 times, where BM25 has long saturated. A tsvector holds at most 1 MB: a document whose
-- terms pass that is kept with each term once (its title weight kept), and without its row when
-- even that is too long (kb.document_terms_vector). The rows are written by one statement, so the
-- statistics triggers run once per call, not once per document (migration 0026).
CREATE OR REPLACE FUNCTION kb.refresh_document_terms(document_ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM kb.document_terms t
    WHERE t.document_id = ANY (document_ids)
      AND NOT EXISTS (SELECT 1 FROM kb.chunks c WHERE c.document_id = t.document_id);
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
    ),
    summed AS (
        SELECT o.document_id, o.workspace_id, o.text_config, sum(t.titled + t.body)::integer AS tokens,
               string_agg(t.quoted || ':' || t.positions, ' ') AS counted,
               string_agg(t.quoted || CASE WHEN t.titled > 0 THEN ':1A' ELSE ':1' END, ' ') AS once
        FROM (SELECT document_id, min(workspace_id) AS workspace_id, min(text_config) AS text_config
              FROM chunks GROUP BY document_id) o
        JOIN terms t USING (document_id)
        GROUP BY o.document_id, o.workspace_id, o.text_config
    ),
    built AS (
        SELECT document_id, workspace_id, text_config, tokens, kb.document_terms_vector(counted, once) AS tsv
        FROM summed
    ),
    dropped AS (
        DELETE FROM kb.document_terms t USING built b WHERE t.document_id = b.document_id AND b.tsv IS NULL
    )
    INSERT INTO kb.document_terms AS t (document_id, workspace_id, text_config, tsv, tokens)
    SELECT document_id, workspace_id, text_config, tsv, tokens FROM built WHERE tsv IS NOT NULL
    ORDER BY document_id
    ON CONFLICT (document_id) DO UPDATE
    SET workspace_id = excluded.workspace_id, text_config = excluded.text_config,
        tsv = excluded.tsv, tokens = excluded.tokens
    WHERE (t.workspace_id, t.text_config, t.tsv, t.tokens)
          IS DISTINCT FROM (excluded.workspace_id, excluded.text_config, excluded.tsv, excluded.tokens);
END;
$$;
