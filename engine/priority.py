"""Which engine calls go first: a priority per kind of call, as vLLM's priority scheduling takes it (lower is
earlier), and a lock that lets the waiting call of the earliest priority in first (the in-process engines, whose
one model takes calls one at a time).

The kinds: an ``interactive`` turn (a client waits on it), a ``memory`` method's own call, a ``background`` response,
an ``evaluation``'s call. A memory method's call made for a request runs at the later of ``memory`` and the request's
own kind: it never overtakes the request it serves, nor an interactive turn when it serves a background one.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, fields

from engine.purpose import STEP, Purpose

LANES = ("interactive", "background", "evaluation")
"""What a request is run for, and so the priority of its calls (``RequestOptions.lane``, ``AgentConfig.lane``)."""


@dataclass(frozen=True)
class Priorities:
    """A priority per kind of call; ``on`` False: every call is sent without one (vLLM's default, 0)."""

    interactive: int = 0
    memory: int = 1
    background: int = 2
    evaluation: int = 3
    on: bool = True

    def of(self, lane: str, purpose: Purpose = STEP) -> int:
        """The priority of a call of ``purpose`` made for a request of ``lane``."""
        if lane not in LANES:
            raise ValueError(f"a request's lane is one of {', '.join(LANES)}, not {lane!r}")
        if not self.on:
            return 0
        own: int = getattr(self, lane)
        return own if purpose.kind == STEP.kind else max(own, self.memory)

    @classmethod
    def parse(cls, text: str) -> Priorities:
        """``interactive=0,memory=1,background=2,evaluation=3`` (any subset; the rest keep their defaults), or
        ``off``."""
        if text.strip() == "off":
            return cls(on=False)
        kinds = {f.name for f in fields(cls)} - {"on"}
        given: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, eq, value = part.partition("=")
            name = name.strip()
            if not eq or name not in kinds:
                raise ValueError(f"priorities are KIND=INT with KIND one of {', '.join(sorted(kinds))}, or off; "
                                 f"not {part!r}")
            try:
                given[name] = int(value)
            except ValueError:
                raise ValueError(f"the priority of {name} is an integer, not {value.strip()!r}") from None
        d = cls()
        return cls(given.get("interactive", d.interactive), given.get("memory", d.memory),
                   given.get("background", d.background), given.get("evaluation", d.evaluation))

    def __str__(self) -> str:
        if not self.on:
            return "off"
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self) if f.name != "on")


class PriorityLock:
    """A lock whose waiters enter by priority (lower first), then by arrival: the calls of one model that takes
    them one at a time, so an interactive turn waits for the call in progress and never for a queue of background
    ones. ``with lock.hold(priority):``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._waiting: list[tuple[int, int]] = []
        self._order = itertools.count()

    def acquire(self, priority: int = 0) -> None:
        with self._cond:
            ticket = (priority, next(self._order))
            heapq.heappush(self._waiting, ticket)
            while self._held or self._waiting[0] != ticket:
                self._cond.wait()
            heapq.heappop(self._waiting)
            self._held = True

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def hold(self, priority: int = 0) -> _Held:
        return _Held(self, priority)


class _Held:
    def __init__(self, lock: PriorityLock, priority: int) -> None:
        self.lock, self.priority = lock, priority

    def __enter__(self) -> None:
        self.lock.acquire(self.priority)

    def __exit__(self, *exc: object) -> None:
        self.lock.release()
