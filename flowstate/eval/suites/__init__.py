"""The built-in suites, each generated from a seed with a chosen number of tasks and depth."""

from __future__ import annotations

from collections.abc import Callable

from flowstate.eval.suites import bundle, chain, hotel, travel
from flowstate.eval.task import Task

SUITES: dict[str, Callable[[int, int, int], list[Task]]] = {
    "hotel": hotel.generate, "bundle": bundle.generate, "travel": travel.generate, "chain": chain.generate,
}


def generate(suite: str, tasks: int, depth: int, seed: int = 0) -> list[Task]:
    """``tasks`` task instances of ``depth`` subtasks each; the same arguments give the same tasks."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; valid suites: {', '.join(SUITES)}")
    if tasks < 1 or depth < 1:
        raise ValueError("tasks and depth must be at least 1")
    return SUITES[suite](tasks, depth, seed)
