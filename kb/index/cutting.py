"""A document's cut: its chunks, context lines, embedded texts and their hashes, and its language
(design §7) — the Python an index run adds to the embedder's work, in one place so that it can run
in this process or in a cutter process of its own (``CutterProcess``).

An index run's client is one Python interpreter: cutting (the chunker), the context lines, the
hashes and the language detection hold its lock as much as the embedder does. A big run hands
this part to one child process, batch by batch, a batch ahead of the embedder in the run's
process, so the two interpreters work at once (``Indexer._run_documents``). What the child
computes is what the run's process would (the same functions on the same bytes), so the stored
index is the same either way.

This module imports only what a cut needs (no database, no git): the child loads no more.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import select
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kb.errors import UnindexableDocument
from kb.index.chunk_context import context_line, embedded_text, heading_paths
from kb.index.chunking import Chunk, Chunker, LazyChunker
from kb.index.languages import cache_in, detect_language, detect_languages, lexically_stable, text_config
from kb.store.indexable import decode_document


def sha256_text(text: str) -> str:
    """Hex sha256 of a chunk's UTF-8 text (the embedding cache key, design §7)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def error_text(exc: BaseException) -> str:
    """How a document's failure is recorded: ``Type: message``."""
    return f"{type(exc).__name__}: {exc}"


@dataclass
class Cut:
    """One document cut (``cut_document``). ``text``: the document's text while its language is
    still to be detected (``settle_languages``); ``text_config`` once it is."""

    chunks: list[Chunk] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    embedded: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    text_config: str | None = None
    text: str | None = None
    lexically_stable: bool = True
    error: str | None = None
    unindexable: str | None = None

    @property
    def writable(self) -> bool:
        """Neither failed nor unindexable."""
        return self.error is None and self.unindexable is None


def cut_document(chunker: Chunker | LazyChunker, max_bytes: int, title: str, data: bytes) -> Cut:
    """Decode, cut and hash one document's bytes (``title``: its title, for the context lines);
    its language is left to ``settle_languages`` (``text``). A document that cannot be indexed is
    ``unindexable``; any other failure is its ``error`` (it fails alone, design §7)."""
    cut = Cut()
    try:
        text = decode_document(data, max_bytes)
        cut.chunks = chunker.chunk(text)
        cut.text = text
        cut.lexically_stable = lexically_stable(text, title)
        cut.contexts = [context_line(title, path) for path in heading_paths(text, cut.chunks)]
        cut.embedded = [embedded_text(ctx, c.text) for ctx, c in zip(cut.contexts, cut.chunks)]
        cut.hashes = [sha256_text(e) for e in cut.embedded]
    except UnindexableDocument as exc:
        cut.unindexable = str(exc)
    except Exception as exc:  # one document's failure never stops the others (§7)
        cut.error = error_text(exc)
    return cut


def document_config(fts_config: str, text: str) -> str:
    """The text-search configuration of a document: ``fts_config`` (``KB_FTS_CONFIG``), or with
    ``auto`` the one of its detected language (kb.languages)."""
    return fts_config if fts_config != "auto" else text_config(detect_language(text))


def settle_languages(fts_config: str, cuts: list[Cut]) -> None:
    """Give every cut still holding its text its text-search configuration, the batch's
    languages detected together (``detect_languages``); when that fails, document by document,
    so a failure fails the document alone (design §7). Drops the texts."""
    pending = [c for c in cuts if c.text is not None and c.writable]
    if fts_config != "auto":
        for c in pending:
            c.text_config = fts_config
    elif pending:
        try:
            languages = detect_languages([c.text or "" for c in pending])
        except Exception:
            for c in pending:
                try:
                    c.text_config = document_config(fts_config, c.text or "")
                except Exception as exc:
                    c.error = error_text(exc)
        else:
            for c, language in zip(pending, languages):
                c.text_config = text_config(language)
    for c in cuts:
        c.text = None


# -- the cutter process ----------------------------------------------------------------------
READY = "kb-cutter-ready"
"""What a cutter process says first, once its chunker is built (``serve``)."""


def serve() -> None:
    """A cutter process's loop (``python -c "from kb.index.cutting import serve; serve()"
    CONFIG``, CONFIG the JSON of ``CutterProcess``'s settings): builds its chunker, says ``READY``,
    then answers each batch read from stdin (pickled ``[(title, bytes or error)]``) with its cuts
    (pickled ``[Cut]``, languages settled) on stdout, until stdin ends. Ctrl-C reaches the whole
    process group: the run's process stops it (by ending its stdin), so it ignores SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    config = json.loads(sys.argv[1])
    if config["model_cache"] is not None:
        cache_in(Path(config["model_cache"]))
    chunker, max_bytes, fts_config = Chunker(config["chunk_size"]), config["max_bytes"], config["fts_config"]
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    pickle.dump(READY, answers)
    answers.flush()
    while True:
        try:
            documents = pickle.load(requests)
        except EOFError:
            return
        cuts = [
            cut_document(chunker, max_bytes, title, data) if isinstance(data, bytes) else Cut(error=data)
            for title, data in documents
        ]
        settle_languages(fts_config, cuts)
        pickle.dump(cuts, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


class CutterProcess:
    """One cutter process (``serve``), for one index run: a fresh interpreter that imports only
    this module's needs (not the parent's main module, nor a copy of its threads and
    connections). Batches go in with ``send`` (written by a thread of their own, so a full pipe
    never blocks the run) and their cuts come out in the same order (``receive``); ``ready``
    says whether the child has started (waiting for it up to a time given, if any). ``close`` (or the ``with`` block's
    end) ends its stdin — or kills it when batches are still in hand — and waits for it, so no
    process outlives the run. A child that dies makes ``receive`` raise (EOFError, OSError):
    the run cuts in its own process from then on."""

    def __init__(self, chunk_size: int, max_bytes: int, fts_config: str, model_cache: Path | None) -> None:
        config = {
            "chunk_size": chunk_size,
            "max_bytes": max_bytes,
            "fts_config": fts_config,
            "model_cache": None if model_cache is None else str(model_cache),
        }
        root = str(Path(__file__).resolve().parents[2])  # this kb, whatever the child's path says
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        self._process: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-c", "from kb.index.cutting import serve; serve()", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._feeder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-index-cutter-feed")
        self._started = False
        self._in_hand = 0

    @property
    def pid(self) -> int | None:
        """The child's process id (None once closed)."""
        return None if self._process is None else self._process.pid

    def ready(self, wait: float = 0.0) -> bool:
        """Whether the child has started (said ``READY``), waiting up to ``wait`` seconds for it
        (none by default)."""
        if self._started or self._process is None:
            return self._started
        stdout = self._process.stdout
        assert stdout is not None
        if not select.select([stdout], [], [], wait)[0]:
            return False
        if pickle.load(stdout) != READY:
            raise OSError("the cutter process did not start")
        self._started = True
        return True

    def send(self, documents: list[tuple[str, bytes | str]]) -> None:
        """Hand the child a batch (``(title, bytes)``, or ``(title, error)`` for a document that
        could not be read); its cuts come back from ``receive``, in order."""
        if self._process is None:
            raise OSError("the cutter process was stopped")
        self._in_hand += 1
        self._feeder.submit(self._write, self._process, documents)

    @staticmethod
    def _write(process: subprocess.Popen[bytes], documents: list[tuple[str, bytes | str]]) -> None:
        assert process.stdin is not None
        try:
            pickle.dump(documents, process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            process.stdin.flush()
        except (OSError, ValueError):  # the child died or was stopped: receive says so
            pass

    def receive(self) -> list[Cut]:
        """The cuts of the oldest batch sent and not yet received (waits for them)."""
        if self._process is None or not self._in_hand:
            raise OSError("no batch in the cutter process")
        stdout = self._process.stdout
        assert stdout is not None
        if not self._started:
            if pickle.load(stdout) != READY:
                raise OSError("the cutter process did not start")
            self._started = True
        cuts = pickle.load(stdout)
        self._in_hand -= 1
        return cuts

    def close(self) -> None:
        """Stop the child and wait for it (idempotent)."""
        if self._process is None:
            return
        process, self._process = self._process, None
        try:
            if self._in_hand:  # a run that stopped: what it handed over is not wanted
                process.kill()
            self._feeder.shutdown(wait=True)
            with contextlib.suppress(OSError):
                process.stdin.close()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        finally:
            process.stdout.close()

    def __enter__(self) -> CutterProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
