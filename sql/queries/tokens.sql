-- Named queries of API tokens (kb/db/tokens.py, design §16).

-- name: insert_api_token
INSERT INTO kb.api_tokens (name, secret_sha256, scope, workspace_ids, expires_at)
VALUES (%(name)s, %(digest)s, %(scope)s, %(workspace_ids)s, now() + %(expires_in)s::interval)
ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
RETURNING id, name, scope, workspace_ids, created_at, expires_at, revoked_at;

-- name: verify_api_token
-- The live token with this digest (none when unknown, revoked or expired): one index lookup per request.
SELECT id, name, scope, workspace_ids, created_at, expires_at, revoked_at
FROM kb.api_tokens
WHERE secret_sha256 = %(digest)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now());

-- name: list_api_tokens
SELECT id, name, scope, workspace_ids, created_at, expires_at, revoked_at
FROM kb.api_tokens
WHERE %(include_revoked)s OR revoked_at IS NULL
ORDER BY id;

-- name: revoke_api_token
-- By id (a number) or by the live token's name; an already revoked token keeps its first time.
UPDATE kb.api_tokens SET revoked_at = now()
WHERE revoked_at IS NULL AND (id = %(id)s OR name = %(name)s)
RETURNING id, name, scope, workspace_ids, created_at, expires_at, revoked_at;

-- name: live_api_token_exists
SELECT EXISTS (
    SELECT 1 FROM kb.api_tokens WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
) AS present;

-- name: api_token_is_live
-- Whether the token with this id is live (not revoked, not expired), as verify_api_token decides.
SELECT EXISTS (
    SELECT 1 FROM kb.api_tokens
    WHERE id = %(id)s AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())
) AS live;
