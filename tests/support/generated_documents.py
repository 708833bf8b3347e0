"""Generated documents for the index tests (convergence, kill -9 of a reindexing worker), and the
rows of a named test query; deterministic for a seed."""

from __future__ import annotations

import random

from kb.db import database
from kb.knowledge_base import KnowledgeBase
from support.named_queries import queries

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "kappa",
    "omega",
    "sigma",
    "tau",
    "refund",
    "policy",
    "annual",
    "plan",
    "invoice",
]


def named_rows(kb: KnowledgeBase, query: str, **params) -> list[dict]:
    """The rows of named query ``query`` (tests/sql/testing.sql) on ``kb``'s database."""
    with database.connect(kb.database_url, autocommit=True) as conn:
        return conn.execute(queries[query], params).fetchall()


def generated_paragraphs(n: int, seed: int = 7) -> list[str]:
    """``n`` paragraphs of 25–45 words of ``WORDS``, each starting ``Section i:``."""
    rng = random.Random(seed)
    return [f"Section {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(25, 45))) for i in range(n)]


def generated_corpus(n: int) -> dict[str, str]:
    """``n`` documents of three paragraphs each, spread over four folders: ``{path: text}``."""
    texts = generated_paragraphs(n * 3, seed=3)
    return {f"/documents/Folder {i % 4}/Doc {i}.md": "\n\n".join(texts[3 * i : 3 * i + 3]) + "\n" for i in range(n)}


def write_all(kb: KnowledgeBase, ws: int, docs: dict[str, str], message: str = "import") -> None:
    """Create workspace ``ws`` and write ``docs`` (``{path: text}``) in one transaction."""
    kb.create_workspace(ws)
    with kb.transaction(ws, message, "t") as tx:
        for path, text in docs.items():
            tx.write(path, text)
