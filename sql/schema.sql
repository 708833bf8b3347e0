-- kb: the full current schema for a fresh database (SPEC §12).
-- Every change here also gets an append-only file in migrations/; tests/test_migrations.py proves
-- that this file and all migrations applied in order produce the same catalog.

CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA IF NOT EXISTS kb;

-- One row per workspace. head_revision: the newest revision Postgres has recorded;
-- last_indexed_revision: the index stamp (SPEC §7); last_projected_revision: the projection's.
CREATE TABLE kb.workspaces (
    id integer PRIMARY KEY CHECK (id > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    head_revision text,
    revision_count bigint NOT NULL DEFAULT 0,
    last_indexed_revision text,
    last_projected_revision text
);

-- One row per revision (git commit), written in the transaction that holds the write lock (SPEC §3).
CREATE TABLE kb.revisions (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    id text NOT NULL,
    seq bigint NOT NULL,
    parent_id text,
    author text NOT NULL,
    committer text NOT NULL,
    message text NOT NULL,
    committed_at timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, id),
    UNIQUE (workspace_id, seq)
);

-- Per-path history rows, so history(path) never walks git (SPEC §3).
-- change: added | modified | removed | moved (path is the destination, old_path the source)
-- | moved_away (path is the source, new_path the destination).
CREATE TABLE kb.path_changes (
    workspace_id integer NOT NULL,
    revision_id text NOT NULL,
    seq bigint NOT NULL,
    path text NOT NULL,
    change text NOT NULL CHECK (change IN ('added', 'modified', 'removed', 'moved', 'moved_away')),
    old_path text,
    new_path text,
    content_id text,
    PRIMARY KEY (workspace_id, revision_id, path),
    FOREIGN KEY (workspace_id, revision_id) REFERENCES kb.revisions (workspace_id, id) ON DELETE CASCADE
);
CREATE INDEX path_changes_by_path ON kb.path_changes (workspace_id, path, seq DESC);

-- Document rows: identity, type, metadata and title are Postgres' own (SPEC §1); path mirrors git.
-- status is the derived index's state for the document (SPEC §7).
CREATE TABLE kb.documents (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    path text NOT NULL,
    title text NOT NULL,
    document_type text NOT NULL DEFAULT 'NOTE',
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    unique_identifier_hash text,
    content_id text,
    revision_id text,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'indexed', 'failed', 'quarantined', 'unindexable')),
    indexed_content_id text,
    indexed_revision text,
    index_error text,
    index_attempts integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, path)
);
CREATE INDEX documents_by_status ON kb.documents (workspace_id, status);

-- Folder rows: every folder implied by a document path or holding a .keep (SPEC §6).
CREATE TABLE kb.folders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    path text NOT NULL,
    name text NOT NULL,
    parent_path text,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, path)
);

-- Chunks: disposable, rebuildable from git (SPEC §1). Spans are nullable so legacy rows fit (§9).
CREATE TABLE kb.chunks (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    document_id bigint NOT NULL REFERENCES kb.documents (id) ON DELETE CASCADE,
    workspace_id integer NOT NULL,
    position integer NOT NULL,
    text text NOT NULL,
    text_sha256 text NOT NULL,
    start_char integer NOT NULL,
    end_char integer NOT NULL,
    start_line integer,
    end_line integer,
    token_count integer,
    embedding_model text NOT NULL,
    embedding vector(384),
    tsv tsvector NOT NULL
);
CREATE INDEX chunks_by_document ON kb.chunks (document_id, position);
CREATE INDEX chunks_by_workspace ON kb.chunks (workspace_id);
CREATE INDEX chunks_tsv ON kb.chunks USING gin (tsv);

-- Content-addressed embedding cache, chunk level (SPEC §7): a one-line edit re-embeds only the
-- chunks whose text changed.
CREATE TABLE kb.embedding_cache (
    text_sha256 text NOT NULL,
    model text NOT NULL,
    dim integer NOT NULL,
    embedding vector NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (text_sha256, model, dim)
);

-- ---- issue 4: derived index observability (migration 0003) ----

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

-- ---- issue 12: search statistics and inline vectors (migration 0007) ----

-- Vectors (1.5 kB) stay in the heap row instead of TOAST, so the exact scan reads no TOAST pages.
-- New rows only: rows written before this migration move inline when they are rewritten, which
-- the next `kb reindex` does for every chunk (what a chunk embeds changed with this issue: title and
-- heading path, so every text_sha256 differs).
ALTER TABLE kb.chunks ALTER COLUMN embedding SET STORAGE PLAIN;

-- The text-search configuration the chunk's tsv was built with (per document language);
-- NULL on rows written before this migration (they were built with 'english').
ALTER TABLE kb.chunks ADD COLUMN text_config text;

-- BM25 term statistics per workspace, kept by the trigger below: in how many chunks a lexeme
-- occurs, and per text configuration the chunk count and the sum of tsvector lengths.
CREATE TABLE kb.lexeme_stats (
    workspace_id integer NOT NULL,
    lexeme text NOT NULL,
    chunk_count integer NOT NULL,
    PRIMARY KEY (workspace_id, lexeme)
);

CREATE TABLE kb.text_stats (
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    chunk_count bigint NOT NULL,
    lexeme_total bigint NOT NULL,
    PRIMARY KEY (workspace_id, text_config)
);

-- Adds (sign = 1) or removes (sign = -1) the terms of changed chunks (parallel arrays); upserts in key order,
-- so concurrent writers cannot deadlock on the statistics rows.
CREATE FUNCTION kb.add_chunk_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH c AS (
        SELECT w AS workspace_id, coalesce(t, 'english') AS text_config, v AS tsv
        FROM unnest(workspace_ids, text_configs, tsvs) AS changed (w, t, v)
    ),
    lexemes AS (
        INSERT INTO kb.lexeme_stats AS s (workspace_id, lexeme, chunk_count)
        SELECT c.workspace_id, u.lexeme, sign * count(*) FROM c, unnest(c.tsv) u
        GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (workspace_id, lexeme) DO UPDATE SET chunk_count = s.chunk_count + excluded.chunk_count
    )
    INSERT INTO kb.text_stats AS s (workspace_id, text_config, chunk_count, lexeme_total)
    SELECT workspace_id, text_config, sign * count(*), sign * sum(length(tsv)) FROM c
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (workspace_id, text_config) DO UPDATE
    SET chunk_count = s.chunk_count + excluded.chunk_count,
        lexeme_total = s.lexeme_total + excluded.lexeme_total;
$$;

-- Statement-level trigger over the transition tables: inserted chunks add their terms, deleted
-- ones remove them, an update counts only rows whose tsv, workspace or configuration changed.
CREATE FUNCTION kb.count_chunk_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM kb.add_chunk_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv), 1)
        FROM new_chunks n;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM kb.add_chunk_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv), -1)
        FROM old_chunks o;
    ELSE
        PERFORM kb.add_chunk_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv), -1),
                kb.add_chunk_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv), 1)
        FROM old_chunks o JOIN new_chunks n ON n.id = o.id
        WHERE (o.tsv, o.workspace_id, o.text_config) IS DISTINCT FROM (n.tsv, n.workspace_id, n.text_config);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER chunks_count_terms_insert AFTER INSERT ON kb.chunks
    REFERENCING NEW TABLE AS new_chunks FOR EACH STATEMENT EXECUTE FUNCTION kb.count_chunk_terms();
CREATE TRIGGER chunks_count_terms_update AFTER UPDATE ON kb.chunks
    REFERENCING OLD TABLE AS old_chunks NEW TABLE AS new_chunks
    FOR EACH STATEMENT EXECUTE FUNCTION kb.count_chunk_terms();
CREATE TRIGGER chunks_count_terms_delete AFTER DELETE ON kb.chunks
    REFERENCING OLD TABLE AS old_chunks FOR EACH STATEMENT EXECUTE FUNCTION kb.count_chunk_terms();

-- Partial HNSW indexes built per large workspace by the job kb.maintain_vector_index
-- (kb/vector_index.py); search uses only the indexes recorded here (built and valid).
CREATE TABLE kb.vector_indexes (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    model text NOT NULL,
    index_name text NOT NULL,
    dim integer NOT NULL,
    built_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, model)
);
