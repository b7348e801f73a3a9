"""The protocol grammar as accept/reject tables: it accepts valid steps and rejects the typical broken ones."""

from __future__ import annotations

import json

import pytest

from flowstate.active import ActiveState
from flowstate.constrain import step_ids
from flowstate.demo import hotel
from flowstate.limits import COMPACT
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.parse import parse_output
from flowstate.protocol import block_schemas
from grammars.check import GrammarError, accepts, validate
from grammars.four_blocks import StepIds, ToolBounds, protocol_grammar
from tests.helpers import add, output


def raw(focus: list = [], delta: list = [], tools: list = [], content: object = None) -> str:
    """Four blocks rendered like ``render_output`` but without validating them first."""
    items = [{"target_id": f, "reason": "test"} if isinstance(f, str) else f for f in focus]
    blocks = {"state_focus": items, "state_delta": delta, "tool_calls": tools,
              "assistant_message": {"content": content}}
    return "\n".join(f"<{k}>\n{json.dumps(v)}\n</{k}>" for k, v in blocks.items())

STATIC = protocol_grammar(block_schemas(), hotel.TOOLS.specs())  # the standard profile
COMPACT_STATIC = protocol_grammar(block_schemas(COMPACT), hotel.TOOLS.specs(),
                                  bounds=ToolBounds(COMPACT.tool_text, COMPACT.tool_items))
SEARCH = {"name": "search_hotels",
          "arguments": {"city": "Lisbon", "check_in": "2026-09-20", "check_out": "2026-09-22", "as_of": "2026-09-01"}}


def test_the_grammar_compiles() -> None:
    validate(STATIC)


def test_accepts_every_step_of_the_shipped_hotel_script() -> None:
    lines = (json.loads(line)["text"] for line in hotel.script_path().read_text().splitlines())
    assert all(accepts(STATIC, text) for text in lines)


STATIC_CASES = [
    ("tool call", output(tools=[SEARCH]), True),
    ("final answer", output(content="Done."), True),
    ("state update only (wait)", output(delta=[add("kn_a", x=1)]), True),
    ("access only (wait)", output(focus=["dec_a"]), True),
    ("update and remove",
     output(delta=[{"operation": "update", "state_id": "kn_a", "summary": "s"},
                   {"operation": "remove", "state_id": "kn_b"}], content="ok"), True),
    ("control: raw rendering of a valid tool call", raw(tools=[SEARCH]), True),
    ("control: raw rendering of a valid add", raw(delta=[add("kn_a", x=1)], content="ok"), True),
    ("everything empty", raw(), False),
    ("tools and a final answer together", raw(tools=[SEARCH], content="hi"), False),
    ("unknown tool", raw(tools=[{"name": "rm_rf", "arguments": {}}]), False),
    ("wrong argument type", raw(tools=[{**SEARCH, "arguments": {**SEARCH["arguments"], "city": 3}}]), False),
    ("missing argument", raw(tools=[{"name": "book_hotel", "arguments": {"hotel_id": "A"}}]), False),
    ("unknown state type", raw(delta=[{**add("kn_a"), "state_set": "opinion"}]), False),
    ("unknown relation", raw(delta=[add("kn_a", refs=[("causes", "x")])]), False),
    ("bad id shape", raw(delta=[add("Kn-A")]), False),
    ("summary of 400 characters", raw(delta=[{**add("kn_a"), "summary": "x" * 400}]), True),
    ("summary too long", raw(delta=[{**add("kn_a"), "summary": "x" * 401}]), False),
    ("tool argument as long as its schema allows",
     raw(tools=[{**SEARCH, "arguments": {**SEARCH["arguments"], "city": "x" * 500}}]), True),
    ("tool argument the schema does not declare",
     raw(tools=[{**SEARCH, "arguments": {**SEARCH["arguments"], "eventId": "x"}}]), False),
    ("nested value", raw(delta=[add("kn_a", legs=[{"from": "LIS", "stops": [{"at": "x", "min": 40}]}])]), True),
    ("value nested beyond the depth", raw(delta=[add("kn_a", a={"b": {"c": {"d": {"e": {"f": 1}}}}})]), False),
    ("answer of 3,000 characters", raw(content="word " * 600), True),
    ("blocks out of order",
     output(content="x").replace("<state_focus>\n[]\n</state_focus>\n", "") + "\n<state_focus>\n[]\n</state_focus>",
     False),
    ("prose before the blocks", "Sure!\n" + output(content="x"), False),
    ("code fence around the blocks", "```\n" + output(content="x") + "\n```", False),
    ("missing a block", output(content="x").replace("<tool_calls>\n[]\n</tool_calls>\n", ""), False),
    ("single quotes", output(content="x").replace('"content"', "'content'"), False),
]


@pytest.mark.parametrize(("why", "text", "expected"), STATIC_CASES, ids=[c[0] for c in STATIC_CASES])
def test_static_grammar(why: str, text: str, expected: bool) -> None:
    assert accepts(STATIC, text) is expected
    if expected:
        parse_output(text)  # whatever the grammar accepts, the parser accepts


def test_a_cut_output_is_a_prefix_of_the_grammar_and_no_more() -> None:
    text = output(tools=[SEARCH])
    cut = text[: len(text) // 2]
    assert not accepts(STATIC, cut) and accepts(STATIC, cut, prefix=True)
    assert not accepts(STATIC, "Sure! " + cut, prefix=True)  # a prefix no sentence starts with
    assert not accepts(STATIC, text + "\nmore", prefix=True)  # past the end of a whole sentence


COMPACT_CASES = [  # the tight bounds that keep a tiny model terminating
    ("tool call", output(tools=[SEARCH]), True),
    ("summary of 96 characters", raw(delta=[{**add("kn_a"), "summary": "x" * 96}]), True),
    ("summary too long", raw(delta=[{**add("kn_a"), "summary": "x" * 97}]), False),
    ("tool argument too long", raw(tools=[{**SEARCH, "arguments": {**SEARCH["arguments"], "city": "x" * 97}}]), False),
    ("one level of nesting", raw(delta=[add("kn_a", n=[1, 2])]), True),
    ("nested value", raw(delta=[add("kn_a", deep={"a": {"b": 1}})]), False),
    ("answer of 480 characters", raw(content="x" * 480), True),
    ("answer too long", raw(content="x" * 481), False),
]


@pytest.mark.parametrize(("why", "text", "expected"), COMPACT_CASES, ids=[c[0] for c in COMPACT_CASES])
def test_compact_grammar(why: str, text: str, expected: bool) -> None:
    assert accepts(COMPACT_STATIC, text) is expected
    if expected:
        parse_output(text, limits=COMPACT)


IDS = StepIds(focus=("dec_a", "obs_r1_s1_1"), own=("kn_mine",), refs=("dec_a", "kn_mine", "obs_r2_s1_1"))
STEP = protocol_grammar(block_schemas(), hotel.TOOLS.specs(), IDS)

STEP_CASES = [
    ("access an admissible id", output(focus=["dec_a"]), True),
    ("access a referenced observation", output(focus=["obs_r1_s1_1"]), True),
    ("access an id outside the admissible set", output(focus=["kn_other"]), False),
    ("update a state of this request", output(delta=[{"operation": "update", "state_id": "kn_mine", "summary": "s"}]),
     True),
    ("update a historical state", output(delta=[{"operation": "update", "state_id": "dec_a", "summary": "s"}]), False),
    ("remove a state of this request", output(delta=[{"operation": "remove", "state_id": "kn_mine"}]), True),
    ("remove an unknown state", output(delta=[{"operation": "remove", "state_id": "ghost"}]), False),
    ("ref to a known id", output(delta=[add("kn_new", refs=[("derives", "obs_r2_s1_1")])]), True),
    ("ref to an unknown id", output(delta=[add("kn_new", refs=[("derives", "ghost")])]), False),
    ("add with a fresh id", output(delta=[add("kn_new")]), True),
]


@pytest.mark.parametrize(("why", "text", "expected"), STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_id_aware_grammar(why: str, text: str, expected: bool) -> None:
    assert accepts(STEP, text) is expected


def test_nothing_to_access_or_change_means_empty_focus_and_adds_only() -> None:
    grammar = protocol_grammar(block_schemas(), hotel.TOOLS.specs(), StepIds(focus=(), own=(), refs=()))
    assert accepts(grammar, output(delta=[add("kn_new")], content="x"))
    assert not accepts(grammar, raw(focus=["anything"], content="x"))
    assert not accepts(grammar, raw(delta=[{"operation": "remove", "state_id": "kn_new"}], content="x"))
    assert not accepts(grammar, raw(delta=[add("kn_new", refs=[("derives", "kn_x")])], content="x"))


def test_no_tools_means_no_tool_calls() -> None:
    grammar = protocol_grammar(block_schemas(), [])
    assert accepts(grammar, output(content="x"))
    assert not accepts(grammar, output(tools=[SEARCH]))


def test_step_ids_follow_the_rules_of_psa_and_isu() -> None:
    hist = Node(id="dec_a", type=StateType.JUDGEMENT, summary="s", value={}, request=1,
                refs=(Ref(rel=Relation.SUPPORTS, state_id="obs_r1_s1_1"),))
    state = ActiveState(request=2, history_ids=frozenset({"dec_a", "pref_b", "obs_r1_s1_1"}),
                        index_ids=frozenset({"dec_a", "pref_b"}))
    ids = step_ids(state)
    assert (ids.focus, ids.own, ids.refs) == (("dec_a", "pref_b"), (), ("dec_a", "pref_b"))
    from flowstate.active import Disclosed

    state = state.with_disclosed(Disclosed(hist))
    ids = step_ids(state)
    assert ids.focus == ("obs_r1_s1_1", "pref_b")  # dec_a visible now; its evidence accessible


def test_a_refused_grammar_is_a_clear_error() -> None:
    with pytest.raises(GrammarError, match="grammar refused"):
        validate("start: %json {\"type\": \"object\", \"propertyNames\": {\"pattern\": \"a\"}}")


def test_the_per_step_grammar_refuses_an_add_of_a_used_or_reserved_id() -> None:
    """B.4: an Add needs an unused id — decoded out, not rejected after (a small model copies its last step's add)."""
    state = ActiveState(request=2, history_ids=frozenset({"dec_a", "obs_r1_s1_1"}), index_ids=frozenset({"dec_a"}))
    state = state.with_added(Node(id="kn_mine", type=StateType.KNOWLEDGE, summary="s", value={}, request=2))
    grammar = protocol_grammar(block_schemas(), hotel.TOOLS.specs(), step_ids(state))
    for used in ("dec_a", "kn_mine", "obs_r1_s1_1", "obs_new", "page_1"):
        assert not accepts(grammar, output(delta=[add(used)])), used
    for fresh in ("kn_mine2", "dec", "dec_ab", "k", "obs", "pag", "x" * 48):
        assert accepts(grammar, output(delta=[add(fresh)])), fresh
    assert not accepts(grammar, raw(delta=[add("x" * 49)], content="x"))  # still the protocol's shape
    assert not accepts(grammar, raw(delta=[add("Kn_upper")], content="x"))


def test_the_id_shape_is_the_protocols_pattern() -> None:
    import random
    import re

    from flowstate.constrain import ID_SHAPE
    from flowstate.nodes import ID_PATTERN
    from grammars.ids import unused_id_pattern

    shape = re.compile(unused_id_pattern(ID_SHAPE, []))
    pattern = re.compile(ID_PATTERN)
    rng = random.Random(0)
    alphabet = "abz019_A-é"
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.choice([0, 1, 2, 5, 47, 48, 49])))
        assert bool(shape.match(text)) == bool(pattern.match(text)), text
