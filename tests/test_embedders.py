"""design §7: the OpenAI-compatible embedder against a real local HTTP endpoint."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kb.errors import EmbeddingError
from kb.index.embedding import HashingEmbedder, OpenAIEmbedder, make_embedder


class _Handler(BaseHTTPRequestHandler):
    reference = HashingEmbedder(384)

    def do_POST(self):  # http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if body["model"] == "missing-model":
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"error": "model not found"}')
            return
        vectors = self.reference.embed(body["input"])
        data = [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        if body["model"] == "bad-shape":
            data = [{"index": 0, "embedding": [0.0, 1.0]}]
        payload = json.dumps({"data": list(reversed(data)), "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_openai_compatible_endpoint_from_settings(settings, endpoint):
    configured = settings.model_copy(update={"embedding_model": "openai:local-model", "openai_base_url": endpoint})
    embedder = make_embedder(configured)
    assert isinstance(embedder, OpenAIEmbedder) and embedder.model == "local-model" and embedder.dim == 384
    vectors = embedder.embed(["first text", "second text"])
    expected = HashingEmbedder(384).embed(["first text", "second text"])
    assert vectors.shape == (2, 384) and (abs(vectors - expected) < 1e-6).all()  # order restored by index


def test_openai_endpoint_errors_are_clear(endpoint):
    with pytest.raises(EmbeddingError, match="HTTP 404.*missing-model"):
        OpenAIEmbedder("missing-model", 384, endpoint, None).embed(["x"])
    with pytest.raises(EmbeddingError, match="expected 384-d"):
        OpenAIEmbedder("bad-shape", 384, endpoint, None).embed(["x", "y"])
    with pytest.raises(EmbeddingError, match="failed"):
        OpenAIEmbedder("m", 384, "http://127.0.0.1:9/v1", None).embed(["x"])


def test_openai_embedder_indexes_a_workspace(kb, endpoint):
    kb.use_embedder(OpenAIEmbedder("local-model", 384, endpoint, None))
    kb.create_workspace(1)
    with kb.transaction(1, "one", "t") as tx:
        tx.write("/documents/a.md", "annual refund policy\n")
    report = kb.index(1)
    assert report.documents_indexed == 1 and report.embeddings_computed == 1
    assert kb.search(1, "refund policy", 1)[0].path == "/documents/a.md"


def test_hashing_query_vector_without_numpy_is_the_embedded_vector():
    """The plain-Python query vector a one-shot search uses (design §13) is, float for float,
    the float32 vector the hashing embedder stores for the same text."""
    from kb.index.embedding import vector_literal

    embedder = HashingEmbedder(384)
    words = ["refund", "invoice", "annual", "plan", "Ünïcödé", "straße", "日本語", "a", "b", "c"]
    texts = ["", "x", "refund refund refund", *(" ".join(words[i:] + words[:i]) * (i + 1) for i in range(len(words)))]
    for text in texts:
        assert vector_literal(embedder.query_vector(text)) == vector_literal(embedder.embed([text])[0]), text


def test_vector_literal_names_every_float32_exactly(kb):
    """The indexer's vector text (9 significant digits, shorter than a float64 repr) is read by
    pgvector as exactly the float32 vector the embedder returned: tiny, huge, negative, zero and
    dense values alike."""
    import numpy as np
    from support.generated_documents import named_rows

    from kb.index.embedding import vector_literal

    rng = np.random.default_rng(5)
    vectors = [
        rng.standard_normal(384).astype(np.float32),
        (rng.standard_normal(384) * 1e-30).astype(np.float32),
        (rng.standard_normal(384) * 1e30).astype(np.float32),
        np.nextafter(np.float32(1), np.float32(2), dtype=np.float32) * np.ones(384, dtype=np.float32),
        HashingEmbedder(384).embed(["refund invoice annual plan"])[0],
    ]
    for vector in vectors:
        literal = vector_literal(vector)
        assert np.array_equal(np.array(literal[1:-1].split(","), dtype=np.float32), vector)
        [row] = named_rows(kb, "test_vector_as_floats", literal=literal)
        assert np.array_equal(np.array(row["floats"], dtype=np.float32), vector)
    assert vector_literal([0.5, float("nan")]) == "[0.5,nan]"


def test_a_lazy_embedder_loads_its_model_once_for_threads_asking_at_once(monkeypatch, tmp_path):
    """``kb serve``'s threads share one LazyEmbedder: the first searches, arriving together, load
    the model once (each load is seconds and a model's memory)."""
    from kb.index import embedding
    from kb.settings import Settings

    loads = []
    inside = threading.Barrier(2, timeout=2)
    real = embedding.make_embedder

    def counting(settings):
        loads.append(settings.embedding_model)
        try:
            inside.wait()  # a second load would meet the first here; with one, the wait breaks
        except threading.BrokenBarrierError:
            pass
        return real(settings)

    monkeypatch.setattr(embedding, "make_embedder", counting)
    lazy = embedding.LazyEmbedder(Settings(storage_root=tmp_path, embedding_model="hashing"))
    vectors = []
    threads = [threading.Thread(target=lambda: vectors.append(lazy.embed(["refund"]))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert loads == ["hashing"] and len(vectors) == 2
