-- Named queries of workspace moves (kb/workspace/moves.py, kb/db/locks.py; design §15).

-- name: writes_refused_by_move
-- Run by every writer in the round trip that takes the write lock (design §15): the workspace's
-- open move window, if any (none once it has expired; clock_timestamp, not the transaction's start,
-- because the lock may have been waited for), and its home node with that node's storage id, so a
-- writer on a node that is no longer the home (the move flipped it) writes nothing to its stale
-- copy. No row: the workspace does not exist (the writer's own read says so).
SELECT w.home_node, n.storage_id AS home_storage_id, m.move_id, m.target_node, m.opened_at, m.expires_at,
       greatest(1, ceil(extract(epoch FROM m.expires_at - clock_timestamp())))::int AS retry_after
FROM kb.workspaces AS w
LEFT JOIN kb.nodes AS n ON n.name = w.home_node
LEFT JOIN kb.workspace_moves AS m ON m.workspace_id = w.id AND m.expires_at > clock_timestamp()
WHERE w.id = %(workspace_id)s;

-- name: move_window
-- The workspace's move window, expired or not.
SELECT workspace_id, move_id, source_node, target_node, step, head_revision, opened_at, expires_at,
       expires_at <= clock_timestamp() AS expired
FROM kb.workspace_moves WHERE workspace_id = %(workspace_id)s;

-- name: open_move_window
-- Under the write lock: open (or renew its own, or take over an expired or flipped) window for a
-- move. Returns the row; none when another move's window is open (two moves started at once).
INSERT INTO kb.workspace_moves (workspace_id, move_id, source_node, target_node, step, head_revision, expires_at)
VALUES (%(workspace_id)s, %(move_id)s, %(source_node)s, %(target_node)s, 'window', %(head_revision)s,
        clock_timestamp() + make_interval(secs => %(seconds)s))
ON CONFLICT (workspace_id) DO UPDATE
SET move_id = excluded.move_id, source_node = excluded.source_node, target_node = excluded.target_node,
    step = 'window', head_revision = excluded.head_revision, opened_at = now(), expires_at = excluded.expires_at
WHERE kb.workspace_moves.move_id = excluded.move_id OR kb.workspace_moves.expires_at <= clock_timestamp()
RETURNING workspace_id, move_id, source_node, target_node, step, head_revision, opened_at, expires_at;

-- name: renew_move_window
-- The move reached ``step``: record it and push the expiry back. No row: the window is gone
-- (aborted, or expired and taken over).
UPDATE kb.workspace_moves
SET step = %(step)s, expires_at = clock_timestamp() + make_interval(secs => %(seconds)s)
WHERE workspace_id = %(workspace_id)s AND move_id = %(move_id)s AND expires_at > clock_timestamp()
RETURNING workspace_id, move_id, step, expires_at;

-- name: abort_move_window
-- `kb workspace move N --abort`: delete the window, whoever opened it.
DELETE FROM kb.workspace_moves WHERE workspace_id = %(workspace_id)s
RETURNING move_id, source_node, target_node, step;

-- name: flip_move_window
-- The flip's transaction (under the write lock): its window, still open, becomes 'flipped' and
-- expires at once (writers go on); the row stays until the old copy is retired. No row: the window
-- is not this move's or has expired.
UPDATE kb.workspace_moves SET step = 'flipped', expires_at = clock_timestamp()
WHERE workspace_id = %(workspace_id)s AND move_id = %(move_id)s AND expires_at > clock_timestamp()
  AND step <> 'flipped'
RETURNING move_id, target_node;

-- name: finish_move
-- The old copy was retired: the flipped move's row goes.
DELETE FROM kb.workspace_moves
WHERE workspace_id = %(workspace_id)s AND move_id = %(move_id)s AND step = 'flipped';

-- name: close_move_window
-- A move that stopped before copying (the home node has open turns) closes its own window.
DELETE FROM kb.workspace_moves
WHERE workspace_id = %(workspace_id)s AND move_id = %(move_id)s AND step <> 'flipped';
