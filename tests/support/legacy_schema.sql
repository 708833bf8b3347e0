-- The legacy knowledge base kb seeds from (design §10) and whose chunks the span fill converges
-- (design §9): documents and folders as rows of a "virtual filesystem", chunk vectors without
-- line spans. Only the columns kb's seeder reads (sql/queries/seed.sql) and what the tests check.
-- Filled by tests/support/legacy_source.py. Needs pgvector.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA IF NOT EXISTS legacy;

-- key/value facts about the source: embedding_model names the model of legacy.chunks.embedding
CREATE TABLE legacy.meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE legacy.folders (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id bigint NOT NULL,
    parent_id    bigint REFERENCES legacy.folders (id) ON DELETE CASCADE,  -- NULL: top level
    name         text NOT NULL,        -- as the user typed it: may hold '/' or ':'
    position     text,
    created_at   timestamptz NOT NULL
);

CREATE TABLE legacy.documents (
    id                     bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workspace_id           bigint NOT NULL,
    folder_id              bigint REFERENCES legacy.folders (id) ON DELETE SET NULL,  -- NULL: top level
    title                  text NOT NULL,  -- as typed: neither safe as a file name nor unique
    document_type          text NOT NULL,  -- NOTE, FILE, ARTIFACT
    document_metadata      jsonb NOT NULL DEFAULT '{}',
    content                text,           -- the body as rendered; the fallback
    source_markdown        text,           -- the body as written; preferred when present
    content_hash           text NOT NULL,
    unique_identifier_hash text NOT NULL,
    status                 text NOT NULL DEFAULT 'ready',  -- ready, pending or failed
    created_by_id          text,
    created_at             timestamptz NOT NULL,
    updated_at             timestamptz NOT NULL
);

CREATE TABLE legacy.chunks (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    document_id bigint NOT NULL REFERENCES legacy.documents (id) ON DELETE CASCADE,
    position    integer NOT NULL,
    content     text NOT NULL,         -- a substring of the body it was cut from, when it was cut
    embedding   vector(384) NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX ON legacy.chunks (document_id, position);
