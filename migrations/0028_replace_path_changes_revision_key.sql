-- kb.path_changes without its foreign key to kb.revisions (design §14). A folder rename records two
-- path changes per document under the write lock — 9,224 rows for a folder of 4,612 documents — and
-- the key checked every row with a trigger call: ~30 ms of a ~110 ms lock hold. And a big draft now
-- inserts its path changes ahead of its revision's row (record_path_changes_ahead, in the lock's
-- round trip), which the key would refuse; the store deletes them in the same transaction when that
-- revision is not recorded (tests/test_store.py checks no row outlives it). What else the key did,
-- delete a revision's path changes with the revision (a workspace's deletion cascades to its
-- revisions), a statement-level trigger does, once per statement.
ALTER TABLE kb.path_changes DROP CONSTRAINT path_changes_workspace_id_revision_id_fkey;

CREATE FUNCTION kb.delete_path_changes_of_revisions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM kb.path_changes AS p
    USING gone_revisions AS r
    WHERE p.workspace_id = r.workspace_id AND p.revision_id = r.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER revisions_delete_path_changes AFTER DELETE ON kb.revisions
    REFERENCING OLD TABLE AS gone_revisions FOR EACH STATEMENT EXECUTE FUNCTION kb.delete_path_changes_of_revisions();
