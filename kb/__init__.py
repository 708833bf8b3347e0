"""kb — a git-native knowledge base on Postgres.

Public surface: ``KnowledgeBase`` (the facade), ``Settings``, and the error hierarchy in
``kb.errors``. Everything else is reachable but private to kb's own modules.
"""

from typing import TYPE_CHECKING

from kb.errors import *  # noqa: F403  (the error hierarchy is public)

if TYPE_CHECKING:
    from kb.knowledge_base import KnowledgeBase
    from kb.settings import Settings


def __getattr__(name: str):
    # Imported on first use, so `import kb.errors` (every CLI command) does not load pydantic.
    if name == "KnowledgeBase":
        from kb.knowledge_base import KnowledgeBase

        return KnowledgeBase
    if name == "Settings":
        from kb.settings import Settings

        return Settings
    if name == "__version__":  # the installed distribution's version, as pip shows it
        from importlib.metadata import version

        return version("kb")
    raise AttributeError(name)


__all__ = ["KnowledgeBase", "Settings"]
