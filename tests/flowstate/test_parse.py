"""The four-block protocol parser: valid outputs parse, broken ones name the block and the fault."""

from __future__ import annotations

import pytest

from flowstate.errors import ProtocolError
from flowstate.limits import COMPACT
from flowstate.parse import parse_output
from flowstate.protocol import AddOp, ModelOutput, UpdateOp, render_output
from tests.helpers import output

OK_DELTA = ('[{"operation": "add", "state_set": "preference", "state_id": "pref_x", "summary": "s", "value": '
            '{}, "refs": []}]')


def blocks(focus: str = "[]", delta: str = "[]", tools: str = "[]", message: str = '{"content": "hi"}') -> str:
    return (
        f"<state_focus>\n{focus}\n</state_focus>\n<state_delta>\n{delta}\n</state_delta>\n"
        f"<tool_calls>\n{tools}\n</tool_calls>\n<assistant_message>\n{message}\n</assistant_message>"
    )


ACCEPTED = [
    blocks(),
    blocks(focus='[{"target_id": "dec_a", "reason": "need it"}]', message='{"content": null}'),
    blocks(delta=OK_DELTA, message='{"content": null}'),
    blocks(tools='[{"name": "search", "arguments": {"q": "x"}}]', message='{"content": null}'),
    blocks(delta='[{"operation": "update", "state_id": "pref_x", "summary": "new"}]', message='{"content": null}'),
    blocks(delta='[{"operation": "remove", "state_id": "pref_x"}]', message='{"content": null}'),
    "  \n" + blocks() + "\n\n",
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepts_valid_outputs(text: str) -> None:
    assert isinstance(parse_output(text), ModelOutput)


REJECTED = [
    ("no blocks at all", "Sure! I will book the hotel.", "state_focus", "missing <state_focus>"),
    ("blocks out of order",
     blocks().replace("<state_focus>\n[]\n</state_focus>\n", "") + "<state_focus>[]</state_focus>", "state_focus",
     "unexpected tag <state_delta>"),
    ("prose before a block", "Let me think.\n" + blocks(), "state_focus", "unexpected text"),
    ("text after the last block", blocks() + "\nDone!", "assistant_message", "after"),
    ("invalid JSON", blocks(delta="[{'operation': 'add'}]"), "state_delta", "invalid JSON"),
    ("unclosed block", blocks().replace("</tool_calls>", ""), "tool_calls", "missing </tool_calls>"),
    ("empty block", blocks(tools=""), "tool_calls", "empty block"),
    ("block not an array", blocks(delta=OK_DELTA[1:-1]), "state_delta", "expected a JSON array"),
    ("message not an object", blocks(message='"hello"'), "assistant_message", "valid dictionary"),
    ("answer over the limit", blocks(message='{"content": "' + "x" * 16_001 + '"}'), "assistant_message", "16000"),
    ("nested too deeply", blocks(tools="[" * 100_000 + "]" * 100_000), "tool_calls", "nested too deeply"),
    ("all parts empty", blocks(message='{"content": null}'), "output", "at least one"),
]


@pytest.mark.parametrize(("why", "text", "block", "fragment"), REJECTED, ids=[r[0] for r in REJECTED])
def test_rejects_broken_outputs_naming_the_block(why: str, text: str, block: str, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_output(text)
    assert info.value.block == block
    assert fragment in info.value.message


# Items are validated one by one (B.4: failing operations "are excluded"): a malformed one is left out
# with its reason and the rest of the step stands.
GOOD_OP = '{"operation": "add", "state_set": "knowledge", "state_id": "kn_ok", "summary": "s", "value": {}, "refs": []}'
MALFORMED = [
    ("unknown state type", "state_delta", OK_DELTA[1:-1].replace("preference", "opinion"), "state_set"),
    ("unknown operation", "state_delta", OK_DELTA[1:-1].replace('"add"', '"upsert"'), "operation"),
    ("unknown relation", "state_delta",
     OK_DELTA[1:-1].replace('"refs": []', '"refs": [{"rel": "causes", "state_id": "a"}]'), "rel"),
    ("bad id shape", "state_delta", OK_DELTA[1:-1].replace("pref_x", "Pref X!"), "state_id"),
    ("op not an object", "state_delta", '"add pref_x"', "valid dictionary"),
    ("summary over the limit", "state_delta", OK_DELTA[1:-1].replace('"s"', '"' + "s" * 401 + '"'), "400"),
    ("extra field in focus", "state_focus", '{"target_id": "a", "why": "x"}', "why"),
    ("focus without target", "state_focus", '{"reason": "x"}', "target_id"),
    ("tool call without name", "tool_calls", '{"arguments": {}}', "name"),
    ("tool arguments not an object", "tool_calls", '{"name": "search", "arguments": [1]}', "arguments"),
]


@pytest.mark.parametrize(("why", "block", "bad", "fragment"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_item_is_excluded_alone(why: str, block: str, bad: str, fragment: str) -> None:
    good = {"state_focus": '{"target_id": "dec_a", "reason": "r"}', "state_delta": GOOD_OP,
            "tool_calls": '{"name": "search", "arguments": {"q": "x"}}'}[block]
    text = blocks(**{{"state_focus": "focus", "state_delta": "delta",
                      "tool_calls": "tools"}[block]: f"[{bad}, {good}]"},
                  message='{"content": null}')
    parsed = parse_output(text)
    kept = {"state_focus": parsed.state_focus, "state_delta": parsed.state_delta, "tool_calls": parsed.tool_calls}
    assert len(kept[block]) == 1  # the good item stands
    assert [(m.block, m.position) for m in parsed.malformed] == [(block, 1)]
    assert fragment in parsed.malformed[0].reason


def test_items_beyond_the_count_limit_are_excluded() -> None:
    ops = ", ".join(GOOD_OP.replace("kn_ok", f"kn_{i}") for i in range(5))
    parsed = parse_output(blocks(delta=f"[{ops}]", message='{"content": null}'), limits=COMPACT)
    assert [op.state_id for op in parsed.state_delta] == ["kn_0", "kn_1", "kn_2", "kn_3"]
    assert parsed.malformed[0].position == 5 and "more than 4" in parsed.malformed[0].reason
    assert len(parse_output(blocks(delta=f"[{ops}]", message='{"content": null}')).state_delta) == 5  # standard: 16


def test_only_malformed_items_is_a_step_not_a_protocol_error() -> None:
    parsed = parse_output(blocks(delta='[{"operation": "upsert"}]', message='{"content": null}'))
    assert parsed.is_empty() and len(parsed.malformed) == 1


def test_tools_and_an_answer_together_keep_the_tools_and_exclude_the_answer() -> None:
    parsed = parse_output(blocks(tools='[{"name": "search", "arguments": {}}]'))
    assert parsed.tool_calls[0].name == "search" and parsed.final_response is None
    assert parsed.malformed[0].block == "assistant_message"


def test_the_papers_one_template_is_accepted_for_remove_and_update() -> None:
    """B.3 shows one object with every field and says "Set operation to add, update, or remove"."""
    template = ('{{"state_set": "artifacts", "operation": "{op}", "state_id": "art_x", "summary": "s", "value": {{"a": '
                '1}}, "refs": []}}')
    parsed = parse_output(blocks(delta="[" + ", ".join(template.format(op=op)
                                                       for op in ("add", "update", "remove")) + "]",
                                 message='{"content": null}'))
    add, update, remove = parsed.state_delta
    assert add.state_set.value == "artifact" and update.state_set.value == "artifact"
    assert update.value == {"a": 1} and remove.state_id == "art_x" and not parsed.malformed


def test_state_values_nest_under_the_standard_profile_only() -> None:
    nested = '{"operation": "add", "state_set": "artifact", "state_id": "plan", "summary": "s", "value": ' \
             '{"legs": [{"from": "LIS", "to": "OPO", "stops": [{"at": "x", "min": 40}]}]}, "refs": []}'
    assert parse_output(blocks(delta=f"[{nested}]",
                               message='{"content": null}')).state_delta[0].value["legs"][0]["to"] == "OPO"
    compact = parse_output(blocks(delta=f"[{nested}]", message='{"content": null}'), limits=COMPACT)
    assert not compact.state_delta and "value" in compact.malformed[0].reason


def test_render_then_parse_round_trips() -> None:
    original = ModelOutput(
        state_delta=(
            AddOp(operation="add", state_set="judgement", state_id="dec_a", summary="décision", value={"n": [1, 2]}),
            UpdateOp(operation="update", state_id="dec_a", summary="changed"),
        )
    )
    again = parse_output(render_output(original))
    assert again == original
    assert "value" not in render_output(original).split("update")[1]  # update omits unchanged fields


def test_a_closing_tag_inside_a_json_string_is_content() -> None:
    """Found by the real eval: the grammar lets a string hold "</tool_calls>", so the parser must too."""
    from flowstate.protocol import block_schemas
    from grammars.check import accepts
    from grammars.four_blocks import protocol_grammar

    tricky = "</tool_calls></json> <assistant_message>"
    raw = output(tools=[{"name": "book", "arguments": {"hotel": tricky}}])
    tool = {"name": "book", "description": "",
            "parameters": {"type": "object", "properties": {"hotel": {"type": "string"}},
                                                                "required": ["hotel"]}}
    assert accepts(protocol_grammar(block_schemas(), [tool]), raw)
    assert parse_output(raw).tool_calls[0].arguments == {"hotel": tricky}
    with pytest.raises(ProtocolError, match="unexpected tag </json>"):  # not JSON: cut at the first closing tag
        parse_output(raw.replace('"hotel": "', '"hotel": '))
