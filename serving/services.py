"""What one server is built from (``ServerConfig``, the CLI's options) and what its routes share (``Services``:
the session registry, the turns' driver adapter, metrics, the limiter), built once by ``build``."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.requests import Request

from engine.base import Engine, Message
from engine.priority import Priorities
from flowstate import tracing
from flowstate.config import AgentConfig, LoopConfig
from flowstate.errors import SessionHasForks
from flowstate.memory.base import Strategy
from flowstate.memory.state import FLOWSTATE
from flowstate.store.audit import Entry
from flowstate.store.repository import Repository
from flowstate.store.retention import RetentionPolicy
from flowstate.store.transfer import SessionFile
from flowstate.tools import ToolSet
from serving.chat.wire import IngressLimits
from serving.errors import conflict
from serving.metrics import TenantMetrics
from serving.quotas import Admissions
from serving.registry import Registry
from serving.retention import Sweeper
from serving.tenancy import Authenticator, Caller, cache_salts, forbidden, routing_ids
from serving.turns import Turns

STREAM_ANSWERS = ("auto", "always", "never")
log = logging.getLogger("flowstate.serving")


@dataclass
class ServerConfig:
    """Everything one server needs; the CLI builds it from ``flowstate serve`` options."""

    engine: Engine
    repo: Repository
    # static client keys: each adopted at start as a tenant of its own (flowstate/store/tenants.py)
    keys: Sequence[str] = ()
    admin_keys: Sequence[str] = ()  # keys that manage tenants and keys (/v1/admin/...), never a tenant's memory
    metrics_keys: Sequence[str] = ()  # keys that read the whole server's /metrics (a client key reads its own)
    tools: ToolSet = field(default_factory=ToolSet)
    loop: LoopConfig = field(default_factory=LoopConfig)
    strategy: Strategy = FLOWSTATE  # the memory method every session of this server runs
    policy: str = ""  # the deployment's task policy, before each client's system message
    model_id: str = "flowstate"
    turn_lease_s: float = 30.0  # a turn's quota slot: unrenewed this long (its server killed), it no longer counts
    background_lease_s: float = 15.0  # a background response's lease: unrenewed this long, its server stopped
    max_concurrency: int = 64  # turns running at once (worker threads); one session's turns are serialized
    max_live_sessions: int = 4096  # idle sessions kept in memory (others reload from the database)
    session_memory_mb: float = 1024.0  # ... and the memory they may hold together (their transcripts), in MiB
    stream_answers: str = "auto"  # token streaming of answers (STREAM_ANSWERS): auto (under a grammar), always, never
    ingress: IngressLimits = field(default_factory=IngressLimits)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)  # the server's (a tenant's own replaces it)
    retention_every_s: float = 60.0  # how often the server sweeps what outlived its policy
    clock: Callable[[], float] = time.time  # what retention takes as now (a test moves it)
    redact: tuple[str, ...] = ()  # the kinds redacted before anything is stored (flowstate/store/redaction.py); () none
    vault_key: str | None = None  # the key of the vault that keeps redacted values (needed with ``redact``)
    cache_isolation: str = "tenant"  # engine calls' prefix-cache partition: off, tenant or session (serving.tenancy)
    cache_secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))  # salts' and routing ids' key
    priorities: Priorities = field(default_factory=Priorities)  # each kind of engine call's priority (engine.priority)


@dataclass
class Services:
    """What the routes serve, for one app."""

    config: ServerConfig
    auth: Authenticator
    sessions: Registry
    turns: Turns
    admissions: Admissions
    metrics: TenantMetrics
    limiter: anyio.CapacityLimiter
    models: set[str]
    sweeper: Sweeper
    running: set[asyncio.Task[Any]] = field(default_factory=set)  # turns, and responses being stored

    def namespace(self, request: Request) -> str:
        """The caller's tenant's namespace ('' on an open server); 401 without a valid key, 403 for an admin key
        (it manages tenants and keys, and reads no tenant's memory)."""
        caller: Caller = request.state.caller
        if caller.error is not None:
            raise caller.error
        if caller.namespace is None:
            raise forbidden("an admin key manages tenants and keys; it reads no tenant's memory: use a tenant's key")
        return caller.namespace

    def admin(self, request: Request) -> None:
        """Nothing, for an admin key; 401 without a valid key, 403 for a tenant's key (or on a server without
        admin keys)."""
        caller: Caller = request.state.caller
        if caller.admin:
            return
        if caller.error is not None and not self.auth.open:
            raise caller.error
        raise forbidden("the admin routes need an admin key (--admin-key, $FLOWSTATE_ADMIN_KEYS)")

    async def record(self, entry: Entry) -> None:
        """An action in the audit trail, in a transaction of its own (a read, or a refusal)."""
        await anyio.to_thread.run_sync(self.config.repo.audit.record, entry)

    async def forget(self, session: str, audit: Entry | None = None) -> bool:
        """Delete a session (``DELETE /v1/sessions/{id}``, and a conversation's): from the database and from memory,
        once no turn holds it; False if there was none."""
        await self.sessions.enter(session)
        try:
            live = self.sessions.peek(session)
            try:
                deleted = await anyio.to_thread.run_sync(self.config.repo.delete_session, session, audit)
            except SessionHasForks as exc:  # names hold no '/': the key's namespace is what comes before the last
                ns = session[:session.rfind("/") + 1]
                forks = ", ".join(repr(f[len(ns):]) for f in exc.forks[:5])
                raise conflict(f"session {session[len(ns):]!r} has {len(exc.forks)} fork(s) that share its requests "
                               f"({forks}{', …' if len(exc.forks) > 5 else ''}): delete them first",
                               "session_has_forks") from None
            self.sessions.forget(session)
        finally:
            self.sessions.leave(session)
        return deleted or (live is not None and live.run is not None)


    async def take_in(self, file: SessionFile, namespace: str, audit: Entry | None = None) -> list[str]:
        """Import a checked session file into the namespace (``POST /v1/sessions/import``), holding each of its
        sessions as a turn would, so that no turn of this server starts in one meanwhile; the names made."""
        names = sorted(namespace + name for name in file.names)
        entered: list[str] = []
        try:
            for name in names:
                await self.sessions.enter(name)
                entered.append(name)
            running = [n for n in names if (live := self.sessions.peek(n)) is not None and live.run is not None]
            if running:
                raise conflict(f"a turn runs in session {running[0][len(namespace):]!r}: its name is taken",
                               "session_exists")
            await anyio.to_thread.run_sync(self.config.repo.transfer.write, file, namespace, audit)
            for name in names:
                self.sessions.forget(name)  # what memory held of these names (none was in the database) goes
        finally:
            for name in reversed(entered):
                self.sessions.leave(name)
        return file.names


def agent_config(config: ServerConfig) -> AgentConfig:
    """The server's agent: its engine calls salted by tenant or session, routed by a keyed id, ordered by kind — and
    the engine told the system prompt every tenant shares, where it can keep that prefix across salts."""
    engine, isolated = config.engine, config.cache_isolation != "off"
    agent = AgentConfig(engine, strategy=config.strategy, tools=config.tools, policy=config.policy, loop=config.loop,
                        cache_salt=cache_salts(config.cache_isolation, config.cache_secret),
                        routing=routing_ids(config.cache_secret), priorities=config.priorities)
    if not engine.capabilities.known:
        log.info("the %s engine's server did not answer at start: whether it takes a cache salt and a priority is "
                 "read at the first call it answers", engine.name)
    elif isolated and not engine.capabilities.salts:
        log.warning("cache isolation %s: the %s engine takes no cache salt, so every tenant shares its prefix cache "
                    "(another tenant's prompts can be timed)", config.cache_isolation, engine.name)
    if isolated and engine.capabilities.shares:
        engine.share_prefix([Message("system", agent.system_prompt())])
    if not isolated and (config.keys or config.admin_keys):  # tenants share the cache: none is told another's hits
        agent.told_cached = engine.count_tokens(agent.system_prompt())
    if config.priorities.on and engine.capabilities.known and not engine.capabilities.priority:
        log.info("the %s engine takes no priority: its calls run in arrival order", engine.name)
    return agent


def build(config: ServerConfig) -> Services:
    """The services of one server."""
    if config.redact:
        if not config.vault_key:
            raise ValueError("redaction needs a vault key (--vault-key, $FLOWSTATE_VAULT_KEY): the values it replaces "
                             "are kept encrypted under it")
        redaction = config.repo.redact(config.vault_key, config.redact)
        config.tools.restore = redaction.restore
        tracing.scrub = lambda text: redaction.redactor.text("", text)  # a span's texts (a tool's error) redacted
    sessions = Registry(config.repo, config.max_live_sessions, config.tools.release,
                        int(config.session_memory_mb * (1 << 20)))
    config.tools.hold_while(sessions.running)  # a bounded MCP source never ends a connection a turn is using
    config.repo.quotas.lease_s = config.turn_lease_s
    metrics = TenantMetrics(config.engine, config.tools.sources)
    return Services(
        config=config, auth=Authenticator(config.repo.tenants, config.keys, config.admin_keys, config.repo.audit),
        sessions=sessions,
        turns=Turns(config.engine, config.repo, agent_config(config), config.stream_answers),
        admissions=Admissions(config.repo.quotas, metrics.throttle),
        metrics=metrics,
        limiter=anyio.CapacityLimiter(config.max_concurrency),
        models={config.model_id, config.engine.model_name or config.model_id},
        sweeper=Sweeper(sessions, config.retention, config.retention_every_s, metrics.total, config.clock),
    )


def services_of(request: Request) -> Services:
    """What the request's server is built from (``create_app`` keeps it on ``app.state``)."""
    services: Services = request.app.state.services
    return services
