"""The built-in suites, each generated from a seed with a chosen number of tasks and depth.

The small suites (hotel, bundle, travel, chain) return tool results of a few dozen tokens: fast, but
not the regime where memory saves tokens. The realistic suites (shopping, planning, reasoning)
return pages and tables the size of the benchmarks the paper measured; their sizes are options.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.base import Engine
from flowstate.eval.suites import bundle, chain, hotel, planning, reasoning, shopping, travel
from flowstate.eval.task import Task

SMALL = ("hotel", "bundle", "travel", "chain")
REALISTIC = ("shopping", "planning", "reasoning")
TAU3 = ("tau3-airline", "tau3-retail")  # τ³-bench's domains, read from its data (flowstate.eval.tau3)
REPLAY = "tau-replay"  # recorded τ-bench conversations replayed (flowstate.eval.replay), from --data FILE
ARENA = "memoryarena"  # MemoryArena's formal reasoning data (flowstate.eval.memoryarena), from --data FILE


@dataclass(frozen=True)
class Spec:
    """What a run asks of a suite besides how many tasks: their depth and seed, size options, and where data comes
    from (τ³'s data folder and trials, a recording or dataset file, a judge)."""

    depth: int
    seed: int = 0
    sizes: Mapping[str, int] = field(default_factory=dict)  # only the suite's own options
    data_dir: str | None = None
    trials: int = 1
    data: str | None = None
    judge: Engine | None = None


class Suite(Protocol):
    """A suite: its name, the size options it takes (with their defaults), and its tasks for a run."""

    @property
    def name(self) -> str: ...

    @property
    def options(self) -> Mapping[str, int]: ...

    def tasks(self, n: int, spec: Spec) -> list[Task]: ...


@dataclass(frozen=True)
class Generated:
    """A suite generated from a seed: ``n`` tasks of ``depth`` subtasks, the same for the same spec."""

    name: str
    make: Callable[..., list[Task]]
    options: Mapping[str, int] = field(default_factory=dict)

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        if n < 1 or spec.depth < 1:
            raise ValueError("tasks and depth must be at least 1")
        return self.make(n, spec.depth, spec.seed, **spec.sizes)


@dataclass(frozen=True)
class Tau3:
    """A τ³-bench domain: its first ``n`` tasks, each ``trials`` times, from its data."""

    name: str
    options: Mapping[str, int] = field(default_factory=dict)

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        from flowstate.eval.tau3.tasks import generate as tau3_tasks

        return tau3_tasks(self.name, n, spec.data_dir, spec.trials)


@dataclass(frozen=True)
class Replay:
    """Recorded τ-bench conversations, replayed (``--data FILE``)."""

    name: str = REPLAY

    @property
    def options(self) -> Mapping[str, int]:
        from flowstate.eval.replay import OPTIONS

        return OPTIONS

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        from flowstate.eval.replay import generate as replay_tasks

        return replay_tasks(spec.data, n, **spec.sizes)


@dataclass(frozen=True)
class Arena:
    """MemoryArena's formal reasoning data (``--data FILE``), graded by the judge where one is given."""

    name: str = ARENA
    options: Mapping[str, int] = field(default_factory=dict)

    def tasks(self, n: int, spec: Spec) -> list[Task]:
        from flowstate.eval.memoryarena import read

        return list(read(spec.data, n, spec.judge))


REGISTRY: dict[str, Suite] = {
    "hotel": Generated("hotel", hotel.generate), "bundle": Generated("bundle", bundle.generate),
    "travel": Generated("travel", travel.generate), "chain": Generated("chain", chain.generate),
    "shopping": Generated("shopping", shopping.generate, shopping.OPTIONS),
    "planning": Generated("planning", planning.generate, planning.OPTIONS),
    "reasoning": Generated("reasoning", reasoning.generate, reasoning.OPTIONS),
    **{name: Tau3(name) for name in TAU3}, REPLAY: Replay(), ARENA: Arena(),
}
"""Every suite by name: one protocol, whether generated, read from τ³'s data, replayed or a dataset."""
SUITES = (*SMALL, *REALISTIC)  # the generated suites
ALL = tuple(REGISTRY)


def suite(name: str) -> Suite:
    """The suite called ``name`` (unknown names list the valid ones)."""
    found = REGISTRY.get(name)
    if found is None:
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(ALL)}")
    return found


def options(name: str) -> dict[str, int]:
    """The size options a suite takes, with their defaults."""
    return dict(suite(name).options)


def check_options(suites: Any, given: Mapping[str, int]) -> None:
    """Every option given is taken by at least one of the suites."""
    known = {name for s in suites for name in options(s)}
    unknown = sorted(set(given) - known)
    if unknown:
        valid = ", ".join(sorted(known)) or "none"
        raise ValueError(f"unknown suite option(s) {', '.join(unknown)} for suites {', '.join(suites)}; valid: {valid}")


def generate(name: str, tasks: int, depth: int, seed: int = 0, sizes: Mapping[str, int] | None = None,
             data_dir: str | None = None, trials: int = 1, replay: str | None = None,
             judge: Engine | None = None) -> list[Task]:
    """``tasks`` task instances of ``depth`` subtasks each; the same arguments give the same tasks.

    ``sizes`` sets observation sizes; each suite takes the ones it knows (``options``). The τ³ suites
    read their data (``data_dir``: a tau2-bench checkout's data folder) and run each task ``trials`` times;
    ``tau-replay`` reads its recorded conversations from ``replay``, ``memoryarena`` its JSON Lines from it too
    (graded by ``judge`` where one is given).
    """
    chosen = suite(name)
    taken = {k: v for k, v in (sizes or {}).items() if k in chosen.options}
    if any(v < 1 for v in taken.values()):
        raise ValueError("suite options must be at least 1")
    return chosen.tasks(tasks, Spec(depth, seed, taken, data_dir, trials, replay, judge))
