-- Issue 10 (SPEC §8): the citation registry. New tables only: nothing existing is rewritten or locked.

-- Citation registry (SPEC §8, issue 10): per conversation (chat) in a workspace, handle n →
-- {path, blob id, revision, title, numbered}, never a chunk id. A handle is keyed on the
-- document's path and content (blob id); revision is one revision holding that blob at that path
-- (resolution reads from there). handle_count is the chat's last handed-out number: taking the
-- chat row's lock to bump it serializes concurrent searches of one chat, so no number is handed
-- out twice. Chats unused for KB_CITATION_TTL seconds are deleted by the kb.expire_citations task.
CREATE TABLE kb.citation_chats (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    chat_id text NOT NULL CHECK (length(chat_id) BETWEEN 1 AND 200),
    handle_count integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, chat_id)
);
CREATE INDEX citation_chats_by_last_use ON kb.citation_chats (last_used_at);

CREATE TABLE kb.citation_handles (
    workspace_id integer NOT NULL,
    chat_id text NOT NULL,
    n integer NOT NULL CHECK (n > 0),
    path text NOT NULL,
    content_id text NOT NULL,
    revision text NOT NULL,
    title text NOT NULL,
    numbered boolean NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, chat_id, n),
    UNIQUE (workspace_id, chat_id, path, content_id),
    FOREIGN KEY (workspace_id, chat_id) REFERENCES kb.citation_chats (workspace_id, chat_id) ON DELETE CASCADE
);
