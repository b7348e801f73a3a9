"""Background responses (``background: true``): a turn that goes on without its client.

The response is stored ``in_progress`` before its turn is started and stored again as it ends (completed,
incomplete, failed, or cancelled), so ``GET /v1/responses/{id}`` polls it from any server on the database. While
the turn runs, this server renews the response's lease every ``RENEW_S``; a lease left unrenewed for ``LEASE_S``
means its server stopped (killed, crashed), and any server — this one after a restart — marks the response failed:
it is never left in progress, and no server runs its turn again. A cancel (``POST …/cancel``) stops the turn at its
next step boundary, keeping what it did as an ended request. A streamed background response keeps its events here,
so a client that lost its connection resumes with ``GET …?stream=true&starting_after=N``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from flowstate.store.repository import Repository

LEASE_S = 15.0  # a background response whose lease is this old is failed: its server stopped (--background-lease)
RENEW_S = 3.0  # how often a server renews the leases of the responses it runs (and expires stale ones)
KEEP_STREAMS = 64  # ended streamed background responses whose events stay here for a resumed stream
KEEPALIVE_S = 10.0
STOPPED = {"code": "server_error", "message": "the server running this background response stopped before it ended; "
                                             "what its turn finished is kept in its session"}

log = logging.getLogger("flowstate.serving")


@dataclass
class Job:
    """A background response this server runs: its session, its turn, and its events when it streams."""

    session: str  # the full session name
    task: asyncio.Task[dict[str, Any]] | None = None
    cancelling: bool = False
    events: list[str] = field(default_factory=list)  # each SSE event as sent; its index is its sequence number
    ended: bool = False
    more: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, text: str) -> None:
        self.events.append(text)
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        waiting, self.more = self.more, asyncio.Event()
        waiting.set()


class Background:
    """The background responses of one server and the leases that say they still run."""

    def __init__(self, repo: Repository, lease_s: float = LEASE_S) -> None:
        self.repo, self.lease_s = repo, lease_s
        self.renew_s = min(RENEW_S, lease_s / 3)
        self.jobs: dict[str, Job] = {}
        self.streams: OrderedDict[str, Job] = OrderedDict()  # streamed ones, ended ones last in, first out
        self._keeper: asyncio.Task[None] | None = None

    def start(self, response_id: str, job: Job) -> None:
        self.jobs[response_id] = job
        if job.task is not None:
            job.task.add_done_callback(lambda t: (self.jobs.pop(response_id, None),
                                                  t.cancelled() or t.exception()))  # its failure is stored, not lost
        self.keep()

    def keep(self) -> None:
        """Renew and expire leases from now on (at the server's start, and with its first background response)."""
        if self._keeper is None or self._keeper.done():
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()

    async def _keep(self) -> None:
        while True:
            try:
                now = int(time.time())
                await anyio.to_thread.run_sync(self.repo.responses.renew, list(self.jobs), now)
                expired = await anyio.to_thread.run_sync(self.repo.responses.expire, now - int(self.lease_s), STOPPED)
                for rid in expired:
                    log.warning("background response %s failed: its server stopped before it ended", rid)
            except Exception:  # a database that is down now is retried at the next round
                log.exception("renewing background leases")
            await asyncio.sleep(self.renew_s)

    async def cancel(self, response_id: str, run_of: Callable[[str], Any]) -> bool:
        """Stop the response's turn at its next step boundary and wait for it to end; False if this server does
        not run it. ``run_of``: the request a session's turn runs now (None before it starts)."""
        job = self.jobs.get(response_id)
        if job is None or job.task is None:
            return False
        job.cancelling = True
        while not job.task.done():
            run = run_of(job.session)
            if run is not None:
                run.cancelled.set()
            await asyncio.wait([job.task], timeout=0.05)
        return True

    def pump(self, response_id: str, job: Job, events: AsyncIterator[str]) -> None:
        """Keep a streamed response's events as they come, whoever reads them (the client may be gone)."""
        self.streams[response_id] = job

        async def run() -> None:
            try:
                async for text in events:
                    if text.startswith("event:"):
                        job.add(text)
            finally:
                job.end()
                while len(self.streams) > KEEP_STREAMS:
                    oldest = next((k for k, j in self.streams.items() if j.ended), None)
                    if oldest is None:
                        break
                    del self.streams[oldest]

        task = asyncio.get_running_loop().create_task(run())
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    def events(self, response_id: str) -> Job | None:
        return self.streams.get(response_id)


_tasks: set[asyncio.Task[None]] = set()  # pumps, held until they end


async def follow(job: Job, after: int) -> AsyncIterator[str]:
    """The job's events after sequence number ``after``, then each as it comes, until the response ends."""
    i = after + 1
    while True:
        waiter = job.more
        while i < len(job.events):
            yield job.events[i]
            i += 1
        if job.ended:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.wait(), KEEPALIVE_S)
            continue
        yield ": keep-alive\n\n"
