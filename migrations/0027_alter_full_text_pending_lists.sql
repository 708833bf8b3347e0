-- design §7, §8, §14: the two full-text GIN indexes (chunks, whole-document terms) keep a pending
-- list again, bounded to 64 kB. Migration 0013 turned GIN's pending list off because with the
-- default limit (4 MB, merged only by VACUUM or a full list) every search read up to 20,000 chunks'
-- unsorted entries (lexical leg 44 ms p50 against 14 ms merged), and the indexer's direct inserts
-- "cost little". Once an index run was a pipeline, those direct inserts (one index descent per
-- lexeme of every chunk) were the slowest step of writing a batch: bin/bench_index_pipeline.py,
-- 1,500 tldr pages, kb/reference 0.27-0.32 with direct inserts against 0.36-0.43 with a 64 kB
-- list, same machine and load. At 64 kB the inserting backend merges the list in bulk about once
-- per batch, and a search reads at most 64 kB of pending entries (a lexical query on a
-- 2,927-chunk workspace: 0.108 ms merged, 0.122 ms with 80 chunks pending).
ALTER INDEX kb.chunks_tsv SET (fastupdate = true, gin_pending_list_limit = 64);
ALTER INDEX kb.document_terms_tsv SET (fastupdate = true, gin_pending_list_limit = 64);
