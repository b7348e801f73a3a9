"""Client tool schemas drawn from the JSON Schema vocabulary — references of every spelling, recursion,
combinators, type lists, boolean schemas, const and enums of every JSON type, patterns, formats, prefixItems,
draft-4 item arrays, patternProperties, unicode names — get a 200 or a 400 that says why, never a 5xx, on an
engine that decodes under grammars; and every grammar a 200 was served under compiles in llguidance."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.scripted import ScriptedEngine
from grammars.check import validate
from tests.helpers import output
from tests.serving.test_contracts import USER, serve

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=6)
json_data = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=4),
                         lambda inner: st.lists(inner, max_size=2) | st.dictionaries(names, inner, max_size=2),
                         max_leaves=4)
TYPES = ["string", "integer", "number", "boolean", "null", "object", "array"]
leaves = st.one_of(
    st.sampled_from(TYPES).map(lambda t: {"type": t}),
    st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True).map(lambda ts: {"type": ts}),
    st.booleans(),
    json_data.map(lambda v: {"const": v}),
    st.lists(json_data, min_size=1, max_size=4).map(lambda vs: {"enum": vs}),
    st.sampled_from(["[a-z]+", "^[0-9]{3}$", "\\d+-\\d+", "(a|b)*"]).map(lambda p: {"type": "string", "pattern": p}),
    st.sampled_from(["date", "date-time", "email", "uuid", "uri", "ipv4"]).map(
        lambda f: {"type": "string", "format": f}),
    st.integers(0, 5).map(lambda n: {"type": "integer", "minimum": n, "maximum": n + 9}),
    # references: recursion to the root, the two definition containers, into a property, escaped, dangling
    st.sampled_from(["#", "#/$defs/item", "#/definitions/item", "#/$defs/a~1b", "#/$defs/nest/$defs/deep",
                     "#/properties/first", "#/$defs/missing"]).map(lambda r: {"$ref": r}),
)


def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(lambda props, req, extra: {"type": "object", "properties": props,
                                              **({"required": list(props)} if req and props else {}), **extra},
                  st.dictionaries(names, inner, max_size=3), st.booleans(),
                  st.sampled_from([{}, {"additionalProperties": False},
                                   {"patternProperties": {"^x": {"type": "string"}}},
                                   {"additionalProperties": {"type": "integer"}}])),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, inner, st.integers(0, 3)),
        st.lists(inner, min_size=1, max_size=2).map(lambda xs: {"type": "array", "prefixItems": xs}),
        st.lists(inner, min_size=1, max_size=2).map(lambda xs: {"type": "array", "items": xs}),  # draft 4-7 tuples
        st.builds(lambda kind, xs: {kind: xs}, st.sampled_from(["anyOf", "oneOf", "allOf"]),
                  st.lists(inner, min_size=1, max_size=3)),
    )


schemas = st.recursive(leaves, extend, max_leaves=8)
DRAFTS = [{}, {"$schema": "http://json-schema.org/draft-07/schema#"},
          {"$schema": "http://json-schema.org/draft-04/schema#"}]
parameters = st.builds(
    lambda draft, props, defs, nested: {**draft, "type": "object",
                                        "properties": {"first": {"type": "string"}, **props},
                                        "$defs": {"item": defs, "a/b": {"type": "integer"},
                                                  "nest": {"$defs": {"deep": nested}}},
                                        "definitions": {"item": {"type": "boolean"}}},
    st.sampled_from(DRAFTS), st.dictionaries(names, schemas, max_size=3), schemas, schemas)


def test_no_tool_schema_gets_a_5xx_and_every_served_grammar_compiles() -> None:
    engine = ScriptedEngine([output(content="ok")] * 400, grammar=True)
    seen: dict[int, int] = {}
    codes: dict[str | None, int] = {}
    for _, http in serve(engine, max_steps=1):

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        @given(params=parameters)
        def probe(params: dict[str, Any]) -> None:
            before = len(engine.calls)
            resp = http.post("/v1/chat/completions", json={
                "model": "flowstate", "messages": USER, "user": f"s{sum(seen.values())}",
                "tools": [{"type": "function", "function": {"name": "tool", "parameters": params}}]})
            seen[resp.status_code] = seen.get(resp.status_code, 0) + 1
            assert resp.status_code in (200, 400), (params, resp.text)
            if resp.status_code == 400:
                error = resp.json()["error"]
                assert error["param"].startswith("tools") and error["message"], error
                codes[error["code"]] = codes.get(error["code"], 0) + 1
            else:
                assert len(engine.calls) == before + 1
                validate(engine.calls[-1]["grammar"])  # what a real engine would compile, compiles

        probe()
    assert seen.get(200, 0) >= 30 and seen.get(400, 0) >= 5, (seen, codes)  # both outcomes were exercised


@pytest.mark.parametrize(("parameters", "status"), [
    ({"type": "object", "definitions": {"c": {"type": "string"}}, "properties": {"a": {"$ref": "#/definitions/c"}}},
     200),
    ({"type": "object", "properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}}}, 200),
    ({"type": "object", "$defs": {"geo": {"$defs": {"City": {"type": "string"}}}},
      "properties": {"a": {"$ref": "#/$defs/geo/$defs/City"}}}, 200),
    ({"type": "object", "properties": {"self": {"$ref": "#"}}}, 200),
    ({"type": "object", "$defs": {"a/b": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/a~1b"}}}, 200),
    ({"type": "object", "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}}}, 200),
    ({"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}, 400),
])
def test_the_reported_schemas_are_served_and_an_endless_recursion_is_a_400_naming_it(
        parameters: dict[str, Any], status: int) -> None:
    engine = ScriptedEngine([output(content="ok")], grammar=True)
    for _, http in serve(engine, max_steps=1):
        resp = http.post("/v1/chat/completions", json={"model": "flowstate", "messages": USER, "user": "r",
                                                       "tools": [{"type": "function", "function": {
                                                           "name": "tool", "parameters": parameters}}]})
        assert resp.status_code == status, resp.text
        if status == 400:
            error = resp.json()["error"]
            assert error["code"] == "infinite_recursion" and error["param"] == "tools[0].function.parameters"
            assert "recursive schema with no finite value: #" in error["message"]
        else:
            validate(engine.calls[-1]["grammar"])
