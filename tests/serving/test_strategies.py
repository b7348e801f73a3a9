"""Every strategy the evaluator compares can be served: ``flowstate serve --strategy NAME`` through the official
``openai`` client — a client tool round trip, then a second request that only the strategy's memory can answer
(the scripted engine serves that answer only to a prompt holding what the first request left)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from flowstate.memory import get
from flowstate.memory.mage import COMPRESS, MAINTAIN
from flowstate.protocol import ModelOutput, render_output
from tests.helpers import add
from tests.serving.conftest import Server
from tests.serving.test_chat import PRICE_TOOL, client


def step(strategy: str, delta: list[dict[str, Any]] = (), tools: list[dict[str, Any]] = (),  # type: ignore[assignment]
         content: str | None = None, when: str | None = None) -> dict[str, Any]:
    """A script line: an output in the strategy's own blocks (served to a prompt holding ``when``)."""
    text = render_output(ModelOutput.model_validate(
        {"state_focus": [], "state_delta": list(delta), "tool_calls": list(tools),
         "assistant_message": {"content": content}}),
        get(strategy).blocks, get(strategy).optional)
    return {"text": text, **({"when": when} if when else {})}


# per strategy: what request 1's prompt must show (its memory section), and what request 2's prompt can only
# hold if the memory kept request 1 (the tool result, the state made from it, the summary of the segment)
CASES: dict[str, tuple[str, str]] = {
    "full-context": ("<user_query>", '"result":{"price":120}'),
    "flowstate-lean": ("<user_query>", '"result":{"price":120}'),  # the chat below the crossover
    "no-psa": ("<active_state>", '"price_a"'),
    "mage": ("<execution_state>", "SUMMARY: A costs 120"),
    "mem0-style": ("<memories>", "FACT: hotel A costs 120"),
}


def script(strategy: str) -> list[dict[str, Any]]:
    first_memory, remembered = CASES[strategy]
    delta1 = [add("want_a", hotel="A")] if strategy == "no-psa" else []
    delta2 = [add("price_a", refs=[("supports", "obs_r1_s1_1")], price=120)] if strategy == "no-psa" else []
    lines: list[dict[str, Any]] = []
    if strategy == "mage":  # Compress and Maintain at the end of each request (first: their prompts hold the rest)
        lines += [{"text": '{"summary": "SUMMARY: A costs 120"}', "when": COMPRESS},
                  {"text": '{"valid": true, "note": ""}', "when": MAINTAIN},
                  {"text": '{"summary": "asked again"}', "when": COMPRESS},
                  {"text": '{"valid": true, "note": ""}', "when": MAINTAIN}]
    if strategy == "mem0-style":  # extraction at the end of each request; the update phase after facts were found
        lines += [{"text": '{"facts": ["FACT: hotel A costs 120"]}', "when": "<extract_memories>"},
                  {"text": '{"memory": [{"id": "0", "text": "FACT: hotel A costs 120", "event": "ADD", '
                           '"old_memory": ""}]}', "when": "<update_memories>"},
                  {"text": '{"facts": []}', "when": "<extract_memories>"}]
    return lines + [
        step(strategy, delta1, [{"name": "get_price", "arguments": {"hotel": "A"}}], when=first_memory),
        step(strategy, delta2, content="A costs 120.", when='"price":120'),
        step(strategy, content="It was 120.", when=remembered),
    ]


@pytest.mark.parametrize("strategy", list(CASES))
def test_a_served_strategy_remembers_across_requests(server: Server, strategy: str) -> None:
    url = server.start(script(strategy), "--strategy", strategy)
    c = client(url)
    messages: list[Any] = [{"role": "user", "content": "What does hotel A cost?"}]
    first = c.chat.completions.create(model="flowstate", messages=messages, tools=[PRICE_TOOL], user="alice")
    calls = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_price"
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": calls[0].id, "content": '{"price": 120}'}]
    answer = c.chat.completions.create(model="flowstate", messages=messages, tools=[PRICE_TOOL], user="alice")
    assert answer.choices[0].message.content == "A costs 120."
    again = c.chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "And what was it?"}],
                                      tools=[PRICE_TOOL], user="alice")
    assert again.choices[0].message.content == "It was 120."
    assert again.model_extra is not None and again.model_extra["flowstate"]["request"] == 2
    session = c.get("/sessions/alice", cast_to=object)
    assert [r["query"] for r in session["requests"]] == ["What does hotel A cost?", "And what was it?"]  # type: ignore[index]


def test_a_client_tool_may_not_take_a_memory_methods_tool_name(server: Server) -> None:
    url = server.start([step("mage", content="x")], "--strategy", "mage")
    revise = {"type": "function", "function": {"name": "revise_memory", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError, match="already server-side tools"):
        client(url).chat.completions.create(model="flowstate", messages=[{"role": "user", "content": "hi"}],
                                            tools=[revise], user="bob")  # type: ignore[list-item]


def test_an_unknown_strategy_is_refused_with_the_valid_ones(server: Server) -> None:
    with pytest.raises(RuntimeError,
                       match="unknown strategy 'magic'; valid strategies: flowstate, flowstate-paged, "
                             "flowstate-facts, flowstate-lean, full-context"):
        server.start([step("flowstate", content="x")], "--strategy", "magic")
