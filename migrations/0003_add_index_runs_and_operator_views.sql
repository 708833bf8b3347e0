-- Issue 4 (SPEC §7): progress rows of index runs, and the operator views kb.index_lag and
-- kb.job_health. A new table and views only: nothing existing is rewritten or locked.

-- One row per index run (index_changes or reindex), updated after every batch of documents, so a
-- DBA can watch a run with SELECT. A reindex killed mid-way resumes after cursor_document_id.
-- status: running | finished | interrupted (a run that died and was superseded).
CREATE TABLE kb.index_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    kind text NOT NULL CHECK (kind IN ('index_changes', 'reindex')),
    status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'finished', 'interrupted')),
    target_revision text,
    documents_total integer NOT NULL DEFAULT 0,
    documents_done integer NOT NULL DEFAULT 0,
    documents_failed integer NOT NULL DEFAULT 0,
    cursor_document_id bigint,
    chunks_written bigint NOT NULL DEFAULT 0,
    chunks_reused bigint NOT NULL DEFAULT 0,
    embeddings_computed bigint NOT NULL DEFAULT 0,
    embeddings_cached bigint NOT NULL DEFAULT 0,
    resumed_count integer NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX index_runs_by_workspace ON kb.index_runs (workspace_id, kind, id DESC);

-- Per workspace: recorded head, index stamp, how many revisions the stamp is behind the recorded
-- head, document states, and the latest index run. (git HEAD itself is not in Postgres: the
-- periodic sweep compares it and records what is missing, SPEC §3, §7.)
CREATE VIEW kb.index_lag AS
SELECT w.id AS workspace_id,
       w.head_revision AS head,
       w.last_indexed_revision AS stamp,
       w.last_projected_revision AS projected,
       w.revision_count - coalesce(s.seq, 0) AS revisions_behind,
       coalesce(d.documents, 0) AS documents,
       coalesce(d.pending, 0) AS documents_pending,
       coalesce(d.failed, 0) AS documents_failed,
       coalesce(d.quarantined, 0) AS documents_quarantined,
       coalesce(d.unindexable, 0) AS documents_unindexable,
       r.kind AS last_run_kind,
       r.status AS last_run_status,
       r.documents_done AS last_run_documents_done,
       r.documents_total AS last_run_documents_total,
       r.updated_at AS last_run_updated_at
FROM kb.workspaces w
LEFT JOIN kb.revisions s ON s.workspace_id = w.id AND s.id = w.last_indexed_revision
LEFT JOIN LATERAL (
    SELECT count(*) AS documents,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           count(*) FILTER (WHERE status = 'quarantined') AS quarantined,
           count(*) FILTER (WHERE status = 'unindexable') AS unindexable
    FROM kb.documents WHERE workspace_id = w.id
) d ON true
LEFT JOIN LATERAL (
    SELECT kind, status, documents_done, documents_total, updated_at
    FROM kb.index_runs WHERE workspace_id = w.id ORDER BY id DESC LIMIT 1
) r ON true;

-- Per Procrastinate queue: jobs waiting (todo, due now), running, failed, and the age of the
-- oldest job waiting to run (since it was due: deferred, or scheduled for a time now past).
CREATE VIEW kb.job_health AS
SELECT j.queue_name AS queue,
       count(*) FILTER (WHERE j.status = 'todo') AS todo,
       count(*) FILTER (WHERE j.status = 'doing') AS doing,
       count(*) FILTER (WHERE j.status = 'failed') AS failed,
       count(*) FILTER (WHERE j.status = 'succeeded') AS succeeded,
       now() - min(greatest(coalesce(j.scheduled_at, e.deferred_at), e.deferred_at))
           FILTER (WHERE j.status = 'todo' AND coalesce(j.scheduled_at, now()) <= now()) AS oldest_waiting
FROM procrastinate_jobs j
LEFT JOIN LATERAL (
    SELECT min(at) AS deferred_at FROM procrastinate_events
    WHERE job_id = j.id AND type = 'deferred'
) e ON true
GROUP BY j.queue_name;
