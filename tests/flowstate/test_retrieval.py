"""The retrieval baselines on the strategy seam: BM25 over earlier requests, Mem0-style extracted memories."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.memory.chat import FULL_CONTEXT
from flowstate.memory.ranking import okapi, words
from flowstate.memory.retrieval import BM25, MEM0_STYLE, TOP_K, entries, rank
from flowstate.tags import EXTRACT, UPDATE


def output(content: str) -> str:
    """An answer in the two-block protocol the retrieval baselines use."""
    return (f"<tool_calls>\n[]\n</tool_calls>\n<assistant_message>\n{json.dumps({'content': content})}\n"
            "</assistant_message>")


def test_rank_keeps_the_most_similar_documents_in_their_order() -> None:
    docs = [f"booking of hotel {name} in {city}" for name, city in
            [("alder", "lisbon"), ("birch", "porto"), ("cedar", "seville"), ("dune", "ghent"), ("elm", "bologna"),
             ("fjord", "valencia"), ("grove", "lisbon")]]
    chosen = rank(docs, "what did the lisbon hotel cost?", k=2)
    assert chosen == [0, 6]  # the two Lisbon bookings, oldest first
    assert rank(docs[:3], "anything", k=TOP_K) == [0, 1, 2]  # no more than k: all of them
    assert rank(docs, "zzz qqq", k=3) == [4, 5, 6]  # nothing in common: the most recent


def test_bm25_ranks_as_memoryarenas_rag_memory() -> None:
    """BM25Okapi on lower-cased [a-z0-9]+ words, the top 3 best first whatever their score (MemoryArena's
    RAGMemorySystem); one entry per earlier request, cut only past 2,048 tokens."""
    from rank_bm25 import BM25Okapi

    assert words("Hotel-ALDER, room #12; café") == ["hotel", "alder", "room", "12", "caf"]
    docs = ["alder lisbon 120", "birch porto 90", "alder porto 95", "cedar seville 80", "dune ghent 70"]
    chosen = okapi(docs, "the Alder in Porto")
    scores = BM25Okapi([words(d) for d in docs]).get_scores(words("the Alder in Porto"))
    assert chosen == sorted(range(5), key=lambda i: -scores[i])[:3] and chosen[0] == 2  # both words first
    assert len(okapi(docs, "nothing shared")) == 3 and okapi(docs, "!!!") == [] and okapi([], "alder") == []

    from flowstate.store.repository import RequestRow

    def row(i: int, query: str) -> RequestRow:
        return RequestRow(index=i, query=query, response="done")

    short, long = row(1, "book alder"), row(2, "x" * 9000)
    pieces = entries([short, long], [])
    assert pieces[0].startswith('{"query_id":1') and len(pieces) == 3  # 9,000 characters > 2,048 × 4: two pieces
    assert [len(p) for p in pieces[1:]] == [8192, len(pieces[1] + pieces[2]) - 8192]


def test_bm25_shows_only_the_retrieved_chunks_fewer_than_full_context(tmp_path: Path) -> None:
    """At depth 6 (five earlier requests, each with a page-sized tool result) BM25 retrieves TOP_K chunks of the
    history, not every earlier request, while full context shows them all."""
    topics = ["apples", "pears", "plums", "figs", "limes"]

    def catalog(fruit: str) -> str:
        """A page about a fruit."""
        return f"{fruit} page: " + " ".join(f"{fruit}-item-{i} costs {i}" for i in range(40))

    def script() -> list[str]:
        out = []
        for topic in topics:
            out += [f'<tool_calls>\n[{{"name": "catalog", "arguments": {{"fruit": "{topic}"}}}}]\n</tool_calls>\n'
                    '<assistant_message>\n{"content": null}\n</assistant_message>', output(content=f"noted {topic}")]
        return [*out, output(content="the figs")]

    shown = {}
    for strategy in (BM25, FULL_CONTEXT):
        engine = ScriptedEngine(script())
        with Repository.open(tmp_path / f"{strategy.name}.db") as repo:
            agent = Agent(engine, repository=repo, session="s", strategy=strategy, tools=[catalog])
            for topic in topics:
                agent.run(f"remember the {topic}")
            agent.run("what about the figs?")
        if strategy is BM25:
            memory = engine.prompts[-1][1].content.split("<retrieved_memory>")[1].split("</retrieved_memory>")[0]
        else:  # full context is the chat itself
            memory = "".join(m.content for m in engine.prompts[-1][1:])
        shown[strategy.name] = {t for t in topics if f"{t} page" in memory}
    assert shown["full-context"] == set(topics)
    assert "figs" in shown["bm25"] and len(shown["bm25"]) < len(topics)


def test_mem0_style_extracts_with_a_model_call_that_counts_and_keeps_only_its_facts(tmp_path: Path) -> None:
    added = '{"memory": [{"id": "0", "text": "Hotel Alder was booked at 120 per night.", "event": "ADD"}]}'
    engine = ScriptedEngine([
        output(content="Booked Alder at 120."), '{"facts": ["Hotel Alder was booked at 120 per night."]}', added,
        output(content="It was 120."), "not JSON at all",
    ])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=MEM0_STYLE)
        first = agent.run("Book Alder.")
        second = agent.run("What did the hotel cost?")
        nodes = repo.nodes("s")
    assert [c.raw for c in first.memory_calls] == ['{"facts": ["Hotel Alder was booked at 120 per night."]}', added]
    assert engine.prompts[1][0].content.startswith(EXTRACT)  # the extraction call, after the answer
    assert "Personal Information Organizer" in engine.prompts[1][0].content  # Mem0's released prompt
    assert engine.prompts[1][1].content.startswith("Input:\n")
    assert (engine.prompts[2][0].content.startswith(UPDATE)
            and "Current memory is empty." in engine.prompts[2][1].content)
    assert first.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in (*first.steps, *first.memory_calls))
    assert "Hotel Alder was booked at 120 per night." in engine.prompts[3][1].content  # in <memories> next time
    assert [n.id for n in nodes] == ["mem_r1_1"]  # no tool results, no states: only memories cross requests
    assert second.memory_calls[0].protocol_error is not None and second.persisted_states == ()


def test_mem0_update_phase_adds_updates_deletes_and_fails_open(tmp_path: Path) -> None:
    from flowstate.memory.retrieval import live_memories

    def update(*events: tuple[str, str, str]) -> str:
        return json.dumps({"memory": [{"event": e, "id": i, "text": t} for e, i, t in events]})

    engine = ScriptedEngine([
        output("ok"), '{"facts": ["Alder costs 120.", "The user likes quiet rooms."]}',
        update(("ADD", "0", "Alder costs 120."), ("ADD", "1", "The user likes quiet rooms.")),
        output("ok"), '{"facts": ["Alder costs 140 now.", "The user no longer cares about noise."]}',
        # Mem0's temporary ids: "0" and "1" are the memories shown, in order; "7" was not shown (dropped)
        update(("UPDATE", "0", "Alder costs 140."), ("DELETE", "1", ""), ("ADD", "new", "x"), ("DELETE", "7", "")),
        output("ok"), '{"facts": ["Birch costs 90."]}', "no JSON here",
        output("ok"), '{"facts": []}',
    ])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=MEM0_STYLE)
        first = agent.run("Book Alder.")
        second = agent.run("Alder again.")
        third = agent.run("Birch?")
        agent.run("What do you remember?")
        live = {n.value["fact"] for n in live_memories(repo.nodes("s"))}
    assert len(first.memory_calls) == 2 and "Current memory is empty." in engine.prompts[2][1].content
    assert len(second.memory_calls) == 2 and engine.prompts[5][0].content.startswith(UPDATE)
    # the similar memories, as Mem0 shows them
    assert '{"id": "0", "text": "Alder costs 120."}' in engine.prompts[5][1].content
    assert second.memory_calls[1].protocol_error["message"] == "1 decision(s) dropped: unknown event or id"
    assert third.memory_calls[1].protocol_error is not None  # an unreadable update adds the facts: nothing is lost
    assert live == {"Alder costs 140.", "x", "Birch costs 90."}
    shown = engine.prompts[-2][1].content.split("<memories>")[1]
    assert "Alder costs 120." not in shown and "quiet rooms" not in shown and "Alder costs 140." in shown


def test_memory_calls_count_in_the_evaluation(tmp_path: Path) -> None:
    rows = run_eval(EvalConfig(suites=("chain",), strategies=("mem0-style", "bm25"), tasks=1, depth=3, out=tmp_path,
                               policy="oracle"), [])
    by = {r.strategy: r for r in rows}
    # extraction; then, once memories are stored, the update phase's call too
    assert [s.memory_calls for s in by["mem0-style"].subtasks] == [2, 2, 2]
    assert all(s.memory_calls == 0 for s in by["bm25"].subtasks)
    mem0 = by["mem0-style"].subtasks[0]
    assert len(mem0.calls) == mem0.steps + 2  # the extraction and update calls are two more, with their tokens


def test_zipact_tracks_the_query_every_tool_result_and_the_final_response(tmp_path: Path) -> None:
    from flowstate.memory.tracker import TRACK, ZIPACT

    def state(goal: str, **world: Any) -> str:
        return json.dumps({"goal": goal, "world": world, "constraints": []})

    tool = ('<tool_calls>\n[{"name": "echo", "arguments": {"x": 7}}]\n</tool_calls>\n<assistant_message>\n{"content": '
            'null}\n</assistant_message>')
    engine = ScriptedEngine([
        state("echo 7"), tool, state("echo", x=7), output("x is 7"), state("echo", x=7, told="x is 7"),
        state("recall x", x=7, told="x is 7"), output("x was 7"), state("recall x", x=7, told="x was 7"),
    ])

    def echo(x: int) -> int:
        """Return x."""
        return x

    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=ZIPACT, tools=[echo])
        first = agent.run("Echo 7.")
        agent.run("What was x?")
        nodes = repo.nodes("s")
    tracker = [i for i, (system, _) in enumerate(engine.prompts) if system.content.startswith(TRACK)]
    assert tracker == [0, 2, 4, 5, 7] and len(first.memory_calls) == 3  # query, tool result, response
    assert "<new_observation>" in engine.prompts[2][1].content and "<response>\nx is 7" in engine.prompts[4][1].content
    assert '"world":{"x":7}' in engine.prompts[3][1].content  # the agent sees the tracked state ...
    assert "<trajectory>" not in engine.prompts[3][1].content  # ... and not the history
    assert '"told":"x is 7"' in engine.prompts[5][1].content  # the state after the response carries over
    assert '"goal":"recall x"' in engine.prompts[6][1].content  # the next query was tracked before acting
    assert [n.id for n in nodes] == ["zipact_r1", "zipact_r2"]  # one state per request, no tool results


def test_zipact_bm25_shows_the_tracked_state_and_retrieved_chunks(tmp_path: Path) -> None:
    from flowstate.memory.tracker import ZIPACT_BM25

    def catalog(fruit: str) -> str:
        """A page about a fruit."""
        return f"{fruit} page: the {fruit} cost 3"

    tool = ('<tool_calls>\n[{"name": "catalog", "arguments": {"fruit": '
            '"figs"}}]\n</tool_calls>\n<assistant_message>\n{"content": null}\n</assistant_message>')
    tracker = [(json.dumps({"goal": "g", "world": {}, "constraints": []}), "<track_state>")] * 5
    engine = ScriptedEngine([*tracker, (tool, "remember the figs"), (output("noted"), "figs page"),
                             (output("3"), "what did")])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=ZIPACT_BM25, tools=[catalog])
        agent.run("remember the figs")
        agent.run("what did the figs cost?")
        assert any(n.is_observation for n in repo.nodes("s"))  # the history BM25 retrieves from is kept
    last = next(u.content for s, u in reversed(engine.prompts) if "<retrieved_memory>" in u.content)
    assert "<tracked_state>" in last and "figs page: the figs cost 3" in last.split("<retrieved_memory>")[1]


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
    assert MEM0_STYLE.start(repo.view("s")).documents == ()  # no fact
    assert tracked(ZIPACT.start(repo.view("s")).state)["goal"] == ""  # no tracked state
    assert load_tree(repo.nodes("s")).summaries == {}  # no summary


def test_reasoningbank_judges_distils_strategies_and_retrieves_the_closest(tmp_path: Path) -> None:
    """As MemoryArena's ReasoningBankMemorySystem: a success/fail judge, the released extraction instruction for
    the verdict, Markdown memory items, one record per request; the top 5 records by their trajectory, best
    first; strategies, not the earlier requests' facts."""
    from flowstate.memory.reasoning import DISTILL, JUDGE, REASONINGBANK, TOP_K

    def items(*titles: str) -> str:
        return "\n\n".join(f"# Memory Item {i}\n## Title {t}\n## Description {t} described.\n## Content How to {t}."
                            for i, t in enumerate(titles, 1))

    engine = ScriptedEngine([
        output("Booked."), "success", items("book a room", "check the price first"),
        output("Paid."), "unsure", items("pay a bill"),
        output("Done."), "fail", "no items here",
        output("ok"), "success", items("x"),
    ])
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=REASONINGBANK)
        first = agent.run("Book a hotel room in Lisbon for 120.")
        second = agent.run("Pay the restaurant bill.")
        third = agent.run("Cancel the taxi.")
        agent.run("Book another hotel room, in Porto.")
        nodes = repo.nodes("s")
    assert engine.prompts[1][0].content.startswith(JUDGE) and engine.prompts[2][0].content.startswith(DISTILL)
    assert engine.prompts[1][1].content.startswith("Task and Trajectory:\n") and \
        engine.prompts[1][1].content.endswith("Answer with 'success' or 'fail' only.")
    assert "how an agent successfully solved the task" in engine.prompts[2][0].content and len(first.memory_calls) == 2
    # a verdict that is neither word counts as a failure (MemoryArena: "success" in the reply), recorded as an error
    assert second.memory_calls[0].protocol_error is not None and "failed" in engine.prompts[5][0].content
    assert third.memory_calls[1].protocol_error is not None  # no item in the format: no record
    assert [n.id for n in nodes][:3] == ["rb_r1", "rb_r2", "rb_r4"] and not any(n.is_observation for n in nodes)
    assert nodes[0].value["status"] == "success" and nodes[1].value["status"] == "fail"
    assert len(nodes[0].value["memory_items"]) == 2
    memory = engine.prompts[9][1].content.split("<strategy_memory>")[1].split("</strategy_memory>")[0]
    assert TOP_K == 5 and memory.count('"record_id"') == 2  # every record, up to 5: the two there are
    assert memory.index('"rb_r1"') < memory.index('"rb_r2"')  # the hotel request's record first: the closest
    assert "Lisbon" not in memory and "120" not in memory  # strategies, not the earlier request's facts