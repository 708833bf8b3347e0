"""Legacy knowledge bases for the seed and span-fill tests (design §9, §10): a second database on
the test server filled by ``legacy_source.fill_legacy`` from kb's own test corpus, as a second
application would have left it."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import psycopg

from kb.index.embedding import HashingEmbedder
from support.corpus import corpus_path, markdown_files
from support.database import run_admin, with_database
from support.legacy_source import DIMENSIONS, MODEL, fill_legacy, legacy_hash_vector

_counter = itertools.count()


class LegacyHashEmbedder(HashingEmbedder):
    """The legacy set's stand-in model ``legacy-hash-384`` (``legacy_hash_vector``), registered as
    the active embedder so adopted vectors and query vectors share one space. Counts every text it
    embeds: seeding must call it zero times."""

    def __init__(self) -> None:
        super().__init__(DIMENSIONS)
        self.model = MODEL
        self.semantic = False
        self.texts: list[str] = []

    def _vector(self, text: str) -> np.ndarray:
        return legacy_hash_vector(text)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        return np.stack([self._vector(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def make_legacy(
    pg_server: str, source: Path, workspace: int = 1, *, subset: int | None = None, dsn: str | None = None
) -> tuple[str, dict]:
    """Create a legacy database on ``pg_server`` (or add to ``dsn``'s) from the markdown under
    ``source`` — its first ``subset`` files (sorted) when given — and return ``(dsn, summary)``
    (the summary of :func:`support.legacy_source.fill_legacy`)."""
    if dsn is None:
        name = f"kb_legacy_{os.getpid()}_{next(_counter)}"
        run_admin(pg_server, "drop_database", database=name)
        run_admin(pg_server, "create_database", database=name)
        dsn = with_database(pg_server, name)
    files = markdown_files(source)[:subset]
    return dsn, fill_legacy(dsn, source, files, workspace)


def drop_legacy(pg_server: str, dsn: str) -> None:
    """Drop a database made by :func:`make_legacy`."""
    run_admin(pg_server, "drop_database", database=psycopg.conninfo.conninfo_to_dict(dsn)["dbname"])


def english_pages() -> Path:
    """The English pages of the test corpus (nested folders, tables, code blocks)."""
    return corpus_path("en")


def all_pages() -> Path:
    """The whole test corpus: English, German, Japanese and Arabic pages under one root."""
    return corpus_path()
