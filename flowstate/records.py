"""Records of what a request did, step by step: what ``run`` returns and ``--json`` prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.base import Usage


@dataclass(frozen=True)
class ToolCallRecord:
    name: str
    arguments: dict[str, Any]
    observation_id: str
    result: Any = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": self.arguments, "observation_id": self.observation_id}
        if self.error is None:
            out["result"] = self.result
        else:
            out["error"] = self.error
        return out


@dataclass(frozen=True)
class StepRecord:
    """One model call: its raw output and everything the runtime did with it."""

    index: int
    raw: str
    usage: Usage
    grammar_ms: float = 0.0  # time to build this step's grammar (0 without one)
    protocol_error: dict[str, str] | None = None
    committed: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    disclosed: list[str] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    final_response: str | None = None

    @property
    def decision(self) -> str:
        if self.protocol_error is not None:
            return "invalid"
        if self.final_response is not None:
            return "final"
        return "tools" if self.tool_calls else "defer"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "raw": self.raw,
            "decision": self.decision,
            "protocol_error": self.protocol_error,
            "committed": self.committed,
            "rejected": self.rejected,
            "disclosed": self.disclosed,
            "refused": self.refused,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "final_response": self.final_response,
            "usage": self.usage.to_dict(),
            "grammar_ms": round(self.grammar_ms, 3),
        }


@dataclass(frozen=True)
class RunRecord:
    """One request of a session, start to end."""

    session: str
    request: int
    query: str
    response: str | None
    steps: tuple[StepRecord, ...]
    persisted_states: tuple[str, ...] = ()
    persisted_observations: tuple[str, ...] = ()

    @property
    def usage(self) -> Usage:
        total = Usage()
        for s in self.steps:
            total = total + s.usage
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "request": self.request,
            "query": self.query,
            "response": self.response,
            "steps": [s.to_dict() for s in self.steps],
            "usage": {**self.usage.to_dict(), "model_calls": len(self.steps)},
            "persisted": {"states": list(self.persisted_states), "observations": list(self.persisted_observations)},
        }
