-- Issue 9 (SPEC §3, §4): group commit. A writer queues its staged change set here before it waits
-- for the workspace write lock; the lock holder records every queued change set as consecutive
-- revisions in one Postgres transaction and one ref update, and writes each one's outcome (the
-- revision, or the error that refused it) in that transaction. UNLOGGED: a row lives only while
-- its writer waits (committing one costs no WAL flush); a server crash empties the table, and the
-- writers waiting then get an error, as they would anyway. ``backend_pid`` is the writer's server
-- session: an intent whose session has ended belongs to a killed writer and is never recorded.
CREATE UNLOGGED TABLE kb.write_intents (
    id bigserial PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    paths text[] NOT NULL,
    payload jsonb NOT NULL,
    outcome jsonb,
    backend_pid integer NOT NULL DEFAULT pg_backend_pid(),
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX write_intents_pending ON kb.write_intents (workspace_id, id) WHERE outcome IS NULL;
