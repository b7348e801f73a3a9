"""The retrieval baselines on the strategy seam: BM25 over earlier requests, Mem0-style extracted memories."""

from __future__ import annotations

import json
from pathlib import Path

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.memory.retrieval import BM25, EXTRACT, MEM0_STYLE, TOP_K, rank


def output(content: str) -> str:
    """An answer in the two-block protocol the retrieval baselines use."""
    return f"<tool_calls>\n[]\n</tool_calls>\n<assistant_message>\n{json.dumps({'content': content})}\n</assistant_message>"


def test_rank_keeps_the_most_similar_documents_in_their_order() -> None:
    docs = [f"booking of hotel {name} in {city}" for name, city in
            [("alder", "lisbon"), ("birch", "porto"), ("cedar", "seville"), ("dune", "ghent"), ("elm", "bologna"),
             ("fjord", "valencia"), ("grove", "lisbon")]]
    chosen = rank(docs, "what did the lisbon hotel cost?", k=2)
    assert chosen == [0, 6]  # the two Lisbon bookings, oldest first
    assert rank(docs[:3], "anything", k=TOP_K) == [0, 1, 2]  # no more than k: all of them
    assert rank(docs, "zzz qqq", k=3) == [4, 5, 6]  # nothing in common: the most recent


def test_bm25_shows_only_the_retrieved_requests(tmp_path: Path) -> None:
    engine = ScriptedEngine([output(content=f"noted {i}") for i in range(1, 9)])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=BM25)
        for topic in ["apples", "pears", "plums", "figs", "limes", "kiwis", "dates"]:
            agent.run(f"remember {topic}")
        agent.run("what about the figs?")
    prompt = engine.prompts[-1][1].content
    memory = prompt.split("<retrieved_memory>")[1].split("</retrieved_memory>")[0]
    assert memory.count('"user_query"') == TOP_K and '"remember figs"' in memory
    assert "<active_state>" not in prompt and "<state_delta>" not in engine.prompts[-1][0].content


def test_mem0_style_extracts_with_a_model_call_that_counts_and_keeps_only_its_facts(tmp_path: Path) -> None:
    engine = ScriptedEngine([
        output(content="Booked Alder at 120."), '{"facts": ["Hotel Alder was booked at 120 per night."]}',
        output(content="It was 120."), "not JSON at all",
    ])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=MEM0_STYLE)
        first = agent.run("Book Alder.")
        second = agent.run("What did the hotel cost?")
        nodes = repo.nodes("s")
    assert [c.raw for c in first.memory_calls] == ['{"facts": ["Hotel Alder was booked at 120 per night."]}']
    assert engine.prompts[1][0].content.startswith(EXTRACT)  # the extraction call, after the answer
    assert first.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in (*first.steps, *first.memory_calls))
    assert "Hotel Alder was booked at 120 per night." in engine.prompts[2][1].content  # in <memories> next time
    assert [n.id for n in nodes] == ["mem_r1_1"]  # no tool results, no states: only memories cross requests
    assert second.memory_calls[0].protocol_error is not None and second.persisted_states == ()


def test_memory_calls_count_in_the_evaluation(tmp_path: Path) -> None:
    rows = run_eval(EvalConfig(suites=("chain",), strategies=("mem0-style", "bm25"), tasks=1, depth=3, out=tmp_path,
                               policy="oracle"), [])
    by = {r["strategy"]: r for r in rows}
    assert all(s["memory_calls"] == 1 for s in by["mem0-style"]["subtasks"])
    assert all(s["memory_calls"] == 0 for s in by["bm25"]["subtasks"])
    mem0 = by["mem0-style"]["subtasks"][0]
    assert len(mem0["calls"]) == mem0["steps"] + 1  # the extraction call is one more call, with its tokens


def test_zipact_acts_on_a_tracked_state_updated_by_its_own_calls(tmp_path: Path) -> None:
    from flowstate.memory.tracker import TRACK, ZIPACT

    tool = '<tool_calls>\n[{"name": "echo", "arguments": {"x": 7}}]\n</tool_calls>\n<assistant_message>\n{"content": null}\n</assistant_message>'
    engine = ScriptedEngine([
        tool, '{"goal": "echo", "world": {"x": 7}, "constraints": []}', output("x is 7"),
        output("x was 7"),
    ])

    def echo(x: int) -> int:
        """Return x."""
        return x

    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=ZIPACT, tools=[echo])
        first = agent.run("Echo 7.")
        agent.run("What was x?")
        nodes = repo.nodes("s")
    assert engine.prompts[1][0].content.startswith(TRACK) and len(first.memory_calls) == 1
    assert '"world":{"x":7}' in engine.prompts[2][1].content  # the agent sees the tracked state ...
    assert "<trajectory>" not in engine.prompts[2][1].content  # ... and not the history
    assert '"world":{"x":7}' in engine.prompts[3][1].content  # the state carries over to the next request
    assert [n.id for n in nodes] == ["zipact_r1", "zipact_r2"]  # one state per request, no tool results


def test_the_report_sets_every_strategy_against_full_context(tmp_path: Path) -> None:
    from flowstate.eval.report import markdown, summarize

    config = EvalConfig(suites=("hotel", "shopping"), strategies=("flowstate", "full-context", "bm25", "zipact"),
                        tasks=1, depth=3, out=tmp_path, policy="oracle")
    text = markdown(summarize(run_eval(config, []), config))
    overview = text.split("## Every strategy against full-context")[1].split("## hotel")[0]
    rows = {line.split(" | ")[0].strip("| "): line for line in overview.splitlines() if line.startswith("| ")}
    assert set(rows) >= {"flowstate", "full-context", "bm25", "zipact"}
    assert "(+0.0," in rows["zipact"] and "%)" in rows["zipact"] and rows["full-context"].endswith("| – |")


def test_a_methods_nodes_are_known_by_their_mark_not_by_an_id_a_model_could_write(repo: Repository) -> None:
    from flowstate.memory.mage import load_tree
    from flowstate.memory.retrieval import MEM0_STYLE
    from flowstate.memory.tracker import ZIPACT, tracked
    from flowstate.nodes import Node, StateType

    # states a model made under another strategy, with the ids the methods give their own nodes
    lookalikes = [Node(id=i, type=StateType.KNOWLEDGE, summary="a model's state", value={"fact": "x", "step": 1,
                                                                                         "goal": "fake", "world": {}},
                       request=1) for i in ("mem_r1_1", "zipact_r1", "mage_s1")]
    repo.persist_request("s", 1, "q", "r", lookalikes, {})
    assert MEM0_STYLE.start(repo, "s").documents == ()  # no fact
    assert tracked(ZIPACT.start(repo, "s").state)["goal"] == ""  # no tracked state
    assert load_tree(repo.nodes("s")).summaries == {}  # no summary
