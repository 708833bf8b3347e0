-- Design §7: each workspace has its own embedding model. kb.chunks.embedding loses its declared
-- dimension (an untyped pgvector column holds 384-d MiniLM, 512-d USE and any other model's
-- vectors side by side); every vector search filters by workspace and model first, and a large
-- workspace's partial HNSW index casts its own model's vectors to halfvec(<dim>) (kb.vector_index).
-- kb.workspaces.embedder is the model the workspace's vectors and queries use ('minilm', 'use-m3',
-- 'e5-small', 'hashing', 'openai:<model>', a model directory; NULL: not chosen yet, the default
-- KB_EMBEDDING_MODEL decides at the first index run). next_embedder is the model a switch
-- (kb workspace set-model) is re-embedding the workspace into; search answers from the old
-- vectors until the switch's last transaction swaps them.
-- kb:destructive nothing is lost: vector(384) → vector only drops the declared dimension, every value stays
ALTER TABLE kb.chunks ALTER COLUMN embedding TYPE vector;
ALTER TABLE kb.workspaces ADD COLUMN embedder text;
ALTER TABLE kb.workspaces ADD COLUMN next_embedder text;
