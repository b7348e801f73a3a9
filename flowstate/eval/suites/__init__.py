"""The built-in suites, each generated from a seed with a chosen number of tasks and depth.

The small suites (hotel, bundle, travel, chain) return tool results of a few dozen tokens: fast, but
not the regime where memory saves tokens. The realistic suites (shopping, planning, reasoning)
return pages and tables the size of the benchmarks the paper measured; their sizes are options.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from engine.base import Engine
from flowstate.eval.suites import bundle, chain, hotel, planning, reasoning, shopping, travel
from flowstate.eval.task import Task

SUITES: dict[str, Callable[..., list[Task]]] = {
    "hotel": hotel.generate, "bundle": bundle.generate, "travel": travel.generate, "chain": chain.generate,
    "shopping": shopping.generate, "planning": planning.generate, "reasoning": reasoning.generate,
}
SMALL = ("hotel", "bundle", "travel", "chain")
REALISTIC = ("shopping", "planning", "reasoning")
TAU3 = ("tau3-airline", "tau3-retail")  # τ³-bench's domains, read from its data (flowstate.eval.tau3)
REPLAY = "tau-replay"  # recorded τ-bench conversations replayed (flowstate.eval.replay), from --data FILE
ARENA = "memoryarena"  # MemoryArena's formal reasoning data (flowstate.eval.memoryarena), from --data FILE
ALL = (*SUITES, *TAU3, REPLAY, ARENA)


def options(suite: str) -> dict[str, int]:
    """The size options a suite takes, with their defaults."""
    if suite == REPLAY:
        from flowstate.eval.replay import OPTIONS

        return dict(OPTIONS)
    if suite in TAU3 or suite == ARENA:
        return {}
    params = list(inspect.signature(SUITES[suite]).parameters.values())[3:]
    return {p.name: int(p.default) for p in params}


def check_options(suites: Any, given: Mapping[str, int]) -> None:
    """Every option given is taken by at least one of the suites."""
    known = {name for s in suites for name in options(s)}
    unknown = sorted(set(given) - known)
    if unknown:
        valid = ", ".join(sorted(known)) or "none"
        raise ValueError(f"unknown suite option(s) {', '.join(unknown)} for suites {', '.join(suites)}; valid: {valid}")


def generate(suite: str, tasks: int, depth: int, seed: int = 0, sizes: Mapping[str, int] | None = None,
             data_dir: str | None = None, trials: int = 1, replay: str | None = None,
             judge: Engine | None = None) -> list[Task]:
    """``tasks`` task instances of ``depth`` subtasks each; the same arguments give the same tasks.

    ``sizes`` sets observation sizes; each suite takes the ones it knows (``options``). The τ³ suites
    read their data (``data_dir``: a tau2-bench checkout's data folder) and run each task ``trials`` times;
    ``tau-replay`` reads its recorded conversations from ``replay``, ``memoryarena`` its JSON Lines from it too
    (graded by ``judge`` where one is given).
    """
    if suite not in ALL:
        raise ValueError(f"unknown suite {suite!r}; valid suites: {', '.join(ALL)}")
    taken = {k: v for k, v in (sizes or {}).items() if k in options(suite)}
    if any(v < 1 for v in taken.values()):
        raise ValueError("suite options must be at least 1")
    if suite == REPLAY:
        from flowstate.eval.replay import generate as replay_tasks

        return replay_tasks(replay, tasks, **taken)
    if suite == ARENA:
        from flowstate.eval.memoryarena import read

        return list(read(replay, tasks, judge))
    if suite in TAU3:
        from flowstate.eval.tau3.tasks import generate as tau3_tasks

        return tau3_tasks(suite, tasks, data_dir, trials)
    if tasks < 1 or depth < 1:
        raise ValueError("tasks and depth must be at least 1")
    return SUITES[suite](tasks, depth, seed, **taken)
