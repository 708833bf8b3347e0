-- design §7, §14: kb.refresh_document_terms builds the same rows for less Postgres time; it was
-- nearly as costly as the chunk inserts it follows (1,500 tldr pages, 24 batches: 512 ms against
-- 656 ms, measured with pg_stat_statements), on the index writer's connection, which sets the
-- pace of a bulk run. Three changes, each exact:
-- * a term's positions ('1A,2A,3,4': the first `titled` ones of weight A, at most 256) are cut
--   from two strings built once per call ('1,2,…,256' and '1A,2A,…,256A') at lengths computed from
--   the counts, instead of a generate_series and string_agg subquery per term (17,743 of them);
-- * a document's terms are aggregated by document alone and then joined with its workspace and
--   configuration, instead of a join of every term row before the aggregate (a sort of all of
--   them); a tsvector's text form may list its lexemes in any order;
-- * kb.document_terms_vector (a PL/pgSQL block with an exception handler: a subtransaction per
--   document) is called only for a text of 1 MB or more. Below that the cast cannot fail on a
--   limit: a tsvector's lexemes hold fewer bytes than its text form, positions stay at or below
--   256, and a lexeme is no longer than to_tsvector makes one.
-- The length of '1,2,…,k' is its digits plus k - 1 commas: 2k - 1 up to 9, 3k - 10 up to 99,
-- 4k - 109 up to 256; with an 'A' after each number, k more.
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
    numbers AS (
        SELECT string_agg(p::text, ',' ORDER BY p) AS plain, string_agg(p::text || 'A', ',' ORDER BY p) AS titled
        FROM generate_series(1, 256) p
    ),
    terms AS (
        SELECT c.document_id, c.titled, c.body,
               '''' || replace(replace(c.lexeme, '\', '\\'), '''', '''''') || '''' AS quoted,
               CASE WHEN m.t = 0 THEN left(k.plain, l.n)
                    WHEN m.t = m.n THEN left(k.titled, l.n + m.n)
                    ELSE left(k.titled, l.t + m.t) || ',' || substr(k.plain, l.t + 2, l.n - l.t - 1) END AS positions
        FROM counts c
        CROSS JOIN numbers k
        CROSS JOIN LATERAL (SELECT least(c.titled + c.body, 256)::integer AS n,
                                   least(c.titled, 256)::integer AS t) m
        CROSS JOIN LATERAL (SELECT CASE WHEN m.n <= 9 THEN 2 * m.n - 1 WHEN m.n <= 99 THEN 3 * m.n - 10
                                        ELSE 4 * m.n - 109 END AS n,
                                   CASE WHEN m.t <= 9 THEN 2 * m.t - 1 WHEN m.t <= 99 THEN 3 * m.t - 10
                                        ELSE 4 * m.t - 109 END AS t) l
        WHERE c.titled + c.body > 0
    ),
    summed AS (
        SELECT t.document_id, sum(t.titled + t.body)::integer AS tokens,
               string_agg(t.quoted || ':' || t.positions, ' ') AS counted,
               string_agg(t.quoted || CASE WHEN t.titled > 0 THEN ':1A' ELSE ':1' END, ' ') AS once
        FROM terms t
        GROUP BY t.document_id
    ),
    built AS (
        SELECT s.document_id, o.workspace_id, o.text_config, s.tokens,
               CASE WHEN octet_length(s.counted) < 1048576 THEN s.counted::tsvector
                    ELSE kb.document_terms_vector(s.counted, s.once) END AS tsv
        FROM summed s
        JOIN (SELECT document_id, min(workspace_id) AS workspace_id, min(text_config) AS text_config
              FROM chunks GROUP BY document_id) o USING (document_id)
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
