-- Issue 18 (SPEC §13): one push-only git remote per workspace and its push state.
-- A new table and view only: nothing existing is rewritten or locked.
-- One push-only remote per workspace. The URL never holds credentials (they come from the
-- environment or a credentials file at push time); errors are stored redacted.
CREATE TABLE kb.remotes (
    workspace_id integer PRIMARY KEY REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    url text NOT NULL,
    branch text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_pushed_revision text,
    last_pushed_at timestamptz,
    last_push_error text,
    last_push_attempt_at timestamptz,
    push_failures integer NOT NULL DEFAULT 0
);

-- Per remote: what was pushed, the last error (NULL after a success) and whether the recorded
-- head is ahead of the remote.
CREATE VIEW kb.remote_status AS
SELECT r.workspace_id, r.url, r.branch, r.last_pushed_revision, r.last_pushed_at, r.last_push_error,
       r.last_push_attempt_at, r.push_failures, w.head_revision AS head,
       r.last_pushed_revision IS DISTINCT FROM w.head_revision AS behind
FROM kb.remotes r
JOIN kb.workspaces w ON w.id = r.workspace_id;
