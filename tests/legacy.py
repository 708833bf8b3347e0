"""Legacy knowledge bases for the seed and span-fill tests (issue 11): a second database on the
test server filled by ../shared/legacy/make_legacy.py, like a second application would have."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
from conftest import SHARED, corpus_path, run_admin, with_database

from kb.index.embedding import HashingEmbedder

MAKE_LEGACY = SHARED / "legacy" / "make_legacy.py"
_counter = itertools.count()


class LegacyHashEmbedder(HashingEmbedder):
    """The generator's stand-in model ``legacy-hash-384`` (make_legacy.py's ``hash_vector``),
    registered as the active embedder so adopted vectors and query vectors share one space.
    Counts every text it embeds: seeding must call it zero times."""

    def __init__(self) -> None:
        super().__init__(384)
        self.model = "legacy-hash-384"
        self.semantic = False
        self.texts: list[str] = []

    def _vector(self, text: str):
        import hashlib

        import numpy as np

        out, i = [], 0
        while len(out) < self.dim:
            block = hashlib.sha256(f"{i}:{text}".encode()).digest()
            out.extend((b - 127.5) / 127.5 for b in block)
            i += 1
        vector = np.asarray(out[: self.dim], dtype=np.float32)
        return vector / (np.linalg.norm(vector) or 1.0)

    def embed(self, texts: list[str]):
        self.texts.extend(texts)
        import numpy as np

        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def make_legacy(pg_server: str, source: Path, workspace: int = 1, *, subset: int | None = None,
                dsn: str | None = None) -> tuple[str, dict]:
    """Create a legacy database (or add to ``dsn``'s) from ``source`` and return ``(dsn, summary)``.

    ``subset`` copies the first N markdown files (sorted) into a temporary folder first, to keep a
    big corpus quick. Skips the test when ../shared/legacy is absent.
    """
    if not MAKE_LEGACY.exists():
        pytest.skip(f"{MAKE_LEGACY} is absent (the legacy generator lives in ../shared/legacy)")
    if dsn is None:
        name = f"kb_legacy_{os.getpid()}_{next(_counter)}"
        run_admin(pg_server, "drop_database", database=name)
        run_admin(pg_server, "create_database", database=name)
        dsn = with_database(pg_server, name)
    scratch = None
    if subset is not None:
        scratch = Path(tempfile.mkdtemp(prefix="kb-legacy-src-"))
        files = sorted(p for p in source.rglob("*.md") if not p.name.startswith("."))[:subset]
        for path in files:
            target = scratch / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        source = scratch
    try:
        out = subprocess.run(
            [sys.executable, str(MAKE_LEGACY), "--dsn", dsn, "--source", str(source), "--workspace", str(workspace)],
            check=True, capture_output=True, text=True, timeout=600,
        ).stdout
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return dsn, json.loads(out)


def drop_legacy(pg_server: str, dsn: str) -> None:
    """Drop a database made by :func:`make_legacy`."""
    run_admin(pg_server, "drop_database", database=psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def obsidian_en() -> Path:
    return corpus_path("obsidian-help", "en")


def tldr_pages() -> Path:
    return corpus_path("tldr", "pages")
