"""What a suite is made of: tasks of dependent subtasks, their environment, tools and checkers.

A task is one session: subtask k is request k. Tools are deterministic and bound to a fresh
environment per (task, strategy) run; the information a later subtask needs is returned once,
by an earlier subtask's tool call, and nowhere else.

Reference policies reason over *facts*: the flat key/value pairs an agent takes from tool results
(``distill``; by default a flat result is its own facts), wherever the prompt shows them. ``solve``
says what to do next from the facts at hand, or which facts are missing; ``needs`` names the facts
of earlier subtasks a subtask depends on, so a policy can ask memory for them at its first step;
``guess`` is what a policy without memory does instead.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from flowstate.tools import ToolSet

Facts = Mapping[str, Any]


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class Need:
    keys: tuple[str, ...]  # facts from earlier subtasks that the next action depends on


Decision = Call | Answer | Need


@dataclass(frozen=True)
class Score:
    correct: bool
    credit: float  # soft credit in [0, 1] (sPS); equals correct where a suite has no partial credit
    detail: dict[str, Any] | None = None  # a suite's own figures of the subtask (kept on its row)


TASK_POLICY = (
    "Act with the tools; answer briefly. Every name, number and decision must come from tool results, "
    "from your memory of earlier requests, or from the request itself."
)
"""The task policy of the generated suites (a recording or a τ³ domain brings its own)."""


class Task(ABC):
    """One task instance; subclasses hold its generated data. How it runs (as subtasks or as a conversation) and
    which reference policy drives it, its suite declares (``flowstate.eval.suites.Rules``)."""

    suite: str = ""

    @property
    def policy(self) -> str:
        """The task policy in the system prompt."""
        return TASK_POLICY

    def __init__(self, task_id: str, queries: list[str]) -> None:
        self.id = task_id
        self.queries = queries

    @property
    def depth(self) -> int:
        return len(self.queries)

    def subtask(self, query: str) -> int:
        """The 1-based index of the subtask whose query this is."""
        return self.queries.index(query.strip()) + 1

    @abstractmethod
    def new_env(self) -> Any:
        """A fresh environment (what the tools read and change)."""

    @abstractmethod
    def tools(self, env: Any) -> ToolSet:
        """The tools, bound to ``env``."""

    def distill(self, tool: str, result: Any) -> dict[str, Any]:
        """The facts an agent takes from one tool result (a realistic page holds far more than these)."""
        return dict(result) if isinstance(result, dict) else {}

    def durable(self, key: str) -> bool:
        """Whether a fact is worth recording as a state (search lists, for one, are not)."""
        return True

    def needs(self, k: int) -> tuple[str, ...]:
        """The facts from earlier subtasks that subtask k depends on, as its query lets an agent know."""
        return ()

    @abstractmethod
    def solve(self, k: int, facts: Facts) -> Decision:
        """The oracle's next action in subtask k."""

    @abstractmethod
    def guess(self, k: int, facts: Facts) -> Call | Answer:
        """What to do when the facts ``solve`` needs are out of reach (no memory)."""

    @abstractmethod
    def check(self, k: int, response: str | None, env: Any) -> Score:
        """Grade subtask k after its request ended (``response`` None: the request failed)."""

    def success(self, scores: list[Score]) -> bool:
        """Task success (SR): by default the final subtask, which depends on all earlier ones."""
        return bool(scores) and scores[-1].correct


def numbers(text: str | None) -> list[int]:
    return [int(n) for n in re.findall(r"-?\d+", text or "")]


def says(text: str | None, word: str) -> bool:
    return bool(re.search(rf"\b{re.escape(word)}\b", text or "", re.IGNORECASE))


def seeded(suite: str, seed: int, tasks: int) -> Iterator[tuple[int, random.Random]]:
    """Each task's index and its own random generator (the same tasks for the same suite, seed and index)."""
    for i in range(tasks):
        yield i, random.Random(f"{suite}:{seed}:{i}")


def at_most(suite: str, depth: int, most: int) -> None:
    """Never a silent cap: a depth the suite cannot generate is refused (a report would say a depth the tasks do
    not have)."""
    if depth > most:
        raise ValueError(f"{suite} tasks have at most {most} subtasks")
