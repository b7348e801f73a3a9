"""Records of what a request did, step by step: what ``run`` returns and ``--json`` prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.base import Usage
from flowstate.nodes import canonical_json


@dataclass(frozen=True)
class ToolCallRecord:
    name: str
    arguments: dict[str, Any]
    observation_id: str
    result: Any = None
    error: str | None = None
    repeat_of: str | None = None  # refused, not run: the observation id of the same call made earlier in the request

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCallRecord:
        return cls(d["name"], dict(d["arguments"]), d["observation_id"], d.get("result"), d.get("error"),
                   d.get("repeat_of"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": self.arguments, "observation_id": self.observation_id}
        if self.error is None:
            out["result"] = self.result
        else:
            out["error"] = self.error
        if self.repeat_of is not None:
            out["repeat_of"] = self.repeat_of
        return out

    @property
    def key(self) -> tuple[str, str]:
        """What makes two calls the same call: the tool and its arguments (in canonical JSON)."""
        return self.name, canonical_json(self.arguments)


@dataclass(frozen=True)
class StepRecord:
    """One model call: its raw output and everything the runtime did with it."""

    index: int
    raw: str
    usage: Usage
    grammar_ms: float = 0.0  # time to build this step's grammar (0 without one)
    protocol_error: dict[str, str] | None = None
    truncated: bool = False  # the output was cut at the completion budget (then it also broke the protocol)
    malformed: list[dict[str, Any]] = field(default_factory=list)  # items excluded as malformed
    committed: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, str]] = field(default_factory=list)
    disclosed: list[str] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    final_response: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepRecord:
        """The record ``to_dict`` wrote (the usage's timings as rounded there)."""
        return cls(
            index=d["index"], raw=d["raw"], usage=Usage(**d["usage"]), grammar_ms=d.get("grammar_ms", 0.0),
            protocol_error=d.get("protocol_error"), truncated=d.get("truncated", False),
            malformed=list(d.get("malformed", [])), committed=list(d.get("committed", [])),
            rejected=list(d.get("rejected", [])), disclosed=list(d.get("disclosed", [])),
            refused=list(d.get("refused", [])),
            tool_calls=[ToolCallRecord.from_dict(c) for c in d.get("tool_calls", [])],
            final_response=d.get("final_response"),
        )

    def feedback(self) -> list[dict[str, Any]]:
        """What the runtime tells the next step of this one: what it excluded, rejected or refused, or why the output
        broke the protocol (a cut one as a truncation)."""
        t = self.index
        if self.truncated and self.protocol_error is not None:
            error = f"{self.protocol_error['block']}: {self.protocol_error['message']}"
            return [{
                "kind": "truncated", "step": t,
                "message": f"your output was cut off at the limit of {self.usage.completion_tokens} tokens "
                           f"before it was complete ({error}); write a shorter output: fewer operations, shorter "
                           "summaries, values and messages",
            }]
        if self.protocol_error is not None:
            return [{"kind": "protocol_error", "step": t, **self.protocol_error}]
        return [*({"kind": "malformed", "step": t, **m} for m in self.malformed),
                *({"kind": "rejected", "step": t, **r} for r in self.rejected),
                *({"kind": "refused_access", "step": t, **r} for r in self.refused),
                *({"kind": "repeated_call", "step": t, "tool": c.name, "observation_id": c.observation_id,
                   "message": f"not run: the same call with the same arguments was made before ({c.repeat_of}); "
                              "its result is shown again in the observation. Use it (record what you need), call "
                              "with other arguments, or answer"}
                  for c in self.tool_calls if c.repeat_of is not None)]

    @property
    def repeated(self) -> int:
        """Calls of this step refused as repeats of an earlier call of the request."""
        return sum(c.repeat_of is not None for c in self.tool_calls)

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
            "truncated": self.truncated,
            "malformed": self.malformed,
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
    """One request of a session, start to end (``unfinished``: why it ended without a response)."""

    session: str
    request: int
    query: str
    response: str | None
    steps: tuple[StepRecord, ...]
    persisted_states: tuple[str, ...] = ()
    persisted_observations: tuple[str, ...] = ()
    unfinished: str | None = None
    memory_calls: tuple[StepRecord, ...] = ()  # model calls the memory method made when the request ended

    @property
    def usage(self) -> Usage:
        total = Usage()
        for s in (*self.steps, *self.memory_calls):
            total = total + s.usage
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "request": self.request,
            "query": self.query,
            "response": self.response,
            "unfinished": self.unfinished,
            "steps": [s.to_dict() for s in self.steps],
            "usage": {**self.usage.to_dict(), "model_calls": len(self.steps) + len(self.memory_calls)},
            "persisted": {"states": list(self.persisted_states), "observations": list(self.persisted_observations)},
            **({"memory_calls": [s.to_dict() for s in self.memory_calls]} if self.memory_calls else {}),
        }


FAILED = "failed: "  # how the reason of a request that failed (not one that ran out of steps) begins
LOOPING = "looping: "  # of one that ended because it kept repeating calls
BUDGET = "no final response within the step budget"  # of one that ran out of steps
CANCELLED = "cancelled by its client at a step boundary"  # after FAILED: a background response cancelled


def unfinished_message(reason: str | None, kept: Sequence[str]) -> str:
    """What an agent that ran out of steps tells the user: that it did not finish, why, and what it kept."""
    what = (f"What I worked out so far is kept in memory ({', '.join(kept)}); ask me to continue from it."
            if kept else "I recorded nothing yet; ask again, perhaps with a narrower request.")
    return f"I could not finish this request ({reason}). {what}"
