"""How long one scheduler step takes on a GPU: a roofline of the step's work, for ``flowstate bench capacity``.

A step computes the tokens it schedules (prefill chunks and one token per decoding request) and reads the weights
once, plus the KV cache its attention reads and each sequence's fixed linear-attention state. Its time is the
larger of compute and memory, plus a fixed per-step overhead (the scheduler, sampling, kernel launches)::

    FLOPs = 2·active·(prefill + decode) + a·attended          (a: attention FLOPs per query × context token)
    bytes = dense + experts·touched(tokens) + kv·(context read) + state·sequences
    time  = max(FLOPs / peak FLOP/s, bytes / bandwidth) + overhead

``attended`` sums, over the step's tokens, the context each attends over; ``context read`` sums each scheduled
request's KV (its earlier tokens and this step's). An MoE's experts are touched as ``1 − (1 − k/E)^tokens`` of
them. Peak figures (``flowstate.eval.gpu.GPUS``), no efficiency factors: a real step is slower, which ``fit``
measures against an engine that runs (the per-step overhead and the rates it achieves).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from flowstate.eval.gpu import GPUS, _compute
from flowstate.eval.kv import SHIPPED
from flowstate.eval.kv import load as load_kv

OVERHEAD_S = 0.004
"""A step's fixed cost on a GPU serving stack (vLLM V1 with CUDA graphs: scheduling, input preparation, sampling
and launches), an assumption stated with every figure and replaced by ``fit`` where an engine was measured."""


@dataclass(frozen=True)
class Step:
    """The work one scheduler step holds."""

    prefill: int = 0  # prompt tokens computed
    decode: int = 0  # tokens decoded, one per decoding request
    context: int = 0  # KV tokens read: each scheduled request's earlier tokens and this step's
    attended: int = 0  # Σ over the step's tokens of the context each attends over
    sequences: int = 0  # requests scheduled


@dataclass(frozen=True)
class StepTime:
    """The roofline of one model on one device."""

    label: str
    flops: float  # peak FLOP/s
    bandwidth: float  # bytes/s
    active: float  # parameters computed per token
    dense_bytes: float  # weights every step reads (all but the experts)
    expert_bytes: float  # the experts' weights (0: a dense model)
    route: float  # experts a token is routed to, as a share of them (top_k / experts)
    kv_bytes: float  # per token of context
    attention_flops: float  # per query token per context token
    state_bytes: float  # per sequence (linear-attention layers)
    overhead_s: float = OVERHEAD_S

    def roofs(self, step: Step) -> tuple[float, float]:
        """(compute seconds, memory seconds) of ``step`` at peak."""
        tokens = step.prefill + step.decode
        compute = 2 * self.active * tokens + self.attention_flops * step.attended
        touched = 1 - (1 - self.route) ** tokens if self.expert_bytes else 0.0
        memory = (self.dense_bytes + self.expert_bytes * touched + self.kv_bytes * step.context
                  + self.state_bytes * step.sequences)
        return compute / self.flops, memory / self.bandwidth

    def seconds(self, step: Step) -> float:
        """The step's time: the larger roof, plus the fixed overhead (0 for a step that holds nothing)."""
        if step.prefill + step.decode == 0:
            return 0.0
        return max(self.roofs(step)) + self.overhead_s

    def with_overhead(self, seconds: float) -> StepTime:
        return replace(self, overhead_s=seconds)


def _parse(spec: str) -> tuple[str, str]:
    """(model, GPU) of ``MODEL@GPU[:BATCH]``."""
    model_name, at, rest = spec.partition("@")
    gpu = rest.partition(":")[0]
    if not at or gpu not in GPUS:
        raise ValueError(f"--gpu-cost {spec!r}: expected MODEL@GPU, e.g. qwen3.5-27b@h200 (GPUs: {', '.join(GPUS)})")
    return model_name, gpu


def load(spec: str, overhead_s: float = OVERHEAD_S) -> StepTime:
    """``MODEL@GPU`` (a shipped model with compute figures, a GPU of ``GPUS``; a ``:BATCH`` is ignored: the
    scheduler decides each step's batch)."""
    import json

    model_name, gpu = _parse(spec)
    model = load_kv(model_name)
    compute = _compute(model_name)
    config: dict[str, Any] = json.loads(SHIPPED.read_text())[model_name]["config"]
    text = config.get("text_config") or config
    q_heads = int(text["num_attention_heads"])
    experts = compute.get("expert_billion", 0.0) * 1e9 * model.dtype_bytes
    device = GPUS[gpu]
    return StepTime(
        label=f"{model_name} on {gpu.upper()}", flops=device["bf16_tflops"] * 1e12,
        bandwidth=device["bandwidth_tb_s"] * 1e12, active=compute["active_billion"] * 1e9,
        dense_bytes=compute["params_billion"] * 1e9 * model.dtype_bytes - experts, expert_bytes=experts,
        route=compute["top_k"] / compute["experts"] if experts else 0.0, kv_bytes=model.bytes_per_token,
        # QKᵀ and AV: 2 multiply-adds per head dimension, per head, per full-attention layer
        attention_flops=4.0 * model.kv_layers * q_heads * model.head_dim,
        state_bytes=model.fixed_state_bytes, overhead_s=overhead_s)


def kv_tokens(spec: str, memory_gib: float | None = None, utilization: float = 0.9) -> int:
    """The KV cache, in tokens, of ``MODEL@GPU``: the share vLLM takes of the GPU's memory (``utilization``, its
    default 0.9) less the weights, over the bytes a token of context holds."""
    model_name, gpu = _parse(spec)
    model = load_kv(model_name)
    if model.weights_bytes is None:
        raise ValueError(f"the weights of {model_name} are unknown: give --kv-tokens")
    gib = memory_gib if memory_gib is not None else GPUS[gpu]["memory_gib"]
    free = gib * (1 << 30) * utilization - model.weights_bytes
    if free <= 0:
        raise ValueError(f"{model_name}'s weights do not fit {gib} GiB at {utilization:.0%}")
    return int(free // model.bytes_per_token)


def step_of(scheduled: Sequence[tuple[int, int, int]]) -> Step:
    """A step's work from what the scheduler scheduled: per request (tokens this step, tokens computed before,
    prompt tokens); a request still inside its prompt prefills, one past it decodes."""
    prefill = decode = context = attended = 0
    for n, computed, prompt in scheduled:
        if computed < prompt:
            prefill += n
        else:
            decode += n
        context += computed + n
        attended += n * computed + n * (n + 1) // 2
    return Step(prefill, decode, context, attended, len(scheduled))


def fit(steps: Sequence[Step], seconds: Sequence[float], base: StepTime) -> StepTime:
    """``base`` with the FLOP rate, bandwidth and per-step overhead that best explain measured step times (least
    squares; a log grid over the rates, refined twice, the overhead solved for each pair): what an engine achieves,
    in place of peak figures."""
    work = [base.with_overhead(0).roofs(s) for s in steps]  # seconds at the base's rates
    lo_f, hi_f, lo_b, hi_b = -4.0, 4.0, -4.0, 4.0  # log10 of each rate's factor over the base's
    best = (math.inf, 1.0, 1.0, 0.0)
    for _ in range(3):
        for i in range(41):
            for j in range(41):
                f, b = 10 ** (lo_f + (hi_f - lo_f) * i / 40), 10 ** (lo_b + (hi_b - lo_b) * j / 40)
                roof = [max(c / f, m / b) for c, m in work]
                overhead = max(0.0, sum(t - r for t, r in zip(seconds, roof, strict=True)) / len(roof))
                err = sum((overhead + r - t) ** 2 for t, r in zip(seconds, roof, strict=True))
                if err < best[0]:
                    best = (err, f, b, overhead)
        f_log, b_log = math.log10(best[1]), math.log10(best[2])
        span_f, span_b = (hi_f - lo_f) / 20, (hi_b - lo_b) / 20
        lo_f, hi_f, lo_b, hi_b = f_log - span_f, f_log + span_f, b_log - span_b, b_log + span_b
    _, f, b, overhead = best
    return replace(base, label=f"{base.label}, fitted", flops=base.flops * f, bandwidth=base.bandwidth * b,
                   overhead_s=overhead)
