-- Issue 12 (SPEC §8): the full-text index is per workspace and keeps no pending list.
--
-- 1. The GIN index covers (workspace_id, tsv) (btree_gin: a trusted contrib extension, shipped
--    with every standard Postgres build), so the lexical leg's candidates are the workspace's own
--    matches, found in the index; a tsv-only index returned every workspace's matches, which the
--    planner either filtered on the heap or intersected with a bitmap of all the workspace's rows
--    (10,000 or 100,000 entries per search).
-- 2. fastupdate is off: with GIN's default, new chunks' entries go to an unsorted pending list (up
--    to gin_pending_list_limit, 4 MB) that only VACUUM or a full list merges into the index, and
--    every search reads the whole list. bin/bench_search.py, 10,000-chunk workspace, same run:
--    lexical leg 44 ms p50 with a 20,000-chunk pending list, 14 ms once it was merged. Chunks are
--    written by the indexer in the background, where the direct insert costs little.
--
-- The index is rebuilt (CREATE INDEX holds off chunk writes, not reads, while it builds).
CREATE EXTENSION IF NOT EXISTS btree_gin;
DROP INDEX kb.chunks_tsv;
CREATE INDEX chunks_tsv ON kb.chunks USING gin (workspace_id, tsv) WITH (fastupdate = off);
