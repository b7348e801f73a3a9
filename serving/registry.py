"""The sessions a server holds between HTTP calls, and the lock that serializes each session's turns.

A session's lock lives exactly as long as someone holds it or waits for it: ``enter`` counts the
caller in, ``leave`` counts it out, and the entry (lock included) goes when the count is zero. So
eviction can never drop a lock that a waiting turn will wake on, and names that are only ever
refused leave nothing behind. Idle sessions beyond ``keep``, or beyond a byte
budget, leave memory (their transcript reloads from the database on their next call); a session with a holder, a waiter or a request waiting on
tool results is never dropped.

On a database that several servers share (PostgreSQL), ``enter`` also takes the session's lock in the
database, so two servers never run turns of one session at once, and ``live`` reads the session from
the database at every turn (another server may have moved it on, or taken its waiting request further).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from flowstate.store.repository import Repository
from serving.sessions import Live, load_live


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    holders: int = 0  # turns holding or waiting for the lock
    shared: Any = None  # the database's lock on the session, while this process holds the session


class Registry:
    """Live sessions and their locks, for one event loop."""

    def __init__(self, repo: Repository, keep: int = 4096, on_leave: Callable[[str], None] = lambda _: None,
                 budget: int | None = None) -> None:
        """``keep``: idle sessions held at most; ``budget``: the bytes they may hold together (``Live.bytes``; None:
        no limit); ``on_leave(name)``: a session left memory (what the server's tools hold for it may go; it must
        not block)."""
        self.repo, self.keep, self.on_leave, self.budget = repo, keep, on_leave, budget
        self._entries: dict[str, _Entry] = {}
        self._live: OrderedDict[str, Live] = OrderedDict()

    async def enter(self, name: str) -> None:
        """Wait for the session's lock; every ``enter`` is paired with one ``leave``."""
        entry = self._entries.setdefault(name, _Entry())
        entry.holders += 1
        try:
            await entry.lock.acquire()
        except BaseException:  # cancelled while waiting
            self._release(name, entry, locked=False)
            raise
        if self.repo.shared:  # then every server's turns of this session, one at a time
            held = self.repo.session_lock(name)
            try:
                await anyio.to_thread.run_sync(held.__enter__)
            except BaseException:
                self._release(name, entry, locked=True)
                raise
            entry.shared = held

    def leave(self, name: str) -> None:
        """Release the session's lock (taken by ``enter``)."""
        self._release(name, self._entries[name], locked=True)

    def _release(self, name: str, entry: _Entry, *, locked: bool) -> None:
        if entry.shared is not None:
            held, entry.shared = entry.shared, None
            held.__exit__(None, None, None)
        if locked:
            entry.lock.release()
        entry.holders -= 1
        if entry.holders == 0:
            del self._entries[name]
        self._evict()

    async def live(self, name: str) -> Live:
        """The session's live state; call between ``enter`` and ``leave``. A session not in memory (or, on a shared
        database, every time) is read from the repository in a worker thread: never on the event loop."""
        if name not in self._live or self.repo.shared:  # shared: the database is the truth, whoever moved it on
            self._live[name] = await anyio.to_thread.run_sync(load_live, self.repo, name)
        self._live.move_to_end(name)
        self._evict()
        return self._live[name]

    def busy(self, name: str) -> bool:
        """Whether a turn holds the session or waits for it."""
        return name in self._entries

    def _evict(self) -> None:
        """Idle sessions leave memory, least recently used first, while more are held than ``keep`` or they hold
        more than ``budget`` bytes (a session a turn holds, or whose request waits on tool results, stays)."""
        total = self.held_bytes() if self.budget is not None else 0
        for old in list(self._live):
            over_budget = self.budget is not None and total > self.budget
            if len(self._live) <= self.keep and not over_budget:
                return
            live = self._live[old]
            if live.run is None and old not in self._entries:
                total -= live.bytes()
                del self._live[old]
                self.on_leave(old)

    def held_bytes(self) -> int:
        """What the sessions in memory hold, by ``Live.bytes``."""
        return sum(live.bytes() for live in self._live.values())

    def peek(self, name: str) -> Live | None:
        return self._live.get(name)

    def names(self, prefix: str) -> list[str]:
        """Sessions in memory whose name starts with ``prefix`` (some may not be stored yet)."""
        return [n for n in self._live if n.startswith(prefix)]

    async def view(self, name: str) -> Live:
        """A session as it stands, from memory or the database (in a worker thread), without keeping it in memory
        (read only)."""
        live = None if self.repo.shared else self._live.get(name)
        return live if live is not None else await anyio.to_thread.run_sync(load_live, self.repo, name)

    def forget(self, name: str) -> None:
        if self._live.pop(name, None) is not None:
            self.on_leave(name)

    def held(self) -> int:
        """How many sessions have a lock entry now (for tests and metrics)."""
        return len(self._entries)

    def in_memory(self) -> int:
        return len(self._live)
