-- Named queries of nodes and home nodes (kb/db/nodes.py, kb/store/homes.py; design §15).

-- name: register_node
-- A node's process starts: insert its row, or refresh the heartbeat, start time and URL of the
-- existing one (a process without a URL, such as `kb worker`, keeps the one `kb serve` advertised).
-- The same storage (storage id) mounted at another path updates the path. Returns the row as
-- stored, so the caller can refuse a name taken by another storage (a different storage id).
INSERT INTO kb.nodes AS n (name, storage_root, storage_id, url)
VALUES (%(name)s, %(storage_root)s, %(storage_id)s, %(url)s)
ON CONFLICT (name) DO UPDATE
SET url = coalesce(EXCLUDED.url, n.url), heartbeat_at = now(), started_at = now(),
    storage_root = CASE WHEN n.storage_id IS NOT DISTINCT FROM EXCLUDED.storage_id
                        THEN EXCLUDED.storage_root ELSE n.storage_root END,
    storage_id = coalesce(n.storage_id, EXCLUDED.storage_id)
RETURNING name, storage_root, storage_id, url;

-- name: node_heartbeat
UPDATE kb.nodes SET heartbeat_at = now() WHERE name = %(name)s RETURNING name;

-- name: list_nodes
-- Every node with its heartbeat's age in seconds (Postgres' clock: no skew between hosts) and how
-- many workspaces it is home to.
SELECT n.name, n.storage_root, n.storage_id, n.url, n.started_at, n.heartbeat_at,
       extract(epoch FROM now() - n.heartbeat_at)::float8 AS heartbeat_age,
       (SELECT count(*) FROM kb.workspaces AS w WHERE w.home_node = n.name) AS workspaces
FROM kb.nodes AS n
ORDER BY n.name;

-- name: get_node
SELECT n.name, n.storage_root, n.storage_id, n.url, n.started_at, n.heartbeat_at,
       extract(epoch FROM now() - n.heartbeat_at)::float8 AS heartbeat_age
FROM kb.nodes AS n WHERE n.name = %(name)s;

-- name: workspace_home
-- A workspace's home node and that node's URL, storage id and heartbeat age (seconds); no row when
-- the workspace does not exist, NULL node columns while it has no home node.
SELECT w.id AS workspace_id, w.home_node, w.repository_id, n.url, n.storage_root, n.storage_id,
       extract(epoch FROM now() - n.heartbeat_at)::float8 AS heartbeat_age
FROM kb.workspaces AS w
LEFT JOIN kb.nodes AS n ON n.name = w.home_node
WHERE w.id = %(workspace_id)s;

-- name: set_workspace_home
-- Flip a workspace's home node, compare-and-swap: only when it is still %(expected)s (NULL for a
-- workspace without one). Returns the row when it flipped, nothing when another change came first.
UPDATE kb.workspaces SET home_node = %(node)s
WHERE id = %(workspace_id)s AND home_node IS NOT DISTINCT FROM %(expected)s
RETURNING id, home_node;

-- name: homeless_workspaces
-- Workspaces made before nodes existed (no home node yet), for adoption (kb/store/homes.py).
SELECT id, repository_id FROM kb.workspaces WHERE home_node IS NULL ORDER BY id;

-- name: node_workspace_ids
-- The workspaces homed on a node (its sweep covers only these, design §15).
SELECT id FROM kb.workspaces WHERE home_node = %(node)s ORDER BY id;

-- name: forget_node
-- Remove a node's row (kb nodes forget) unless workspaces are homed on it or it heartbeat within
-- %(stale_seconds)s; returns the row as it was (with why it stays, when it stays) or nothing when
-- no node has that name. Locks the row so a starting node's registration waits.
WITH candidate AS (
    SELECT n.name,
           (SELECT count(*) FROM kb.workspaces AS w WHERE w.home_node = n.name) AS workspaces,
           extract(epoch FROM now() - n.heartbeat_at)::float8 AS heartbeat_age
    FROM kb.nodes AS n WHERE n.name = %(name)s
    FOR UPDATE OF n
), forgotten AS (
    DELETE FROM kb.nodes AS n
    USING candidate AS c
    WHERE n.name = c.name AND c.workspaces = 0 AND c.heartbeat_age > %(stale_seconds)s
    RETURNING n.name
)
SELECT c.name, c.workspaces, c.heartbeat_age, EXISTS (SELECT 1 FROM forgotten) AS forgotten
FROM candidate AS c;
