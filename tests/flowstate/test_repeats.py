"""Loops end: a call that repeats an earlier call of the request with the same arguments is refused (not run, its
earlier outcome shown again, feedback saying so); a request that keeps repeating ends unfinished as a loop, with
that reason persisted — in every strategy, through the one driver."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from flowstate.records import LOOPING
from flowstate.store.repository import Repository
from tests.helpers import AgentFactory, output, task_row

RUNS: list[dict[str, Any]] = []


def book(hotel: str) -> dict[str, Any]:
    """Book a hotel (a call with a side effect: running it twice books twice)."""
    RUNS.append({"hotel": hotel})
    return {"booking": f"BK-{hotel}-{len(RUNS)}"}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RUNS.clear()


def call(hotel: str) -> dict[str, Any]:
    return {"name": "book", "arguments": {"hotel": hotel}}


def test_a_repeated_call_is_not_run_and_the_next_step_is_told(make_agent: AgentFactory) -> None:
    agent, engine = make_agent([
        output(tools=[call("A")]),
        output(tools=[call("A")]),  # the same call again
        output(tools=[call("B")]),  # other arguments: run
        output(content="booked A and B"),
    ], tools=[book])
    record = agent.run("book A, then B")
    assert record.response == "booked A and B"
    assert RUNS == [{"hotel": "A"}, {"hotel": "B"}]  # the repeat booked nothing
    repeat = record.steps[1].tool_calls[0]
    assert repeat.repeat_of == "obs_r1_s1_1" and repeat.result == {"booking": "BK-A-1"}  # the earlier outcome
    assert record.steps[1].repeated == 1 and record.steps[2].repeated == 0
    third = engine.prompts[2][1].content  # the prompt after the refused step
    assert '"kind":"repeated_call"' in third and "not run" in third and '"repeat_of":"obs_r1_s1_1"' in third
    assert '"kind":"repeated_call"' not in engine.prompts[3][1].content  # told once, about that step only


def test_a_call_after_a_different_call_runs_again(make_agent: AgentFactory) -> None:
    """A, B, A: the world may have changed in between (a reservation read again after its update): run."""
    agent, _ = make_agent([output(tools=[call("A")]), output(tools=[call("B")]), output(tools=[call("A")]),
                           output(content="done")], tools=[book])
    record = agent.run("q")
    assert RUNS == [{"hotel": "A"}, {"hotel": "B"}, {"hotel": "A"}] and record.steps[2].repeated == 0


def read(reservation: str) -> dict[str, Any]:
    """Read a reservation (changes nothing)."""
    RUNS.append({"read": reservation})
    return {"reservation": reservation}


def lookups(*names: str) -> list[dict[str, Any]]:
    return [output(tools=[{"name": "read", "arguments": {"reservation": n}}]) for n in names]


def test_a_cycle_of_reads_is_refused_where_the_tool_is_declared_read_only(make_agent: AgentFactory) -> None:
    """A B C A B C A with read-only tools: a read made once more after other reads runs (an agent checking again, as
    τ³'s gold does), a third time it is a repeat (a model reading its reservations round and round: nothing between
    could have changed them); the same cycle of a tool not so declared runs every call."""
    from flowstate.tools import Tool

    reads = replace(Tool.from_function(read), read_only=True)
    agent, _ = make_agent([*lookups("A", "B", "C", "A", "B", "C", "A"), output(content="done")], tools=[reads])
    record = agent.run("q")
    assert RUNS == [{"read": n} for n in "ABCABC"]
    assert [s.repeated for s in record.steps] == [0, 0, 0, 0, 0, 0, 1, 0]
    assert [c.repeat_of for c in record.steps[6].tool_calls] == ["obs_r1_s4_1"]
    RUNS.clear()
    agent, _ = make_agent([*lookups("A", "B", "A", "B", "A"), output(content="done")], tools=[read])  # not declared
    assert sum(s.repeated for s in agent.run("q").steps) == 0 and len(RUNS) == 5


def test_a_read_after_a_write_between_runs_again(make_agent: AgentFactory) -> None:
    """A, book, A: the write may have changed what A reads, so A runs again though its tool is read-only."""
    from flowstate.tools import Tool

    reads = replace(Tool.from_function(read), read_only=True)
    agent, _ = make_agent([*lookups("A"), output(tools=[call("X")]), *lookups("A"), output(content="done")],
                          tools=[reads, book])
    assert sum(s.repeated for s in agent.run("q").steps) == 0 and RUNS == [{"read": "A"}, {"hotel": "X"}, {"read": "A"}]


def test_a_loop_of_parallel_calls_is_refused(make_agent: AgentFactory) -> None:
    """[A, B], [A, B], [A, B]: each later step is refused whole, its outcome the first step's."""
    agent, _ = make_agent([output(tools=[call("A"), call("B")])] * 3 + [output(content="done")], tools=[book])
    record = agent.run("q")
    assert RUNS == [{"hotel": "A"}, {"hotel": "B"}]
    assert [s.repeated for s in record.steps[:3]] == [0, 2, 2]
    assert [c.repeat_of for c in record.steps[2].tool_calls] == ["obs_r1_s1_1", "obs_r1_s1_2"]


def test_a_duplicate_within_one_step_runs_once(make_agent: AgentFactory) -> None:
    agent, _ = make_agent([output(tools=[call("A"), call("A")]), output(content="done")], tools=[book])
    record = agent.run("book A")
    assert RUNS == [{"hotel": "A"}]
    assert [c.repeat_of for c in record.steps[0].tool_calls] == [None, "obs_r1_s1_1"]
    assert record.steps[0].tool_calls[1].result == {"booking": "BK-A-1"}  # the outcome of the call it repeats


def test_a_request_that_keeps_repeating_ends_unfinished_as_a_loop(make_agent: AgentFactory, repo: Repository) -> None:
    agent, engine = make_agent([output(tools=[call("A")])] * 4 + [output(content="next")], tools=[book],
                               max_repeats=2, max_steps=16)
    record = agent.run("book A")
    assert record.response is None and record.unfinished is not None and record.unfinished.startswith(LOOPING)
    assert len(record.steps) == 4  # one run, then three refused repeats: the third exceeds max_repeats=2
    assert RUNS == [{"hotel": "A"}]
    assert repo.requests("s1")[0].unfinished == record.unfinished  # persisted with its reason
    assert agent.run("and now?").response == "next"  # the session goes on
    assert "looping" in engine.prompts[-1][1].content  # the index tells the next request why


def test_repeats_count_per_request_and_max_repeats_zero_ends_at_the_first(make_agent: AgentFactory) -> None:
    agent, _ = make_agent([output(tools=[call("A")]), output(content="one"),
                           output(tools=[call("A")]), output(tools=[call("A")]), output(content="never")],
                          tools=[book], max_repeats=0)
    assert agent.run("q1").response == "one"
    second = agent.run("q2")  # A again, but in a new request: run; its repeat ends the request at once
    assert RUNS == [{"hotel": "A"}, {"hotel": "A"}]
    assert second.response is None and (second.unfinished or "").startswith(LOOPING) and len(second.steps) == 2


def test_a_negative_max_repeats_is_refused() -> None:
    from flowstate import LoopConfig

    with pytest.raises(ValueError, match="max_repeats"):
        LoopConfig(max_repeats=-1)


@pytest.mark.parametrize("name", ["full-context", "no-isu", "no-psa", "bm25", "mage", "zipact"])
def test_every_strategy_ends_a_loop(name: str, repo: Repository) -> None:
    from engine.scripted import ScriptedEngine
    from flowstate import Agent, LoopConfig
    from flowstate.memory import get
    from flowstate.protocol import ModelOutput, ToolCall, render_output

    strategy = get(name)
    text = render_output(ModelOutput(tool_calls=(ToolCall(name="book", arguments={"hotel": "A"}),)), strategy.blocks)
    engine = ScriptedEngine([text] * 40)  # mage, zipact: their own calls need no script (none of theirs runs here)
    agent = Agent(engine, repository=repo, session=name, tools=[book], config=LoopConfig(max_steps=16),
                  strategy=strategy)
    record = agent.run("book A")
    assert (record.unfinished or "").startswith(LOOPING), record.unfinished
    assert RUNS == [{"hotel": "A"}]


def test_the_report_counts_repeated_calls_and_loops() -> None:
    from flowstate.eval.metrics import cost

    def sub(tool_calls: int, repeated: int, error: str | None) -> dict[str, Any]:
        return {"usage": {"prompt_tokens": 1, "cached_tokens": 0, "completion_tokens": 1}, "steps": 1,
                "parse_failures": 0, "rejected": 0, "response": None if error else "ok", "error": error,
                "tool_calls": tool_calls, "repeated_calls": repeated}

    rows = [task_row([sub(3, 2, LOOPING + "3 calls"), sub(0, 0, None)]),
            task_row([sub(1, 0, "no final response within the step budget of 16 steps")])]
    c = cost(rows)
    assert (c["tool_calls"], c["repeated_calls"], c["loops"], c["budget_ends"]) == (4, 2, 1, 1)
    assert c["tool_use"] == pytest.approx(2 / 3)
    older = [task_row([{k: v for k, v in sub(1, 0, None).items() if k not in ("tool_calls", "repeated_calls")}])]
    assert cost(older)["repeated_calls"] == 0 and cost(older)["tool_calls"] is None  # rows of older runs count none


def test_the_step_after_a_refused_repeat_holds_its_calls(repo: Repository) -> None:
    """Under a grammar, the step after one whose every call was refused as a repeat may answer or record, but not
    call (a model that copies its last step is steered out of the loop); the step after that may call again."""
    from engine.scripted import ScriptedEngine
    from flowstate import Agent, LoopConfig
    from grammars.check import accepts

    engine = ScriptedEngine([output(tools=[call("A")]), output(tools=[call("A")]), output(delta=[{
        "operation": "add", "state_set": "knowledge", "state_id": "booked", "summary": "A booked", "value": {},
        "refs": []}]), output(tools=[call("B")]), output(content="done")], grammar=True)
    agent = Agent(engine, repository=repo, session="s", tools=[book], config=LoopConfig())
    assert agent.run("book A, then B").response == "done"
    grammars = [c["grammar"] for c in engine.calls]
    a_call, answer = output(tools=[call("C")]), output(content="ok")
    assert accepts(grammars[1], a_call)  # after a call that ran: calls allowed
    assert not accepts(grammars[2], a_call) and accepts(grammars[2], answer)  # after the refused repeat: held
    assert accepts(grammars[3], a_call)  # after a step that called nothing: calls again


def test_after_max_repeats_refused_the_next_step_must_answer(repo: Repository) -> None:
    """Once max_repeats repeats were refused, the next step decides as the step budget's last one does: it answers
    (under a grammar a looping model cannot run a request to its budget)."""
    from engine.scripted import ScriptedEngine
    from flowstate import Agent, LoopConfig
    from grammars.check import accepts

    note = {"operation": "add", "state_set": "knowledge", "state_id": "note", "summary": "s", "value": {}, "refs": []}
    engine = ScriptedEngine([output(tools=[call("A")]), output(tools=[call("A")]), output(delta=[note]),
                             output(tools=[call("A")]), output(content="A is booked")], grammar=True)
    agent = Agent(engine, repository=repo, session="s", tools=[book], config=LoopConfig(max_repeats=2))
    record = agent.run("book A")
    assert record.response == "A is booked" and RUNS == [{"hotel": "A"}]
    last = engine.calls[-1]["grammar"]
    wait = output(delta=[dict(note, state_id="other")])
    assert accepts(last, output(content="ok")) and not accepts(last, wait)
    assert not accepts(last, output(tools=[call("C")]))
    assert accepts(engine.calls[2]["grammar"], wait)  # after the first refused repeat it could still record


def test_under_a_grammar_a_loop_is_answered_not_ended(repo: Repository) -> None:
    """Past max_repeats under a grammar the request is not cut off: its next step must answer (a step of a
    new call and a repeat is not held, so repeats can pass max_repeats before a step holds)."""
    from engine.scripted import ScriptedEngine
    from flowstate import Agent, LoopConfig
    from grammars.check import accepts

    engine = ScriptedEngine([output(tools=[call("A"), call("A")]), output(tools=[call("A"), call("A")]),
                             output(content="A is booked")], grammar=True)
    agent = Agent(engine, repository=repo, session="s", tools=[book], config=LoopConfig(max_repeats=2))
    record = agent.run("book A")
    assert record.response == "A is booked" and record.unfinished is None and RUNS == [{"hotel": "A"}]
    assert not accepts(engine.calls[-1]["grammar"], output(tools=[call("C")]))  # the answer was forced
