"""One request of an evaluated episode, run and recorded alike for a task's subtasks and a τ³ conversation's turns:
its response, its steps, its failure, and the memory method's own model calls (their tokens count for the method)."""

from __future__ import annotations

from dataclasses import dataclass

from flowstate.agent import Agent
from flowstate.errors import RequestFailed
from flowstate.records import StepRecord


@dataclass(frozen=True)
class Outcome:
    response: str | None
    steps: tuple[StepRecord, ...]
    error: str | None  # why the request ended without a response (unfinished or failed)
    memory_calls: tuple[StepRecord, ...]


def request_outcome(agent: Agent, query: str) -> Outcome:
    """Run ``query`` as the agent session's next request; a failed request is an outcome, not an exception (with the
    steps it ran, as its error carries them)."""
    try:
        record = agent.run(query)
    except RequestFailed as exc:
        steps = tuple(StepRecord.from_dict(s) for s in (exc.record or {}).get("steps", []))
        return Outcome(None, steps, str(exc), ())
    return Outcome(record.response, record.steps, record.unfinished, record.memory_calls)
