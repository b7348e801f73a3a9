"""``flowstate serve``: the OpenAI-compatible endpoint."""

from __future__ import annotations

import os
from typing import Any

import click

import engine as engines
from engine.priority import Priorities
from flowstate import memory
from flowstate.cli import options
from flowstate.cli.forgetting import POLICY
from flowstate.cli.settings import announce, config_options, in_force
from flowstate.store import chain
from flowstate.store.redaction import KINDS, parse_kinds
from flowstate.store.repository import Repository
from flowstate.store.retention import RetentionPolicy
from serving.chat.wire import IngressLimits
from serving.server import HEADER_TIMEOUT_S
from serving.services import STREAM_ANSWERS, ServerConfig


class PrioritiesParam(click.ParamType[Priorities, Any]):
    """Engine calls' priorities by kind: ``interactive=0,memory=1,background=2,evaluation=3`` (any subset), or
    ``off``."""

    name = "priorities"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Priorities:
        if isinstance(value, Priorities):
            return value
        try:
            return Priorities.parse(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


PRIORITIES = PrioritiesParam()

_SERVER = ServerConfig.__dataclass_fields__  # each default stated once, where the server's objects keep it
_INGRESS = IngressLimits()


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; without API keys keep it loopback.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--db", default=None, help="The memory: a SQLite file or a postgresql:// URL [default: as for run].")
@options.engine_options
@click.option("--api-key", "api_keys", multiple=True,
              help="A client key (repeatable) [default: $FLOWSTATE_API_KEYS, comma-separated; none].")
@click.option("--admin-key", "admin_keys", multiple=True,
              help="A key that manages tenants and their keys at /v1/admin/... (repeatable) [default: "
                   "$FLOWSTATE_ADMIN_KEYS, comma-separated; none]; it reads a tenant's memory only with "
                   "X-FlowState-Tenant on a GET, each such read in the audit trail, and changes none.")
@click.option("--metrics-key", "metrics_keys", multiple=True,
              help="A key that reads the whole server's /metrics (repeatable) [default: $FLOWSTATE_METRICS_KEYS, "
                   "comma-separated]; with API keys, a client key reads only its own turns' figures.")
@click.option("--tools", "tools_ref", default=None,
              help="Server-side tools as module:attribute, besides each request's client tools.")
@options.mcp_options
@click.option("--model-id", default=_SERVER["model_id"].default, show_default=True,
              help="The model name clients send and /v1/models lists.")
@click.option("--max-live-sessions", default=_SERVER["max_live_sessions"].default, show_default=True,
              type=click.IntRange(min=1),
              help="Idle sessions kept in memory; others reload from the database on their next call.")
@click.option("--session-memory", "session_memory_mb", default=_SERVER["session_memory_mb"].default, show_default=True,
              type=click.FloatRange(min=1),
              help="MiB the idle sessions in memory may hold together (their transcripts, "
                                                 "tool results included); beyond, the least recently used reload from "
                                                 "the database on their next call.")
@click.option("--max-body-mb", default=_INGRESS.max_body_bytes / (1 << 20), show_default=True,
              type=click.FloatRange(min=0.001),
              help="Largest request body accepted (413 beyond).")
@click.option("--body-timeout", default=_INGRESS.body_timeout_s, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a client has to send its whole body (408 beyond).")
@click.option("--header-timeout", default=HEADER_TIMEOUT_S, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a client has to send a request's headers (the connection is closed with 408 beyond).")
@click.option("--stream-answers", default=_SERVER["stream_answers"].default, show_default=True,
              type=click.Choice(STREAM_ANSWERS),
              help="Stream the answer token by token: auto = when decoding under a grammar (the streamed answer is "
                   "then the final one); always = also without one; never = send it whole.")
@options.loop_options()
@click.option("--strategy", "strategy_name", default="flowstate", show_default=True,
              help=f"The memory method every session runs: {', '.join(memory.METHODS)} (flowstate-paged:N: an index "
                   f"budget of N tokens; flowstate-lean:N: states past N earlier requests; a state "
                   f"method{memory.APPEND}: the append-only layout, as --layout append).")
@options.layout_option
@options.embed_option
@click.option("--background-lease", "background_lease_s", default=_SERVER["background_lease_s"].default,
              show_default=True, type=click.FloatRange(min=1),
              help="Seconds a background response's lease lasts unrenewed: after that its server is taken to have "
                   "stopped and the response is failed (the server renews it every few seconds while it runs).")
@click.option("--turn-lease", "turn_lease_s", default=_SERVER["turn_lease_s"].default, show_default=True,
              type=click.FloatRange(min=1),
              help="Seconds a running turn's quota slot lasts unrenewed: after that a killed server's turns no longer "
                   "count against their tenant's concurrent turns (the server renews them every third of it).")
@click.option("--retention", type=POLICY, default=None,
              help="How long memory is kept: idle=30d,age=180d (either bound alone), or off [default: "
                   "$FLOWSTATE_RETENTION, else off]. Sessions idle or old past it, stored responses and unused "
                   "conversations older than it are removed by a sweep; a tenant's own policy replaces it.")
@click.option("--retention-every", "retention_every_s", default=_SERVER["retention_every_s"].default,
              show_default=True, type=click.FloatRange(min=1), help="Seconds between retention sweeps.")
@click.option("--redact", type=click.Choice(["off", "mask"]), default="off", show_default=True,
              help="mask: personal data and secrets (--redact-kinds) are replaced by stable placeholders "
                   "before anything is stored, indexed, exported or traced; the values are kept encrypted "
                   "(--vault-key) and restored into a tool call's arguments just before the tool runs.")
@click.option("--redact-kinds", default=",".join(KINDS), show_default=True,
              help=f"What --redact mask replaces, comma-separated: {', '.join(KINDS)}.")
@click.option("--vault-key", default=None, help="The Fernet key that encrypts redacted values [default: "
              "$FLOWSTATE_VAULT_KEY]; keep it outside the database: without it no redacted value can be recovered.")
@click.option("--cache-isolation", type=click.Choice(["off", "tenant", "session"]),
              default=_SERVER["cache_isolation"].default, show_default=True,
              help="Engine calls' prefix-cache partition: tenant (no call of one tenant reuses another's cached "
                   "prefix, nor learns of it from cached_tokens), session, or off (everyone shares it). Salts are "
                   "derived on the server, never taken from a client.")
@click.option("--priorities", type=PRIORITIES, default=str(Priorities()), show_default=True,
              help="Each kind of engine call's priority, lower first (vLLM's --scheduling-policy priority; the "
                   "in-process engines' queue): interactive turns, memory methods' own calls, background responses, "
                   "evaluations; or off (none sent).")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@options.otlp_option
@config_options
def serve(
    host: str, port: int, db: str | None, api_keys: tuple[str, ...], admin_keys: tuple[str, ...],
    metrics_keys: tuple[str, ...],
    tools_ref: str | None, model_id: str,
    loop: options.LoopOptions, log_level: str, max_live_sessions: int, session_memory_mb: float, max_body_mb: float,
    body_timeout: float, header_timeout: float, stream_answers: str, strategy_name: str, layout: str,
    mcp: options.McpOptions,
    embed_spec: str | None, background_lease_s: float, turn_lease_s: float, otlp_endpoint: str | None,
    retention: RetentionPolicy | None, retention_every_s: float, redact: str, redact_kinds: str, vault_key: str | None,
    cache_isolation: str, priorities: Priorities, config_file: str | None, print_config: bool, **engine_opts: Any,
) -> None:
    """Serve an OpenAI-compatible endpoint whose model remembers — Chat Completions, the Responses API and
    conversations, the console at /ui/ and memory search (FastAPI on uvicorn)."""
    from serving.server import serve as run_server

    ctx = click.get_current_context()
    if print_config:
        click.echo(in_force(ctx))
        return
    announce(ctx)
    with options.errors():
        keys = list(api_keys) or _listed("FLOWSTATE_API_KEYS")
        operators = list(metrics_keys) or _listed("FLOWSTATE_METRICS_KEYS")
        admins = list(admin_keys) or _listed("FLOWSTATE_ADMIN_KEYS")
        embedder = options.load_embedder(embed_spec)  # what mem0-style and reasoningbank rank by (None: BM25)
        strategy = memory.embedded(memory.get(*memory.laid_out((strategy_name,), layout)), embedder)
        tools = mcp.tools(tools_ref)
        try:
            model = engines.load(**engine_opts)
            repo = Repository.open(db or options.default_db())
            config = loop.config(model)
            ingress = IngressLimits(max_body_bytes=int(max_body_mb * (1 << 20)), body_timeout_s=body_timeout)
            server = ServerConfig(engine=model, repo=repo, keys=keys, admin_keys=admins, metrics_keys=operators,
                                  tools=tools, loop=config,
                                  strategy=strategy, model_id=model_id, max_live_sessions=max_live_sessions,
                                  session_memory_mb=session_memory_mb, ingress=ingress,
                                  stream_answers=stream_answers, background_lease_s=background_lease_s,
                                  turn_lease_s=turn_lease_s, retention_every_s=retention_every_s,
                                  retention=retention or POLICY.convert(os.environ.get("FLOWSTATE_RETENTION") or "off",
                                                                        None, None),
                                  redact=_kinds(redact_kinds) if redact == "mask" else (),
                                  vault_key=vault_key or os.environ.get("FLOWSTATE_VAULT_KEY") or None,
                                  cache_isolation=cache_isolation, priorities=priorities)
            server.cache_secret = _cache_secret() or server.cache_secret
            _audit_key()
            try:
                with options.traced(otlp_endpoint):
                    run_server(server, host=host, port=port, log_level=log_level, header_timeout_s=header_timeout)
            finally:
                repo.close()
        finally:
            tools.close()
            if embedder is not None:
                embedder.close()


def _audit_key() -> None:
    """Refuse at start an ``$FLOWSTATE_AUDIT_KEY`` that every audited action would then fail on."""
    try:
        chain.key()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _cache_secret() -> bytes | None:
    """``$FLOWSTATE_CACHE_SECRET``, which servers of one deployment share so that they salt a tenant's calls and
    route a session's alike (unset: a random secret per process)."""
    given = os.environ.get("FLOWSTATE_CACHE_SECRET", "")
    if not given:
        return None
    if len(given) < 16:
        raise click.BadParameter("$FLOWSTATE_CACHE_SECRET is at least 16 characters (e.g. openssl rand -hex 32)")
    return given.encode()


def _kinds(text: str) -> tuple[str, ...]:
    try:
        return parse_kinds(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--redact-kinds") from None


def _listed(variable: str) -> list[str]:
    return [k.strip() for k in os.environ.get(variable, "").split(",") if k.strip()]
