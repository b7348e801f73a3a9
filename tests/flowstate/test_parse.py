"""The four-block protocol parser: valid outputs parse, broken ones name the block and the fault."""

from __future__ import annotations

import pytest

from flowstate.errors import ProtocolError
from flowstate.parse import parse_output
from flowstate.protocol import AddOp, ModelOutput, UpdateOp, render_output
from tests.helpers import output

OK_DELTA = '[{"operation": "add", "state_set": "preference", "state_id": "pref_x", "summary": "s", "value": {}, "refs": []}]'


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
    ("blocks out of order", blocks().replace("<state_focus>\n[]\n</state_focus>\n", "") + "<state_focus>[]</state_focus>", "state_focus", "unexpected tag <state_delta>"),
    ("prose before a block", "Let me think.\n" + blocks(), "state_focus", "unexpected text"),
    ("text after the last block", blocks() + "\nDone!", "assistant_message", "after"),
    ("invalid JSON", blocks(delta="[{'operation': 'add'}]"), "state_delta", "invalid JSON"),
    ("unclosed block", blocks().replace("</tool_calls>", ""), "tool_calls", "missing </tool_calls>"),
    ("empty block", blocks(tools=""), "tool_calls", "empty block"),
    ("unknown state type", blocks(delta=OK_DELTA.replace("preference", "opinion")), "state_delta", "state_set"),
    ("unknown operation", blocks(delta=OK_DELTA.replace('"add"', '"upsert"')), "state_delta", "operation"),
    ("unknown relation", blocks(delta=OK_DELTA.replace('"refs": []', '"refs": [{"rel": "causes", "state_id": "a"}]')), "state_delta", "rel"),
    ("bad id shape", blocks(delta=OK_DELTA.replace("pref_x", "Pref X!")), "state_delta", "state_id"),
    ("extra field", blocks(focus='[{"target_id": "a", "why": "x"}]'), "state_focus", "why"),
    ("message not an object", blocks(message='"hello"'), "assistant_message", "valid dictionary"),
    ("tool call without name", blocks(tools='[{"arguments": {}}]', message='{"content": null}'), "tool_calls", "name"),
    ("tools and final answer together", blocks(tools='[{"name": "search", "arguments": {}}]'), "assistant_message", "one execution decision"),
    ("all parts empty", blocks(message='{"content": null}'), "output", "at least one"),
]


@pytest.mark.parametrize(("why", "text", "block", "fragment"), REJECTED, ids=[r[0] for r in REJECTED])
def test_rejects_broken_outputs_naming_the_block(why: str, text: str, block: str, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_output(text)
    assert info.value.block == block
    assert fragment in info.value.message


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
    tool = {"name": "book", "description": "", "parameters": {"type": "object", "properties": {"hotel": {"type": "string"}},
                                                                "required": ["hotel"]}}
    assert accepts(protocol_grammar(block_schemas(), [tool]), raw)
    assert parse_output(raw).tool_calls[0].arguments == {"hotel": tricky}
    with pytest.raises(ProtocolError, match="unexpected tag </json>"):  # not JSON: cut at the first closing tag
        parse_output(raw.replace('"hotel": "', '"hotel": '))
