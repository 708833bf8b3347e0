-- Issue 12 (SPEC §8): each chunk's length in tokens is stored with it, so the lexical leg does not
-- recount it on every search.
--
-- Okapi BM25 divides by the chunk's length in tokens (migration 0014: kb.tsvector_tokens, a SQL
-- function that unnests the whole tsvector). The lexical leg computed it for every candidate and
-- every query term it held: on bin/bench_search.py's 10,000-chunk workspace that was a third of
-- the statement's execution time. As a stored generated column it is computed once, when the
-- chunk's tsv is written, and is always the length of the tsv in the row.
--
-- Adding the column rewrites kb.chunks and computes every row's length under an ACCESS EXCLUSIVE
-- lock held until the migrations commit: searches and chunk writes wait meanwhile (about 19 s
-- for 30,000 chunks on a 2-core machine). Upgrade with `kb init` when a pause is acceptable.
ALTER TABLE kb.chunks
    ADD COLUMN tsv_tokens integer GENERATED ALWAYS AS (kb.tsvector_tokens(tsv)) STORED;
