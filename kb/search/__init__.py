"""Search (design §8): hybrid lexical and vector legs fused by reciprocal rank, rendered as envelopes."""
