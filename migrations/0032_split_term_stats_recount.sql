-- design §7, §14: the recount that ends a bulk index run's deferral (migration 0029) in two halves
-- that can run at once on two connections: kb.recount_chunk_term_stats (kb.text_stats and
-- kb.lexeme_stats, from the workspace's chunks) and kb.recount_document_term_stats
-- (kb.document_text_stats and kb.document_lexeme_stats, from its kb.document_terms rows). Neither
-- reads what the other writes. The recount is the serial end of a bulk run, the run's other work
-- done: on 1,500 tldr pages (2,927 chunks, 11,627 lexemes of each kind) each half took 100-135 ms,
-- most of it inserting its lexeme rows, one after the other. The indexer now runs the document
-- half on a second connection while its own, holding the workspace's chunk lock (so no chunk or
-- document_terms row of the workspace changes meanwhile), runs the chunk half and then ends the
-- deferral (kb/index/indexer.py). kb.recount_term_stats stays, both halves and the deferral's end
-- in one call, for the sweep's recount of a deferral a dead run left.
CREATE FUNCTION kb.recount_chunk_term_stats(ws integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    config text;
BEGIN
    DELETE FROM kb.lexeme_stats WHERE workspace_id = ws;
    DELETE FROM kb.text_stats WHERE workspace_id = ws;
    INSERT INTO kb.text_stats (workspace_id, text_config, chunk_count, token_total)
    SELECT ws, coalesce(c.text_config, 'english'), count(*), sum(c.tsv_tokens)
    FROM kb.chunks c WHERE c.workspace_id = ws
    GROUP BY 2 ORDER BY 2;
    FOR config IN SELECT s.text_config FROM kb.text_stats s WHERE s.workspace_id = ws ORDER BY 1 LOOP
        INSERT INTO kb.lexeme_stats (workspace_id, text_config, lexeme, chunk_count)
        SELECT ws, config, s.word, s.ndoc
        FROM ts_stat(format('SELECT tsv FROM kb.chunks WHERE workspace_id = %s AND coalesce(text_config, %L) = %L',
                            ws, 'english', config)) s
        ORDER BY s.word;
    END LOOP;
END;
$$;

CREATE FUNCTION kb.recount_document_term_stats(ws integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    config text;
BEGIN
    DELETE FROM kb.document_lexeme_stats WHERE workspace_id = ws;
    DELETE FROM kb.document_text_stats WHERE workspace_id = ws;
    INSERT INTO kb.document_text_stats (workspace_id, text_config, document_count, token_total)
    SELECT ws, t.text_config, count(*), sum(t.tokens)
    FROM kb.document_terms t WHERE t.workspace_id = ws
    GROUP BY 2 ORDER BY 2;
    FOR config IN SELECT s.text_config FROM kb.document_text_stats s WHERE s.workspace_id = ws ORDER BY 1 LOOP
        INSERT INTO kb.document_lexeme_stats (workspace_id, text_config, lexeme, document_count)
        SELECT ws, config, s.word, s.ndoc
        FROM ts_stat(format('SELECT tsv FROM kb.document_terms WHERE workspace_id = %s AND text_config = %L',
                            ws, config)) s
        ORDER BY s.word;
    END LOOP;
END;
$$;

CREATE OR REPLACE FUNCTION kb.recount_term_stats(ws integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM kb.recount_chunk_term_stats(ws);
    PERFORM kb.recount_document_term_stats(ws);
    DELETE FROM kb.deferred_term_stats WHERE workspace_id = ws;
END;
$$;
