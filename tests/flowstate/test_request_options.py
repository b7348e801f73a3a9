"""What a request asks of the model: tool choice, one call per step, the answer's JSON schema — by grammar,
and enforced on outputs decoded without one; stop sequences; per-call sampling reaching the engine."""

from __future__ import annotations

import json

import pytest

from engine.base import Capabilities, Sampling
from engine.errors import EngineConfigError
from engine.scripted import ScriptedEngine
from flowstate import Repository
from flowstate.config import AgentConfig
from flowstate.constrain import GrammarMode, Grammars
from flowstate.demo import hotel
from flowstate.loop import RequestRun
from flowstate.memory.state import FLOWSTATE
from flowstate.parse import parse_output
from flowstate.request_options import RequestOptions
from grammars.check import accepts
from tests.helpers import output

SEARCH = {"name": "search_hotels", "arguments": {"city": "Lisbon", "check_in": "2026-09-20", "check_out": "2026-09-22",
                                                  "as_of": "2026-09-01"}}
BOOK = {"name": "book_hotel", "arguments": {"hotel_id": "A", "check_in": "2026-09-20", "check_out": "2026-09-22"}}
SCHEMA = {"type": "object",
          "properties": {"hotel": {"type": "string", "enum": ["A", "B"]}, "nights": {"type": "integer"}},
          "required": ["hotel", "nights"], "additionalProperties": False}


def grammar(**options: object) -> str:
    g = Grammars(hotel.TOOLS.specs(), GrammarMode.STATIC, options=RequestOptions(**options)).static  # type: ignore[arg-type]
    assert g is not None
    return g


def json_answer(value: object) -> str:
    return output(content="X").replace('{"content": "X"}', json.dumps({"content": value}))


@pytest.mark.parametrize(("options", "text", "ok"), [
    ({"tool_choice": "required"}, output(tools=[SEARCH]), True),
    ({"tool_choice": "required"}, output(content="no tools"), False),
    ({"tool_choice": "required"}, output(delta=[{"operation": "remove", "state_id": "x"}]), True),  # state first
    ({"tool_choice": "search_hotels"}, output(tools=[SEARCH]), True),
    ({"tool_choice": "search_hotels"}, output(tools=[BOOK]), False),
    ({"tool_choice": "search_hotels"}, output(content="hi"), False),
    ({"tool_choice": "none"}, output(tools=[SEARCH]), False),
    ({"tool_choice": "none"}, output(content="hi"), True),
    ({"parallel_tool_calls": False}, output(tools=[SEARCH]), True),
    ({"parallel_tool_calls": False}, output(tools=[SEARCH, BOOK]), False),
    ({"answer_schema": SCHEMA}, json_answer({"hotel": "A", "nights": 2}), True),
    ({"answer_schema": SCHEMA}, json_answer({"hotel": "C", "nights": 2}), False),
    ({"answer_schema": SCHEMA}, output(content="A for two nights"), False),
    ({"hidden": ("book_hotel",)}, output(tools=[SEARCH]), True),  # a Responses mcp tool's allowed_tools
    ({"hidden": ("book_hotel",)}, output(tools=[BOOK]), False),
])
def test_the_grammar_holds_the_request_to_its_options(options: dict, text: str, ok: bool) -> None:
    assert accepts(grammar(**options), text) is ok


@pytest.mark.parametrize(("options", "text", "kept", "reason"), [
    ({"tool_choice": "required"}, output(content="no tools"), "nothing", "call a tool"),
    ({"tool_choice": "search_hotels"}, output(tools=[BOOK, SEARCH]), "search_hotels", "does not allow"),
    ({"tool_choice": "none"}, output(tools=[SEARCH]), "nothing", "does not allow"),
    ({"parallel_tool_calls": False}, output(tools=[SEARCH, BOOK]), "search_hotels", "one call per step"),
    ({"hidden": ("book_hotel",)}, output(tools=[BOOK, SEARCH]), "search_hotels", "not among this request's allowed"),
])
def test_without_a_grammar_what_the_options_forbid_is_excluded(options: dict, text: str, kept: str,
                                                               reason: str) -> None:
    out = RequestOptions(**options).enforce(parse_output(text))  # type: ignore[arg-type]
    assert [c.name for c in out.tool_calls] == ([] if kept == "nothing" else [kept])
    assert out.final_response is None and reason in out.malformed[-1].reason


def test_a_json_answer_is_checked_and_handed_over_as_json_text() -> None:
    parsed = parse_output(json_answer({"hotel": "B", "nights": 3}), answer_schema=SCHEMA)
    assert json.loads(parsed.final_response or "") == {"hotel": "B", "nights": 3}
    with pytest.raises(Exception, match="does not match the response format at 'nights'"):
        parse_output(json_answer({"hotel": "B", "nights": "three"}), answer_schema=SCHEMA)


def test_stop_sampling_and_budget_reach_the_request_and_its_engine() -> None:
    engine = ScriptedEngine([output(content="Hotel A. Then B.")])
    options = RequestOptions(sampling=Sampling(temperature=0.7, top_p=0.9, seed=42), max_tokens=77, stop=(". ",))
    with Repository.open(":memory:") as repo:
        run = RequestRun(engine=engine, repo=repo, session="s", query="q", agent=AgentConfig(engine, FLOWSTATE),
                         options=options)
        run.step()
        assert run.record is not None and run.record.response == "Hotel A"
        assert repo.requests("s")[0].response == "Hotel A"  # stored as the client received it
    assert engine.calls == [{"grammar": None, "max_tokens": 77, "sampling": options.sampling}]


def test_an_engine_that_cannot_honour_a_sampling_field_is_refused() -> None:
    class Fixed(ScriptedEngine):
        capabilities = Capabilities(sampling=frozenset({"temperature"}))

    with Repository.open(":memory:") as repo, pytest.raises(EngineConfigError, match="cannot honour seed, top_p"):
        fixed = Fixed(["x"])
        RequestRun(engine=fixed, repo=repo, session="s", query="q", agent=AgentConfig(fixed, FLOWSTATE),
                   options=RequestOptions(sampling=Sampling(temperature=0.5, top_p=0.5, seed=1)))
