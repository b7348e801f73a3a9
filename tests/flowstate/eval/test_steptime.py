"""The step-time model on hand-computed steps: a prefill chunk meets the compute roof, a decode batch the memory
roof (weights plus the KV it reads), an MoE's touched experts grow with the step's tokens, and the simulated clock
turns the scheduler's numbers into the step's work and each call's latency and first token."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from flowstate.bench.capacity import MARKER, ScheduledCall, SimulatedTiming, appended, copies
from flowstate.eval import steptime
from flowstate.eval.steptime import Step, StepTime

TOY = StepTime("toy", flops=1e15, bandwidth=1e12, active=1e9, dense_bytes=2e9, expert_bytes=0.0, route=0.0,
               kv_bytes=1e5, attention_flops=1e4, state_bytes=0.0, overhead_s=0.001)


def test_a_prefill_chunk_is_compute_bound() -> None:
    step = Step(prefill=4096, context=4096, attended=4096 * 4097 // 2, sequences=1)
    compute, memory = TOY.roofs(step)
    assert compute == pytest.approx((2e9 * 4096 + 1e4 * 8_390_656) / 1e15)  # 8.28 ms
    assert memory == pytest.approx((2e9 + 1e5 * 4096) / 1e12)  # 2.41 ms
    assert TOY.seconds(step) == pytest.approx(compute + 0.001)


def test_a_decode_batch_is_memory_bound_and_pays_for_the_kv_it_reads() -> None:
    step = Step(decode=8, context=8 * 1001, attended=8 * 1001, sequences=8)
    compute, memory = TOY.roofs(step)
    assert memory == pytest.approx((2e9 + 1e5 * 8008) / 1e12) and compute < memory / 100
    assert TOY.seconds(step) == pytest.approx(0.0028008 + 0.001)
    longer = Step(decode=8, context=8 * 10_001, attended=8 * 10_001, sequences=8)
    assert TOY.seconds(longer) - TOY.seconds(step) == pytest.approx(1e5 * 8 * 9000 / 1e12)
    assert TOY.seconds(Step()) == 0.0  # a step with nothing scheduled costs nothing


def test_an_moes_experts_are_read_as_the_steps_tokens_touch_them() -> None:
    moe = StepTime("moe", 1e15, 1e12, 3e9, dense_bytes=1e9, expert_bytes=60e9, route=8 / 256, kv_bytes=0.0,
                   attention_flops=0.0, state_bytes=0.0, overhead_s=0.0)
    one, many = moe.roofs(Step(decode=1, sequences=1))[1], moe.roofs(Step(decode=64, sequences=64))[1]
    assert one == pytest.approx((1e9 + 60e9 * 8 / 256) / 1e12)
    assert many == pytest.approx((1e9 + 60e9 * (1 - (1 - 8 / 256) ** 64)) / 1e12) and many > 3 * one


def test_the_shipped_models_on_an_h200() -> None:
    dense = steptime.load("qwen3.5-27b@h200")
    assert dense.active == 27e9 and dense.bandwidth == 4.8e12 and dense.expert_bytes == 0
    assert dense.kv_bytes == 2 * 16 * 4 * 256 * 2  # 16 full-attention layers, 4 KV heads of 256, bf16
    assert dense.attention_flops == 4 * 16 * 24 * 256
    decode = Step(decode=32, context=32 * 20_000, attended=32 * 20_000, sequences=32)
    assert dense.roofs(decode)[1] > dense.roofs(decode)[0]  # decoding 32 sessions: memory-bound
    assert steptime.kv_tokens("qwen3.5-27b@h200") > steptime.kv_tokens("qwen3.5-27b@h200", 80.0) > 0
    with pytest.raises(ValueError, match="expected MODEL@GPU"):
        steptime.load("qwen3.5-27b")


def test_the_clock_reads_the_schedulers_numbers_into_work_and_latency() -> None:
    timing = SimulatedTiming()
    timing.submitted("a")
    timing.submitted("b")
    a = SimpleNamespace(num_computed_tokens=512, num_prompt_tokens=1000)  # a prefill chunk of 512, from 0
    b = SimpleNamespace(num_computed_tokens=150, num_prompt_tokens=100)  # decoding, 149 tokens before this one
    timing.step(TOY, {"a": 512, "b": 1}, {"a": a, "b": b}, sampling=["b"])
    work = Step(prefill=512, decode=1, context=512 + 150, attended=512 * 513 // 2 + 150, sequences=2)
    assert timing.now == pytest.approx(TOY.seconds(work))
    assert timing.ttft == [pytest.approx(timing.now)]  # b sampled its first token in this step
    timing.finished("b")
    assert timing.latency == [pytest.approx(timing.now)]
    figures = timing.figures(sessions=2)
    assert figures["sessions_per_hour"] == pytest.approx(2 * 3600 / timing.now, rel=1e-3)
    assert figures["compute_bound_steps"] == 0.0  # 513 tokens: 1.03 ms of compute under 2.07 ms of weights and KV


def test_a_fit_recovers_the_rates_and_overhead_that_made_the_times() -> None:
    """Step times made by a known roofline (a CPU-like 400 GFLOP/s, 20 GB/s, 8 ms a step) over prefill- and
    decode-bound steps: fitting from a base 10x off recovers each within 5%, and predicts every step."""
    import random

    from flowstate.eval.steptime import Step, StepTime, fit, step_of

    true = StepTime("cpu", flops=4e11, bandwidth=2e10, active=1.35e8, dense_bytes=2.7e8, expert_bytes=0.0, route=0.0,
                    kv_bytes=23040.0, attention_flops=69120.0, state_bytes=0.0, overhead_s=0.008)
    rng = random.Random(5)
    steps = [step_of([(rng.choice([1, 1, 1, 256]), rng.randint(0, 3000), 1500) for _ in range(rng.randint(1, 8))])
             for _ in range(120)]
    assert any(s.prefill for s in steps) and any(not s.prefill for s in steps)
    got = fit(steps, [true.seconds(s) for s in steps], replace(true, flops=4e12, bandwidth=2e11, overhead_s=0.0))
    for name in ("flops", "bandwidth", "overhead_s"):
        assert abs(getattr(got, name) / getattr(true, name) - 1) < 0.05, (name, getattr(got, name))
    assert step_of([(256, 0, 1000), (1, 1200, 1000)]) == Step(prefill=256, decode=1, context=256 + 1201,
                                                              attended=256 * 257 // 2 + 1201, sequences=2)


def test_forced_tokens_are_spread_over_a_calls_sampled_tokens() -> None:
    """Fast-forward in the capacity bench: one entry per sampled token (how many steps the call takes), the forced
    tokens appended after them, summing to the output; a call the grammar forces whole still samples once."""
    assert appended(10, 4) == [1, 1, 1, 1, 0, 0]
    assert appended(10, 0) == [0] * 10
    assert appended(7, 7) == [6] and appended(1, 0) == [0]
    for output, forced in [(100, 33), (1300, 640), (5, 1)]:
        runs = appended(output, forced)
        assert len(runs) == output - forced and len(runs) + sum(runs) == output and max(runs) - min(runs) <= 1


def test_reused_sessions_are_distinct_copies_after_the_system_prompt() -> None:
    """Past what a trace holds, sessions are reused in turn; copy k carries its own token after the system
    message in every call, so copies share the system prompt and a copy's calls share their prefixes."""
    a = [ScheduledCall([1, 2, 3, 10, 11], 5, 2), ScheduledCall([1, 2, 3, 10, 11, 12], 4)]
    b = [ScheduledCall([1, 2, 3, 20], 3)]
    made = copies([a, b], [[3, 3], [3]], 5)
    assert made[0] == a and made[1] == b
    assert [c.ids for c in made[2]] == [[1, 2, 3, MARKER + 1, 10, 11], [1, 2, 3, MARKER + 1, 10, 11, 12]]
    assert made[2][0].output == 5 and made[2][0].forced == 2 and made[3][0].ids == [1, 2, 3, MARKER + 1, 20]
    assert made[4][0].ids == [1, 2, 3, MARKER + 2, 10, 11]
    assert copies([a, b], [[3, 3], [3]], 1) == [a]
