"""Several OpenAI-compatible servers behind one engine: session-affine routing with failover.

A call names its session (``affinity``); all calls of a session go to one server while that server is
healthy, so the session's prompt prefix stays in that server's KV cache. New sessions are placed by
rendezvous hashing over the healthy servers (they spread evenly, and a server coming back takes its
share again). A server that fails a call after its own retries is marked down for ``cooldown_s`` and
the call is made again on another server — the step restarts there; nothing of the request is lost
or run twice. Per-server calls, cached-token share and errors are kept for ``/metrics``.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from engine.base import ALL_SAMPLING, Capabilities, Engine, Generation, Message, OnText, RemoteEngine, Sampling
from engine.errors import EngineError, EngineUnavailable
from engine.purpose import STEP, Purpose


@dataclass
class ServerStats:
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0
    down_until: float = 0.0


class RouterEngine(Engine):
    """OpenAI-compatible servers as one engine (``--engine openai --base-url URL1,URL2,…``)."""

    name = "openai"
    capabilities = Capabilities(grammar=True, streams=True, sampling=ALL_SAMPLING, routes=True, stats=True)

    def __init__(self, servers: Sequence[RemoteEngine], cooldown_s: float = 30.0) -> None:
        if not servers:
            raise ValueError("a router needs at least one server")
        self.servers = list(servers)
        self.capabilities = self._joint()
        self.model_name = self.servers[0].model_name
        self.cooldown_s = cooldown_s
        self.stats = {s.base_url: ServerStats() for s in self.servers}
        self._placed: dict[str, int] = {}  # session -> server index
        self._lock = threading.Lock()

    def _healthy(self, now: float) -> list[int]:
        return [i for i, s in enumerate(self.servers) if self.stats[s.base_url].down_until <= now]

    def _pick(self, affinity: str, exclude: set[int]) -> int:
        now = time.monotonic()
        with self._lock:
            healthy = [i for i in self._healthy(now) if i not in exclude]
            if not healthy:
                healthy = [i for i in range(len(self.servers)) if i not in exclude]  # all down: try them anyway
            if not healthy:
                raise EngineUnavailable(f"all {len(self.servers)} servers failed this call")
            placed = self._placed.get(affinity)
            if placed in healthy:
                return placed
            best = max(healthy,
                       key=lambda i: hashlib.sha256(f"{affinity}\0{self.servers[i].base_url}".encode()).digest())
            self._placed[affinity] = best
            return best

    def _joint(self) -> Capabilities:
        """A salt isolates only where every server takes it; a priority orders calls only where every server does;
        known once every server's kind is."""
        caps = [s.capabilities for s in self.servers]
        return replace(type(self).capabilities, salts=all(c.salts for c in caps),
                       priority=all(c.priority for c in caps), known=all(c.known for c in caps))

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        key = affinity if affinity is not None else messages[0].content[:200] if messages else ""
        tried: set[int] = set()
        while True:
            i = self._pick(key, tried)
            server = self.servers[i]
            stats = self.stats[server.base_url]
            try:
                gen: Generation = server.generate(messages, grammar=grammar, max_tokens=max_tokens, on_text=on_text,
                                                  sampling=sampling, affinity=affinity, purpose=purpose,
                                                  cache_salt=cache_salt, priority=priority)
            except EngineError as exc:
                with self._lock:
                    stats.errors += 1
                    if exc.retryable:
                        stats.down_until = time.monotonic() + self.cooldown_s
                        self._placed.pop(key, None)
                if not exc.retryable or len(tried) + 1 >= len(self.servers):
                    raise
                tried.add(i)
                continue
            if not self.capabilities.known:  # a server down at start has answered now: read what it honours
                self.capabilities = self._joint()
            with self._lock:
                stats.calls += 1
                stats.prompt_tokens += gen.usage.prompt_tokens
                stats.cached_tokens += gen.usage.cached_tokens
            return gen

    def count_tokens(self, text: str) -> int:
        return int(self.servers[0].count_tokens(text))

    def server_stats(self) -> dict[str, dict[str, float]]:
        """Per server: calls, cached share of prompt tokens, errors, whether it is marked down now."""
        now = time.monotonic()
        with self._lock:
            return {url: {"calls": s.calls, "errors": s.errors, "down": float(s.down_until > now),
                          "cached_share": s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0}
                    for url, s in self.stats.items()}
