"""kb — a git-native knowledge base on Postgres.

Public surface: ``KnowledgeBase`` (the facade), ``Settings``, and the error hierarchy in
``kb.errors``. Everything else is reachable but private to kb's own modules.
"""

from kb.errors import *  # noqa: F401,F403  (the error hierarchy is public)
from kb.settings import Settings


def __getattr__(name: str):
    if name == "KnowledgeBase":
        from kb.knowledge_base import KnowledgeBase

        return KnowledgeBase
    raise AttributeError(name)


__all__ = ["KnowledgeBase", "Settings"]
