"""The evaluator's unit of work, typed: a task's row (``TaskRow``), its subtasks' (``SubtaskRow``), a τ³
conversation's grade (``Tau3Row``). ``runner`` builds them once; report, metrics, kv, gpu and the benches read
them by attribute. ``results.jsonl`` holds each ``TaskRow.to_dict()`` as one JSON line, and ``TaskRow.from_dict``
reads every earlier format back (the one adapter: fields added since default, positional calls through
``calls.read``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from engine.base import Usage
from flowstate.eval.calls import read
from flowstate.eval.tau3.evaluate import Grade
from flowstate.records import StepRecord


@dataclass(frozen=True)
class Tokens:
    """A subtask's tokens over its model calls (the agent's steps and the memory method's own calls)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens}


@dataclass(frozen=True)
class SubtaskRow:
    """One subtask (a τ³ turn): how it was graded and what its request did and cost."""

    k: int
    correct: bool
    credit: float
    response: str | None
    error: str | None  # why the request ended without a response
    steps: int
    parse_failures: int
    rejected: int  # operations rejected, accesses refused and items excluded as malformed
    usage: Tokens
    calls: tuple[Usage, ...]  # every model call, the memory method's after the steps
    truncations: int = 0  # (rows of older runs: none counted)
    memory_calls: int = 0
    disclosure_steps: int = 0  # steps that only waited for history
    tool_calls: int | None = None  # None: a row of an older run, which did not count them
    repeated_calls: int = 0
    detail: dict[str, Any] | None = None  # a suite's own figures (the sessions suite: agreement, off-record calls)

    @classmethod
    def of(cls, k: int, response: str | None, steps: Sequence[StepRecord], correct: bool, credit: float,
           error: str | None, memory_calls: Sequence[StepRecord] = (), detail: dict[str, Any] | None = None,
           ) -> SubtaskRow:
        """The row of a request's step records; the memory method's own model calls count in its usage and calls."""
        calls = tuple(read(s.usage.to_dict()) for s in (*steps, *memory_calls))  # as results.jsonl keeps them
        return cls(
            k=k, correct=correct, credit=credit, response=response, error=error, steps=len(steps),
            parse_failures=sum(s.protocol_error is not None for s in steps),
            rejected=sum(len(s.rejected) + len(s.refused) + len(s.malformed) for s in steps),
            usage=Tokens(sum(c.prompt_tokens for c in calls), sum(c.cached_tokens for c in calls),
                         sum(c.completion_tokens for c in calls)),
            calls=calls, truncations=sum(s.truncated for s in steps), memory_calls=len(memory_calls),
            disclosure_steps=sum(s.decision == "defer" for s in steps),
            tool_calls=sum(len(s.tool_calls) for s in steps), repeated_calls=sum(s.repeated for s in steps),
            detail=detail,
        )

    def to_dict(self) -> dict[str, Any]:
        """The row as results.jsonl holds it, in the order runs have always written it."""
        out = {"k": self.k, "correct": self.correct, "credit": self.credit, "response": self.response,
               "error": self.error, "steps": self.steps, "parse_failures": self.parse_failures,
               "truncations": self.truncations, "rejected": self.rejected, "usage": self.usage.to_dict(),
               "memory_calls": self.memory_calls, "disclosure_steps": self.disclosure_steps,
               "tool_calls": self.tool_calls, "repeated_calls": self.repeated_calls,
               "calls": [c.to_dict() for c in self.calls]}
        if self.tool_calls is None:
            del out["tool_calls"]
        if self.detail is not None:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SubtaskRow:
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in d.items() if k in known}, "usage": Tokens(**d["usage"]),
                      "calls": tuple(read(c) for c in d["calls"])})


@dataclass(frozen=True)
class Tau3Row:
    """A τ³ conversation's grade, how it ended and who played the user; with an MCP server's tools, how many of
    their results were compared with the domain's own and which differed."""

    grade: Grade
    ended_by: str
    user: str
    results_compared: int | None = None
    results_differ: tuple[Any, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        compared = {} if self.results_compared is None else \
            {"results_compared": self.results_compared, "results_differ": list(self.results_differ or ())}
        return {**self.grade.to_dict(), "ended_by": self.ended_by, "user": self.user, **compared}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Tau3Row:
        known = {f.name for f in fields(Grade)}
        differ = d.get("results_differ")
        return cls(Grade(**{k: v for k, v in d.items() if k in known}), d["ended_by"], d.get("user", ""),
                   d.get("results_compared"), None if differ is None else tuple(differ))


@dataclass(frozen=True)
class TaskRow:
    """One finished task (a τ³ conversation: also its base task, trial and grade), one line of ``results.jsonl``."""

    suite: str
    strategy: str
    task: str
    depth: int
    run: str  # the id of the evaluation run that wrote it
    started: float
    ended: float
    success: bool
    subtasks: tuple[SubtaskRow, ...]
    base_task: str | None = None
    trial: int | None = None
    tau3: Tau3Row | None = None

    @property
    def tokens(self) -> int:
        return sum(s.usage.total for s in self.subtasks)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"suite": self.suite, "strategy": self.strategy, "task": self.task}
        if self.tau3 is not None:  # a conversation's row, in the order runs have always written it
            out |= {"base_task": self.base_task, "trial": self.trial, "started": self.started, "ended": self.ended,
                    "depth": self.depth, "run": self.run}
        else:
            out |= {"depth": self.depth, "run": self.run, "started": self.started, "ended": self.ended}
        out |= {"success": self.success, "subtasks": [s.to_dict() for s in self.subtasks]}
        if self.tau3 is not None:
            out["tau3"] = self.tau3.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskRow:
        """A row as any run wrote it (older ones lack the fields added since; see ``SubtaskRow``)."""
        tau3 = d.get("tau3")
        return cls(d["suite"], d["strategy"], str(d["task"]), int(d["depth"]), d["run"], d["started"], d["ended"],
                   bool(d["success"]), tuple(SubtaskRow.from_dict(s) for s in d["subtasks"]), d.get("base_task"),
                   d.get("trial"), None if tau3 is None else Tau3Row.from_dict(tau3))


def calls_of(subtasks: Sequence[SubtaskRow]) -> list[Usage]:
    """Every model call of these subtasks, in order."""
    return [c for s in subtasks for c in s.calls]
