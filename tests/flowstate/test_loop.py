"""The execution loop (Algorithm 1) on the scripted engine: feedback, failures, tools, persistence."""

from __future__ import annotations

import pytest

from engine.errors import EngineError
from flowstate import RequestFailed
from flowstate.records import FAILED
from tests.helpers import AgentFactory, add, output


def boom(x: int) -> int:
    """A tool that always raises."""
    raise RuntimeError(f"tool exploded on {x}")


def double(x: int) -> int:
    """Double a number."""
    return 2 * x


def test_rejected_operations_and_refused_access_are_fed_back(make_agent: AgentFactory) -> None:
    agent, engine = make_agent([
        output(delta=[{"operation": "remove", "state_id": "ghost"}], focus=["nowhere"]),
        output(content="done"),
    ])
    record = agent.run("q")
    assert record.steps[0].rejected == [{"operation": "remove", "state_id": "ghost",
                                         "reason": "no state 'ghost' was created in this request"}]
    assert record.steps[0].refused[0]["target_id"] == "nowhere"
    second_prompt = engine.prompts[1][1].content
    feedback = second_prompt.split("<feedback>")[1].split("</feedback>")[0]
    assert '"kind":"rejected"' in feedback and '"state_id":"ghost"' in feedback
    assert '"kind":"refused_access"' in feedback and '"target_id":"nowhere"' in feedback
    assert "<feedback>" not in engine.prompts[0][1].content


def test_protocol_error_is_fed_back_and_the_loop_goes_on(make_agent: AgentFactory, repo) -> None:
    agent, engine = make_agent(["I think I should book.", output(delta=[add("k1")], content="ok")])
    record = agent.run("q")
    assert record.response == "ok"
    assert record.steps[0].protocol_error == {"block": "state_focus",
                                              "message": "missing <state_focus> (blocks must come in the order "
                                                         "state_focus, state_delta, tool_calls, assistant_message)"}
    assert '"kind":"protocol_error"' in engine.prompts[1][1].content
    assert [n.id for n in repo.nodes("s1")] == ["k1"]


def test_consecutive_protocol_errors_fail_the_request_and_persist_it_unfinished(make_agent: AgentFactory, repo) -> None:
    agent, engine = make_agent([
        output(tools=[{"name": "double", "arguments": {"x": 4}}]),
        output(delta=[add("k1", refs=[("supports", "obs_r1_s1_1")])]), "bad", "worse", "worst",
        output(focus=["k1"]), output(content="from k1"),
    ], tools=[double], max_protocol_errors=3)
    with pytest.raises(RequestFailed, match="3 consecutive outputs broke the protocol") as info:
        agent.run("q")
    assert info.value.record is not None and len(info.value.record["steps"]) == 5
    # Algorithm 1 ends with Persist: the states and the tool results they cite are kept, marked unfinished
    [request] = repo.requests("s1")
    assert request.response is None and request.unfinished is not None
    assert request.unfinished.startswith(FAILED) and "3 consecutive outputs" in request.unfinished
    assert {n.id for n in repo.nodes("s1")} == {"k1", "obs_r1_s1_1"}
    # the next request has its own k and reaches the failed one's state through the index
    record = agent.run("what was it?")
    assert record.request == 2 and record.response == "from k1"
    index = engine.prompts[5][1].content.split("<historical_state_index>")[1]
    assert '"query_id":1' in index and "unfinished" in index and '"state_id":"k1"' in index


def test_step_budget_with_on_budget_fail_fails_the_request_and_persists_nothing(make_agent: AgentFactory, repo) -> None:
    agent, _ = make_agent([output(delta=[add(f"k{i}")]) for i in range(3)], max_steps=3, on_budget="fail")
    with pytest.raises(RequestFailed, match="step budget of 3"):
        agent.run("q")
    assert repo.request_count("s1") == 0


def test_engine_error_fails_the_request_and_persists_it_unfinished(make_agent: AgentFactory, repo) -> None:
    agent, _ = make_agent([output(delta=[add("k1")])])  # exhausted at step 2
    with pytest.raises(RequestFailed, match="engine error at step 2") as info:
        agent.run("q")
    assert isinstance(info.value.__cause__, EngineError)
    [request] = repo.requests("s1")
    assert request.unfinished is not None and request.unfinished.startswith(FAILED + "engine error at step 2")
    assert [n.id for n in repo.nodes("s1")] == ["k1"]


def test_several_tool_calls_per_step_and_a_raising_tool(make_agent: AgentFactory, repo) -> None:
    agent, engine = make_agent(
        [
            output(tools=[{"name": "double", "arguments": {"x": 4}}, {"name": "boom", "arguments": {"x": 1}},
                          {"name": "nope", "arguments": {}}, {"name": "double", "arguments": {"x": "many"}}]),
            output(delta=[add("kn_eight", refs=[("derives", "obs_r1_s1_1")]),
                          add("kn_fail", refs=[("derives", "obs_r1_s1_2")])],
                   content="8"),
        ],
        tools=[double, boom],
    )
    record = agent.run("double 4")
    calls = [c.to_dict() for c in record.steps[0].tool_calls]
    assert calls[0] == {"name": "double", "arguments": {"x": 4}, "observation_id": "obs_r1_s1_1", "result": 8}
    assert calls[1]["error"] == "RuntimeError: tool exploded on 1"
    assert calls[2]["error"].startswith("unknown tool 'nope'; available: double, boom")
    assert calls[3]["error"].startswith("invalid arguments for double: x:")
    observation = engine.prompts[1][1].content.split("<latest_observation>")[1]
    assert '"observation_id":"obs_r1_s1_1"' in observation and '"result":8' in observation
    assert '"observation_id":"obs_r1_s1_4"' in observation
    # Persist keeps referenced observations only
    assert record.to_dict()["persisted"] == {"states": ["kn_eight", "kn_fail"],
                                             "observations": ["obs_r1_s1_1", "obs_r1_s1_2"]}
    stored = {n.id: n for n in repo.nodes("s1")}
    assert set(stored) == {"kn_eight", "kn_fail", "obs_r1_s1_1", "obs_r1_s1_2"}
    assert stored["obs_r1_s1_2"].value["error"] == "RuntimeError: tool exploded on 1"


def test_latest_observation_is_only_the_previous_steps(make_agent: AgentFactory) -> None:
    agent, engine = make_agent(
        [output(tools=[{"name": "double", "arguments": {"x": 1}}]), output(delta=[add("k")]), output(content="x")],
        tools=[double],
    )
    agent.run("q")
    assert "obs_r1_s1_1" in engine.prompts[1][1].content
    assert "<latest_observation>\nnone\n</latest_observation>" in engine.prompts[2][1].content


def test_disclosed_content_is_visible_from_the_next_step_and_same_step_refs_do_not_open_access(
        make_agent: AgentFactory) -> None:
    first, _ = make_agent([
        output(tools=[{"name": "double", "arguments": {"x": 21}}]),
        output(delta=[add("dec_x", "judgement", refs=[("supports", "obs_r1_s1_1")], answer=42)], content="42"),
    ], tools=[double])
    first.run("q1")
    second, engine = make_agent([
        # access dec_x, and in the same step ask for its evidence, which is not yet referenced by S_2,1
        output(focus=["dec_x", "obs_r1_s1_1"]),
        output(focus=["obs_r1_s1_1"]),
        output(delta=[add("dec_y", "judgement", refs=[("supersedes", "dec_x")])], content="still 42"),
    ], tools=[double])
    record = second.run("q2")
    assert record.steps[0].disclosed == ["dec_x"]
    assert record.steps[0].refused[0]["target_id"] == "obs_r1_s1_1"
    assert record.steps[1].disclosed == ["obs_r1_s1_1"]
    active = [p[1].content.split("<active_state>")[1].split("</active_state>")[0] for p in engine.prompts]
    assert active[0] == "\n"
    assert '"answer":42' in active[1] and '"result":42' not in active[1]  # relation only, not the neighbour
    assert '"result":42' in active[2]


def test_historical_states_cannot_be_changed_through_the_loop(make_agent: AgentFactory, repo) -> None:
    first, _ = make_agent([output(delta=[add("pref_a", "preference", budget=100)], content="noted")])
    first.run("q1")
    before = repo.nodes("s1")
    second, _ = make_agent([
        output(focus=["pref_a"]),
        output(delta=[{"operation": "update", "state_id": "pref_a", "value": {"budget": 1}},
                      {"operation": "remove", "state_id": "pref_a"},
                      add("pref_a", "preference"),
                      add("pref_b", "preference", refs=[("supersedes", "pref_a")], budget=1)], content="ok"),
    ])
    record = second.run("q2")
    assert [r["operation"] for r in record.steps[1].rejected] == ["update", "remove", "add"]
    assert repo.nodes("s1")[: len(before)] == before
    assert repo.nodes("s1")[-1].id == "pref_b"


def test_agent_defaults_to_the_embedded_engine(monkeypatch: pytest.MonkeyPatch, repo) -> None:
    import engine
    from engine.scripted import ScriptedEngine
    from flowstate import Agent

    asked: list[str] = []

    def fake_load(name: str, **options: object) -> ScriptedEngine:
        asked.append(name)
        return ScriptedEngine([output(content="hi")])

    monkeypatch.setattr(engine, "load", fake_load)
    agent = Agent(repository=repo, session="s")
    assert asked == ["llamacpp"] and agent.run("q").response == "hi"


def test_a_malformed_item_is_fed_back_and_the_rest_of_the_step_stands(make_agent: AgentFactory, repo) -> None:
    raw = output(delta=[add("kn_good")]).replace(
        '[{"operation": "add"', '[{"operation": "upsert", "state_id": "kn_bad"}, {"operation": "add"')
    agent, engine = make_agent([raw, output(content="done")])
    record = agent.run("q")
    assert record.steps[0].protocol_error is None
    assert [op["state_id"] for op in record.steps[0].committed] == ["kn_good"]
    assert record.steps[0].malformed[0]["id"] == "kn_bad" and record.steps[0].malformed[0]["block"] == "state_delta"
    feedback = engine.prompts[1][1].content.split("<feedback>")[1]
    assert '"kind":"malformed"' in feedback and '"id":"kn_bad"' in feedback
    assert [n.id for n in repo.nodes("s1")] == ["kn_good"]


def test_a_truncated_output_is_reported_as_truncation_and_the_model_is_told_to_be_shorter(
        make_agent: AgentFactory) -> None:
    cut = output(delta=[add("kn_a")])[:60]
    agent, engine = make_agent([(cut, None, "length"), "not the protocol", output(content="done")])
    record = agent.run("q")
    first, second = record.steps[0], record.steps[1]
    assert first.truncated and first.protocol_error is not None
    assert not second.truncated and second.protocol_error is not None  # a plain protocol error
    assert '"kind":"truncated"' in engine.prompts[1][1].content and "shorter" in engine.prompts[1][1].content
    assert '"kind":"protocol_error"' in engine.prompts[2][1].content
    assert record.to_dict()["steps"][0]["truncated"] is True
