-- Design §3: a write's idempotency key. Every store transaction and turn commit carries a key
-- (the caller's, e.g. the HTTP Idempotency-Key header, or one generated per call); the revision
-- row and its key row are written in the same Postgres transaction under the write lock, and the
-- key is also written into the commit object (header ``kb-write-key``), so a revision git has and
-- Postgres lacks is recorded with its key when the store catches up. Under the write lock a write
-- whose key is already here records nothing and returns that revision: a retry after any failure
-- applies a change at most once, and ``write_outcome(workspace, key)`` settles a write whose
-- outcome the caller did not learn.
CREATE TABLE kb.write_keys (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    key text NOT NULL CHECK (key <> ''),
    revision_id text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, key)
);
