"""``kb serve --with-worker`` whose embedder is slow (``python tests/support/slow_server.py PORT DELAY``):
settings come from the environment (``KB_*``) like ``kb serve``; used by the SIGTERM test."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, which holds support/

from kb.adapters.http.server import serve
from support.embedders import SlowEmbedder

if __name__ == "__main__":
    serve(port=int(sys.argv[1]), with_worker=True, embedder=SlowEmbedder(float(sys.argv[2])), insecure_no_auth=True)
