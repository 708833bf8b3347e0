"""A kb worker process whose embedder is slow (``python tests/support/slow_worker.py DELAY``): settings come
from the environment (``KB_*``) like ``kb worker``; used by the kill -9 tests."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, which holds support/

from kb.knowledge_base import KnowledgeBase
from support.embedders import SlowEmbedder

if __name__ == "__main__":
    kb = KnowledgeBase.open()
    kb.use_embedder(SlowEmbedder(float(sys.argv[1])))
    kb.run_worker()
