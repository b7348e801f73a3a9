"""What a session holds on a GPU: KV-cache bytes per token of context from a model's ``config.json``, and how
many sessions of a measured peak context fit beside the weights.

Bytes per token = 2 (K and V) × layers that keep a KV cache × KV heads × head dim × dtype bytes. Hybrid
models (Qwen3.5: linear attention in three of every four layers) keep a growing KV cache only in their
full-attention layers (``layer_types``, or every ``full_attention_interval``-th layer); their linear-attention
layers keep a fixed state per session instead (value heads × key dim × value dim per layer, in the model's
dtype here; the small convolution state is left out). Shipped configurations: ``kv_models.json``, each with
where its numbers come from; any ``config.json`` path works too (weights from a ``model.safetensors.index.json``
beside it, or ``params_billion`` unknown).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowstate.eval.rows import TaskRow, calls_of

SHIPPED = Path(__file__).with_name("kv_models.json")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1, "fp8": 1}
GIB = 2**30


@dataclass(frozen=True)
class KVModel:
    name: str
    kv_layers: int  # layers whose KV cache grows with the context
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    fixed_state_bytes: int  # per session, whatever its length (linear-attention layers' state)
    weights_bytes: int | None
    source: str

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.kv_layers * self.kv_heads * self.head_dim * self.dtype_bytes

    def session_bytes(self, context: float) -> float:
        return context * self.bytes_per_token + self.fixed_state_bytes

    def sessions_fit(self, context: float, gpu_gib: float) -> int | None:
        """Sessions of ``context`` tokens that fit in ``gpu_gib`` beside the weights (None: weights unknown)."""
        if self.weights_bytes is None:
            return None
        free = gpu_gib * GIB - self.weights_bytes
        return max(0, math.floor(free / self.session_bytes(context))) if context > 0 else None


def from_config(config: dict[str, Any], name: str, params_billion: float | None = None, source: str = "") -> KVModel:
    c = config.get("text_config") or config
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    dtype = DTYPE_BYTES.get(str(c.get("torch_dtype") or c.get("dtype") or config.get("torch_dtype") or "bfloat16"), 2)
    if c.get("layer_types"):
        full = sum(t == "full_attention" for t in c["layer_types"])
    elif c.get("full_attention_interval"):
        full = layers // int(c["full_attention_interval"])
    else:
        full = layers
    linear = layers - full
    fixed = linear * int(c.get("linear_num_value_heads") or 0) * int(c.get("linear_key_head_dim") or 0) \
        * int(c.get("linear_value_head_dim") or 0) * dtype
    weights = int(params_billion * 1e9 * dtype) if params_billion else None
    return KVModel(name, full, kv_heads, head_dim, dtype, fixed, weights, source)


def load(name_or_path: str) -> KVModel:
    """A shipped configuration by name, or a ``config.json`` (or a folder holding one)."""
    shipped = json.loads(SHIPPED.read_text())
    if name_or_path in shipped:
        entry = shipped[name_or_path]
        return from_config(entry["config"], name_or_path, entry["params_billion"], entry["source"])
    path = Path(name_or_path)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"--kv-model {name_or_path!r} is neither a shipped configuration ({', '.join(shipped)}) "
                         "nor a config.json")
    config = json.loads(path.read_text())
    index = path.with_name("model.safetensors.index.json")
    total = json.loads(index.read_text()).get("metadata", {}).get("total_size") if index.is_file() else None
    model = from_config(config, str(path), None, f"{path}")
    return model if total is None else KVModel(**{**model.__dict__, "weights_bytes": int(total)})


def footprint(rows: Sequence[TaskRow], model: KVModel, gpu_gib: float) -> dict[str, Any]:
    """Per task (session): its peak context (prompt + completion of its largest call); over the tasks: mean
    context per call, mean and largest peak, KV bytes at the mean peak, and sessions of that peak that fit."""
    peaks, contexts = [], []
    for r in rows:
        calls = [c.prompt_tokens + c.completion_tokens for c in calls_of(r.subtasks)]
        if calls:
            peaks.append(max(calls))
            contexts += calls
    if not peaks:
        return {}
    mean_peak = sum(peaks) / len(peaks)
    return {"model": model.name, "bytes_per_token": model.bytes_per_token,
            "context_per_call": sum(contexts) / len(contexts),
            "peak_context": mean_peak, "max_peak_context": max(peaks),
            "session_gib": model.session_bytes(mean_peak) / GIB, "sessions_fit": model.sessions_fit(mean_peak, gpu_gib),
            "gpu_gib": gpu_gib}
