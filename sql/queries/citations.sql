-- Named queries of the citation registry and follow (kb/citations/registry.py, kb/citations/conversation.py;
-- design §8).

-- name: touch_citation_chat
-- Create the chat or mark it used now; locks the chat row until the transaction ends, which
-- serializes handle numbering within one chat.
INSERT INTO kb.citation_chats (workspace_id, chat_id)
VALUES (%(workspace_id)s, %(chat_id)s)
ON CONFLICT (workspace_id, chat_id) DO UPDATE SET last_used_at = now()
RETURNING handle_count;

-- name: mark_citation_chat_used
UPDATE kb.citation_chats SET last_used_at = now()
WHERE workspace_id = %(workspace_id)s AND chat_id = %(chat_id)s;

-- name: register_citation_handle
-- The handle of (path, content_id) in a chat: the existing one (numbered once any showing was
-- numbered), or the chat's next number. Run after touch_citation_chat in the same transaction.
WITH existing AS (
    UPDATE kb.citation_handles SET numbered = numbered OR %(numbered)s
    WHERE workspace_id = %(workspace_id)s AND chat_id = %(chat_id)s
      AND path = %(path)s AND content_id = %(content_id)s
    RETURNING n, path, content_id, revision, title, numbered
),
allocated AS (
    UPDATE kb.citation_chats SET handle_count = handle_count + 1
    WHERE workspace_id = %(workspace_id)s AND chat_id = %(chat_id)s
      AND NOT EXISTS (SELECT 1 FROM existing)
    RETURNING handle_count AS n
),
inserted AS (
    INSERT INTO kb.citation_handles (workspace_id, chat_id, n, path, content_id, revision, title, numbered)
    SELECT %(workspace_id)s, %(chat_id)s, a.n, %(path)s, %(content_id)s, %(revision)s, %(title)s, %(numbered)s
    FROM allocated a
    RETURNING n, path, content_id, revision, title, numbered
)
SELECT * FROM existing
UNION ALL
SELECT * FROM inserted;

-- name: citation_handle
SELECT n, path, content_id, revision, title, numbered, created_at
FROM kb.citation_handles
WHERE workspace_id = %(workspace_id)s AND chat_id = %(chat_id)s AND n = %(n)s;

-- name: citation_handles
SELECT n, path, content_id, revision, title, numbered, created_at
FROM kb.citation_handles
WHERE workspace_id = %(workspace_id)s AND chat_id = %(chat_id)s
ORDER BY n;

-- name: forget_citation_chat
DELETE FROM kb.citation_chats
WHERE workspace_id = %(workspace_id)s AND chat_id = %(chat_id)s
RETURNING handle_count;

-- name: expire_citation_chats
-- Chats unused for %(ttl_seconds)s seconds, with their handles (ON DELETE CASCADE).
WITH gone AS (
    DELETE FROM kb.citation_chats
    WHERE last_used_at < now() - make_interval(secs => %(ttl_seconds)s)
    RETURNING 1
)
SELECT count(*) AS chats FROM gone;

-- name: revision_holding_blob
-- The newest recorded revision that wrote blob %(content_id)s at %(path)s (a repo path).
SELECT revision_id FROM kb.path_changes
WHERE workspace_id = %(workspace_id)s AND path = %(path)s AND content_id = %(content_id)s
ORDER BY seq DESC
LIMIT 1;

-- name: last_changes_of_paths
-- The newest recorded change at each of %(paths)s (repo paths) that has one; new_path set: a
-- move took the document there away last (the walk goes on from there).
SELECT DISTINCT ON (path) path, seq, new_path FROM kb.path_changes
WHERE workspace_id = %(workspace_id)s AND path = ANY(%(paths)s)
ORDER BY path, seq DESC;

-- name: document_changes_after
-- Recorded changes of the document at %(path)s (a repo path) after seq %(after_seq)s, oldest
-- first; a row with new_path set is where it moved away (the walk continues there).
SELECT seq, change, content_id, new_path FROM kb.path_changes
WHERE workspace_id = %(workspace_id)s AND path = %(path)s AND seq > %(after_seq)s
ORDER BY seq;
