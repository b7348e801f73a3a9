"""Prometheus metrics of one server: turns, model calls, tokens, steps, rejected operations, latency — over the
whole server (the operator's view), and per API key (what each key's holder may see of its own turns)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from engine.base import Engine
from flowstate.records import StepRecord
from flowstate.tools import ToolSource
from serving.turns import TurnResult

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    """One registry per app, so several servers in one process never share counts."""

    def __init__(self, engine: Engine | None = None, sources: Sequence[ToolSource] = ()) -> None:
        self.registry = r = CollectorRegistry()
        if engine is not None and engine.capabilities.stats:
            r.register(_ServerCollector(engine))
        if sources:
            r.register(_SourcesCollector(sources))
        self.turns = Counter("flowstate_turns", "Chat completion calls by outcome", ["outcome"], registry=r)
        self.requests = Counter("flowstate_requests_finished", "Agent requests answered and persisted", registry=r)
        self.model_calls = Counter("flowstate_model_calls", "Model calls (agent steps)", registry=r)
        self.prompt_tokens = Counter("flowstate_prompt_tokens", "Prompt tokens over all model calls", registry=r)
        self.cached_tokens = Counter("flowstate_cached_tokens", "Prompt tokens served from the prefix cache",
                                     registry=r)
        self.completion_tokens = Counter("flowstate_completion_tokens", "Completion tokens", registry=r)
        self.rejected = Counter("flowstate_rejected_operations", "State operations and accesses rejected", registry=r)
        self.protocol_errors = Counter("flowstate_protocol_errors", "Model outputs that broke the protocol", registry=r)
        self.truncations = Counter("flowstate_truncations", "Model outputs cut at the completion budget", registry=r)
        self.unfinished = Counter("flowstate_requests_unfinished", "Agent requests that ended at the step budget",
                                  registry=r)
        self.throttled = Counter("flowstate_throttled_requests", "Requests refused by a tenant's quota (429), by the "
                                 "limit that refused them", ["limit"], registry=r)
        self.expired = Counter("flowstate_retention_removed", "Sessions, stored responses and conversations removed "
                               "by retention's sweep, by kind", ["kind"], registry=r)
        self.unreadable = Gauge("flowstate_retention_unreadable_policies", "Tenants whose stored retention policy "
                                "the sweep cannot read: their memory is kept, the others' swept", registry=r)
        self.turn_latency = Histogram("flowstate_turn_latency_seconds", "Wall time of one chat completion call",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.call_latency = Histogram("flowstate_model_call_latency_seconds", "Wall time of one model call",
                                      buckets=LATENCY_BUCKETS, registry=r)

    def observe(self, result: TurnResult, seconds: float) -> None:
        self.turns.labels(result.finish_reason).inc()
        self.turn_latency.observe(seconds)
        if result.finished:
            self.requests.inc()
        if result.unfinished is not None:
            self.unfinished.inc()
        self._steps(result.steps)

    def failed(self, outcome: str, steps: Sequence[StepRecord] = ()) -> None:
        """A turn that failed: its outcome, and the model calls it made before it did."""
        self.turns.labels(outcome).inc()
        self._steps(steps)

    def _steps(self, steps: Sequence[StepRecord]) -> None:
        self.model_calls.inc(len(steps))
        for step in steps:
            self.prompt_tokens.inc(step.usage.prompt_tokens)
            self.cached_tokens.inc(step.usage.cached_tokens)
            self.completion_tokens.inc(step.usage.completion_tokens)
            self.rejected.inc(len(step.rejected) + len(step.refused) + len(step.malformed))
            self.protocol_errors.inc(step.protocol_error is not None)
            self.truncations.inc(step.truncated)
            self.call_latency.observe(step.usage.ttft_s + step.usage.decode_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class TenantMetrics:
    """The server's counts, and each key namespace's own: a key's holder sees only its turns; the operator (a
    metrics key, or everyone on a server without keys) the whole server's, per-server engine figures included."""

    def __init__(self, engine: Engine | None = None, sources: Sequence[ToolSource] = ()) -> None:
        self.total = Metrics(engine, sources)
        self._tenants: dict[str, Metrics] = {}
        self._lock = threading.Lock()

    def of(self, namespace: str) -> Metrics:
        with self._lock:
            if namespace not in self._tenants:
                self._tenants[namespace] = Metrics()
            return self._tenants[namespace]

    def observe(self, namespace: str, result: TurnResult, seconds: float) -> None:
        self.total.observe(result, seconds)
        if namespace:
            self.of(namespace).observe(result, seconds)

    def failed(self, namespace: str, outcome: str, steps: Sequence[StepRecord] = ()) -> None:
        self.total.failed(outcome, steps)
        if namespace:
            self.of(namespace).failed(outcome, steps)

    def throttle(self, namespace: str, limit: str) -> None:
        """A request refused by its tenant's quota (``limit``: requests, turns or tokens)."""
        self.total.throttled.labels(limit).inc()
        if namespace:
            self.of(namespace).throttled.labels(limit).inc()

    def render(self, namespace: str | None = None) -> bytes:
        """The whole server's figures (``None``), or one key namespace's."""
        return self.total.render() if namespace is None else self.of(namespace).render()


class _ServerCollector(Collector):
    """Per-server figures of a routing engine, read when /metrics is scraped."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Any:
        stats = self.engine.server_stats()
        families = {
            "calls": GaugeMetricFamily("flowstate_server_calls", "Model calls served, per server", labels=["server"]),
            "cached_share": GaugeMetricFamily("flowstate_server_cached_share",
                                              "Share of prompt tokens the server reported cached", labels=["server"]),
            "errors": GaugeMetricFamily("flowstate_server_errors", "Calls the server failed", labels=["server"]),
            "down": GaugeMetricFamily("flowstate_server_down", "1 while the server is marked down", labels=["server"]),
        }
        for url, figures in stats.items():
            for key, family in families.items():
                family.add_metric([url], figures[key])
        yield from families.values()


class _SourcesCollector(Collector):
    """Live connections of each tool source (an MCP server), and those ended to keep within its bound."""

    def __init__(self, sources: Sequence[ToolSource]) -> None:
        self.sources = sources

    def collect(self) -> Any:
        live = GaugeMetricFamily("flowstate_mcp_connections", "Live MCP connections, per server", labels=["server"])
        released = GaugeMetricFamily("flowstate_mcp_released", "Per-session MCP connections ended to keep within "
                                     "--mcp-sessions, per server", labels=["server"])
        for source in self.sources:
            live.add_metric([source.name], source.live)
            released.add_metric([source.name], source.released)
        yield live
        yield released
