"""Text embeddings for the memory methods whose sources rank by them (ReasoningBank, Mem0): any
OpenAI-compatible ``/v1/embeddings`` server (``vllm serve`` an embedding model serves one), or a GGUF on
llama.cpp in process (the embedded SmolLM2, mean-pooled: a test instrument, not an embedding model). Chosen as one value, ``openai:MODEL@URL`` or ``llamacpp[:FILE.gguf]`` (``engine/spec.py``).
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from engine.errors import EngineConfigError, EngineError
from engine.spec import label, parse

BATCH = 64  # texts per request to a server


class Embedder(ABC):
    """Texts in, one unit-length vector each."""

    label: str

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order, each of length 1 (raises ``EngineError``)."""

    def close(self) -> None:
        """Release what the embedder holds."""


def unit(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


class ServerEmbedder(Embedder):
    """``/v1/embeddings`` of an OpenAI-compatible server, through the official client (retries and errors as the
    ``openai`` engine has them)."""

    def __init__(self, base_url: str | None = None, *, model: str | None = None, api_key: str | None = None) -> None:
        from engine.openai import OpenAIEngine

        self._server = OpenAIEngine(base_url, api_key=api_key, model=model)
        self.label = f"openai:{self._server.model}"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        for start in range(0, len(texts), BATCH):
            batch = list(texts[start:start + BATCH])
            vectors = self._server.embed(batch)
            if len(vectors) != len(batch):
                raise EngineError(f"server {self._server.base_url} returned {len(vectors)} embeddings for {len(batch)} texts")
            out += [unit(v) for v in vectors]
        return out


class LlamaCppEmbedder(Embedder):
    """A GGUF on llama.cpp in process, its token vectors mean-pooled (one call at a time)."""

    def __init__(self, model: str | None = None, *, threads: int | None = None) -> None:
        import llama_cpp

        from engine.llamacpp import resolve_gguf

        path, embedded = resolve_gguf(model)
        self._llm = llama_cpp.Llama(model_path=path, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                                    n_ctx=2048, n_threads=threads, verbose=False)
        self._lock = threading.Lock()
        self.label = "llamacpp:" + ("embedded" if embedded else path)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            try:
                vectors: Any = self._llm.embed(list(texts), normalize=True, truncate=True)
            except (RuntimeError, ValueError) as exc:
                raise EngineError(f"llama.cpp embedding failed: {exc}") from exc
        return [unit(v) for v in vectors]

    def close(self) -> None:
        self._llm.close()


def load(spec: str, option: str = "--embed", api_key: str | None = None) -> Embedder:
    """The embedder a spec names: ``openai:MODEL@URL`` or ``llamacpp[:FILE.gguf]``."""
    opts = parse(spec, option)
    name, extra = opts.pop("name"), set(opts) - {"model", "base_url", "api_key"}
    if extra:
        raise EngineConfigError(f"{option} {label({'name': name, **opts})} takes a model and a URL only, not {sorted(extra)}")
    if name == "openai":
        return ServerEmbedder(opts.get("base_url"), model=opts.get("model"), api_key=opts.get("api_key") or api_key)
    if name == "llamacpp":
        if "base_url" in opts:
            raise EngineConfigError(f"{option}: llamacpp embeds in process; it takes no URL")
        return LlamaCppEmbedder(opts.get("model"))
    raise EngineConfigError(f"{option} takes openai:MODEL@URL or llamacpp[:FILE.gguf], not {spec!r}")
