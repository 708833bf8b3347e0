"""Sentence-transformers models through onnxruntime and the tokenizers library (design §7).

A sentence-transformers model (MiniLM, or any model directory ``KB_EMBEDDING_MODEL`` names) is
exported once, with torch, into one ONNX graph holding the whole pipeline — transformer, pooling,
dense layers, normalisation — beside the model's own fast tokenizer (``tokenizer.json``, saved from
the tokenizer sentence-transformers itself uses). Afterwards every embedding, the query's in a
one-shot ``kb search`` and the worker's chunks alike, runs on onnxruntime and tokenizers: torch,
transformers and sentence-transformers are not imported.

The export is made at the first embedding (first index or first search) or by ``kb prepare-model``,
into ``{KB_MODEL_CACHE}/{directory name}-{12 hex of the directory's path}/``:
``model.onnx``, ``tokenizer.json`` and ``export.json`` (written last, atomically; it marks a
finished export) recording the source's sha256 over every file, each file's size and mtime (a
cheap check at load: only a changed file makes kb hash the model again) and what the runtime needs
(input names, maximum length, padding token, dimension). Before it is recorded the export is
checked against sentence-transformers' own ``encode`` on ``PROBE_TEXTS``: the cosine of each pair
must be at least ``MIN_COSINE``. A model that fails the check (or cannot be exported) is recorded
as refused, with the reason, and kb embeds with it through torch (``SentenceTransformerEmbedder``)
until its files change. Exports of one model by several processes are serialised by an ``flock``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kb.errors import ConfigurationError, EmbeddingError
from kb.extras import install_command

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import numpy as np

EXPORT_FORMAT = 1
"""Version of the cache layout and export procedure; a record of another version is re-exported."""
MIN_COSINE = 0.9999
"""Least cosine between the ONNX and the torch embedding of each probe text for an export to be used."""
PROBE_TEXTS = (
    "How do citations stay valid across history?",
    "  leading and trailing spaces  ",
    "Ünïcödé, ÇAPITALS and accents: résumé, naïve, Straße",
    "日本語のテキストと中文文本",
    "refund\n\nfor an annual\tsubscription",
    "word " * 600,  # longer than any model reads: truncated the same way
    "x",
)
"""Texts the exported graph must embed like sentence-transformers: cases, spacing, scripts,
truncation, a batch padded to its longest member."""

_EXPORT_LOCK = ".export.lock"


@dataclass(frozen=True)
class OnnxExport:
    """A finished export in the cache: its folder and its ``export.json`` record."""

    folder: Path
    record: dict

    @property
    def refused(self) -> str | None:
        """Why the model runs through torch instead (export failed or vectors differ), or None."""
        return self.record.get("refused")


def cache_folder(cache_root: Path, directory: Path) -> Path:
    """The cache folder of the model in ``directory``: ``{cache_root}/{name}-{12 hex}``, the hex of
    sha256 of the directory's resolved path (two models of one name never share a folder)."""
    resolved = directory.expanduser().resolve()
    return cache_root / f"{resolved.name}-{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"


def _source_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and ".git" not in p.relative_to(directory).parts)


def _fingerprint(directory: Path) -> dict[str, list[int]]:
    """``{relative path: [size, mtime_ns]}`` of every file of the model (a stat each, no read)."""
    result = {}
    for path in _source_files(directory):
        stat = path.stat()
        result[path.relative_to(directory).as_posix()] = [stat.st_size, stat.st_mtime_ns]
    return result


def source_checksum(directory: Path) -> str:
    """sha256 over every file of the model directory (relative path and content, in path order)."""
    digest = hashlib.sha256()
    for path in _source_files(directory):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def _read_record(folder: Path) -> dict | None:
    try:
        record = json.loads((folder / "export.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("format") == EXPORT_FORMAT else None


def _current(folder: Path, directory: Path) -> OnnxExport | None:
    """The recorded export when it was made from the model as it is now, else None. Unchanged
    sizes and mtimes vouch for the recorded checksum; otherwise the model is hashed again."""
    record = _read_record(folder)
    if record is None or record.get("source") != str(directory):
        return None
    fingerprint = _fingerprint(directory)
    if record.get("files") != fingerprint:
        if record.get("source_sha256") != source_checksum(directory):
            return None
        record = {**record, "files": fingerprint}  # touched, not changed: remember the new stats
        with contextlib.suppress(OSError):
            _write_json(folder / "export.json", record)
    if record.get("refused") is None and not all(
        (folder / name).is_file() for name in ("model.onnx", "tokenizer.json")
    ):
        return None
    return OnnxExport(folder, record)


def _write_json(path: Path, data: dict) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


@contextlib.contextmanager
def _export_lock(folder: Path) -> Iterator[None]:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / _EXPORT_LOCK, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def prepared_export(directory: Path, cache_root: Path) -> OnnxExport:
    """The ONNX export of the sentence-transformers model in ``directory``, made now (with torch)
    when the cache holds none for the model as it is; a refused export is returned as such.

    Raises ConfigurationError when there is no export and torch or sentence-transformers is
    missing to make one, or the cache folder cannot be written.
    """
    directory = directory.expanduser().resolve()
    folder = cache_folder(cache_root, directory)
    found = _current(folder, directory)
    if found is not None:
        return found
    try:
        with _export_lock(folder):
            found = _current(folder, directory)  # another process may have finished it meanwhile
            if found is not None:
                return found
            # A warning, so a waiting `kb worker` or first `kb search` says why nothing moves yet
            log.warning(
                "kb: exporting the model in %s to ONNX once (seconds to a minute; "
                "`kb prepare-model` makes it ahead of time)",
                directory,
            )
            return _export(directory, folder)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot write the ONNX export of {directory} under {cache_root} ({exc}); "
            "make KB_MODEL_CACHE a writable folder"
        ) from exc


def _export(directory: Path, folder: Path) -> OnnxExport:
    """Export the model with torch, check it against sentence-transformers, record it."""
    record = {
        "format": EXPORT_FORMAT,
        "source": str(directory),
        "source_sha256": source_checksum(directory),
        "files": _fingerprint(directory),
    }
    try:
        import sentence_transformers  # noqa: F401 - a missing package is named before any work
        import torch  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"the model in {directory} has no ONNX export yet and making one needs torch and "
            f"sentence-transformers ({install_command('minilm')}), once"
        ) from exc
    model = load_sentence_transformer(directory)
    try:
        record.update(_export_graph(model, folder))
        cosine = _check_export(model, folder, record)
    except Exception as exc:  # any failure of the exporter or the check: embed through torch
        record["refused"] = f"{type(exc).__name__}: {exc}"[:500]
    else:
        record["min_cosine"] = cosine
        if cosine < MIN_COSINE:
            record["refused"] = f"the ONNX vectors differ from sentence-transformers' (least cosine {cosine:.6f})"
    _write_json(folder / "export.json", record)
    return OnnxExport(folder, record)


def _export_graph(model, folder: Path) -> dict:
    """Write ``model.onnx`` (the whole pipeline, inputs → ``sentence_embedding``) and
    ``tokenizer.json``; returns the runtime facts for ``export.json``."""
    import torch

    features = model.preprocess(list(PROBE_TEXTS[:2]))
    inputs = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in features]
    if inputs[:2] != ["input_ids", "attention_mask"]:
        raise ConfigurationError(f"the model's tokenizer gives {sorted(features)}, not input_ids and attention_mask")

    class Pipeline(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            return self.model({**dict(zip(inputs, tensors)), "modality": "text"})["sentence_embedding"]

    axes = {name: {0: "batch", 1: "tokens"} for name in inputs}
    graph = folder / "model.onnx"
    temporary = folder / ".tmp-model.onnx"
    # The tracer's warnings (a shape test taken as a constant) are what _check_export verifies.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Pipeline().eval(),
            tuple(features[name] for name in inputs),
            str(temporary),
            input_names=inputs,
            output_names=["sentence_embedding"],
            dynamic_axes={**axes, "sentence_embedding": {0: "batch"}},
            dynamo=False,  # the TorchScript exporter: no onnxscript, one self-contained file
            opset_version=17,
        )
    os.replace(temporary, graph)
    tokenizer = model.tokenizer
    backend = tokenizer.backend_tokenizer  # the fast tokenizer transformers itself runs
    backend.save(str(folder / ".tmp-tokenizer.json"))
    os.replace(folder / ".tmp-tokenizer.json", folder / "tokenizer.json")
    return {
        "inputs": inputs,
        "max_length": int(model.max_seq_length),
        "pad_id": int(tokenizer.pad_token_id),
        "pad_token": str(tokenizer.pad_token),
        "pad_type_id": int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
        "padding_side": str(getattr(tokenizer, "padding_side", "right")),
        "dim": int(model.encode(["x"], convert_to_numpy=True).shape[1]),
    }


def _check_export(model, folder: Path, record: dict) -> float:
    """Least cosine between sentence-transformers' and the ONNX graph's vector of each probe text."""
    import numpy as np

    expected = np.asarray(model.encode(list(PROBE_TEXTS), normalize_embeddings=True, convert_to_numpy=True))
    actual = OnnxRuntimeModel(OnnxExport(folder, record)).embed(list(PROBE_TEXTS))
    return float(np.min(np.sum(expected * actual, axis=1)))


def load_sentence_transformer(directory: Path):
    """The sentence-transformers model saved in ``directory``, on the CPU, offline (torch).

    Raises ConfigurationError when sentence-transformers is missing or the directory holds no
    loadable model.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads at run time
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import transformers
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ConfigurationError(
            f"a sentence-transformers model needs the minilm extra ({install_command('minilm')})"
        ) from exc
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        return SentenceTransformer(str(directory), device="cpu")
    except (OSError, ValueError) as exc:
        raise ConfigurationError(
            f"{directory} is not a loadable sentence-transformers model directory ({exc}); "
            "point KB_EMBEDDING_MODEL at a directory saved by SentenceTransformer.save()"
        ) from exc


def optimized_graph(graph: Path, runtime_version: str) -> Path | None:
    """Where the export's graph is kept as onnxruntime optimises it (``ORT_ENABLE_EXTENDED``, the
    level whose output is portable between CPUs): ``model.optimized-{12 hex}.onnx`` beside it, the
    hex of the onnxruntime version and the graph's size and mtime; None when the graph is missing.

    A session made from it skips those passes: 30–60 ms of a cold search's session (measured on
    MiniLM, bin/bench_cli_startup.py --minilm). onnxruntime still applies its layout passes when
    it loads the copy, so the session runs the same kernels: the vectors are bit-identical."""
    try:
        stat = graph.stat()
    except OSError:
        return None
    key = f"{runtime_version}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return graph.with_name(f"model.optimized-{hashlib.sha256(key.encode()).hexdigest()[:12]}.onnx")


def _session(onnxruntime, path: Path, save_to: Path | None = None):
    """An onnxruntime CPU session of the graph at ``path``; with ``save_to``, one optimised to
    ``ORT_ENABLE_EXTENDED`` that writes its graph there (``optimized_graph``)."""
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # errors only: the exporter's graph draws optimiser notes
    if save_to is not None:
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(save_to)
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _write_optimized(onnxruntime, graph: Path, optimized: Path) -> None:
    """Write ``optimized`` (``optimized_graph``) from ``graph`` at once (a temporary file replaced
    into place); copies made from an earlier export of the graph are removed. A failure (no room,
    a read-only cache, a graph onnxruntime cannot save) leaves later sessions to optimise again."""
    try:
        fd, name = tempfile.mkstemp(dir=graph.parent, prefix=".tmp-optimized-", suffix=".onnx")
    except OSError:
        return
    os.close(fd)
    temporary = Path(name)
    with contextlib.suppress(OSError):  # mkstemp makes it 0600: readable as the folder is
        os.chmod(temporary, graph.parent.stat().st_mode & 0o666)
    kept = False
    try:
        _session(onnxruntime, graph, save_to=temporary)
        os.replace(temporary, optimized)
        kept = True
    except Exception as exc:  # onnxruntime's own classes, or OSError: a cache only
        log.debug("kb: cannot keep the optimised graph of %s (%s)", graph, exc)
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
    with contextlib.suppress(OSError):
        made = graph.stat().st_mtime_ns
        for other in graph.parent.glob("model.optimized-*.onnx"):
            if other != optimized and other.stat().st_mtime_ns < made:  # from an earlier export
                other.unlink()
    # The temporaries of sessions killed while they wrote (up to the graph's size each) were never
    # removed. With the copy in place, a concurrent writer's is redundant: its replace then finds
    # no file (a cache only), or puts the same graph in place.
    for leftover in graph.parent.glob(".tmp-optimized-*.onnx") if kept else ():
        with contextlib.suppress(OSError):
            leftover.unlink()


class OnnxRuntimeModel:
    """An export loaded into an onnxruntime session and a tokenizers ``Tokenizer``; thread-safe
    (onnxruntime's ``run`` and the tokenizer's ``encode_batch`` are). ``source``: the graph file
    the session was made from, the export's ``model.onnx`` or its optimised copy
    (``optimized_graph``), which the first session writes."""

    def __init__(self, export: OnnxExport, batch_size: int = 64) -> None:
        try:
            import onnxruntime
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigurationError(
                "running a sentence-transformers model without torch needs onnxruntime and tokenizers "
                f"({install_command('minilm')})"
            ) from exc
        record = export.record
        self.dim = int(record["dim"])
        self.batch_size = batch_size
        self._inputs = list(record["inputs"])
        self._tokenizer = Tokenizer.from_file(str(export.folder / "tokenizer.json"))
        self._tokenizer.enable_truncation(int(record["max_length"]))
        self._tokenizer.enable_padding(
            direction=record.get("padding_side", "right"),
            pad_id=int(record["pad_id"]),
            pad_type_id=int(record.get("pad_type_id", 0)),
            pad_token=str(record["pad_token"]),
        )
        graph = export.folder / "model.onnx"
        optimized = optimized_graph(graph, onnxruntime.__version__)
        session = None
        if optimized is not None and optimized.is_file():
            try:
                session, self.source = _session(onnxruntime, optimized), optimized
            except Exception:  # a damaged copy (onnxruntime's own classes): the export answers
                with contextlib.suppress(OSError):
                    optimized.unlink()
        if session is None:
            try:
                session, self.source = _session(onnxruntime, graph), graph
            except Exception as exc:  # onnxruntime raises its own classes for a damaged file
                raise ConfigurationError(
                    f"onnxruntime cannot load {graph} ({exc}); delete the folder "
                    f"{export.folder} and kb exports the model again"
                ) from exc
            if optimized is not None:
                _write_optimized(onnxruntime, graph, optimized)
        self._session = session

    def embed(self, texts: list[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised, in the order of ``texts``; batches of
        ``batch_size`` texts of similar length (less padding), as sentence-transformers does."""
        import numpy as np

        result = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            encodings = self._tokenizer.encode_batch([texts[i] for i in rows])
            columns = {
                "input_ids": [e.ids for e in encodings],
                "attention_mask": [e.attention_mask for e in encodings],
                "token_type_ids": [e.type_ids for e in encodings],
            }
            feed = {name: np.asarray(columns[name], dtype=np.int64) for name in self._inputs}
            try:
                vectors = self._session.run(["sentence_embedding"], feed)[0]
            except Exception as exc:  # onnxruntime's own error classes
                raise EmbeddingError(f"onnxruntime failed to embed {len(rows)} texts: {exc}") from exc
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            result[rows] = vectors / np.where(norms == 0, 1, norms)
        return result


class OnnxEmbedder:
    """A sentence-transformers model embedding through its ONNX export (design §7): the same
    vectors as the model through torch (cosine ≥ ``MIN_COSINE``), hence the same vector space
    ``model``. ``languages``: the ISO 639-1 codes it was trained on, or None for all."""

    semantic = True

    def __init__(
        self,
        export: OnnxExport,
        model: str,
        batch_size: int = 64,
        languages: frozenset[str] | None = None,
    ) -> None:
        self.model = model
        self.languages = languages
        self.folder = export.folder
        self._runtime = OnnxRuntimeModel(export, batch_size)
        self.dim = self._runtime.dim

    def embed(self, texts: list[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, normalised; raises EmbeddingError when onnxruntime fails."""
        return self._runtime.embed(texts)
