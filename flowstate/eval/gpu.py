"""What a GPU pays for an evaluation's model calls: prefill-equivalent tokens (PET), from a roofline of a named
model on a named GPU.

    PET = U′ + F + w·D + κ·Σ_calls D_call·(P_call + D_call/2)

U′ is the uncached prefill with the deployment's fixed prefix (every call's system message) shared across
sessions, as a server's prefix cache holds it; F the completion tokens a grammar forced and the engine appended
in one forward pass (prefill weight); D the tokens decoded one step each; P a call's prompt. ``w`` is the time of
one decoded token over that of one prefilled token; ``κ`` what each decoded token costs, in prefilled tokens,
per token of context it attends over (it reads that token's KV cache).

The roofline: prefilling is compute-bound, ``2·active parameters`` FLOPs a token at the GPU's peak; a decode
step at batch B reads the weights once for its B tokens (an MoE's experts: those B tokens' routes touch
``1 − (1 − k/E)^B`` of them), plus each session's fixed linear-attention state; attention at decode reads
``bytes_per_token`` of KV cache per context token. Peak figures, no efficiency factors: real prefill runs
below peak FLOPs, which makes ``w`` smaller, so ``--gpu-cost MODEL@GPU:BATCH,w=W`` sets it outright.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.base import Usage
from flowstate.eval.kv import SHIPPED, KVModel
from flowstate.eval.kv import load as load_kv

GPUS: dict[str, dict[str, Any]] = {
    "h200": {"bandwidth_tb_s": 4.8, "bf16_tflops": 989.0, "memory_gib": 141,
             "source": "NVIDIA H200 Tensor Core GPU datasheet (SXM): 4.8 TB/s HBM3e, 1,979 BF16 TFLOPS with "
                       "sparsity, so 989 dense"},
    "h100": {"bandwidth_tb_s": 3.35, "bf16_tflops": 989.0, "memory_gib": 80,
             "source": "NVIDIA H100 Tensor Core GPU datasheet (SXM): 3.35 TB/s HBM3, 1,979 BF16 TFLOPS with "
                       "sparsity, so 989 dense"},
}
"""Peak figures of the GPUs a cost can be named on, with their sources."""

DEFAULT = "qwen3.5-27b@h200:32"
TARGET_WEIGHT = 3.0
"""The decode weight at which the README states FlowState's targets (about what a ~30B dense model on an H200 at
batch 32 achieves in practice, below its peak roofline)."""


@dataclass(frozen=True)
class GPUCost:
    """The weights of one model on one GPU at one batch size (or a decode weight given outright)."""

    label: str
    w: float  # prefill tokens per decoded token
    kappa: float  # prefill tokens per decoded token per token of context
    source: str

    def pet(self, calls: Sequence[Usage]) -> dict[str, float]:
        """PET of a set of calls (rows of older runs without shared and forced tokens count them 0) and its parts."""
        uncached = forced = decoded = attended = 0.0
        for c in calls:
            f = min(c.forced_tokens, c.completion_tokens)
            d = c.completion_tokens - f
            uncached += c.prompt_tokens - max(c.cached_tokens, c.shared_tokens)
            forced += f
            decoded += d
            attended += d * (c.prompt_tokens + c.completion_tokens / 2)
        return {"shared_uncached": uncached, "forced": forced, "decoded": decoded,
                "pet": uncached + forced + self.w * decoded + self.kappa * attended}


def _compute(name: str) -> dict[str, Any]:
    shipped = json.loads(SHIPPED.read_text())
    entry = shipped.get(name, {})
    if "compute" not in entry:
        known = [n for n, e in shipped.items() if "compute" in e]
        raise ValueError(f"--gpu-cost: no compute figures for model {name!r}; known: {', '.join(known)}")
    compute: dict[str, Any] = entry["compute"]
    return compute


def roofline(model: KVModel, compute: dict[str, Any], gpu: str, batch: int) -> tuple[float, float]:
    """(w, κ) of ``model`` on ``gpu`` at ``batch`` decoding sessions."""
    spec = GPUS[gpu]
    bandwidth, flops = spec["bandwidth_tb_s"] * 1e12, spec["bf16_tflops"] * 1e12
    dtype = model.dtype_bytes
    prefill_s = 2 * compute["active_billion"] * 1e9 / flops
    experts = compute.get("expert_billion", 0.0)
    touched = 1 - (1 - compute["top_k"] / compute["experts"]) ** batch if experts else 0.0
    weights = (compute["params_billion"] - experts + experts * touched) * 1e9 * dtype
    decode_s = max((weights / batch + model.fixed_state_bytes) / bandwidth, prefill_s)
    return decode_s / prefill_s, model.bytes_per_token / bandwidth / prefill_s


def load(spec: str = DEFAULT, decode_weight: float | None = None) -> GPUCost:
    """``MODEL@GPU:BATCH`` (a shipped model with compute figures, a GPU of ``GPUS``, decoding sessions); with
    ``decode_weight``, that ``w`` over the roofline's (κ still the roofline's)."""
    model_name, at, rest = spec.partition("@")
    gpu, colon, batch_text = rest.partition(":")
    if not at or not colon or gpu not in GPUS or not batch_text.isdigit() or int(batch_text) < 1:
        raise ValueError(f"--gpu-cost {spec!r}: expected MODEL@GPU:BATCH, e.g. {DEFAULT} (GPUs: {', '.join(GPUS)})")
    if decode_weight is not None and decode_weight <= 0:
        raise ValueError(f"--gpu-cost's decode weight w must be positive, not {decode_weight}")
    model = load_kv(model_name)
    w, kappa = roofline(model, _compute(model_name), gpu, int(batch_text))
    label = f"{model_name} on {gpu.upper()} at batch {batch_text}"
    if decode_weight is not None:
        return GPUCost(f"{label}, w = {decode_weight:g} (given)", decode_weight, kappa, GPUS[gpu]["source"])
    return GPUCost(label, w, kappa, GPUS[gpu]["source"])
