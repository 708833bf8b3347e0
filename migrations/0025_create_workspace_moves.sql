-- Design §15: a workspace move's read-only window. While a row here has not expired, every writer
-- that takes the workspace's write lock (kb.db.locks.locked_pipeline, the one way to it) is refused
-- with WorkspaceMoving before it writes anything; reads go on. The window is opened and closed under
-- the write lock, so a write in flight either landed before the copy starts or is refused. The move
-- renews ``expires_at`` at each step; an abandoned window lets writers in again once it has expired,
-- and ``kb workspace move N --abort`` deletes it at once. ``step`` is the last step the move reached
-- (window, copied, verified), for `kb workspace move` to resume and for operators to read.
CREATE TABLE kb.workspace_moves (
    workspace_id integer PRIMARY KEY REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    move_id text NOT NULL CHECK (move_id <> ''),
    source_node text,
    target_node text NOT NULL CHECK (target_node <> ''),
    step text NOT NULL DEFAULT 'window',
    head_revision text,
    opened_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
