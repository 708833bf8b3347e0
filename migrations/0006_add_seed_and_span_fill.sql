-- Issue 11 (SPEC §9, §10): seeding from legacy rows, the span fill and the drift check.
-- Adopted legacy chunks have no character offsets either: dropping NOT NULL is a catalog-only
-- change (no rewrite, no long lock). Everything else is new tables and views.
ALTER TABLE kb.chunks ALTER COLUMN start_char DROP NOT NULL;
ALTER TABLE kb.chunks ALTER COLUMN end_char DROP NOT NULL;

-- One row per seeded workspace (SPEC §10): where it came from, the seed revision, whether byte
-- parity passed, and who is the authority (flipped = kb; a re-seed then needs --force).
CREATE TABLE kb.seeds (
    workspace_id integer PRIMARY KEY REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    source text NOT NULL,
    legacy_workspace bigint NOT NULL,
    legacy_model text,
    seed_revision text,
    documents integer NOT NULL DEFAULT 0,
    parity_ok boolean NOT NULL DEFAULT false,
    seeded_at timestamptz NOT NULL DEFAULT now(),
    flipped boolean NOT NULL DEFAULT false,
    flipped_at timestamptz,
    unflipped_at timestamptz
);

-- Legacy document id → kb document row (SPEC §10 identity adoption). document_id is NULL once
-- the kb row is gone (removed in kb after the flip).
CREATE TABLE kb.legacy_documents (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    legacy_id bigint NOT NULL,
    document_id bigint REFERENCES kb.documents (id) ON DELETE SET NULL,
    path text NOT NULL,
    PRIMARY KEY (workspace_id, legacy_id)
);
CREATE INDEX legacy_documents_by_document ON kb.legacy_documents (document_id);

-- The span fill's knobs (SPEC §9), one row a DBA flips with psql:
--   UPDATE kb.span_fill_control SET paused = true;   -- honoured within one batch
CREATE TABLE kb.span_fill_control (
    id boolean PRIMARY KEY DEFAULT true CHECK (id),
    paused boolean NOT NULL DEFAULT false,
    batch_documents integer NOT NULL DEFAULT 500 CHECK (batch_documents > 0),
    throttle_ms integer NOT NULL DEFAULT 0 CHECK (throttle_ms >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO kb.span_fill_control DEFAULT VALUES;

-- Documents whose adopted chunks no longer match their body: they keep document-level citations
-- and are not retried while their content stays the same.
CREATE TABLE kb.span_fill_skips (
    document_id bigint PRIMARY KEY REFERENCES kb.documents (id) ON DELETE CASCADE,
    workspace_id integer NOT NULL,
    content_id text NOT NULL,
    reason text NOT NULL,
    skipped_at timestamptz NOT NULL DEFAULT now()
);

-- One row per workspace per span-fill run, updated after every batch.
CREATE TABLE kb.span_fill_runs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    status text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'finished', 'paused', 'yielded', 'interrupted')),
    documents_filled integer NOT NULL DEFAULT 0,
    documents_stale integer NOT NULL DEFAULT 0,
    chunks_filled bigint NOT NULL DEFAULT 0,
    batches integer NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX span_fill_runs_by_workspace ON kb.span_fill_runs (workspace_id, id DESC);

-- Per workspace with chunks lacking spans or a span-fill history: the backlog, the documents
-- skipped as stale, the last run and its rate (documents per second).
CREATE VIEW kb.span_backlog AS
SELECT w.id AS workspace_id,
       coalesce(s.flipped, false) AS flipped,
       (SELECT count(*) FROM kb.chunks c WHERE c.workspace_id = w.id AND c.start_line IS NULL) AS chunks_without_spans,
       (SELECT count(DISTINCT c.document_id) FROM kb.chunks c
         WHERE c.workspace_id = w.id AND c.start_line IS NULL) AS documents_without_spans,
       (SELECT count(*) FROM kb.span_fill_skips k WHERE k.workspace_id = w.id) AS documents_stale,
       r.status AS last_run_status,
       r.started_at AS last_run_started_at,
       r.updated_at AS last_run_updated_at,
       r.documents_filled AS last_run_documents_filled,
       CASE WHEN r.updated_at > r.started_at
            THEN round((r.documents_filled / extract(epoch FROM r.updated_at - r.started_at))::numeric, 1)
       END AS last_run_documents_per_second
FROM kb.workspaces w
LEFT JOIN kb.seeds s ON s.workspace_id = w.id
LEFT JOIN LATERAL (
    SELECT status, started_at, updated_at, documents_filled FROM kb.span_fill_runs
    WHERE workspace_id = w.id ORDER BY id DESC LIMIT 1
) r ON true
WHERE s.workspace_id IS NOT NULL OR r.status IS NOT NULL
   OR EXISTS (SELECT 1 FROM kb.chunks c WHERE c.workspace_id = w.id AND c.start_line IS NULL);

-- Drift check (flipped workspaces): git HEAD against document and chunk rows. One row per
-- finding of the workspace's latest check; repaired says whether this run repaired it (Postgres
-- side only: re-projection, re-queued indexing).
CREATE TABLE kb.drift_findings (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    checked_revision text,
    kind text NOT NULL CHECK (kind IN ('missing_row', 'extra_row', 'content_mismatch', 'index_mismatch')),
    path text NOT NULL,
    detail text,
    repaired boolean NOT NULL DEFAULT false,
    found_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX drift_findings_by_workspace ON kb.drift_findings (workspace_id, kind);

-- Per workspace: findings of the latest drift check by kind, and how many were repaired.
CREATE VIEW kb.drift_report AS
SELECT workspace_id, kind, count(*) AS findings, count(*) FILTER (WHERE repaired) AS repaired,
       max(found_at) AS checked_at, max(checked_revision) AS checked_revision
FROM kb.drift_findings
GROUP BY workspace_id, kind;
