// A Zero schema for kb's published tables (kb_publication: thin metadata of kb.documents and
// kb.folders). tests/test_zero.py checks it against the publication's column lists.
import { createSchema, json, number, string, table } from "@rocicorp/zero";

const documents = table("documents")
  .from("kb.documents")
  .columns({
    id: number(),
    workspace_id: number(),
    path: string(),
    title: string(),
    document_type: string(),
    metadata: json(),
    unique_identifier_hash: string().optional(),
    content_id: string().optional(),
    revision_id: string().optional(),
    status: string(), // pending | indexed | failed | quarantined | unindexable
    created_at: number(), // timestamptz → epoch milliseconds
    updated_at: number(),
  })
  .primaryKey("id");

const folders = table("folders")
  .from("kb.folders")
  .columns({
    id: number(),
    workspace_id: number(),
    path: string(),
    name: string(),
    parent_path: string().optional(),
    created_at: number(),
  })
  .primaryKey("id");

export const schema = createSchema({ tables: [documents, folders] });
