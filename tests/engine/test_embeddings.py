"""Embeddings (``engine/embeddings.py``): the embedded GGUF on llama.cpp, and any ``/v1/embeddings`` server read with
the official ``openai`` client — here a loopback server that serves the llama.cpp vectors."""

from __future__ import annotations

import base64
import json
import math
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from engine.embeddings import BATCH, LlamaCppEmbedder, ServerEmbedder, load
from engine.errors import EngineConfigError, EngineError, EngineUnavailable
from tests.engine.openai_stub import send

TEXTS = ["the order #W123 holds a blue kettle", "a kettle that is blue, in order W123", "a flight from SFO to JFK"]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def local() -> Iterator[LlamaCppEmbedder]:
    embedder = LlamaCppEmbedder()
    yield embedder
    embedder.close()


def test_the_embedded_model_embeds_unit_vectors_nearer_for_nearer_texts(local: LlamaCppEmbedder) -> None:
    vectors = local.embed(TEXTS)
    assert len(vectors) == 3 and len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 100
    assert all(math.isclose(cosine(v, v), 1.0, rel_tol=1e-6) for v in vectors)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])  # the two kettles
    assert cosine(local.embed(TEXTS[:1])[0], vectors[0]) > 0.9999  # the same text, alone or in a batch
    assert local.label == "llamacpp:embedded" and load("llamacpp").label == "llamacpp:embedded"


@pytest.fixture(scope="module")
def server(local: LlamaCppEmbedder) -> Iterator[dict[str, Any]]:
    seen: dict[str, Any] = {"batches": [], "fail": None}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # /v1/models
            send(self, json.dumps({"object": "list", "data": [{"id": "embedder", "object": "model", "created": 0,
                                                               "owned_by": "test"}]}).encode(), "application/json")

        def do_POST(self) -> None:  # /v1/embeddings
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if seen["fail"] is not None:
                self.send_response(seen["fail"])
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps({"error": {"message": "no such model"}}).encode())
                return
            texts = body["input"]
            seen["batches"].append(len(texts))
            vectors = local.embed(texts)
            if body.get("encoding_format") == "base64":  # what the official client asks for by default
                items = [base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors]
            else:
                items = vectors
            data = [{"object": "embedding", "index": i, "embedding": e} for i, e in reversed(list(enumerate(items)))]
            send(self, json.dumps({"object": "list", "data": data, "model": body["model"],
                                   "usage": {"prompt_tokens": 1, "total_tokens": 1}}).encode(), "application/json")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    seen["url"] = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    yield seen
    httpd.shutdown()


def test_a_server_embeds_as_the_model_does_in_batches_and_in_order(server: dict[str, Any], local: LlamaCppEmbedder) -> None:
    embedder = load(f"openai@{server['url']}")  # the model: the server's first
    assert embedder.label == "openai:embedder"
    texts = [f"text number {i}" for i in range(BATCH + 3)]
    vectors = embedder.embed(texts)
    assert server["batches"][-2:] == [BATCH, 3]
    assert all(math.isclose(cosine(a, b), 1.0, rel_tol=1e-5) for a, b in zip(vectors, local.embed(texts), strict=True))


def test_server_errors_are_engine_errors(server: dict[str, Any]) -> None:
    embedder = ServerEmbedder(server["url"], model="embedder")
    server["fail"] = 404
    try:
        with pytest.raises(EngineConfigError, match="refused the request"):
            embedder.embed(["x"])
    finally:
        server["fail"] = None
    gone = ServerEmbedder("http://127.0.0.1:9/v1", model="m")
    gone._server.retries, gone._server.backoff_s = 0, 0.0
    with pytest.raises(EngineUnavailable, match="unreachable"):
        gone.embed(["x"])


@pytest.mark.parametrize(("spec", "message"), [
    ("openai:m", "needs --base-url"),
    ("llamacpp@http://x/v1", "takes no URL"),
    ("vllm:/models/e", "takes openai:MODEL@URL or llamacpp"),
    ("openai:m@http://x/v1,temperature=0.5", "takes a model and a URL only"),
])
def test_a_bad_embed_spec_says_why(spec: str, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        load(spec)
