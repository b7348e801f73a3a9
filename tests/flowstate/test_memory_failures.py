"""A failure inside a memory method's own model call (an extraction, a tracker update, a judge, a Compress) fails the
request as any failure does: persisted unfinished (``failed: …``), ``RequestFailed`` raised, the next request and
the rest of an evaluation going on."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.base import Capabilities, Engine, Generation, Message, Usage
from engine.errors import EngineError
from engine.purpose import STEP, Purpose
from flowstate import Agent, Repository
from flowstate.errors import RequestFailed
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.memory import get
from flowstate.protocol import ModelOutput, render_output
from flowstate.records import FAILED


class MemoryCallsDown(Engine):
    """The agent calls a tool, then answers; the memory method's own calls fail from the ``down_from``-th on."""

    name = "memory-calls-down"
    capabilities = Capabilities()

    def __init__(self, blocks: Sequence[str], down_from: int = 1) -> None:
        self.blocks, self.down_from = blocks, down_from
        self.agent_calls = self.memory_calls = 0

    def generate(self, messages: Sequence[Message], *, purpose: Purpose = STEP, **_: Any) -> Generation:
        if purpose.kind != STEP.kind:  # a memory method's own call, as the method declares it
            self.memory_calls += 1
            if self.memory_calls >= self.down_from:
                raise EngineError("memory call down")
            return Generation("{}", Usage(prompt_tokens=1, completion_tokens=1))
        self.agent_calls += 1
        first = '"step":1' not in messages[-1].content and self.agent_calls % 2 == 1
        out: dict[str, Any] = {"state_focus": [], "state_delta": [], "tool_calls": [],
                               "assistant_message": {"content": None}}
        if first:
            out["tool_calls"] = [{"name": "echo", "arguments": {"text": "hi"}}]
        else:
            out["assistant_message"] = {"content": "done"}
        return Generation(render_output(ModelOutput.model_validate(out), self.blocks),
                          Usage(prompt_tokens=1, completion_tokens=1))

    def count_tokens(self, text: str) -> int:
        return len(text.split())


def echo(text: str) -> str:
    """Echo the text."""
    return text


@pytest.mark.parametrize(("name", "down_from", "where"), [
    ("mem0-style", 1, "at the request's end"),  # extraction
    ("reasoningbank", 1, "at the request's end"),  # the judge
    ("mage", 1, "at the request's end"),  # Compress
    ("zipact", 2, "after step 1"),  # the tracker's update on the tool result (its first call, on the query, works)
])
def test_a_memory_methods_failed_call_persists_the_request_failed_and_the_session_goes_on(
        tmp_path: Path, name: str, down_from: int, where: str) -> None:
    strategy = get(name)
    engine = MemoryCallsDown(strategy.blocks, down_from)
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", tools=[echo], strategy=strategy)
        with pytest.raises(RequestFailed, match=f"memory method's call {where}: memory call down") as failed:
            agent.run("first")
        assert failed.value.persisted
        (request,) = repo.requests("s")
        assert request.response is None and request.unfinished is not None
        assert request.unfinished.startswith(FAILED) and "memory call down" in request.unfinished
        assert failed.value.record is not None and failed.value.record["steps"][0]["tool_calls"][0]["result"] == "hi"
        engine.down_from = 10**6  # the memory calls are back: the next request runs
        assert agent.run("second").response == "done"
        assert [r.index for r in repo.requests("s")] == [1, 2]


def test_an_evaluation_goes_on_past_a_memory_methods_failed_call(tmp_path: Path) -> None:
    strategy = get("mem0-style")
    config = EvalConfig(suites=("hotel",), strategies=(strategy.name,), tasks=2, depth=2, out=tmp_path / "ev")
    rows = run_eval(config, [MemoryCallsDown(strategy.blocks)])
    assert len(rows) == 2  # both tasks ran to their end
    errors = [s.error or "" for r in rows for s in r.subtasks]
    assert errors and all("memory call down" in e for e in errors)
