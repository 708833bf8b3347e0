"""Embedding models per workspace (design §7).

Each workspace records the model its vectors and queries use in ``kb.workspaces.embedder``:
``minilm``, ``use-m3``, ``e5-small``, ``hashing``, ``openai:<model>`` or a model directory (the
names ``KB_EMBEDDING_MODEL`` takes). A workspace with none recorded uses the default,
``KB_EMBEDDING_MODEL``; with ``auto`` the first index run picks one by the languages of the
workspace's documents (``auto_choice``) and records it, so a later change of the default never
mixes two models in one workspace. A seeded workspace records its legacy model (kb.legacy.seed)
and keeps it until switched (``kb workspace set-model``, kb.index.model_switch).

``ModelSet`` holds one lazily loaded embedder per model name for a process; its embedders are
shared by every thread and workspace that uses the same model.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

from kb.db.sql import queries
from kb.errors import ConfigurationError
from kb.index import multilingual
from kb.index.embedding import Embedder, LazyEmbedder, minilm_available
from kb.index.languages import detect_language
from kb.settings import Settings

if TYPE_CHECKING:
    from kb.db.database import Connection
    from kb.git.repository import Repository

AUTO_SAMPLE = 200
"""Documents whose language auto counts (the first by id)."""
AUTO_BY_LANGUAGE = {"en": "minilm"}
"""The model auto picks for a workspace whose documents are mostly in a language; any other
language gets ``AUTO_MULTILINGUAL``. Chosen on bin/eval_search.py (six vault languages, both
packaged models, docs/search-and-citations.md): MiniLM is best on English; USE is best or within
noise of e5 on every other vault language and 8–30× faster to index."""
AUTO_MULTILINGUAL = ("use-m3", "e5-small")
"""The packaged multilingual models auto tries, in order, for a non-English workspace."""
NAMES = ("minilm", "use-m3", "e5-small", "hashing")


def normalize(name: str, settings: Settings) -> str:
    """``name`` as recorded for a workspace (stripped), after checking it names a model this
    installation can load: ``minilm``, ``use-m3``, ``e5-small``, ``hashing``, ``openai:<model>`` or
    a model directory. Raises ConfigurationError naming the choices or the missing package."""
    name = name.strip()
    if not name or name == "auto":
        raise ConfigurationError(
            f"{name!r} is not a model; name one of {', '.join(NAMES)}, openai:<model> or a model directory"
        )
    LazyEmbedder(_settings_for(settings, name))  # raises for an unknown name or a missing package
    return name


def _settings_for(settings: Settings, name: str) -> Settings:
    return settings.model_copy(update={"embedding_model": name})


def auto_choice(languages: Counter[str]) -> str:
    """The model auto picks for documents in ``languages`` (counts by ISO 639-1 code): that of
    the commonest language (``AUTO_BY_LANGUAGE``, else the first installed of
    ``AUTO_MULTILINGUAL``), falling back to MiniLM, then hashing, when it is not installed."""
    common = [language for language, _ in languages.most_common() if language != "und"]
    wanted = AUTO_BY_LANGUAGE.get(common[0], "multilingual") if common else "minilm"
    if wanted == "multilingual":
        wanted = next((name for name in AUTO_MULTILINGUAL if multilingual.available(name)), "minilm")
    if wanted == "minilm" and not minilm_available():
        wanted = "hashing"
    return wanted


def workspace_languages(conn: Connection, repo: Repository, workspace_id: int) -> Counter[str]:
    """Languages of up to AUTO_SAMPLE of the workspace's documents (kb.languages)."""
    counts: Counter[str] = Counter()
    for row in conn.execute(
        queries["workspace_languages_sample"], {"workspace_id": workspace_id, "limit": AUTO_SAMPLE}
    ):
        try:
            counts[detect_language(repo.blob(row["content_id"]).decode("utf-8", "replace"))] += 1
        except Exception:  # an unreadable blob is no vote; the indexer reports it
            continue
    return counts


def recorded(conn: Connection, workspace_id: int) -> tuple[str | None, str | None]:
    """``(embedder, next_embedder)`` recorded for the workspace; ``(None, None)`` for a workspace
    with no row (the callers say whether it exists: a search of it finds nothing)."""
    row = conn.execute(queries["workspace_embedder"], {"workspace_id": workspace_id}).fetchone()
    if row is None:
        return None, None
    return row["embedder"], row["next_embedder"]


def pin(conn: Connection, workspace_id: int, name: str) -> str:
    """Record ``name`` as the workspace's model unless one is recorded; returns the recorded one."""
    row = conn.execute(queries["pin_workspace_embedder"], {"workspace_id": workspace_id, "embedder": name}).fetchone()
    return row["embedder"] if row else name


class ModelSet:
    """One embedder per model name, loaded on first use and shared (thread-safe).

    ``default`` is the embedder of workspaces with no recorded model (``KB_EMBEDDING_MODEL``, or
    one a caller installed, e.g. a test's); ``embedder(name)`` any other model's.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._by_name: dict[str, Embedder] = {}
        self._lock = threading.Lock()

    def add(self, name: str, embedder: Embedder) -> None:
        """Serve model ``name`` with ``embedder`` (a caller's own, e.g. a test's)."""
        with self._lock:
            self._by_name[name] = embedder

    def embedder(self, name: str) -> Embedder:
        """The embedder of model ``name`` (loaded lazily: its package is imported on the first
        embed call). Raises ConfigurationError for an unknown name or a missing package."""
        with self._lock:
            found = self._by_name.get(name)
            if found is None:
                found = self._by_name[name] = LazyEmbedder(_settings_for(self.settings, name))
            return found
