-- Issue 17 (SPEC §11): artifact sidecar rows, attached files and pending blob purges.
-- New tables, and one nullable column on kb.documents (instant): nothing is rewritten.
-- Sidecar of an ARTIFACT document (the markdown lives in git at documents/Artifacts/<title>.md):
-- its format and generation counter (optimistic revisions: revise with the generation you read).
CREATE TABLE kb.artifacts (
    document_id bigint PRIMARY KEY REFERENCES kb.documents (id) ON DELETE CASCADE,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    format text NOT NULL,
    generation bigint NOT NULL CHECK (generation > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX artifacts_by_workspace ON kb.artifacts (workspace_id);

-- Files attached to an artifact: one row per role, the bytes in the content-addressed blob store
-- under the storage root ({storage_root}/artifact_blobs/{workspace}/{sha256[:2]}/{sha256}).
CREATE TABLE kb.artifact_files (
    document_id bigint NOT NULL REFERENCES kb.artifacts (document_id) ON DELETE CASCADE,
    workspace_id integer NOT NULL,
    role text NOT NULL,
    size bigint NOT NULL CHECK (size >= 0),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    PRIMARY KEY (document_id, role)
);
CREATE INDEX artifact_files_by_blob ON kb.artifact_files (workspace_id, sha256);

-- Blobs a delete left unreferenced and not yet removed from disk (a failed purge stays here with
-- its error; the sweep retries it).
CREATE TABLE kb.artifact_blob_purges (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    sha256 text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    PRIMARY KEY (workspace_id, sha256)
);

-- When the document was last quarantined: the sweep gives it another attempt once the embedder
-- answers again, at most every KB_QUARANTINE_RETRY_SECONDS (SPEC §7, issue 17).
ALTER TABLE kb.documents ADD COLUMN quarantined_at timestamptz;
