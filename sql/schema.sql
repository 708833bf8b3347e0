-- kb: the full current schema for a fresh database (design §12).
-- Every change here also gets an append-only file in migrations/; tests/test_migrations.py proves
-- that this file and all migrations applied in order produce the same catalog.

CREATE EXTENSION IF NOT EXISTS vector;
CREATE EXTENSION IF NOT EXISTS btree_gin;
CREATE SCHEMA IF NOT EXISTS kb;

-- One row per workspace. head_revision: the newest revision Postgres has recorded;
-- last_indexed_revision: the index stamp (design §7); last_projected_revision: the projection's.
CREATE TABLE kb.workspaces (
    id integer PRIMARY KEY CHECK (id > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    head_revision text,
    revision_count bigint NOT NULL DEFAULT 0,
    last_indexed_revision text,
    last_projected_revision text
);

-- One row per revision (git commit), written in the transaction that holds the write lock (design §3).
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

-- Per-path history rows, so history(path) never walks git (design §3).
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
    PRIMARY KEY (workspace_id, revision_id, path)
);
CREATE INDEX path_changes_by_path ON kb.path_changes (workspace_id, path, seq DESC);

-- No foreign key to kb.revisions (migration 0028): a folder rename writes thousands of these rows
-- under the write lock and the key's check cost a trigger call per row; a big draft inserts them
-- ahead of its revision's row (record_path_changes_ahead) and the store deletes them in the same
-- transaction when that revision is not recorded. A revision's deletion (its workspace's cascades)
-- deletes its path changes through this statement-level trigger instead.
CREATE FUNCTION kb.delete_path_changes_of_revisions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM kb.path_changes AS p
    USING gone_revisions AS r
    WHERE p.workspace_id = r.workspace_id AND p.revision_id = r.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER revisions_delete_path_changes AFTER DELETE ON kb.revisions
    REFERENCING OLD TABLE AS gone_revisions FOR EACH STATEMENT EXECUTE FUNCTION kb.delete_path_changes_of_revisions();

-- Document rows: identity, type, metadata and title are Postgres' own (design §1); path mirrors git.
-- status is the derived index's state for the document (design §7).
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

-- Folder rows: every folder implied by a document path or holding a .keep (design §6).
CREATE TABLE kb.folders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    path text NOT NULL,
    name text NOT NULL,
    parent_path text,
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (workspace_id, path)
);

-- Chunks: disposable, rebuildable from git (design §1). Spans (character and line) are nullable so
-- adopted legacy rows fit until the span fill converges them (§9, §10).
CREATE TABLE kb.chunks (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    document_id bigint NOT NULL REFERENCES kb.documents (id) ON DELETE CASCADE,
    workspace_id integer NOT NULL,
    position integer NOT NULL,
    text text NOT NULL,
    text_sha256 text NOT NULL,
    start_char integer,
    end_char integer,
    start_line integer,
    end_line integer,
    token_count integer,
    embedding_model text NOT NULL,
    embedding vector,
    tsv tsvector NOT NULL
);
CREATE INDEX chunks_by_document ON kb.chunks (document_id, position);
CREATE INDEX chunks_by_workspace ON kb.chunks (workspace_id);
-- Full text per workspace (btree_gin, migration 0013), with a pending list of at most 64 kB: the
-- indexer's inserts are merged in bulk about once per batch, and a search reads at most 64 kB of
-- unmerged entries (migration 0027).
CREATE INDEX chunks_tsv ON kb.chunks USING gin (workspace_id, tsv) WITH (fastupdate = true, gin_pending_list_limit = 64);

-- Content-addressed embedding cache, chunk level (design §7): a one-line edit re-embeds only the
-- chunks whose text changed.
CREATE TABLE kb.embedding_cache (
    text_sha256 text NOT NULL,
    model text NOT NULL,
    dim integer NOT NULL,
    embedding vector NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (text_sha256, model, dim)
);

-- ---- (design §7) derived index observability (migration 0003) ----

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
-- periodic sweep compares it and records what is missing, design §3, §7.)
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

-- Citation registry (design §8): per conversation (chat) in a workspace, handle n →
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
-- ---- (design §10) seeding from legacy rows, span fill, drift check (migration 0006) ----

-- One row per seeded workspace (design §10): where it came from, the seed revision, whether byte
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

-- Legacy document id → kb document row (design §10 identity adoption). document_id is NULL once
-- the kb row is gone (removed in kb after the flip).
CREATE TABLE kb.legacy_documents (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    legacy_id bigint NOT NULL,
    document_id bigint REFERENCES kb.documents (id) ON DELETE SET NULL,
    path text NOT NULL,
    PRIMARY KEY (workspace_id, legacy_id)
);
CREATE INDEX legacy_documents_by_document ON kb.legacy_documents (document_id);

-- The span fill's knobs (design §9), one row a DBA flips with psql:
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
-- ---- (design §8) search statistics and inline vectors (migration 0007) ----

-- Vectors (1.5 kB) stay in the heap row instead of TOAST, so the exact scan reads no TOAST pages.
-- New rows only: rows written before this migration move inline when they are rewritten, which
-- the next `kb reindex` does for every chunk (what a chunk embeds changed with this issue: title and
-- heading path, so every text_sha256 differs).
ALTER TABLE kb.chunks ALTER COLUMN embedding SET STORAGE PLAIN;

-- The text-search configuration the chunk's tsv was built with (per document language);
-- NULL on rows written before this migration (they were built with 'english').
ALTER TABLE kb.chunks ADD COLUMN text_config text;

-- BM25 term statistics per workspace and text configuration, kept by the trigger below: in how
-- many chunks a lexeme occurs, and per configuration the chunk count and the sum of chunk lengths
-- in tokens. A workspace's documents may be in several languages, each indexed with its own
-- configuration; a query is parsed with each of them and each parse must be scored against the
-- chunks of that configuration, with that configuration's document frequencies (migration 0014:
-- counted together, `the`, a stop word in `english` kept by `simple`, looked rare in an English
-- workspace with a few `simple` chunks and pulled those chunks to the top of every query). Chunk
-- lengths are counted in tokens (positions), the length Okapi BM25 means, not distinct lexemes.
CREATE TABLE kb.lexeme_stats (
    workspace_id integer NOT NULL,
    lexeme text NOT NULL,
    chunk_count integer NOT NULL,
    text_config text NOT NULL,
    PRIMARY KEY (workspace_id, text_config, lexeme)
);

CREATE TABLE kb.text_stats (
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    chunk_count bigint NOT NULL,
    token_total bigint NOT NULL,
    PRIMARY KEY (workspace_id, text_config)
);

-- Tokens (positions) in a tsvector; a lexeme stripped of positions counts once.
CREATE FUNCTION kb.tsvector_tokens(tsv tsvector) RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(sum(greatest(cardinality(u.positions), 1)), 0)::bigint FROM unnest(tsv) u;
$$;

-- Each chunk's length in tokens, BM25's document length, computed once when its tsv is written
-- (migration 0016: the lexical leg recounted it for every candidate on every search).
ALTER TABLE kb.chunks
    ADD COLUMN tsv_tokens integer GENERATED ALWAYS AS (kb.tsvector_tokens(tsv)) STORED;

-- A workspace whose term statistics an index run counts once at its end instead of per batch
-- (migration 0029): while its row is here the triggers below leave its chunks and document terms
-- out, and kb.recount_term_stats counts them afresh and deletes the row (kb/index/indexer.py).
CREATE TABLE kb.deferred_term_stats (
    workspace_id integer PRIMARY KEY REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    deferred_at timestamptz NOT NULL DEFAULT now()
);

-- Adds (sign = 1) or removes (sign = -1) the terms of changed chunks (parallel arrays); upserts in key order,
-- so concurrent writers cannot deadlock on the statistics rows. Chunks of a workspace whose counting
-- is deferred (kb.deferred_term_stats) are left out: its run counts them all at its end.
CREATE FUNCTION kb.add_chunk_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH c AS (
        SELECT w AS workspace_id, coalesce(t, 'english') AS text_config, v AS tsv
        FROM unnest(workspace_ids, text_configs, tsvs) AS changed (w, t, v)
        WHERE NOT EXISTS (SELECT 1 FROM kb.deferred_term_stats d WHERE d.workspace_id = changed.w)
    ),
    lexemes AS (
        INSERT INTO kb.lexeme_stats AS s (workspace_id, text_config, lexeme, chunk_count)
        SELECT c.workspace_id, c.text_config, u.lexeme, sign * count(*) FROM c, unnest(c.tsv) u
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (workspace_id, text_config, lexeme) DO UPDATE SET chunk_count = s.chunk_count + excluded.chunk_count
    )
    INSERT INTO kb.text_stats AS s (workspace_id, text_config, chunk_count, token_total)
    SELECT workspace_id, text_config, sign * count(*), sign * sum(kb.tsvector_tokens(tsv)) FROM c
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (workspace_id, text_config) DO UPDATE
    SET chunk_count = s.chunk_count + excluded.chunk_count,
        token_total = s.token_total + excluded.token_total;
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
-- (kb/index/vector_index.py); search uses only the indexes recorded here (built and valid).
CREATE TABLE kb.vector_indexes (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    model text NOT NULL,
    index_name text NOT NULL,
    dim integer NOT NULL,
    built_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, model)
);

-- ---- (design §11) artifacts (migration 0011, design §11) ----

-- Sidecar of an ARTIFACT document (the markdown lives in git at documents/Artifacts/<title>.md):
-- its format and generation counter (optimistic revisions: revise with the generation you read).
CREATE TABLE kb.artifacts (
    document_id bigint PRIMARY KEY REFERENCES kb.documents (id) ON DELETE CASCADE,
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    format text NOT NULL,
    generation bigint NOT NULL CHECK (generation > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX artifacts_by_workspace ON kb.artifacts (workspace_id);

-- Files attached to an artifact: one row per role, the bytes in the content-addressed blob store
-- under the storage root ({storage_root}/artifact_blobs/{workspace}/{sha256[:2]}/{sha256}).
CREATE TABLE kb.artifact_files (
    document_id bigint NOT NULL REFERENCES kb.artifacts (document_id) ON DELETE CASCADE,
    workspace_id integer NOT NULL,
    role text NOT NULL,
    size bigint NOT NULL CHECK (size >= 0),
    sha256 text NOT NULL CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    PRIMARY KEY (document_id, role)
);
CREATE INDEX artifact_files_by_blob ON kb.artifact_files (workspace_id, sha256);

-- Blobs a delete left unreferenced and not yet removed from disk (a failed purge stays here with
-- its error; the sweep retries it).
CREATE TABLE kb.artifact_blob_purges (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    sha256 text NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    PRIMARY KEY (workspace_id, sha256)
);

-- When the document was last quarantined: the sweep gives it another attempt once the embedder
-- answers again, at most every KB_QUARANTINE_RETRY_SECONDS (design §7).
ALTER TABLE kb.documents ADD COLUMN quarantined_at timestamptz;

-- ---- (design §13) push to a git remote (migration 0012, design §13) ----

-- One push-only remote per workspace. The URL never holds credentials (they come from the
-- environment or a credentials file at push time); errors are stored redacted.
CREATE TABLE kb.remotes (
    workspace_id integer PRIMARY KEY REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    url text NOT NULL,
    branch text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    last_pushed_revision text,
    last_pushed_at timestamptz,
    last_push_error text,
    last_push_attempt_at timestamptz,
    push_failures integer NOT NULL DEFAULT 0
);

-- Per remote: what was pushed, the last error (NULL after a success) and whether the recorded
-- head is ahead of the remote.
CREATE VIEW kb.remote_status AS
SELECT r.workspace_id, r.url, r.branch, r.last_pushed_revision, r.last_pushed_at, r.last_push_error,
       r.last_push_attempt_at, r.push_failures, w.head_revision AS head,
       r.last_pushed_revision IS DISTINCT FROM w.head_revision AS behind
FROM kb.remotes r
JOIN kb.workspaces w ON w.id = r.workspace_id;

-- ---- (design §3) titles given by writers (migration 0008) ----

-- One row per document named by title in a revision (path is the virtual path at that revision).
CREATE TABLE kb.recorded_titles (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    seq bigint NOT NULL,
    path text NOT NULL,
    title text NOT NULL,
    PRIMARY KEY (workspace_id, seq, path)
);

-- ---- (design §8) simple + unaccent (migration 0014; its BM25 statistics per configuration are
-- folded into kb.lexeme_stats and kb.text_stats above) ----
CREATE TEXT SEARCH CONFIGURATION kb.simple_unaccent (COPY = pg_catalog.simple);

DO $$
DECLARE
    dictionary text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'unaccent') THEN
        BEGIN
            CREATE EXTENSION IF NOT EXISTS unaccent;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE 'kb.simple_unaccent does not fold accents: this role may not create the unaccent extension';
        END;
    END IF;
    SELECT format('%I.%I', n.nspname, d.dictname) INTO dictionary
    FROM pg_ts_dict d
    JOIN pg_namespace n ON n.oid = d.dictnamespace
    JOIN pg_depend dep ON dep.classid = 'pg_ts_dict'::regclass AND dep.objid = d.oid AND dep.deptype = 'e'
    JOIN pg_extension e ON e.oid = dep.refobjid AND e.extname = 'unaccent'
    WHERE d.dictname = 'unaccent';
    IF dictionary IS NOT NULL THEN
        EXECUTE format('ALTER TEXT SEARCH CONFIGURATION kb.simple_unaccent ALTER MAPPING FOR '
                       'word, hword, hword_part, numword, numhword, hword_numpart WITH %s, simple',
                       dictionary);
    END IF;
END;
$$;

-- ---- (design §8) Arabic with words in Latin letters stemmed as English, as `russian` has them
-- (migration 0033) ----
CREATE TEXT SEARCH CONFIGURATION kb.arabic (COPY = pg_catalog.arabic);

ALTER TEXT SEARCH CONFIGURATION kb.arabic ALTER MAPPING FOR asciiword, asciihword, hword_asciipart WITH english_stem;

-- ---- (design §14) group commit (migration 0015) ----

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
-- The id sequence is logged although the table is not (migration 0017): an unlogged sequence
-- restarts at 1 after a crash, and a new intent could then meet a stale group-commit journal
-- entry of an old one and be settled with that old revision.
ALTER SEQUENCE kb.write_intents_id_seq SET LOGGED;

-- ---- (design §8) whole-document BM25 (migration 0018) ----

-- Each indexed document's terms as one tsvector, for the search's document leg: Okapi BM25 over
-- whole documents beside the chunk leg (a query whose words are spread over several sections of
-- a page matches the page better than any one chunk). Built from the document's chunks by
-- kb.refresh_document_terms, so it always says what the chunks say: the terms of the first chunk's
-- context line (title and heading path, weight A) and of every chunk's body (chunks never overlap,
-- so a body term is counted once), each with its frequency. tokens: the document's length in
-- tokens, the context line counted once.
CREATE TABLE kb.document_terms (
    document_id bigint PRIMARY KEY REFERENCES kb.documents (id) ON DELETE CASCADE,
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    tsv tsvector NOT NULL,
    tokens integer NOT NULL
);
-- A pending list of at most 64 kB, as chunks_tsv's (migration 0027).
CREATE INDEX document_terms_tsv ON kb.document_terms USING gin (workspace_id, tsv)
    WITH (fastupdate = true, gin_pending_list_limit = 64);

-- BM25 statistics of whole documents per workspace and text configuration, kept by the trigger
-- below as kb.lexeme_stats / kb.text_stats are for chunks: in how many documents a lexeme occurs,
-- the document count and the sum of document lengths in tokens.
CREATE TABLE kb.document_lexeme_stats (
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    lexeme text NOT NULL,
    document_count integer NOT NULL,
    PRIMARY KEY (workspace_id, text_config, lexeme)
);

CREATE TABLE kb.document_text_stats (
    workspace_id integer NOT NULL,
    text_config text NOT NULL,
    document_count bigint NOT NULL,
    token_total bigint NOT NULL,
    PRIMARY KEY (workspace_id, text_config)
);

-- Adds (sign = 1) or removes (sign = -1) the terms of changed documents (parallel arrays), in key
-- order so concurrent indexers cannot deadlock on the statistics rows. Documents of a workspace
-- whose counting is deferred (kb.deferred_term_stats) are left out, as in kb.add_chunk_terms.
CREATE FUNCTION kb.add_document_terms(
    workspace_ids integer[], text_configs text[], tsvs tsvector[], tokens integer[], sign integer
) RETURNS void LANGUAGE sql AS $$
    WITH d AS (
        SELECT w AS workspace_id, t AS text_config, v AS tsv, n AS tokens
        FROM unnest(workspace_ids, text_configs, tsvs, tokens) AS changed (w, t, v, n)
        WHERE NOT EXISTS (SELECT 1 FROM kb.deferred_term_stats s WHERE s.workspace_id = changed.w)
    ),
    lexemes AS (
        INSERT INTO kb.document_lexeme_stats AS s (workspace_id, text_config, lexeme, document_count)
        SELECT d.workspace_id, d.text_config, u.lexeme, sign * count(*) FROM d, unnest(d.tsv) u
        GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
        ON CONFLICT (workspace_id, text_config, lexeme) DO UPDATE
        SET document_count = s.document_count + excluded.document_count
    )
    INSERT INTO kb.document_text_stats AS s (workspace_id, text_config, document_count, token_total)
    SELECT workspace_id, text_config, sign * count(*), sign * sum(tokens) FROM d
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (workspace_id, text_config) DO UPDATE
    SET document_count = s.document_count + excluded.document_count,
        token_total = s.token_total + excluded.token_total;
$$;

CREATE FUNCTION kb.count_document_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM kb.add_document_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv),
                                      array_agg(n.tokens), 1)
        FROM new_terms n;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM kb.add_document_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv),
                                      array_agg(o.tokens), -1)
        FROM old_terms o;
    ELSE
        PERFORM kb.add_document_terms(array_agg(o.workspace_id), array_agg(o.text_config), array_agg(o.tsv),
                                      array_agg(o.tokens), -1),
                kb.add_document_terms(array_agg(n.workspace_id), array_agg(n.text_config), array_agg(n.tsv),
                                      array_agg(n.tokens), 1)
        FROM old_terms o JOIN new_terms n ON n.document_id = o.document_id
        WHERE (o.tsv, o.workspace_id, o.text_config, o.tokens)
              IS DISTINCT FROM (n.tsv, n.workspace_id, n.text_config, n.tokens);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER document_terms_count_insert AFTER INSERT ON kb.document_terms
    REFERENCING NEW TABLE AS new_terms FOR EACH STATEMENT EXECUTE FUNCTION kb.count_document_terms();
CREATE TRIGGER document_terms_count_update AFTER UPDATE ON kb.document_terms
    REFERENCING OLD TABLE AS old_terms NEW TABLE AS new_terms
    FOR EACH STATEMENT EXECUTE FUNCTION kb.count_document_terms();
CREATE TRIGGER document_terms_count_delete AFTER DELETE ON kb.document_terms
    REFERENCING OLD TABLE AS old_terms FOR EACH STATEMENT EXECUTE FUNCTION kb.count_document_terms();

-- A document's terms as a tsvector (kb.refresh_document_terms): ``counted`` (each term with its
-- frequency), or ``once`` (each term once) when that passes a tsvector's 1 MB, or NULL when even
-- that does.
CREATE FUNCTION kb.document_terms_vector(counted text, once text) RETURNS tsvector LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    BEGIN
        RETURN counted::tsvector;
    EXCEPTION WHEN program_limit_exceeded THEN
        BEGIN
            RETURN once::tsvector;
        EXCEPTION WHEN program_limit_exceeded THEN
            RETURN NULL;
        END;
    END;
END;
$$;

-- Rebuilds the kb.document_terms rows of the given documents from their chunks (the indexer calls
-- it in the transaction that wrote them, for a whole batch of documents); a document without
-- chunks loses its row. One set-based pass over the chunks' postings: a term's frequency is
-- counted (in the first chunk every occurrence, in the others the body's), then written as
-- positions 1..tf, weight A for the title's, so no position limit of a concatenation (16,383)
-- undercounts a long document. A tsvector keeps at most 256 positions per lexeme: a term counts up
-- to 256 times, where BM25 has long saturated. A tsvector holds at most 1 MB: a document whose
-- terms pass that is kept with each term once (its title weight kept), and without its row when
-- even that is too long (kb.document_terms_vector). The rows are written by one statement, so the
-- statistics triggers run once per call, not once per document (migration 0026).
-- A term's positions are cut from '1,2,…,256' / '1A,2A,…,256A' at computed lengths, the terms
-- aggregated by document before the join, and kb.document_terms_vector called only for a text of
-- 1 MB or more (migration 0031: the same rows for less time).
CREATE FUNCTION kb.refresh_document_terms(document_ids bigint[]) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM kb.document_terms t
    WHERE t.document_id = ANY (document_ids)
      AND NOT EXISTS (SELECT 1 FROM kb.chunks c WHERE c.document_id = t.document_id);
    WITH chunks AS (
        SELECT c.document_id, c.workspace_id, coalesce(c.text_config, 'english') AS text_config, c.tsv,
               row_number() OVER (PARTITION BY c.document_id ORDER BY c.position, c.id) = 1 AS first
        FROM kb.chunks c
        WHERE c.document_id = ANY (document_ids)
    ),
    counts AS (
        SELECT ch.document_id, u.lexeme,
               sum(CASE WHEN ch.first THEN cardinality(array_positions(u.weights, 'A')) ELSE 0 END) AS titled,
               sum(CASE WHEN ch.first
                        THEN greatest(cardinality(u.positions), 1) - cardinality(array_positions(u.weights, 'A'))
                        ELSE cardinality(array_positions(u.weights, 'D')) END) AS body
        FROM chunks ch, unnest(ch.tsv) u
        GROUP BY ch.document_id, u.lexeme
    ),
    numbers AS (
        SELECT string_agg(p::text, ',' ORDER BY p) AS plain, string_agg(p::text || 'A', ',' ORDER BY p) AS titled
        FROM generate_series(1, 256) p
    ),
    terms AS (
        SELECT c.document_id, c.titled, c.body,
               '''' || replace(replace(c.lexeme, '\', '\\'), '''', '''''') || '''' AS quoted,
               CASE WHEN m.t = 0 THEN left(k.plain, l.n)
                    WHEN m.t = m.n THEN left(k.titled, l.n + m.n)
                    ELSE left(k.titled, l.t + m.t) || ',' || substr(k.plain, l.t + 2, l.n - l.t - 1) END AS positions
        FROM counts c
        CROSS JOIN numbers k
        CROSS JOIN LATERAL (SELECT least(c.titled + c.body, 256)::integer AS n,
                                   least(c.titled, 256)::integer AS t) m
        CROSS JOIN LATERAL (SELECT CASE WHEN m.n <= 9 THEN 2 * m.n - 1 WHEN m.n <= 99 THEN 3 * m.n - 10
                                        ELSE 4 * m.n - 109 END AS n,
                                   CASE WHEN m.t <= 9 THEN 2 * m.t - 1 WHEN m.t <= 99 THEN 3 * m.t - 10
                                        ELSE 4 * m.t - 109 END AS t) l
        WHERE c.titled + c.body > 0
    ),
    summed AS (
        SELECT t.document_id, sum(t.titled + t.body)::integer AS tokens,
               string_agg(t.quoted || ':' || t.positions, ' ') AS counted,
               string_agg(t.quoted || CASE WHEN t.titled > 0 THEN ':1A' ELSE ':1' END, ' ') AS once
        FROM terms t
        GROUP BY t.document_id
    ),
    built AS (
        SELECT s.document_id, o.workspace_id, o.text_config, s.tokens,
               CASE WHEN octet_length(s.counted) < 1048576 THEN s.counted::tsvector
                    ELSE kb.document_terms_vector(s.counted, s.once) END AS tsv
        FROM summed s
        JOIN (SELECT document_id, min(workspace_id) AS workspace_id, min(text_config) AS text_config
              FROM chunks GROUP BY document_id) o USING (document_id)
    ),
    dropped AS (
        DELETE FROM kb.document_terms t USING built b WHERE t.document_id = b.document_id AND b.tsv IS NULL
    )
    INSERT INTO kb.document_terms AS t (document_id, workspace_id, text_config, tsv, tokens)
    SELECT document_id, workspace_id, text_config, tsv, tokens FROM built WHERE tsv IS NOT NULL
    ORDER BY document_id
    ON CONFLICT (document_id) DO UPDATE
    SET workspace_id = excluded.workspace_id, text_config = excluded.text_config,
        tsv = excluded.tsv, tokens = excluded.tokens
    WHERE (t.workspace_id, t.text_config, t.tsv, t.tokens)
          IS DISTINCT FROM (excluded.workspace_id, excluded.text_config, excluded.tsv, excluded.tokens);
END;
$$;

-- Counts a workspace's term statistics afresh (what the triggers keep, counted once) in two
-- halves that read nothing the other writes, so they can run at once on two connections
-- (migration 0032): kb.recount_chunk_term_stats from its chunks, kb.recount_document_term_stats
-- from its kb.document_terms rows. The caller holds the workspace's chunk lock, so no chunk or
-- document_terms row of it changes meanwhile. Each text configuration's lexemes are counted by
-- ts_stat, one pass in C (migration 0030).
CREATE FUNCTION kb.recount_chunk_term_stats(ws integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    config text;
BEGIN
    DELETE FROM kb.lexeme_stats WHERE workspace_id = ws;
    DELETE FROM kb.text_stats WHERE workspace_id = ws;
    INSERT INTO kb.text_stats (workspace_id, text_config, chunk_count, token_total)
    SELECT ws, coalesce(c.text_config, 'english'), count(*), sum(c.tsv_tokens)
    FROM kb.chunks c WHERE c.workspace_id = ws
    GROUP BY 2 ORDER BY 2;
    FOR config IN SELECT s.text_config FROM kb.text_stats s WHERE s.workspace_id = ws ORDER BY 1 LOOP
        INSERT INTO kb.lexeme_stats (workspace_id, text_config, lexeme, chunk_count)
        SELECT ws, config, s.word, s.ndoc
        FROM ts_stat(format('SELECT tsv FROM kb.chunks WHERE workspace_id = %s AND coalesce(text_config, %L) = %L',
                            ws, 'english', config)) s
        ORDER BY s.word;
    END LOOP;
END;
$$;

CREATE FUNCTION kb.recount_document_term_stats(ws integer) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    config text;
BEGIN
    DELETE FROM kb.document_lexeme_stats WHERE workspace_id = ws;
    DELETE FROM kb.document_text_stats WHERE workspace_id = ws;
    INSERT INTO kb.document_text_stats (workspace_id, text_config, document_count, token_total)
    SELECT ws, t.text_config, count(*), sum(t.tokens)
    FROM kb.document_terms t WHERE t.workspace_id = ws
    GROUP BY 2 ORDER BY 2;
    FOR config IN SELECT s.text_config FROM kb.document_text_stats s WHERE s.workspace_id = ws ORDER BY 1 LOOP
        INSERT INTO kb.document_lexeme_stats (workspace_id, text_config, lexeme, document_count)
        SELECT ws, config, s.word, s.ndoc
        FROM ts_stat(format('SELECT tsv FROM kb.document_terms WHERE workspace_id = %s AND text_config = %L',
                            ws, config)) s
        ORDER BY s.word;
    END LOOP;
END;
$$;

-- Both halves and the end of the workspace's deferral in one call (migration 0029): the sweep's
-- recount of a deferral a dead run left.
CREATE FUNCTION kb.recount_term_stats(ws integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM kb.recount_chunk_term_stats(ws);
    PERFORM kb.recount_document_term_stats(ws);
    DELETE FROM kb.deferred_term_stats WHERE workspace_id = ws;
END;
$$;

-- design §8: a search envelope cites (path, revision) of what was indexed, and the pair must name
-- the document with those lines. kb.documents kept the indexed content and revision but not the
-- path: after a commit that moved and edited a document, its envelopes paired the new path with
-- the old revision (where the path did not exist, or named another file: swap two files and edit
-- one) until the next index run. indexed_path is the path the indexed content had at
-- indexed_revision; existing rows take their path (what envelopes showed before).
ALTER TABLE kb.documents ADD COLUMN indexed_path text;
UPDATE kb.documents SET indexed_path = path WHERE indexed_content_id IS NOT NULL;

-- Design §3: a write's idempotency key. Every store transaction and turn commit carries a key
-- (the caller's, e.g. the HTTP Idempotency-Key header, or one generated per call); the revision
-- row and its key row are written in the same Postgres transaction under the write lock, and the
-- key is also written into the commit object (header ``kb-write-key``), so a revision git has and
-- Postgres lacks is recorded with its key when the store catches up. Under the write lock a write
-- whose key is already here records nothing and returns that revision: a retry after any failure
-- applies a change at most once, and ``write_outcome(workspace, key)`` settles a write whose
-- outcome the caller did not learn.
CREATE TABLE kb.write_keys (
    workspace_id integer NOT NULL REFERENCES kb.workspaces (id) ON DELETE CASCADE,
    key text NOT NULL CHECK (key <> ''),
    revision_id text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workspace_id, key)
);

-- Design §3: a workspace's repository has an identity (a random id written at creation into its
-- git config as ``kb.repositoryid``) recorded here; kb refuses to touch a repository whose
-- identity is not the recorded one. ``diverged`` holds why the workspace's repository cannot be
-- converged (it lacks a revision Postgres recorded, or is another repository): every job and
-- reader refuses the workspace with HistoryDiverged until an operator restores the repository,
-- and nothing is deleted meanwhile.
ALTER TABLE kb.workspaces ADD COLUMN repository_id text;
ALTER TABLE kb.workspaces ADD COLUMN diverged text;

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

-- Design §16: API tokens of `kb serve` and MCP over HTTP. Only the SHA-256 of a token is kept (the
-- token itself is shown once, at creation); a token names the workspaces it may reach
-- (workspace_ids NULL: every workspace) and one scope (read ⊂ write ⊂ admin). A revoked or
-- expired token is refused by the very next request: the server looks the digest up each time.
-- No foreign key to kb.workspaces: a token may name a workspace an admin creates later, and a
-- deleted workspace's id stays named until the token is revoked.
CREATE TABLE kb.api_tokens (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    secret_sha256 bytea NOT NULL UNIQUE CHECK (length(secret_sha256) = 32),
    scope text NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    workspace_ids integer[] CHECK (cardinality(workspace_ids) > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz,
    revoked_at timestamptz
);
-- A name is a live token's: `kb token revoke NAME` and the committer of its revisions name one token.
CREATE UNIQUE INDEX api_tokens_live_name ON kb.api_tokens (name) WHERE revoked_at IS NULL;

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

-- Design §7: each workspace's embedding model (migration 0024). kb.chunks.embedding is an untyped
-- vector (declared above): each workspace's vectors have their model's dimension. ``embedder``:
-- the model its vectors and queries use (NULL: the default KB_EMBEDDING_MODEL decides at the
-- first index run); ``next_embedder``: the model a switch is re-embedding it into.
ALTER TABLE kb.workspaces ADD COLUMN embedder text;
ALTER TABLE kb.workspaces ADD COLUMN next_embedder text;
