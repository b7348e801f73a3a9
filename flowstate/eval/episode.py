"""One request of an evaluated episode, run and recorded alike for a task's subtasks and a τ³ conversation's turns:
its response, its steps, its failure, and the memory method's own model calls (their tokens count for the method)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowstate.agent import Agent
from flowstate.errors import RequestFailed


@dataclass(frozen=True)
class Outcome:
    response: str | None
    steps: list[dict[str, Any]]
    error: str | None  # why the request ended without a response (unfinished or failed)
    memory_calls: list[dict[str, Any]]


def request_outcome(agent: Agent, query: str) -> Outcome:
    """Run ``query`` as the agent session's next request; a failed request is an outcome, not an exception."""
    try:
        record = agent.run(query)
    except RequestFailed as exc:
        return Outcome(None, (exc.record or {}).get("steps", []), str(exc), [])
    return Outcome(record.response, [s.to_dict() for s in record.steps], record.unfinished,
                   [s.to_dict() for s in record.memory_calls])
