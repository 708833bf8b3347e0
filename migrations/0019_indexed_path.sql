-- SPEC §8: a search envelope cites (path, revision) of what was indexed, and the pair must name
-- the document with those lines. kb.documents kept the indexed content and revision but not the
-- path: after a commit that moved and edited a document, its envelopes paired the new path with
-- the old revision (where the path did not exist, or named another file: swap two files and edit
-- one) until the next index run. indexed_path is the path the indexed content had at
-- indexed_revision; existing rows take their path (what envelopes showed before).
ALTER TABLE kb.documents ADD COLUMN indexed_path text;
UPDATE kb.documents SET indexed_path = path WHERE indexed_content_id IS NOT NULL;
