-- Named queries of the legacy seed (kb/legacy/seed.py, design §10). The legacy_* queries run against the
-- legacy database (schema "legacy", the shape of tests/support/legacy_schema.sql); the others against kb's.

-- name: legacy_meta
SELECT key, value FROM legacy.meta;

-- name: legacy_schema_present
SELECT to_regclass('legacy.documents') IS NOT NULL AS present;

-- name: legacy_folders
SELECT id, parent_id, name, created_at FROM legacy.folders
WHERE workspace_id = %(workspace)s ORDER BY created_at, id;

-- name: legacy_document_plan
-- Everything the path plan and the dry run need, without the bodies: which body would be used
-- (source_markdown, else content), its size, whether it is blank or a pending placeholder, and how
-- many legacy chunks it has. Ordered as collisions are resolved: created_at, then id.
SELECT d.id, d.folder_id, d.title, d.document_type, d.document_metadata AS metadata,
       d.unique_identifier_hash, d.status, d.created_at,
       CASE WHEN d.source_markdown IS NOT NULL AND d.source_markdown <> '' THEN 'source_markdown'
            ELSE 'content' END AS body_source,
       octet_length(coalesce(nullif(d.source_markdown, ''), d.content, '')) AS bytes,
       coalesce(nullif(d.source_markdown, ''), d.content, '') ~ '^[[:space:]]*$' AS blank,
       btrim(coalesce(nullif(d.source_markdown, ''), d.content, '')) IN ('Pending...', 'Pending…')
           AS placeholder,
       (SELECT count(*) FROM legacy.chunks c WHERE c.document_id = d.id) AS chunks
FROM legacy.documents d
WHERE d.workspace_id = %(workspace)s
ORDER BY d.created_at, d.id;

-- name: legacy_document_bodies
SELECT id, coalesce(nullif(source_markdown, ''), content, '') AS body
FROM legacy.documents WHERE workspace_id = %(workspace)s ORDER BY id;

-- name: legacy_chunks
SELECT c.document_id, c.position, c.content, c.embedding::text AS embedding
FROM legacy.chunks c JOIN legacy.documents d ON d.id = c.document_id
WHERE d.workspace_id = %(workspace)s
ORDER BY c.document_id, c.position, c.id;

-- name: get_seed
SELECT * FROM kb.seeds WHERE workspace_id = %(workspace_id)s;

-- name: record_seed
INSERT INTO kb.seeds (workspace_id, source, legacy_workspace, legacy_model, seed_revision, documents,
                      parity_ok)
VALUES (%(workspace_id)s, %(source)s, %(legacy_workspace)s, %(legacy_model)s, %(seed_revision)s,
        %(documents)s, %(parity_ok)s)
ON CONFLICT (workspace_id) DO UPDATE
SET source = EXCLUDED.source, legacy_workspace = EXCLUDED.legacy_workspace,
    legacy_model = EXCLUDED.legacy_model, seed_revision = EXCLUDED.seed_revision,
    documents = EXCLUDED.documents, parity_ok = EXCLUDED.parity_ok, seeded_at = now();

-- name: flip_seed
UPDATE kb.seeds SET flipped = true, flipped_at = now()
WHERE workspace_id = %(workspace_id)s AND parity_ok RETURNING *;

-- name: unflip_seed
UPDATE kb.seeds SET flipped = false, unflipped_at = now()
WHERE workspace_id = %(workspace_id)s AND flipped RETURNING *;

-- name: adopt_document_identity
-- Title, type and metadata are Postgres' own (design §1): the projection keeps them from now on.
UPDATE kb.documents
SET title = %(title)s, document_type = %(document_type)s, metadata = %(metadata)s::jsonb,
    unique_identifier_hash = %(uid_hash)s, updated_at = now()
WHERE workspace_id = %(workspace_id)s AND path = %(path)s
  AND (title, document_type, metadata, unique_identifier_hash)
      IS DISTINCT FROM (%(title)s, %(document_type)s, %(metadata)s::jsonb, %(uid_hash)s)
RETURNING id;

-- name: seeded_documents
SELECT id, path, title, content_id, indexed_content_id,
       EXISTS (SELECT 1 FROM kb.chunks c WHERE c.document_id = d.id) AS has_chunks
FROM kb.documents d WHERE workspace_id = %(workspace_id)s;

-- name: map_legacy_document
INSERT INTO kb.legacy_documents (workspace_id, legacy_id, document_id, path)
VALUES (%(workspace_id)s, %(legacy_id)s, %(document_id)s, %(path)s)
ON CONFLICT (workspace_id, legacy_id) DO UPDATE
SET document_id = EXCLUDED.document_id, path = EXCLUDED.path
WHERE (kb.legacy_documents.document_id, kb.legacy_documents.path)
      IS DISTINCT FROM (EXCLUDED.document_id, EXCLUDED.path);

-- name: unmap_legacy_documents
DELETE FROM kb.legacy_documents
WHERE workspace_id = %(workspace_id)s AND NOT (legacy_id = ANY(%(legacy_ids)s));

-- name: create_adopt_staging
-- Legacy chunk rows are COPYed here first (one round trip per many rows), then inserted at once.
CREATE TEMP TABLE kb_adopt_staging (document_id bigint, position integer, text text, embedding text,
                                    text_config text, lexical_context text, lexical_text text)
ON COMMIT DROP;

-- name: copy_adopt_staging
COPY kb_adopt_staging (document_id, position, text, embedding, text_config, lexical_context, lexical_text)
FROM STDIN;

-- name: adopt_staged_chunks
-- Legacy chunk rows: their vectors kept, no spans yet (the span fill converges them, design §9), the
-- tsv built as the indexer builds it (context line weight A, text weight D, the document's text
-- configuration; kb.lexeme_stats follow through the chunks trigger). The text the legacy model
-- embedded is unknown, so text_sha256 carries a "legacy:" prefix: it never equals an
-- embedding-cache key and the indexer never reuses the row for its own chunks (design §7: the cache
-- is never warmed from legacy rows).
INSERT INTO kb.chunks (document_id, workspace_id, position, text, text_sha256, start_char, end_char,
                       start_line, end_line, token_count, embedding_model, embedding, text_config, tsv)
SELECT s.document_id, d.workspace_id, s.position, s.text,
       'legacy:' || encode(sha256(convert_to(s.text, 'UTF8')), 'hex'), NULL, NULL, NULL, NULL, NULL,
       %(model)s, s.embedding::vector, s.text_config,
       setweight(to_tsvector(s.text_config::regconfig, s.lexical_context), 'A')
       || to_tsvector(s.text_config::regconfig, s.lexical_text)
FROM kb_adopt_staging s JOIN kb.documents d ON d.id = s.document_id;

-- name: mark_documents_adopted
UPDATE kb.documents
SET status = 'indexed', indexed_content_id = content_id, indexed_path = path,
    indexed_revision = %(revision_id)s, index_error = NULL, index_attempts = 0
WHERE id = ANY(%(ids)s);

-- name: migration_status
SELECT s.*, b.chunks_without_spans, b.documents_without_spans, b.documents_stale,
       b.last_run_status AS span_fill_last_run, b.last_run_documents_per_second AS span_fill_rate
FROM kb.seeds s
LEFT JOIN kb.span_backlog b ON b.workspace_id = s.workspace_id
WHERE s.workspace_id = %(workspace_id)s;

-- name: delete_chunks_of_documents
DELETE FROM kb.chunks WHERE document_id = ANY(%(ids)s);

-- name: legacy_document_paths
SELECT legacy_id, path FROM kb.legacy_documents WHERE workspace_id = %(workspace_id)s;
