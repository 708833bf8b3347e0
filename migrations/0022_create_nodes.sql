-- Design §15: nodes (many hosts, one Postgres). A node is a group of kb processes (serve, worker)
-- with a name (KB_NODE), a storage root and, for `kb serve`, an advertised URL (KB_NODE_URL);
-- each heartbeats here. storage_id is a random id kept in a file under the storage root: nodes
-- that see the same file (a shared file system) have the same storage_id and may serve each
-- other's workspaces directly.
CREATE TABLE kb.nodes (
    name text PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$'),
    storage_root text NOT NULL,
    storage_id text,
    url text,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- Each workspace's home node: the node whose storage root holds its repository. Set at creation
-- to the creating node; NULL for workspaces made before nodes existed, until the first node that
-- finds the repository under its storage root adopts it (kb/store/homes.py). Nothing is re-homed
-- silently: only a move flips it (compare-and-swap on the old value).
ALTER TABLE kb.workspaces ADD COLUMN home_node text REFERENCES kb.nodes (name);
CREATE INDEX workspaces_by_home_node ON kb.workspaces (home_node);

-- The Procrastinate queue of a workspace's job: the base queue ('projection', 'index', 'push',
-- 'maintenance') on its home node, '<queue>@<node>'; the node-free base queue while the workspace
-- has no home node (or no row). Every deferral in SQL routes through it (design §15).
CREATE FUNCTION kb.node_queue(queue text, workspace integer) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT queue || coalesce('@' || (SELECT w.home_node FROM kb.workspaces AS w WHERE w.id = workspace), '')
$$;
