-- Issue 13 (SPEC §2.2, §5, §6): titles writers give documents they create or retitle by title,
-- recorded with the revision and copied into kb.documents.title by the projection. A new table
-- only: nothing existing is rewritten or locked.

-- One row per document named by title in a revision (path is the virtual path at that revision).
CREATE TABLE kb.recorded_titles (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    path text NOT NULL,
    title text NOT NULL,
    PRIMARY KEY (workspace_id, seq, path)
);
