"""The endpoint keeps its promises when something goes wrong: at the step budget a request under a contract
(a JSON answer, a required or named tool call) ends with a reply that keeps it — the last step's grammar
admits nothing else — or with an error, never with the budget message; an unfinished request says so; a
model output of any shape is fed back, never a 5xx; path names are normalised like the others; a tool
schema's dangling $ref is refused; the message cap holds. In process, with the official openai client."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.base import Capabilities, Engine, Generation, Message, Usage
from engine.scripted import ScriptedEngine
from flowstate import LoopConfig, Repository
from grammars.check import accepts
from serving.app import create_app
from serving.services import ServerConfig
from tests.helpers import add, output
from tests.serving.test_chat import PRICE_TOOL

SCHEMA = {"type": "object", "properties": {"hotel": {"type": "string"}, "nights": {"type": "integer"}},
          "required": ["hotel", "nights"], "additionalProperties": False}
JSON_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "booking", "schema": SCHEMA}}
NAMED: Any = {"type": "function", "function": {"name": "get_price"}}
USER = [{"role": "user", "content": "Which hotel, for how many nights?"}]


def serve(engine: Engine, **loop: Any) -> Iterator[tuple[openai.OpenAI, TestClient]]:
    with Repository.open(":memory:") as repo:
        app = create_app(ServerConfig(engine=engine, repo=repo, loop=LoopConfig(**loop)))
        with TestClient(app, base_url="http://flowstate.test") as http:
            yield openai.OpenAI(base_url="http://flowstate.test/v1", api_key="none", http_client=http,
                                max_retries=0), http


def answer_json(value: Any) -> str:
    return output(content="X").replace('"X"', json.dumps(value))


# -- the last step decides ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("kind", "kept", "broken"), [
    ("json_schema", answer_json({"hotel": "A", "nights": 2}), output(tools=[{"name": "get_price",
                                                                             "arguments": {"hotel": "A"}}])),
    ("named", output(tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]), output(content="A, 2 nights")),
    ("required", output(tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]), output(delta=[add("note")])),
])
def test_the_last_steps_grammar_admits_only_what_the_request_promised(kind: str, kept: str, broken: str) -> None:
    engine = ScriptedEngine([kept], grammar=True)
    for api, _ in serve(engine, max_steps=1):
        options: dict[str, Any] = {"response_format": JSON_FORMAT} if kind == "json_schema" else {
            "tool_choice": NAMED if kind == "named" else "required"}
        r = api.chat.completions.create(model="flowstate", messages=USER, tools=[PRICE_TOOL], user=kind,
                                        **options)
        if kind == "json_schema":
            assert json.loads(r.choices[0].message.content or "") == {"hotel": "A", "nights": 2}
            assert r.choices[0].finish_reason == "stop"
        else:
            calls = r.choices[0].message.tool_calls
            assert r.choices[0].finish_reason == "tool_calls" and calls and calls[0].function.name == "get_price"
    grammar = engine.calls[0]["grammar"]  # step 1 of 1: the last allowed step
    assert grammar is not None and accepts(grammar, kept) and not accepts(grammar, broken)
    assert not accepts(grammar, output(delta=[add("only_a_note")]))  # no step that only updates state


@pytest.mark.parametrize("kind", ["json_schema", "named", "required"])
def test_without_a_grammar_a_contract_the_budget_breaks_is_an_error_not_the_budget_message(kind: str) -> None:
    # an engine without grammars: the model keeps noting states and never decides
    engine = ScriptedEngine([output(delta=[add(f"note_{i}")]) for i in range(4)])
    for api, http in serve(engine, max_steps=2):
        options: dict[str, Any] = {"response_format": JSON_FORMAT} if kind == "json_schema" else {
            "tool_choice": NAMED if kind == "named" else "required"}
        with pytest.raises(openai.InternalServerError) as raised:
            api.chat.completions.create(model="flowstate", messages=USER, tools=[PRICE_TOOL], user=kind, **options)
        error = raised.value.body
        assert isinstance(error, dict) and error["code"] == "request_failed" and error["type"] == "model_error"
        assert "admits no budget message" in error["message"] and raised.value.status_code == 502
        streamed = http.post("/v1/chat/completions", json={
            "model": "flowstate", "messages": USER, "tools": [PRICE_TOOL], "user": kind + "-s", "stream": True,
            **options})
        events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
        assert events[-1]["error"]["code"] == "request_failed"  # the stream's error event
        assert not any(c["choices"][0]["delta"].get("content") for c in events[:-1] if c.get("choices"))


def test_an_unfinished_request_says_so_streamed_or_not() -> None:
    engine = ScriptedEngine([output(delta=[add("note_a")]), output(delta=[add("note_b")])])
    for api, _ in serve(engine, max_steps=1):
        r = api.chat.completions.create(model="flowstate", messages=USER, user="u1")
        ext = r.model_extra["flowstate"]  # type: ignore[index]
        assert r.choices[0].finish_reason == "length" and "step budget of 1" in ext["unfinished"]
        assert "could not finish" in (r.choices[0].message.content or "")
        chunks = list(api.chat.completions.create(model="flowstate", messages=USER, user="u2", stream=True))
        last = [c for c in chunks if c.choices][-1]
        assert last.choices[0].finish_reason == "length"
        assert "step budget" in last.model_extra["flowstate"]["unfinished"]  # type: ignore[index]
    finished = ScriptedEngine([output(content="A")])
    for api, _ in serve(finished):
        r = api.chat.completions.create(model="flowstate", messages=USER, user="u3")
        assert r.choices[0].finish_reason == "stop" and r.model_extra["flowstate"]["unfinished"] is None  # type: ignore[index]


# -- whatever a model writes is its own fault, fed back -------------------------------------------------

class Queue(Engine):
    """Answers with the outputs put in it, in order."""

    name = "queue"
    capabilities = Capabilities()

    def __init__(self) -> None:
        self.outputs: list[str] = []

    def generate(self, messages: Sequence[Message], **_: Any) -> Generation:
        return Generation(self.outputs.pop(0), Usage(prompt_tokens=1, completion_tokens=1))

    def count_tokens(self, text: str) -> int:
        return len(text)


VALID = [output(content="fine"), output(tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]),
         output(delta=[add("kept", n=1)], content="ok")]
HOSTILE = ["1" * 5000, "1e400", "-1e999", '"\\ud800"', "[" * 3000, "null", '{"$ref": "#"}', '"</tool_calls>"',
           "NaN", "Infinity", '"' + "\u202e" * 50 + '"', "9" * 4301, "1.5e308", '{"a": ' * 40]


@st.composite
def model_outputs(draw: st.DrawFn) -> str:
    """A valid output with one JSON value, key or piece of text replaced by something hostile."""
    text = draw(st.sampled_from(VALID))
    hostile = draw(st.sampled_from(HOSTILE) | st.text(max_size=40))
    where = draw(st.sampled_from(['"fine"', '"A"', "1", '"kept"', "[]", "null", "<tool_calls>", "\n", "{"]))
    if where in text:
        at = draw(st.integers(0, text.count(where) - 1))
        parts = text.split(where)
        text = where.join(parts[: at + 1]) + hostile + where.join(parts[at + 1:])
    cut = draw(st.one_of(st.none(), st.integers(0, len(text))))
    return text if cut is None else text[:cut]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(bad=model_outputs())
def test_no_model_output_ever_becomes_a_5xx(bad: str) -> None:
    engine = Queue()
    for _, http in serve(engine, max_protocol_errors=3):
        engine.outputs[:] = [bad, output(content="recovered")]
        r = http.post("/v1/chat/completions", json={"model": "flowstate", "messages": USER, "user": "fuzz",
                                                    "tools": [PRICE_TOOL]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["finish_reason"] in ("stop", "tool_calls")
        if body["choices"][0]["finish_reason"] == "tool_calls":  # the client's call: valid JSON arguments
            json.loads(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])


# -- names, schemas, caps ----------------------------------------------------------------------------------

def test_a_session_is_reached_in_paths_under_either_unicode_form() -> None:
    decomposed, composed = "caf" + "e\u0301", "caf\u00e9"
    assert unicodedata.normalize("NFC", decomposed) == composed
    for name, other in ((decomposed, composed), (composed, decomposed)):
        for api, http in serve(ScriptedEngine([output(content="hi")])):
            api.chat.completions.create(model="flowstate", messages=USER, user=name)
            for path in (f"/v1/sessions/{httpx.URL(other).path}", f"/v1/sessions/{name}"):
                got = http.get(path)
                assert got.status_code == 200 and got.json()["id"] == composed
                assert http.get(path + "/graph").status_code == 200
            assert http.delete(f"/v1/sessions/{other}").json()["deleted"] is True
            assert http.get(f"/v1/sessions/{name}").status_code == 404


@pytest.mark.parametrize("ref", ["#/definitions/missing", "#/$defs/gone", "other.json#/x", "#/properties/x/nope"])
def test_a_tool_schema_whose_ref_resolves_to_nothing_is_a_400_naming_the_tool(ref: str) -> None:
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}, "y": {"$ref": ref}}}}}
    for api, _ in serve(ScriptedEngine([output(content="never")])):
        with pytest.raises(openai.BadRequestError) as raised:
            api.chat.completions.create(model="flowstate", messages=USER, tools=[tool], user="t")  # type: ignore[list-item]
        assert "tool 'lookup'" in str(raised.value) and "$ref" in str(raised.value)
    resolved = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "$defs": {"city": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/city"}}}}}
    for api, _ in serve(ScriptedEngine([output(content="fine")])):
        r = api.chat.completions.create(model="flowstate", messages=USER, tools=[resolved], user="t")  # type: ignore[list-item]
        assert r.choices[0].message.content == "fine"


def test_the_message_cap_is_2048() -> None:
    for api, _ in serve(ScriptedEngine([output(content="read them all")])):
        many: Any = [{"role": "user", "content": f"line {i}"} for i in range(2049)]
        with pytest.raises(openai.BadRequestError, match="at most 2048 messages"):
            api.chat.completions.create(model="flowstate", messages=many, user="cap")
        r = api.chat.completions.create(model="flowstate", messages=many[:2048], user="cap")
        assert r.choices[0].message.content == "read them all"


def test_the_contracts_bench_counts_kept_and_errors() -> None:
    from flowstate.bench.contracts import bench_contracts, render_table

    call = output(tools=[{"name": "get_price", "arguments": {"hotel": "Aurora"}}])
    kept = ScriptedEngine([answer_json({"hotel": "Aurora", "nights": 3}), call, call])
    rows = bench_contracts(kept, 1, LoopConfig(max_steps=1))
    assert [(r["request"], r["kept"], r["error"], r["broken"]) for r in rows] == [
        ("json_schema", 1, 0, 0), ("tool_choice named", 1, 0, 0), ("tool_choice required", 1, 0, 0)]
    # no grammar, and a model that answers in prose or notes states: each request is an error, never broken
    prose = ScriptedEngine([output(content="Aurora, 3 nights"), output(delta=[add("n1")]), output(delta=[add("n2")])])
    rows = bench_contracts(prose, 1, LoopConfig(max_steps=1))
    assert [(r["kept"], r["error"], r["broken"]) for r in rows] == [(0, 1, 0)] * 3
    assert "| json_schema | 1 | 0 | 1 | 0 | – |" in render_table(rows)
