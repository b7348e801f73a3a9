"""flowstate-lean: memory blocks only when they say something, knowledge by rule, the chat below the crossover and
the index past it — and ISU's and PSA's rules hold for it as for the paper's method."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from flowstate.constrain import GrammarMode, Grammars
from flowstate.history import HistoricalIndex, IndexEntry
from flowstate.limits import COMPACT, STANDARD
from flowstate.memory import get
from flowstate.memory.chat import FULL_CONTEXT
from flowstate.memory.lean import ACCESS, FLOWSTATE_LEAN, LEAN_BLOCKS, OPTIONAL, found, lean_fact, record_ask
from flowstate.parse import ProtocolError, parse_output
from flowstate.protocol import BLOCKS, ModelOutput, block_schemas, render_output
from grammars.check import accepts
from grammars.four_blocks import protocol_grammar
from tests.flowstate.test_strategies import run_oracle
from tests.helpers import add

CALL = {"name": "echo", "arguments": {"text": "hi"}}


def lean(**blocks: Any) -> str:
    """An output as the lean protocol renders it (empty memory blocks left out)."""
    return render_output(ModelOutput.model_validate(blocks), LEAN_BLOCKS, OPTIONAL)


def test_memory_blocks_are_left_out_when_empty_and_read_as_empty() -> None:
    acting = lean(tool_calls=[CALL])
    assert acting.startswith("<tool_calls>") and "state_" not in acting
    assert acting == render_output(ModelOutput.model_validate({"tool_calls": [CALL]}), FULL_CONTEXT.blocks)
    out = parse_output(acting, LEAN_BLOCKS, optional=OPTIONAL)
    assert out.tool_calls[0].name == "echo" and not out.state_delta and not out.state_focus
    recording = lean(state_delta=[add("pref_a", "preference", x=1)], assistant_message={"content": "ok"})
    assert recording.startswith("<tool_calls>") and "<state_focus>" not in recording  # the decision, then the record
    assert parse_output(recording, LEAN_BLOCKS, optional=OPTIONAL).state_delta[0].state_id == "pref_a"
    with pytest.raises(ProtocolError, match="missing <state_focus>"):  # the paper's protocol still needs all four
        parse_output(acting, BLOCKS)
    out_of_order = acting + "\n<state_delta>\n[]\n</state_delta>"
    with pytest.raises(ProtocolError, match="unexpected text after"):  # a memory block after the message
        parse_output(out_of_order, LEAN_BLOCKS, optional=OPTIONAL)


def test_the_grammar_admits_a_memory_block_absent_or_holding_something_never_empty() -> None:
    tools = [{"name": "echo", "description": "e", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]
    grammar = protocol_grammar(block_schemas(), tools, blocks=LEAN_BLOCKS, optional=OPTIONAL)
    assert accepts(grammar, lean(tool_calls=[CALL]))
    assert accepts(grammar, lean(state_delta=[add("pref_a", "preference", x=1)], assistant_message={"content": "ok"}))
    assert accepts(grammar, lean(state_focus=[{"target_id": "fact_r1_s1_1", "reason": "r"}]))  # a wait
    assert accepts(grammar, lean(assistant_message={"content": "done"}))
    four = render_output(ModelOutput.model_validate({"tool_calls": [CALL]}), LEAN_BLOCKS)  # "[]" written out
    assert not accepts(grammar, four)
    assert not accepts(grammar, lean())  # nothing decided: no output at all
    paper = render_output(ModelOutput.model_validate({"tool_calls": [CALL]}), BLOCKS)
    assert accepts(protocol_grammar(block_schemas(), tools), paper)  # the paper's grammar: unchanged


def test_below_the_crossover_its_prompts_are_full_contexts(tmp_path: Path) -> None:
    """The chat below the crossover: every call's messages are full context's, the system message included, byte
    for byte (so a prefix cache serves them alike and a model writes what it writes under full context), while the
    system records a knowledge state per tool result."""
    repo = Repository.open(tmp_path / "m.db")
    _, mine, _ = run_oracle(repo, "chain", FLOWSTATE_LEAN, 4)
    _, theirs, _ = run_oracle(repo, "chain", FULL_CONTEXT, 4)
    assert len(mine.calls) == len(theirs.calls)
    for (m, _, a), (t, _, b) in zip(mine.calls, theirs.calls, strict=True):
        assert m == t and a.text == b.text
    facts = [n for n in repo.nodes("chain/flowstate-lean") if n.id.startswith("fact_")]
    assert facts and all(n.refs[0].state_id.startswith("obs_") for n in facts)


def test_past_the_crossover_the_index_and_the_states_the_query_finds_lead_the_request(tmp_path: Path) -> None:
    repo = Repository.open(tmp_path / "m.db")
    task, engine, firsts = run_oracle(repo, "chain", get("flowstate-lean:0"), 4)
    assert task.queries and "<historical_state_index>" not in engine.calls[0][0][1].content  # nothing earlier yet
    head = engine.calls[firsts[-1]][0][1].content
    assert head.startswith(f"<{ACCESS}>") and "<historical_state_index>" in head
    assert head.index("<historical_state_index>") < head.index("<user_query>")


def test_found_discloses_the_states_that_name_an_identifier_of_the_query() -> None:
    index = HistoricalIndex((IndexEntry(1, "q1", (("fact_a", "get_reservation_details ABC123 → JFK"),
                                                   ("fact_b", "get_user_details mia_li_3668 → gold"))),
                             IndexEntry(2, "q2", (("fact_c", "get_reservation_details XYZ789 → JFK"),))))
    assert found(index, "cancel reservation ABC123 from JFK", 3) == ("fact_a",)  # JFK alone names no identifier
    assert found(index, "is mia_li_3668 gold? and ABC123?", 3) == ("fact_b", "fact_a")  # most words shared first
    assert found(index, "ABC123 or XYZ789?", 1) == ("fact_c",)  # the newest among equals
    assert found(index, "cancel my reservation from JFK", 3) == ()  # common words match every state: none
    assert found(index, "hello there", 3) == ()


def test_a_facts_summary_names_the_identifiers_its_result_holds_however_deep() -> None:
    """The index line of a tool result is the call and its result's identifiers, each once: a payment id deep in
    a reservation is named, so a later request finds the fact by it (a result cut to a line named only its first
    fields); the call's own arguments are not repeated, and the line keeps its bound."""
    from flowstate.nodes import Node, StateType

    result = {"reservation_id": "GV1N64", "cabin": "business", "passengers": [{"name": "James", "dob": "1995-04-07"}],
              "payment_history": [{"payment_id": "gift_card_1642017", "amount": 1900}], "again": "GV1N64"}
    obs = Node(id="obs_r1_s1_1", kind="observation", type=StateType.KNOWLEDGE, request=1,
               summary='get_reservation_details(reservation_id="GV1N64")',
               value={"tool": "get_reservation_details", "arguments": {"reservation_id": "GV1N64"}, "result": result})
    fact = lean_fact(obs, STANDARD, 240)
    assert fact.summary == 'get_reservation_details(reservation_id="GV1N64"): gift_card_1642017'  # no bare date
    assert fact.id == "fact_r1_s1_1" and fact.value["result"] == result and fact.refs[0].state_id == obs.id
    index = HistoricalIndex((IndexEntry(1, "q", ((fact.id, fact.summary),)),))
    assert found(index, "refund to gift_card_1642017", 3) == ("fact_r1_s1_1",)
    assert len(lean_fact(obs, STANDARD, 40).summary) == 40 and FLOWSTATE_LEAN.fact_text == 160


def test_its_index_lists_a_requests_states_as_a_mapping_and_the_policy_reads_both_renderings() -> None:
    """Lean's index line holds the paper's content — query id, states in the order written, query, unfinished —
    with the states a mapping of id to summary (two keys a state fewer); a longer index's rendering extends a
    shorter one's; a reader of either rendering sees the same states."""
    from flowstate.eval.policies import Policy
    from flowstate.memory.lean import index_text

    entries = (IndexEntry(1, 'a "quoted" query', (("fact_r1_s2_1", "get_user_details: x1"), ("fact_r1_s10_1", "b"))),
               IndexEntry(2, "q2", (), "step budget"))
    lines = index_text(HistoricalIndex(entries)).splitlines()
    assert lines[0] == ('{"query_id":1,"states":{"fact_r1_s2_1":"get_user_details: x1","fact_r1_s10_1":"b"},'
                        '"user_query":"a \\"quoted\\" query"}')
    assert lines[1] == '{"query_id":2,"states":{},"unfinished":"step budget","user_query":"q2"}'
    assert index_text(HistoricalIndex(entries)).startswith(index_text(HistoricalIndex(entries[:1])))
    ours = [json.loads(line) for line in lines]
    paper = [json.loads(line) for line in HistoricalIndex(entries).render().splitlines()]
    assert len(index_text(HistoricalIndex(entries))) < len(HistoricalIndex(entries).render())
    assert Policy.visible({"historical_state_index": ours})[0] == Policy.visible({"historical_state_index": paper})[0]


def scripted_session(tmp_path: Path, second: list[str]) -> tuple[Repository, ScriptedEngine, Agent]:
    """Request 1 calls echo and answers (the system records its result as fact_r1_s1_1); request 2 runs
    ``second`` under lean:0 (the index from the first request on)."""
    first = [lean(tool_calls=[CALL]), lean(assistant_message={"content": "done"})]
    engine = ScriptedEngine([*first, *second])
    repo = Repository.open(tmp_path / "m.db")

    def echo(text: str) -> str:
        """Echo the text."""
        return text

    agent = Agent(engine, repository=repo, session="s", tools=[echo], strategy=get("flowstate-lean:0"))
    agent.run("say hi")
    return repo, engine, agent


def test_isu_and_psa_rules_hold_for_it(tmp_path: Path) -> None:
    """B.4's rejections, through the loop: an update of an earlier request's state is rejected (add one that
    supersedes it), a focus on an id the index does not list is refused; a supersedes add stands, and a focus on an
    index id discloses it."""
    second = [
        lean(state_delta=[{"operation": "update", "state_id": "fact_r1_s1_1", "summary": "x"}],
             state_focus=[{"target_id": "nowhere", "reason": "r"}]),
        lean(state_delta=[add("pref_hi", "preference", refs=[("supersedes", "fact_r1_s1_1")], said="hi")],
             state_focus=[{"target_id": "fact_r1_s1_1", "reason": "its text"}]),
        lean(assistant_message={"content": "said hi"}),
    ]
    repo, engine, agent = scripted_session(tmp_path, second)
    record = agent.run("what did you say?")
    first, then = record.steps[0], record.steps[1]
    assert first.rejected and "fact_r1_s1_1" in json.dumps(first.rejected)
    assert first.refused and "nowhere" in json.dumps(first.refused)
    assert then.disclosed == ["fact_r1_s1_1"] and not then.rejected
    assert "pref_hi" in {n.id for n in repo.nodes("s")}
    # what each step brought follows its output; nothing sent before changes (the prompt only appends)
    prompts = engine.prompts[-3:]
    for before, after in zip(prompts, prompts[1:]):
        assert after[: len(before)] == before
    assert "<feedback>" in prompts[1][-1].content and '"state_id":"fact_r1_s1_1"' in prompts[2][-1].content


def test_a_state_the_model_writes_is_a_note_while_the_systems_facts_keep_the_profile(tmp_path: Path) -> None:
    """The grammar admits a model's state of a line and a few scalars and nothing longer (a copied result cannot be
    decoded), the parser excludes it alike (a model decoding freely: fed back as malformed), and the fact the system
    writes from the same result keeps the whole of it."""
    bounds = FLOWSTATE_LEAN.output_limits(STANDARD)
    assert (bounds.ops, bounds.value_depth, bounds.value_text) == (4, 0, 64) and STANDARD.value_depth == 4
    assert FULL_CONTEXT.output_limits(STANDARD) is STANDARD  # every other method: the profile as it is
    tools = [{"name": "echo", "description": "e", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]
    grammar = Grammars(tools, GrammarMode.STATIC, LEAN_BLOCKS, bounds, optional=OPTIONAL).static
    assert grammar is not None
    note = add("pref_a", "preference", refs=[("derives", "fact_r1_s1_1")], seat="aisle", bags=1)
    done = {"content": "done"}
    assert accepts(grammar, lean(state_delta=[note], assistant_message=done))
    copies = {
        "nested": add("pref_a", "preference", reservation={"id": "ABC123", "flights": [{"n": "HAT001"}]}),
        "long": add("pref_a", "preference", text="x" * 65),
        "many": add("pref_a", "preference", a=1, b=2, c=3, d=4, e=5),
    }
    for kind, op in copies.items():
        assert not accepts(grammar, lean(state_delta=[op], assistant_message=done)), kind
        out = parse_output(lean(state_delta=[op], assistant_message=done), LEAN_BLOCKS, bounds, optional=OPTIONAL)
        assert not out.state_delta and out.malformed[0].id == "pref_a", kind  # excluded, the step's answer kept
    five = [add(f"pref_{c}", "preference", x=1) for c in "abcde"]
    assert not accepts(grammar, lean(state_delta=five, assistant_message=done))
    assert accepts(protocol_grammar(block_schemas(), tools, blocks=LEAN_BLOCKS, optional=OPTIONAL),
                   lean(state_delta=[copies["nested"]], assistant_message=done))  # the profile alone admits it

    nested = {"reservation": {"id": "ABC123", "flights": [{"number": "HAT001", "date": "2024-05-15"}]}}
    engine = ScriptedEngine([lean(tool_calls=[{"name": "lookup", "arguments": {}}]),
                             lean(state_delta=[copies["nested"]], assistant_message={"content": "done"})])
    repo = Repository.open(tmp_path / "m.db")

    def lookup() -> dict[str, Any]:
        """Look the reservation up."""
        return nested

    record = Agent(engine, repository=repo, session="s", tools=[lookup], strategy=FLOWSTATE_LEAN).run("look it up")
    assert record.response == "done" and "add.value" in json.dumps(record.steps[1].malformed)
    fact = next(n for n in repo.nodes("s") if n.id.startswith("fact_"))
    assert fact.value["result"] == nested  # the system's fact: the profile's bounds, the whole result
    assert "pref_a" not in {n.id for n in repo.nodes("s")}


def test_a_step_decides_before_it_records_and_records_only_with_its_answer() -> None:
    """The lean order puts tool_calls before state_delta: a step that calls decodes no state (the system has
    recorded each result as a fact already), the step that answers may write the request's states, and a model is
    never held to answering because it began a record. With tools required (no step answers) the calls may carry
    states. The paper's grammar and every other method's system prompt are unchanged."""
    from flowstate.config import AgentConfig
    from flowstate.tools import ToolSet
    from grammars.four_blocks import decides_first

    tools = [{"name": "echo", "description": "e", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]
    note = add("pref_a", "preference", x=1)
    assert decides_first(LEAN_BLOCKS) and not decides_first(BLOCKS)
    grammar = protocol_grammar(block_schemas(), tools, blocks=LEAN_BLOCKS, optional=OPTIONAL)
    assert accepts(grammar, lean(tool_calls=[CALL]))
    assert not accepts(grammar, lean(state_delta=[note], tool_calls=[CALL]))  # the acting step writes no state
    answer = lean(state_delta=[note], assistant_message={"content": "done"})
    assert answer.index("<tool_calls>") < answer.index("<state_delta>") and accepts(grammar, answer)
    assert accepts(grammar, lean(assistant_message={"content": "done"}))
    assert not accepts(grammar, lean(state_delta=[note]))  # nor a step that only records
    assert accepts(grammar, lean(state_focus=[{"target_id": "fact_r1_s1_1", "reason": "r"}]))  # asking stays a step
    paper_order = render_output(ModelOutput.model_validate({"state_delta": [note], "assistant_message": {
        "content": "done"}}), BLOCKS, OPTIONAL)
    assert not accepts(grammar, paper_order)  # the record first: not this protocol
    parsed = parse_output(answer, LEAN_BLOCKS, optional=OPTIONAL)
    assert parsed.state_delta[0].state_id == "pref_a" and parsed.assistant_message.content == "done"
    required = protocol_grammar(block_schemas(), tools, blocks=LEAN_BLOCKS, optional=OPTIONAL, require_tools=True)
    assert accepts(required, lean(state_delta=[note], tool_calls=[CALL]))
    assert not accepts(required, lean(assistant_message={"content": "done"}))
    config = AgentConfig(ScriptedEngine([], grammar=True), FLOWSTATE_LEAN, tools=ToolSet([echo]))
    assert config.grammars(config.specs(), validate=True) is not None  # llguidance compiles it
    full = AgentConfig(ScriptedEngine([], grammar=True), FULL_CONTEXT, tools=ToolSet([echo]))
    assert config.system_prompt() == full.system_prompt()  # the record's rules come with the request that records
    ask = record_ask(FLOWSTATE_LEAN.output_limits(STANDARD))
    assert "<state_delta>" in ask and "Between <tool_calls>[]</tool_calls> and <assistant_message>" in ask
    assert "at most 96 characters" in record_ask(FLOWSTATE_LEAN.output_limits(COMPACT))  # the grammar's bound


def echo(text: str) -> str:
    """Echo the text."""
    return text


def test_a_block_of_requests_records_once_in_its_last_request(tmp_path: Path) -> None:
    """Below the crossover the chat is what later requests read: a request records states only when it is the last
    of a block (the next request folds the block into the index), asked for it at its head, and the grammar of
    every other request admits no state_delta at all — a session that ends within its first block decodes no
    state. The records the block's last request writes are what the index shows past the fold."""
    from flowstate import tags
    from flowstate.tools import ToolSet

    two = get("flowstate-lean:2")
    assert [FLOWSTATE_LEAN.records(k) for k in (1, 10, 29, 30, 31, 40)] == [False, False, False, True, False, True]
    assert all(two.records(k) == (k % 2 == 0) for k in range(1, 7))
    late = replace(FLOWSTATE_LEAN, crossover=30, block=10)  # the first fold at 30, then blocks of 10
    assert [late.indexed(e) for e in (9, 29, 30, 39, 40, 55)] == [0, 0, 30, 30, 40, 50]
    assert [k for k in range(1, 61) if late.records(k)] == [30, 40, 50, 60]
    assert not late.step_blocks(30)[0] == "state_focus" and late.step_blocks(31)[0] == "state_focus"
    assert get("flowstate-lean:5").indexed(12) == 10 and get("flowstate-lean:30").indexed(45) == 40
    assert all(get("flowstate-lean:0").records(k) for k in (1, 2, 3)) and get("flowstate").step_blocks(1) == BLOCKS
    assert FLOWSTATE_LEAN.step_blocks(1) == FULL_CONTEXT.blocks  # below the crossover: full context's grammar
    assert FLOWSTATE_LEAN.step_blocks(30) == ("tool_calls", "state_delta", "assistant_message")
    assert two.step_blocks(3) == ("state_focus", "tool_calls", "assistant_message")
    assert two.step_blocks(4) == LEAN_BLOCKS
    note = add("pref_a", "preference", refs=[("derives", "fact_r2_s1_1")], seat="aisle")
    engine = ScriptedEngine([
        lean(assistant_message={"content": "hello"}),  # request 1: no record admitted
        lean(tool_calls=[CALL]),  # request 2 acts, then records the block with its answer
        lean(state_delta=[note], assistant_message={"content": "aisle noted"}),
        lean(assistant_message={"content": "you like the aisle"}),  # request 3: past the fold
    ], grammar=True)
    repo = Repository.open(tmp_path / "m.db")
    agent = Agent(engine, repository=repo, session="s", tools=ToolSet([echo]), strategy=two)
    for query in ("hi", "I like aisle seats ABC123", "what do I like on ABC123"):
        agent.run(query)
    grammars = [c["grammar"] for c in engine.calls]
    answer = lean(state_delta=[add("pref_b", "preference", x=1)], assistant_message={"content": "ok"})
    assert not accepts(grammars[0], answer) and accepts(grammars[0], lean(assistant_message={"content": "ok"}))
    assert "<state_delta>" not in grammars[0] and '"<state_delta>\\n"' not in grammars[0]
    assert accepts(grammars[2], answer) and not accepts(grammars[3], answer)
    heads = [p[-1].content for p in engine.prompts]
    ask = f"<{tags.STATE_RECORD}>"
    assert ask not in heads[0] and ask in heads[1] and ask not in heads[3]
    assert heads[1].index(ask) < heads[1].index("<user_query>")
    assert "pref_a" in {n.id for n in repo.nodes("s") if n.request == 2}
    first = engine.prompts[3][1].content  # request 3's head: the folded block's index, the note's summary in it
    assert "<historical_state_index>" in first and "pref_a" in first


def test_a_request_that_records_nothing_below_the_crossover_is_decoded_under_full_contexts_grammar() -> None:
    """Not only the prompt: the grammar too, so it forces what full context's forces and a model decodes the same
    tokens (a grammar that also admitted state_focus left `<tool_calls>` unforced, and the 1.5B model's own
    tokenization of it led it elsewhere)."""
    from flowstate.active import ActiveState
    from flowstate.config import AgentConfig
    from flowstate.tools import ToolSet

    mine = AgentConfig(ScriptedEngine([], grammar=True), FLOWSTATE_LEAN, tools=ToolSet([echo]))
    theirs = AgentConfig(ScriptedEngine([], grammar=True), FULL_CONTEXT, tools=ToolSet([echo]))
    lean_grammars, full = mine.grammars(mine.specs()), theirs.grammars(theirs.specs())
    assert lean_grammars is not None and full is not None
    for k in (1, 10, 29):
        state = ActiveState(request=k)
        assert lean_grammars.for_step(state, blocks=FLOWSTATE_LEAN.step_blocks(k)) == full.for_step(state)
        final = lean_grammars.for_step(state, final=True, blocks=FLOWSTATE_LEAN.step_blocks(k))
        assert final == full.for_step(state, final=True)
    assert lean_grammars.for_step(ActiveState(request=30), blocks=FLOWSTATE_LEAN.step_blocks(30)) != full.for_step(
        ActiveState(request=30))


def test_below_the_crossover_the_step_after_a_refused_repeat_reads_as_under_full_context(tmp_path: Path) -> None:
    """Full context renders a request's steps from their results and shows the feedback on a refused repeat once,
    at the end of the next call; lean below the crossover does the same, byte for byte. (An output that breaks the
    protocol is parsed by lean's own blocks, so its feedback names them: the grammar admits no such output.)"""
    from flowstate.tools import ToolSet

    script = [lean(tool_calls=[CALL]), lean(tool_calls=[CALL]), lean(assistant_message={"content": "done"})]
    prompts = []
    for i, strategy in enumerate((FULL_CONTEXT, FLOWSTATE_LEAN)):
        engine = ScriptedEngine(script)
        repo = Repository.open(tmp_path / f"m{i}.db")
        record = Agent(engine, repository=repo, session="s", tools=ToolSet([echo]), strategy=strategy).run("echo hi")
        assert record.response == "done" and record.steps[1].tool_calls[0].repeat_of  # refused as a repeat
        prompts.append(engine.prompts)
    assert len(prompts[0]) == 3 and prompts[0] == prompts[1]
    assert "<feedback>" in prompts[0][2][-1].content and "<feedback>" not in prompts[1][1][-1].content
