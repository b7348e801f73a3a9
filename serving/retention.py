"""Retention's sweep in a server: every ``every_s``, what has outlived its policy goes (flowstate/store/retention.py),
a small batch per transaction, in worker threads (never on the event loop). On PostgreSQL one server sweeps at a
time (an advisory lock; the others skip that round); a session a turn of this server holds, waits for or waits on
tool results in is skipped, and the transaction skips one a turn of another server holds. What was removed is
counted in ``/metrics`` (``flowstate_retention_removed_total{kind}``), logged, and each session in the audit trail."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable

import anyio

from flowstate.store.retention import Expired, RetentionPolicy
from serving.metrics import Metrics
from serving.registry import Registry

log = logging.getLogger("flowstate.serving")
BATCH = 20  # rows a transaction removes at most: a sweep never holds the writer for long


class Sweeper:
    def __init__(self, sessions: Registry, policy: RetentionPolicy, every_s: float, metrics: Metrics,
                 clock: Callable[[], float] = time.time) -> None:
        self.sessions, self.policy, self.every_s, self.metrics, self.clock = sessions, policy, every_s, metrics, clock
        self.store = sessions.repo.retention
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sweep every ``every_s`` from now on (policies may be per tenant only, so it runs even without the
        server's own)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception:  # a database that is down now is retried at the next round
                log.exception("retention sweep")
            await asyncio.sleep(self.every_s)

    async def sweep(self) -> list[Expired] | None:
        """One sweep: what it removed, or None when another server sweeps the database now."""
        lock = self.store.try_sweeping()
        if not await anyio.to_thread.run_sync(lock.__enter__):
            await anyio.to_thread.run_sync(lock.__exit__, None, None, None)
            return None
        try:
            removed = await self._batches(self.clock())
        finally:
            await anyio.to_thread.run_sync(lock.__exit__, None, None, None)
        self.metrics.unreadable.set(len(self.store.unreadable))
        counts = Counter(e.kind for e in removed)
        if removed:
            log.info("retention removed %s", ", ".join(f"{n} {kind}(s)" for kind, n in sorted(counts.items())))
        return removed

    async def _batches(self, now: float) -> list[Expired]:
        removed: list[Expired] = []
        skipped: set[str] = set()
        while True:
            due = await anyio.to_thread.run_sync(self.store.due, self.policy, now, BATCH + len(skipped))
            due = [e for e in due if e.name not in skipped][:BATCH]
            if not due:
                return removed
            claimed = [e.name for e in due if e.kind == "session" and await self.sessions.claim(e.name)]
            items = [e for e in due if e.kind != "session" or e.name in claimed]
            try:
                done = await anyio.to_thread.run_sync(self.store.expire, items, self.policy, now, "server")
                for e in done:
                    if e.kind == "session":
                        self.sessions.forget(e.name)
            finally:
                for name in claimed:
                    self.sessions.leave(name)
            removed += done
            for kind, n in Counter(e.kind for e in done).items():  # counted as each batch goes: a long sweep shows
                self.metrics.expired.labels(kind).inc(n)          # its progress
            skipped.update(e.name for e in due if e not in done)  # held, waiting or revived: not this sweep
