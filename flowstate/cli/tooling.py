"""``flowstate model`` and ``flowstate bench``: exporting the embedded model, and the benchmarks that print figures."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

import engine as engines
from engine.base import Engine
from flowstate.bench.real_model import STRATEGIES as REAL_STRATEGIES
from flowstate.bench.real_model import SUITES as REAL_SUITES
from flowstate.cli.options import LoopOptions, engine_options, errors, loop_options
from flowstate.config import LoopConfig
from flowstate.eval.trace import read as read_trace


@click.group()
def model() -> None:
    """Manage the embedded model."""


@model.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", "source", default=None,
              help="Local HF folder or .gguf [default: embedded SmolLM2-135M-Instruct].")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float32", "float16"]))
def export(directory: Path, source: str | None, dtype: str) -> None:
    """Write the model as a transformers folder that vLLM (and vllm serve) can load."""
    with errors():
        from engine.transformers import export_model

        click.echo(export_model(directory, source, dtype))


@click.group()
def bench() -> None:
    """Benchmarks that print figures."""


OUT = click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                   help="Also write the rows as JSON.")


def progress(line: str) -> None:
    """A bench's progress line, on stderr (its table goes to stdout)."""
    click.echo(line, err=True)


def emit(table: str, out: Path | None, payload: dict[str, Any]) -> None:
    """A bench's table on stdout, and with ``--out`` its rows (``payload``) as JSON."""
    click.echo(table)
    if out is not None:
        out.write_text(json.dumps(payload, indent=2))


def side_by_side(pg_url: str | None) -> list[tuple[str, str]]:
    """SQLite (a fresh file), and PostgreSQL beside it where a URL is given."""
    return [("sqlite", ""), *([("postgresql", pg_url)] if pg_url else [])]


@bench.command("decode")
@engine_options
@click.option("--calls", default=None, type=click.IntRange(min=1),
              help="Use only the first N of the 8 hotel-case prompts.")
@OUT
@click.option("--fast-forward", "fast_forward", default="on", show_default=True,
              type=click.Choice(["on", "off", "both"]),
              help="llamacpp: append the tokens a grammar forces in one forward pass (on), decode them one by one "
                   "(off), or both side by side (both: each engine twice, the second named '… step-by-step').")
@click.option("--speculate", default="off", show_default=True,
              help="Also decode with drafts from the prompt, comma-separated settings side by side (llamacpp: "
                   "off,lookup:4,lookup:8; vllm: off,ngram:4: each engine once per setting, named '… METHOD:K'), "
                   "each drafting one compared with the same engine's undrafted outputs.")
def bench_decode_cmd(calls: int | None, out: Path | None, fast_forward: str, speculate: str,
                     **engine_opts: Any) -> None:
    """Tokens/s without grammar vs static vs per-step grammar, per engine (--engine a,b: side by side in one run)."""
    from flowstate.bench.decode import bench_decode, render_table

    with errors():
        max_tokens = engine_opts.pop("max_tokens")
        names = [n.strip() for n in engine_opts.pop("name").split(",") if n.strip()]
        step_by_step: dict[str, Any] = {"fast_forward": False}
        settings: dict[str, list[tuple[str, dict[str, Any]]]] = {
            "on": [("", {})], "off": [("", step_by_step)], "both": [("", {}), (" step-by-step", step_by_step)]}
        drafts = [s.strip() for s in speculate.split(",") if s.strip()] or ["off"]
        loaded, against = {}, {}
        for n in names:
            for suffix, extra in settings[fast_forward]:
                for draft in drafts:
                    name = n + suffix + ("" if draft == "off" else f" {draft}")
                    more = {} if draft == "off" else {"speculate": draft}
                    loaded[name] = engines.load(n, **engine_opts, **extra, **more, max_tokens=None)
                    against[name] = n + suffix
        rows = bench_decode(loaded, calls=calls, max_tokens=max_tokens, progress=progress, against=against)
        emit(render_table(rows), out, {"engines": names, "rows": rows})


@bench.command("decision")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True), help="A GGUF instruct model.")
def bench_decision_cmd(model: str) -> None:
    """Where a model decides to act or answer: its next-token mass on [ and [] at each block of a first step."""
    from flowstate.bench.decision import bench_decision
    from flowstate.bench.table import table

    with errors():
        engine = engines.load("llamacpp", model=model)
        try:
            rows = bench_decision(engine)
        finally:
            engine.close()
        click.echo(table(["prompt", "block", "P(non-empty)", "P([])"], rows))


@bench.command("calibrate")
@click.argument("real", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.argument("realistic", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--count-tokens", "tokens", default="words", show_default=True, metavar="words|embedded|FILE.gguf",
              help="The vocabulary both runs' tokens are counted in (the real model's GGUF, to compare like with "
                   "like).")
@click.option("--strategy", default="flowstate", show_default=True, help="The method whose requests are compared.")
def bench_calibrate_cmd(real: Path, realistic: Path, tokens: str, strategy: str) -> None:
    """The realistic policy against a real model: two eval folders of the same tasks, figure by figure."""
    from flowstate.bench.calibration import compare
    from flowstate.bench.table import table
    from flowstate.eval.runner import token_counter

    with errors():
        rows = compare(real, realistic, token_counter(tokens), strategy)
        click.echo(table(["figure", "real model", "realistic policy", "real / realistic"], rows))


@bench.command("real-model")
@click.option("--model", required=True, type=click.Path(dir_okay=False, exists=True),
              help="A GGUF instruct model (e.g. the one tests/models/qwen2.5-coder-1.5b.py assembles).")
@click.option("--tasks", default=1, show_default=True, type=click.IntRange(min=1),
              help="Tasks per suite (a later run with more resumes: done tasks are kept).")
@click.option("--depth", default=3, show_default=True, type=click.IntRange(min=1), help="Subtasks per task.")
@click.option("--suite", "suites", default=",".join(REAL_SUITES), show_default=True, help="Suites, comma-separated.")
@click.option("--strategy", "strategies", default=",".join(REAL_STRATEGIES), show_default=True,
              help="Methods, comma-separated.")
@click.option("--max-steps", default=16, show_default=True, type=click.IntRange(min=1), help="Step budget per request.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The evaluation's folder (results.jsonl, report.md) and the table (real-model.md).")
def bench_real_model_cmd(model: str, tasks: int, depth: int, suites: str, strategies: str, max_steps: int,
                         out: Path) -> None:
    """What a real GGUF model does with every method: SR/PS with Wilson intervals, tool use, rejections, repeats."""
    from flowstate.bench.real_model import render, run

    with errors():
        rows = run(model, tasks, depth, out, _names(suites), _names(strategies), max_steps,
                   progress=progress)
        text = render(rows)
        (out / "real-model.md").write_text(text + "\n")
        click.echo(text)


def _names(listed: str) -> list[str]:
    return [n.strip() for n in listed.split(",") if n.strip()]


@bench.command("trace")
@click.argument("trace_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--base-url", required=True, help="The OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")
@click.option("--sessions", default="8", show_default=True, help="Sessions replayed at once; a comma-separated list "
              "runs each in turn (8,16,32: where preemptions start).")
@click.option("--model", "model_name", default=None, help="The served model [default: the server's first].")
@click.option("--strategy", "strategies", default=None, help="Only these methods' traces, comma-separated.")
@click.option("--engine-api-key", default=None, envvar="FLOWSTATE_ENGINE_API_KEY", help="The server's API key.")
@OUT
def bench_trace_cmd(trace_file: str, base_url: str, sessions: str, model_name: str | None, strategies: str | None,
                    engine_api_key: str | None, out: Path | None) -> None:
    """Replay an evaluation's recorded model calls (flowstate eval --trace) on a server, each method side by side:
    wall time, output tok/s, TTFT/TPOT, prefix-cache hits and preemptions."""
    from openai import OpenAI, OpenAIError

    from flowstate.bench.trace import bench_trace, render_table
    from flowstate.eval.sweep import numbers

    with errors():
        traces = _strategies(read_trace(trace_file), strategies)
        counts = numbers(sessions, "--sessions")
        client = OpenAI(base_url=base_url, api_key=engine_api_key or "none", max_retries=0, timeout=3600)
        try:
            model_name = model_name or client.models.list().data[0].id
            rows = bench_trace(traces, client, model_name, base_url, counts,
                               progress=progress)
        except OpenAIError as exc:
            raise ValueError(f"the server at {base_url} failed the replay: {exc}") from exc
        emit(render_table(rows), out, {"trace": trace_file, "model": model_name, "rows": rows})


@bench.command("stepfit")
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="A model folder vLLM loads (flowstate model export writes the embedded one).")
@click.option("--requests", default=24, show_default=True, type=click.IntRange(min=4),
              help="Requests of mixed prompt (50-1,800 words) and output (16-160 tokens) lengths.")
@click.option("--max-num-seqs", default=8, show_default=True, type=click.IntRange(min=1), help="vLLM's --max-num-seqs.")
@click.option("--chunk", default=256, show_default=True, type=click.IntRange(min=16),
              help="vLLM's --max-num-batched-tokens: prompts prefill in chunks of this many tokens beside the decodes.")
@click.option("--trace", "trace_file", default=None, type=click.Path(dir_okay=False),
              help="Replay this evaluation's recorded calls (flowstate eval --trace) instead of the synthetic mix: "
                   "--requests of them that fit the model's window, each method's sessions in turn, prefix caching on.")
@click.option("--strategy", "strategies", default=None,
              help="With --trace: only these methods' calls, comma-separated.")
@OUT
def bench_stepfit_cmd(model_dir: str, requests: int, max_num_seqs: int, chunk: int, trace_file: str | None,
                      strategies: str | None, out: Path | None) -> None:
    """The step-time roofline fitted to a real engine's steps (vLLM in process): FLOP rate, bandwidth, overhead, and
    predicted / measured on held-out steps."""
    from flowstate.bench.capacity import tokenizer
    from flowstate.bench.stepfit import measure, recorded, render_table, synthetic

    with errors():
        if trace_file is None:
            mix = synthetic(requests)
        else:
            mix = recorded(_strategies(read_trace(trace_file), strategies), tokenizer(model_dir), requests)
        row = measure(model_dir, mix, max_num_seqs, chunk, progress=progress)
        emit(render_table([row]), out, {"trace": trace_file, "rows": [row]})


@bench.command("capacity")
@click.argument("trace_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--kv-tokens", type=click.IntRange(min=16), default=None,
              help="The KV cache, in tokens of context (e.g. vLLM's log line 'GPU KV cache size: N tokens').")
@click.option("--kv-gib", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The KV cache in GiB instead: tokens from --model's config.json (bytes per token of its "
                   "full-attention layers).")
@click.option("--sessions", default="1,2,4,8", show_default=True, help="Sessions at once, comma-separated.")
@click.option("--model", "model_dir", default=None, type=click.Path(file_okay=False),
              help="The served model's folder (config.json, tokenizer, chat template) [default: the embedded model].")
@click.option("--block-size", default=16, show_default=True, type=click.IntRange(min=1), help="vLLM's --block-size.")
@click.option("--max-num-batched-tokens", default=8192, show_default=True, type=click.IntRange(min=1),
              help="vLLM's --max-num-batched-tokens (the chunked-prefill budget of one step).")
@click.option("--strategy", "strategies", default=None, help="Only these methods' traces, comma-separated.")
@click.option("--gpu-cost", "gpu_cost", default=None, metavar="MODEL@GPU",
              help="Time each step by the roofline of this model on this GPU (e.g. qwen3.5-27b@h200): sessions per "
                   "GPU-hour, time per call, TTFT, goodput. Without a KV budget, the KV cache is the GPU's.")
@click.option("--gpu-gib", default=None, type=click.FloatRange(min=1), help="With --gpu-cost: the GPU's memory "
              "instead of its datasheet's (e.g. 80 for an 80 GB part).")
@click.option("--step-overhead-ms", default=4.0, show_default=True, type=click.FloatRange(min=0),
              help="With --gpu-cost: each step's fixed cost (scheduling, sampling, launches).")
@click.option("--slo", "slo_s", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="With --gpu-cost: the latency objective of the goodput, p99 seconds per call.")
@click.option("--fast-forward", "fast_forward", default="off", show_default=True,
              type=click.Choice(["off", "on", "both"]),
              help="Append the tokens each call's grammar forced (recorded with --count-tokens embedded) in one "
                   "step, as an engine that fast-forwards does (FlowState's llamacpp; not vLLM 0.32): rows "
                   "'METHOD +ff'. both: each method with and without.")
@click.option("--reuse-sessions", "reuse", is_flag=True,
              help="Let --sessions pass what the trace holds: its sessions reused in turn, each copy made distinct "
                   "after the system message (one token of its own), so copies share the system prompt and nothing "
                   "else, as different conversations do.")
@click.option("--speculate", default="off", show_default=True, metavar="off,ngram:K[:MIN-MAX],...",
              help="Replay vLLM's n-gram drafting on the trace's recorded outputs (exact greedy acceptance): each "
                   "decode step verifies its draft, as prefill-like work in the step. Comma-separated settings, a "
                   "row each ('METHOD ngram:4'); needs --fast-forward off.")
@OUT
def bench_capacity_cmd(trace_file: str, kv_tokens: int | None, kv_gib: float | None, sessions: str,
                       model_dir: str | None, block_size: int, max_num_batched_tokens: int, strategies: str | None,
                       gpu_cost: str | None, gpu_gib: float | None, step_overhead_ms: float, slo_s: float,
                       fast_forward: str, reuse: bool, speculate: str, out: Path | None) -> None:
    """How many sessions of each method fit in a KV budget at once: an evaluation's recorded calls (flowstate eval
    --trace) fed to vLLM's own scheduler in process (no model runs): preemptions, peak KV use, prefix hits; with
    --gpu-cost, each step timed by a roofline: sessions per GPU-hour, time per call and goodput."""
    from engine.lookup import Speculation
    from flowstate.bench.capacity import Budget, Simulation, bench_capacity, render_table, tokenizer
    from flowstate.eval import steptime
    from flowstate.eval.kv import GIB, from_config
    from flowstate.eval.sweep import numbers

    with errors():
        clock = steptime.load(gpu_cost, step_overhead_ms / 1000) if gpu_cost else None
        if gpu_cost and kv_tokens is None and kv_gib is None:
            kv_tokens = steptime.kv_tokens(gpu_cost, gpu_gib)
        if (kv_tokens is None) == (kv_gib is None):
            raise ValueError("give the KV budget once: --kv-tokens N or --kv-gib G (or --gpu-cost MODEL@GPU alone)")
        traces = _strategies(read_trace(trace_file), strategies)
        with tempfile.TemporaryDirectory() as tmp:
            if model_dir is None:
                from engine.transformers import export_model

                model_dir = str(export_model(Path(tmp) / "model"))
            if kv_gib is not None:
                config = json.loads((Path(model_dir) / "config.json").read_text())
                kv_tokens = int(kv_gib * GIB // from_config(config, model_dir).bytes_per_token)
            assert kv_tokens is not None
            simulation = Simulation(model_dir, Budget(kv_tokens, block_size, max_num_batched_tokens))
            modes = {"off": (False,), "on": (True,), "both": (False, True)}[fast_forward]
            drafts = [Speculation.parse(x.strip(), ("ngram",)) for x in speculate.split(",") if x.strip()] or [None]
            rows = bench_capacity(traces, tokenizer(model_dir), simulation, numbers(sessions, "--sessions"),
                                  progress=progress, clock=clock, fast_forward=modes, reuse=reuse, speculate=drafts)
        click.echo(f"KV budget: {kv_tokens} tokens ({kv_tokens // block_size} blocks of {block_size})")
        if clock is not None:
            click.echo(f"Step time: the roofline of {clock.label} at peak, {step_overhead_ms:g} ms a step")
        emit(render_table(rows, slo_s), out, {"trace": trace_file, "kv_tokens": kv_tokens, "rows": rows})


def _strategies(traces: dict[str, Any], wanted: str | None) -> dict[str, Any]:
    """The methods a replay keeps (``--strategy a,b``): all of them, or those named, each held by the trace."""
    if not wanted:
        return traces
    names = [x.strip() for x in wanted.split(",") if x.strip()]
    unknown = [w for w in names if w not in traces]
    if unknown:
        raise ValueError(f"the trace holds no calls of {', '.join(unknown)}; it holds {', '.join(traces)}")
    return {w: traces[w] for w in names}


@bench.command("serve")
@engine_options
@click.option("--sessions", default="8,32", show_default=True, help="Concurrent sessions, comma-separated.")
@click.option("--api", "apis", default="chat", show_default=True,
              help="The endpoint's API: chat (Chat Completions), responses, or both comma-separated (side by side).")
@loop_options(max_steps=2)
@OUT
def bench_serve_cmd(sessions: str, apis: str, out: Path | None, **options: Any) -> None:
    """Output tok/s of N concurrent sessions through flowstate serve vs the same calls sent to the engine directly."""
    from flowstate.bench.serve import APIS, bench_serve, render_table

    counts = [int(x) for x in sessions.split(",") if x.strip()]
    chosen = [a.strip() for a in apis.split(",") if a.strip()]
    if not chosen or set(chosen) - set(APIS):
        raise click.BadParameter(f"one or more of {', '.join(APIS)}", param_hint="--api")
    _on_engine(options, out, render_table,
               lambda model, loop, progress: bench_serve(model, counts, loop, progress, chosen))


@bench.command("contracts")
@engine_options
@click.option("--tries", default=10, show_default=True, type=click.IntRange(min=1), help="Requests of each kind.")
@loop_options(max_steps=3)
@OUT
def bench_contracts_cmd(tries: int, out: Path | None, **options: Any) -> None:
    """Whether replies keep what requests promise (JSON answer, named or required tool call) at a tight step budget."""
    from flowstate.bench.contracts import bench_contracts, render_table

    _on_engine(options, out, render_table, lambda model, loop, progress: bench_contracts(model, tries, loop, progress),
               with_max_tokens=True)


Rows = list[dict[str, Any]]


def _on_engine(options: dict[str, Any], out: Path | None, render: Callable[[Rows], str],
               measure: Callable[[Engine, LoopConfig, Callable[[str], None]], Rows],
               with_max_tokens: bool = False) -> None:
    """A benchmark on one engine under the loop options: load it, measure, close it, print the table (and JSON)."""
    loop: LoopOptions = options.pop("loop")
    with errors():
        model = engines.load(**options)
        config = loop.config(model, max_tokens=options.get("max_tokens") if with_max_tokens else None)
        try:
            rows = measure(model, config, progress)
        finally:
            model.close()
        emit(render(rows), out, {"engine": options["name"], "rows": rows})


@bench.command("repo")
@click.option("--sizes", default="10000,100000,1000000", show_default=True, help="Nodes, comma-separated.")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL server (URL of a database whose user may create databases): each size gets a "
                   "fresh database there [default: $FLOWSTATE_BENCH_PG; without one, SQLite only].")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(min=10),
              help="Disclosures timed per size.")
@OUT
def bench_repo_cmd(sizes: str, pg_url: str | None, samples: int, out: Path | None) -> None:
    """Persist rate, disclose latency (p50/p99) and index build time by size, SQLite and PostgreSQL side by side."""
    from flowstate.bench.repo import bench_repo, render_table

    _on_databases(sizes, pg_url, lambda targets, counts: bench_repo(targets, counts, samples, progress=progress),
                  render_table, out)


def _on_databases(sizes: str, pg_url: str | None, run: Callable[[Any, list[int]], list[dict[str, Any]]],
                  render: Callable[[list[dict[str, Any]]], str], out: Path | None) -> None:
    """A bench by size on fresh databases, SQLite and (with ``pg_url``) PostgreSQL side by side; its table."""
    from flowstate.bench.repo import Databases

    with errors(), tempfile.TemporaryDirectory() as tmp:
        counts = [int(x) for x in sizes.split(",") if x.strip()]
        databases = Databases(tmp, pg_url)
        try:
            rows = run(databases.targets(), counts)
        finally:
            databases.close()
        emit(render(rows), out, {"rows": rows})


@bench.command("admission")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL server (URL of a database whose user may create databases): a fresh database there "
                   "[default: $FLOWSTATE_BENCH_PG; without one, SQLite only].")
@click.option("--requests", default=2000, show_default=True, type=click.IntRange(min=10), help="Requests timed a step.")
@OUT
def bench_admission_cmd(pg_url: str | None, requests: int, out: Path | None) -> None:
    """What a request pays for tenants before its turn: its key resolved, its quota admitted and ended (p50/p99),
    beside keys off, SQLite and PostgreSQL side by side."""
    from flowstate.bench.admission import bench_admission, render_table

    _on_databases("1", pg_url, lambda targets, _: bench_admission(targets, requests, progress=progress),
                  render_table, out)


@bench.command("retention")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL server (URL of a database whose user may create databases): fresh databases there "
                   "[default: $FLOWSTATE_BENCH_PG; without one, SQLite only].")
@click.option("--expired", default=3000, show_default=True, type=click.IntRange(min=1),
              help="Expired sessions seeded for the sweep to remove.")
@click.option("--sessions", default=16, show_default=True, type=click.IntRange(min=1), help="Clients at once.")
@click.option("--turns", default=10, show_default=True, type=click.IntRange(min=1), help="Turns per client.")
@OUT
def bench_retention_cmd(pg_url: str | None, expired: int, sessions: int, turns: int, out: Path | None) -> None:
    """What retention's sweep costs the turns running meanwhile: turn p50/p99 with retention off and on (the sweep
    removing the seeded expired sessions during the traffic), SQLite and PostgreSQL side by side."""
    from flowstate.bench.retention import bench_retention, render_table

    _on_databases("1", pg_url, lambda targets, _: bench_retention(targets, sessions, turns, expired, progress),
                  render_table, out)


@bench.command("priority")
@engine_options
@click.option("--background", default=4, show_default=True, type=click.IntRange(min=1),
              help="Threads keeping background calls going.")
@click.option("--interactive", default=10, show_default=True, type=click.IntRange(min=1),
              help="Interactive calls timed per setting, one after another.")
@click.option("--background-tokens", "max_tokens", default=64, show_default=True, type=click.IntRange(min=1),
              help="Tokens a background call decodes at most.")
@click.option("--pause", "pause_s", default=0.5, show_default=True, type=click.FloatRange(min=0),
              help="Seconds between interactive calls.")
@OUT
def bench_priority_cmd(background: int, interactive: int, max_tokens: int, pause_s: float, out: Path | None,
                       **engine_opts: Any) -> None:
    """What priority by kind buys an interactive call while background calls keep the engine busy: its time to
    first token (the wait for the engine included) with priorities off and on, side by side on one engine."""
    from flowstate.bench.priority import bench_priority, render_table

    with errors():
        model = engines.load(**engine_opts)
        try:
            rows = bench_priority(model, background, interactive, max_tokens, pause_s, progress)
        finally:
            model.close()
        emit(render_table(rows, f"{model.name}:{model.model_name}"), out, {"rows": rows})


@bench.command("isolation")
@click.option("--tenants", default="1,10,100", show_default=True, help="Tenant counts, comma-separated.")
@click.option("--sessions", "per_tenant", default=2, show_default=True, type=click.IntRange(min=1),
              help="Sessions per tenant, all at once.")
@click.option("--turns", default=4, show_default=True, type=click.IntRange(min=1), help="Calls per session.")
@click.option("--growth", default=200, show_default=True, type=click.IntRange(min=1),
              help="Tokens each call's prompt adds to the previous one's.")
@click.option("--output", default=32, show_default=True, type=click.IntRange(min=1), help="Tokens each call decodes.")
@click.option("--model", "model_dir", default=None, type=click.Path(file_okay=False),
              help="The served model's folder (tokenizer, chat template) [default: the embedded model].")
@OUT
def bench_isolation_cmd(tenants: str, per_tenant: int, turns: int, growth: int, output: int, model_dir: str | None,
                        out: Path | None) -> None:
    """What prefix-cache isolation costs: N tenants' sessions on vLLM's own scheduler and prefix cache (no model
    runs), isolation off / tenant / session side by side — hit rate, tokens computed, extra per tenant."""
    from flowstate.bench.isolation import bench_isolation, render_table
    from flowstate.eval.sweep import numbers

    with errors(), tempfile.TemporaryDirectory() as tmp:
        if model_dir is None:
            from engine.transformers import export_model

            model_dir = str(export_model(Path(tmp) / "model"))
        system, rows = bench_isolation(model_dir, numbers(tenants, "--tenants"), per_tenant, turns, growth, output,
                                       progress)
        emit(render_table(system, rows), out, {"system_tokens": system, "rows": rows})


@bench.command("redaction")
@OUT
def bench_redaction_cmd(out: Path | None) -> None:
    """Redaction's detectors on a fixed corpus (precision and recall per kind, positives and look-alikes) and on
    τ³'s databases and task scenarios when installed (e-mails found, anything else found)."""
    from flowstate.bench.redaction import render_table, run, tau3

    with errors():
        result, fresh, held_out = run(), run(held_out=True), tau3()
        emit(render_table(result, held_out, fresh), out, {
            "corpus": {k: dict(v) if isinstance(v, dict) else v for k, v in result.items()},
            "held_out": {k: dict(v) if isinstance(v, dict) else v for k, v in fresh.items()}, "tau3": held_out})


@bench.command("search")
@click.option("--sizes", default="10000,100000", show_default=True, help="States, comma-separated.")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL server (URL of a database whose user may create databases): each size gets a "
                   "fresh database there [default: $FLOWSTATE_BENCH_PG; without one, SQLite only].")
@click.option("--queries", default=500, show_default=True, type=click.IntRange(min=10), help="Searches timed per size.")
@OUT
def bench_search_cmd(sizes: str, pg_url: str | None, queries: int, out: Path | None) -> None:
    """Memory search latency (p50/p99) by the number of states, SQLite and PostgreSQL side by side."""
    from flowstate.bench.search import bench_search, render_table

    _on_databases(sizes, pg_url, lambda targets, counts: bench_search(targets, counts, queries, progress=progress),
                  render_table, out)


@bench.command("index")
@click.option("--requests", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Requests in the session.")
@click.option("--index-budget", default=4096, show_default=True, type=click.IntRange(min=1),
              help="The bounded index's budget (flowstate-paged:N), in estimated tokens.")
@click.option("--prompt-budget", default=16384, show_default=True, type=click.IntRange(min=1),
              help="Count the calls whose prompt exceeds this many tokens.")
@click.option("--suite", default="hotel", show_default=True, type=click.Choice(["hotel", "reasoning"]),
              help="A suite without a depth cap.")
@click.option("--policy", default="oracle", show_default=True, type=click.Choice(["oracle", "realistic"]))
@click.option("--count-tokens", "tokens", default="words", show_default=True, metavar="words|embedded|FILE.gguf",
              help="Count tokens as words and punctuation, with the embedded model's vocabulary (SmolLM2's BPE), or "
                   "with a GGUF file's vocabulary.")
@OUT
def bench_index_cmd(requests: int, index_budget: int, prompt_budget: int, suite: str, policy: str, tokens: str,
                    out: Path | None) -> None:
    """The per-call prompt against k (up to --requests) with the flat index and the bounded one, side by side."""
    from flowstate.bench.index import render, run

    with errors():
        rows = run(requests, index_budget, prompt_budget, suite, policy, tokens)
        emit(render(rows, prompt_budget), out, {"rows": rows})


@bench.command("sessions")
@click.option("--sessions", default=200, show_default=True, type=click.IntRange(min=1),
              help="Sessions, each holding one large client tool result.")
@click.option("--result-mb", default=5.0, show_default=True, type=click.FloatRange(min=0.001), help="Its size.")
@click.option("--session-memory", "budgets", default="256,unbounded", show_default=True,
              help="Server settings side by side: --session-memory MiB values, or 'unbounded' (the count cap alone).")
@OUT
def bench_sessions_cmd(sessions: int, result_mb: float, budgets: str, out: Path | None) -> None:
    """A server's resident memory with N idle sessions holding large tool results, and after deleting them."""
    from flowstate.bench.sessions import bench_sessions, render_table

    with errors():
        try:
            settings = [None if b.strip() == "unbounded" else float(b) for b in budgets.split(",") if b.strip()]
        except ValueError:
            raise ValueError(f"--session-memory takes MiB values or 'unbounded', not {budgets!r}") from None
        rows = bench_sessions(sessions, result_mb, settings, progress=progress)
        emit(render_table(rows), out, {"rows": rows})


@bench.command("console")
@click.option("--requests", default=500, show_default=True, type=click.IntRange(min=1), help="The session's requests.")
@click.option("--states", default=10, show_default=True, type=click.IntRange(min=1), help="States a request.")
@click.option("--polls", default=40, show_default=True, type=click.IntRange(min=4), help="Polls timed (304s).")
@OUT
def bench_console_cmd(requests: int, states: int, polls: int, out: Path | None) -> None:
    """A large session through the console's route: a full read against a poll's 304, and the console's open time."""
    from flowstate.bench.console import bench_console, render_table

    with errors():
        row = bench_console(requests, states, polls, progress=progress)
        emit(render_table(row), out, {"rows": [row]})


@bench.command("responses")
@click.option("--chain", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Stored responses, each continuing the one before.")
@click.option("--reads", default=1000, show_default=True, type=click.IntRange(min=1),
              help="GET and input_items calls on random responses of the chain.")
@click.option("--forks", default=100, show_default=True, type=click.IntRange(min=0),
              help="Responses that each continue a random earlier response of the chain (a fork of its session).")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL database to run beside SQLite [default: $FLOWSTATE_BENCH_PG; without "
                   "one, SQLite only].")
@OUT
def bench_responses_cmd(chain: int, reads: int, forks: int, pg_url: str | None, out: Path | None) -> None:
    """A chain of stored responses through the openai client: create, GET, input_items and fork latency p50/p99."""
    from flowstate.bench.responses import bench_responses, render_table

    with errors():
        databases = side_by_side(pg_url)
        rows = bench_responses(chain, reads, databases, progress=progress, forks=forks)
        emit(render_table(rows), out, {"rows": rows})


@bench.command("mcp")
@click.option("--sessions", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Sessions, one after another, each calling one tool of its own MCP server.")
@click.option("--mcp-sessions", "bound", default=16, show_default=True, type=click.IntRange(min=1),
              help="The server's bound on live per-session MCP servers.")
@click.option("--again", default=100, show_default=True, type=click.IntRange(min=0),
              help="The first sessions (released to keep the bound) then call once more.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the row as JSON.")
def bench_mcp_cmd(sessions: int, bound: int, again: int, out: Path | None) -> None:
    """Per-session MCP servers under --mcp-sessions: live connections and processes, and released sessions' calls."""
    from flowstate.bench.mcp import bench_mcp, render_table

    with errors():
        row = bench_mcp(sessions, bound, again, progress=progress)
        emit(render_table([row]), out, {"rows": [row]})


@bench.command("load")
@click.option("--sessions", default=64, show_default=True, type=click.IntRange(min=1), help="Sessions at once.")
@click.option("--turns", default=10, show_default=True, type=click.IntRange(min=1), help="Turns of each.")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL database to run beside SQLite [default: $FLOWSTATE_BENCH_PG; without "
                   "one, SQLite only].")
@click.option("--source", "sources", multiple=True, type=click.Path(file_okay=False),
              help="Also run the servers from this source tree (a checkout of another commit), repeatable.")
@click.option("--tools", default="none", show_default=True,
              help="Tools each turn sends, comma-separated side by side: none; same (one schema, its grammar cached); "
                   "new (a schema no earlier turn sent, its grammar compiled on that turn).")
@OUT
def bench_load_cmd(sessions: int, turns: int, pg_url: str | None, sources: tuple[str, ...], tools: str,
                   out: Path | None) -> None:
    """N sessions × T turns at once through the openai client: turn latency p50/p99 on SQLite and PostgreSQL."""
    from flowstate.bench.load import bench_load, render_table

    with errors():
        databases = side_by_side(pg_url)
        rows = bench_load(sessions, turns, databases, [*sources, None], progress=progress,
                          tools=_names(tools))
        emit(render_table(rows), out, {"rows": rows})
