-- Design §16: API tokens of `kb serve` and MCP over HTTP. Only the SHA-256 of a token is kept (the
-- token itself is shown once, at creation); a token names the workspaces it may reach
-- (workspace_ids NULL: every workspace) and one scope (read ⊂ write ⊂ admin). A revoked or
-- expired token is refused by the very next request: the server looks the digest up each time.
-- No foreign key to kb.workspaces: a token may name a workspace an admin creates later, and a
-- deleted workspace's id stays named until the token is revoked.
CREATE TABLE kb.api_tokens (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    secret_sha256 bytea NOT NULL UNIQUE CHECK (length(secret_sha256) = 32),
    scope text NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    workspace_ids integer[] CHECK (cardinality(workspace_ids) > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    revoked_at timestamptz
);
-- A name is a live token's: `kb token revoke NAME` and the committer of its revisions name one token.
CREATE UNIQUE INDEX api_tokens_live_name ON kb.api_tokens (name) WHERE revoked_at IS NULL;
