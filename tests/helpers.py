"""Builders of raw protocol outputs for tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from engine.scripted import ScriptedEngine
from flowstate import Agent
from flowstate.protocol import ModelOutput, render_output

AgentFactory = Callable[..., tuple[Agent, ScriptedEngine]]


def output(
    focus: Iterable[Any] = (),
    delta: Iterable[dict[str, Any]] = (),
    tools: Iterable[dict[str, Any]] = (),
    content: str | None = None,
) -> str:
    """The raw text of one model output; focus items may be bare ids."""
    items = [{"target_id": f, "reason": "test"} if isinstance(f, str) else f for f in focus]
    return render_output(
        ModelOutput.model_validate(
            {"state_focus": items, "state_delta": list(delta), "tool_calls": list(tools), "assistant_message": {"content": content}}
        )
    )


def add(state_id: str, type_: str = "knowledge", refs: Iterable[tuple[str, str]] = (), **value: Any) -> dict[str, Any]:
    return {
        "operation": "add", "state_set": type_, "state_id": state_id, "summary": f"summary of {state_id}",
        "value": value, "refs": [{"rel": rel, "state_id": target} for rel, target in refs],
    }
