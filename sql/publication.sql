-- kb_publication: documents and folders rows for logical-replication consumers (design §6), e.g.
-- a Postgres subscriber or Rocicorp Zero. Thin metadata only: no vectors, tsvectors or bodies
-- (chunks are not published at all). Both tables have primary keys, the replica identity that
-- UPDATE and DELETE need, and the column lists include it.
--
-- Applied by kb's migration runner (kb/db/publication.py) after the schema, once, when the connected
-- role may create publications (CREATE on the database, owner of the tables, Postgres >= 15 for
-- column lists); otherwise `kb init` says what to change. Consumers need wal_level=logical.
-- A DBA may run this file by hand: psql "$(kb db-url)" -f sql/publication.sql
CREATE PUBLICATION kb_publication FOR TABLE
    kb.documents (id, workspace_id, path, title, document_type, metadata, unique_identifier_hash,
                  content_id, revision_id, status, created_at, updated_at),
    kb.folders (id, workspace_id, path, name, parent_path, created_at);
