"""A request that runs out of its step budget: persisted unfinished (Algorithm 1 always ends with Persist),
marked so in the index, and seen by the next request — or, with on_budget="fail", nothing persisted."""

from __future__ import annotations

import pytest

from flowstate import RequestFailed
from flowstate.history import session_index
from flowstate.store.repository import Repository
from tests.helpers import AgentFactory, add, output


def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def test_budget_persists_the_states_and_marks_the_request_unfinished(make_agent: AgentFactory,
                                                                     repo: Repository) -> None:
    agent, engine = make_agent([
        output(tools=[{"name": "double", "arguments": {"x": 4}}]),
        output(delta=[add("kn_eight", refs=[("derives", "obs_r1_s1_1")]), add("plan_next")]),
        output(content="the next request answers"),
    ], max_steps=2, tools=[double])
    record = agent.run("double 4, then more")
    assert record.response is None and record.unfinished == "no final response within the step budget of 2 steps"
    assert record.persisted_states == ("kn_eight", "plan_next")
    assert record.persisted_observations == ("obs_r1_s1_1",)  # referenced by a state
    assert [r.unfinished for r in repo.requests("s1")] == [record.unfinished]
    line = session_index(repo, "s1").render()
    assert '"unfinished":"no final response within the step budget of 2 steps"' in line
    assert agent.run("what happened?").response == "the next request answers"
    assert '"unfinished":' in engine.prompts[-1][1].content  # the next request sees that request 1 failed and why


def test_unreferenced_observations_of_an_unfinished_request_are_not_kept(make_agent: AgentFactory,
                                                                         repo: Repository) -> None:
    agent, _ = make_agent([output(tools=[{"name": "double", "arguments": {"x": 1}}])], max_steps=1, tools=[double])
    record = agent.run("q")
    assert record.unfinished is not None and record.persisted_observations == () and repo.nodes("s1") == []
    assert repo.request_count("s1") == 1


def test_on_budget_fail_persists_nothing(make_agent: AgentFactory, repo: Repository) -> None:
    agent, _ = make_agent([output(delta=[add("k1")]), output(delta=[add("k2")])], max_steps=2, on_budget="fail")
    with pytest.raises(RequestFailed, match="step budget of 2") as info:
        agent.run("q")
    assert info.value.record is not None and len(info.value.record["steps"]) == 2
    assert repo.request_count("s1") == 0 and not repo.has_session("s1")


def test_an_unknown_on_budget_is_refused() -> None:
    from flowstate import LoopConfig

    with pytest.raises(ValueError, match="on_budget"):
        LoopConfig(on_budget="retry")  # type: ignore[arg-type]


def test_full_context_and_no_isu_persist_an_unfinished_request_too(repo: Repository) -> None:
    from engine.scripted import ScriptedEngine
    from flowstate import Agent, LoopConfig
    from flowstate.memory.chat import FULL_CONTEXT
    from flowstate.memory.state import NO_ISU
    from flowstate.protocol import ModelOutput, ToolCall, render_output

    for strategy in (FULL_CONTEXT, NO_ISU):
        call = ModelOutput(tool_calls=(ToolCall(name="double", arguments={"x": 2}),))
        agent = Agent(ScriptedEngine([render_output(call, strategy.blocks)]), repository=repo, session=strategy.name,
                      tools=[double], config=LoopConfig(max_steps=1), strategy=strategy)
        record = agent.run("q")
        assert record.unfinished is not None
        assert repo.requests(strategy.name)[0].unfinished == record.unfinished
    assert [n.id for n in repo.nodes("no-isu")][-1] == "response_r1"
    assert repo.node("no-isu", "response_r1").summary == "unfinished: no final response"  # type: ignore[union-attr]

