"""Embedders used by the index tests: real Embedder implementations built on the hashing embedder
(they run for real; they differ only in what they count, reject or how fast they are)."""

from __future__ import annotations

import time

import numpy as np

from kb.index.embedding import HashingEmbedder


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder, recording every text it is asked to embed."""

    def __init__(self, dim: int = 384) -> None:
        super().__init__(dim)
        self.texts: list[str] = []
        self.calls = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        self.texts.extend(texts)
        return super().embed(texts)


class PoisonEmbedder(CountingEmbedder):
    """Raises for any batch holding a text with ``marker`` (a model that rejects one input)."""

    def __init__(self, marker: str = "POISON") -> None:
        super().__init__()
        self.marker = marker

    def embed(self, texts: list[str]) -> np.ndarray:
        if any(self.marker in t for t in texts):
            raise RuntimeError("the model rejected an input")
        return super().embed(texts)


class NaNEmbedder(HashingEmbedder):
    """Returns a NaN vector for texts with ``marker`` (a numerically broken model output)."""

    def __init__(self, marker: str = "NANTEXT") -> None:
        super().__init__()
        self.marker = marker

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = super().embed(texts)
        for i, text in enumerate(texts):
            if self.marker in text:
                vectors[i, 0] = np.nan
        return vectors


class SlowEmbedder(HashingEmbedder):
    """The hashing embedder taking ``delay`` seconds per call (a slow model, for kill tests)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def embed(self, texts: list[str]) -> np.ndarray:
        time.sleep(self.delay)
        return super().embed(texts)


class WorkerStopped(BaseException):
    """What an interrupted worker raises inside a run (as SystemExit or KeyboardInterrupt do):
    not an Exception, so no per-text or per-document fallback catches it."""


class StoppingEmbedder(CountingEmbedder):
    """The hashing embedder, raising WorkerStopped once, at the first batch holding ``marker``."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker, self.stopped = marker, False

    def embed(self, texts: list[str]) -> np.ndarray:
        if not self.stopped and any(self.marker in t for t in texts):
            self.stopped = True
            raise WorkerStopped
        return super().embed(texts)


class OverflowEmbedder(HashingEmbedder):
    """Returns float64 vectors, one of them finite as float64 but beyond float4's range for texts
    with ``marker`` (a model computing in double precision that overflows float4)."""

    def __init__(self, marker: str = "HUGETEXT") -> None:
        super().__init__()
        self.marker = marker

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = super().embed(texts).astype(np.float64)
        for i, text in enumerate(texts):
            if self.marker in text:
                vectors[i, 0] = 1e39
        return vectors
