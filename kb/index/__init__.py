"""The derived index (design §7): chunking, embedding, the per-workspace vector index, index lag."""
