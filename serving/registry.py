"""The sessions a server holds between HTTP calls, and the lock that serializes each session's turns.

A session's lock lives exactly as long as someone holds it or waits for it: ``enter`` counts the
caller in, ``leave`` counts it out, and the entry (lock included) goes when the count is zero. So
eviction can never drop a lock that a waiting turn will wake on, and names that are only ever
refused leave nothing behind. Idle sessions beyond ``keep``, or beyond a byte
budget, leave memory (their transcript reloads from the database on their next call); a session with a holder, a waiter
or a request waiting on tool results is never dropped.

On a database that several servers share (PostgreSQL), ``enter`` also takes the session's lock in the
database, so two servers never run turns of one session at once, and ``live`` reads the session from
the database at every turn (another server may have moved it on, or taken its waiting request further).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from flowstate.store.repository import Repository
from serving.history import match
from serving.live import Live, load_live, waiting_calls

log = logging.getLogger("flowstate.serving")


def _unlock(held: Any) -> None:
    """Release a database session lock in a worker thread (the next turn's ``enter`` waits for it there)."""
    def done(future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.error("releasing a session lock failed: %s", future.exception())

    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not on an event loop: release it here
        held.__exit__(None, None, None)
        return
    loop.run_in_executor(None, held.__exit__, None, None, None).add_done_callback(done)


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
        self._resolving: dict[str, asyncio.Lock] = {}  # per fingerprint base: unnamed conversations resolved in turn
        self._resolvers: dict[str, int] = {}  # ... and how many hold or wait for that lock

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

    async def claim(self, name: str) -> bool:
        """Take the session's lock only if no turn of this server holds it, waits for it, or waits on tool results
        in it (retention's sweep: a busy session is skipped, never waited for); paired with ``leave`` when True.
        Never the database's lock: the sweep's transaction tries that itself."""
        if self.running(name):
            return False
        entry = self._entries.setdefault(name, _Entry())
        entry.holders += 1
        await entry.lock.acquire()  # free (no holder, no waiter): returns without yielding to another task
        return True

    def leave(self, name: str) -> None:
        """Release the session's lock (taken by ``enter``)."""
        self._release(name, self._entries[name], locked=True)

    def _release(self, name: str, entry: _Entry, *, locked: bool) -> None:
        if entry.shared is not None:  # the database's lock goes in a worker thread: never a round trip on the loop
            held, entry.shared = entry.shared, None
            _unlock(held)
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

    def running(self, name: str) -> bool:
        """Whether a turn holds the session, waits for it, or its request waits on tool results (safe to call from a
        worker thread: it only reads)."""
        live = self._live.get(name)
        return name in self._entries or (live is not None and live.run is not None)

    async def resolve(self, base: str, conversation: list[dict[str, Any]], key: str | None) -> str:
        """The session of a conversation that names none (``base``: its fingerprint, namespaced) — the one whose
        history it continues, or whose answered turn it resends (with a reply already given, or under an
        Idempotency-Key used or in use there) — else a new one (``base``, ``base.1``, …). Conversations that merely
        open alike never share a session: one a turn holds now is taken only by its key (a retry, which then waits
        for that turn). Resolutions of one base take turns (a lock of their own); returns with the session entered."""
        lock = self._resolving.setdefault(base, asyncio.Lock())
        self._resolvers[base] = self._resolvers.get(base, 0) + 1
        try:
            async with lock:
                best, by_key = await self._choose(base, conversation, key)
                if not by_key:  # in memory before the next resolution, so a concurrent new conversation picks another
                    await self._hold(best)
        finally:
            self._resolvers[base] -= 1
            if not self._resolvers[base]:
                del self._resolvers[base], self._resolving[base]
        if by_key:  # the key's session is named already: wait for its turn without holding up other resolutions
            await self._hold(best)
        return best

    async def _hold(self, name: str) -> None:
        await self.enter(name)
        try:
            await self.live(name)
        except BaseException:
            self.leave(name)
            raise

    async def _choose(self, base: str, conversation: list[dict[str, Any]], key: str | None) -> tuple[str, bool]:
        """The session ``resolve`` picks, and whether the key chose it."""
        stored = await anyio.to_thread.run_sync(self.repo.sessions, base)
        candidates = [n for n in sorted({*stored, *self.names(base)}) if n == base or n.startswith(base + ".")]
        best, best_rank = None, (-1, -1)
        first_user = next((i for i, m in enumerate(conversation) if m["role"] == "user"), len(conversation))
        # an assistant message after the first user message: the history of one answered conversation
        resent = any(m["role"] == "assistant" for m in conversation[first_user:])
        for full in candidates:
            live = await self.view(full)
            held = self._live.get(full)  # what runs now is in this server's memory (a shared database holds the rest)
            if key is not None and (live.claims(key) or (held is not None and held.claims(key))):
                return full, True
            if self.busy(full):
                continue  # another conversation's turn runs there: what it matches now is in flux
            kind = match(conversation, live.transcript).kind
            if kind == "continues" and (resent or not live.transcript) or kind == "replay" and resent:
                rank = (kind == "continues", len(live.transcript))  # a conversation in progress before a replay
                if rank > best_rank:
                    best, best_rank = full, rank
        if best is None:
            used = set(candidates)
            best = base if base not in used else next(f"{base}.{i}" for i in range(1, len(used) + 2)
                                                      if f"{base}.{i}" not in used)
        return best, False

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

    async def waiting(self, name: str) -> list[str] | None:
        """The client's tool calls the session's unfinished request waits on (None: none), from memory or the
        database's waiting request alone — never its transcripts (a poll asks it every second and a half)."""
        live = None if self.repo.shared else self._live.get(name)
        if live is not None:
            return live.calls
        return waiting_calls(await anyio.to_thread.run_sync(self.repo.waiting.get, name))

    def forget(self, name: str) -> None:
        if self._live.pop(name, None) is not None:
            self.on_leave(name)

    def held(self) -> int:
        """How many sessions have a lock entry now (for tests and metrics)."""
        return len(self._entries)

    def in_memory(self) -> int:
        return len(self._live)
