"""Builders of raw protocol outputs for tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from engine.base import Capabilities, Engine, Generation, Message
from engine.purpose import STEP, Purpose
from engine.scripted import ScriptedEngine
from flowstate import Agent
from flowstate.eval.rows import TaskRow
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
            {"state_focus": items, "state_delta": list(delta), "tool_calls": list(tools),
             "assistant_message": {"content": content}}
        )
    )


def add(state_id: str, type_: str = "knowledge", refs: Iterable[tuple[str, str]] = (), **value: Any) -> dict[str, Any]:
    return {
        "operation": "add", "state_set": type_, "state_id": state_id, "summary": f"summary of {state_id}",
        "value": value, "refs": [{"rel": rel, "state_id": target} for rel, target in refs],
    }


class Recording(Engine):
    """Passes calls through to the real engine and keeps every prompt, grammar and output."""

    name = "recording"
    capabilities = Capabilities(grammar=True, embedded=True)

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.calls: list[tuple[list[Message], str | None, Generation]] = []

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 purpose: Purpose = STEP, **_: Any) -> Generation:
        gen = self.inner.generate(messages, grammar=grammar, max_tokens=max_tokens, purpose=purpose)
        self.calls.append((list(messages), grammar, gen))
        return gen

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


def check_under_grammar(grammar: str, gen: Generation, limits: Any) -> None:
    """What a grammar-constrained engine guarantees whatever the model writes: every token it let through is the
    grammar's (an output cut at its budget is the start of a sentence), and an output that ended is a whole
    sentence the protocol parses."""
    from flowstate.parse import parse_output
    from grammars.check import accepts

    if gen.truncated:
        assert accepts(grammar, gen.text, prefix=True), gen.text
    else:
        assert accepts(grammar, gen.text), gen.text
        parse_output(gen.text, limits=limits)


SUBTASK = {"k": 1, "correct": True, "credit": 1.0, "response": "ok", "error": None, "steps": 1, "parse_failures": 0,
           "rejected": 0, "usage": {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}, "calls": []}


def task_row(subtasks: Sequence[dict[str, Any]] = (), **fields: Any) -> TaskRow:
    """A task's row as results.jsonl holds one, read through the one adapter: what a test gives, the rest defaults
    (each subtask's too)."""
    return TaskRow.from_dict({"suite": "hotel", "strategy": "flowstate", "task": "t", "depth": max(len(subtasks), 1),
                              "run": "r", "started": 0.0, "ended": 1.0, "success": True,
                              "subtasks": [{**SUBTASK, "k": k, **s} for k, s in enumerate(subtasks, 1)], **fields})
