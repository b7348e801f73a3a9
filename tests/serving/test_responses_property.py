"""The Responses API under odd input: bodies generated from the request schema ``/openapi.json`` publishes (every
input item type), then mutated — fields dropped, wrong types, extra fields, values swapped for any JSON — sent to
the app in process; no answer is a 5xx. A fixed seed and a bounded count, so CI runs the same cases every time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from engine.scripted import ScriptedEngine
from flowstate import Repository
from serving.app import create_app
from serving.services import ServerConfig
from tests.helpers import output

JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)


@pytest.fixture(scope="module")
def app() -> Iterator[tuple[TestClient, dict[str, Any]]]:
    engine = ScriptedEngine([output(content="ok")] * 20_000)
    with Repository.open(":memory:") as repo:
        served = create_app(ServerConfig(engine=engine, repo=repo))
        with TestClient(served, base_url="http://flowstate.test") as http:
            spec = http.get("/openapi.json").json()
            yield http, spec




TEXT = st.sampled_from(["", "hi", "flowstate", "user", "call_1", "mcpr_call_1", "msg_1", "auto", "x" * 40])


def from_schema(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> Any:
    """Values a JSON Schema (the subset pydantic writes: $ref, anyOf, const, enum, type, properties, required,
    items, additionalProperties) admits: every optional property sometimes present, every branch of a union."""
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, depth)
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([from_schema(b, defs, depth) for b in schema.get("anyOf", schema.get("oneOf"))])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "string":
        return TEXT
    if kind == "integer":
        return st.integers(schema.get("minimum", -3), min(schema.get("maximum", 2000), 2000))
    if kind == "number":
        return st.floats(schema.get("minimum", -1), schema.get("maximum", 3), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        items = from_schema(schema.get("items", {}), defs, depth + 1) if depth < 4 else JSON
        return st.lists(items, max_size=3)
    if kind == "object" and "properties" in schema:
        required = set(schema.get("required", ()))
        props = {k: from_schema(v, defs, depth + 1) if depth < 4 else JSON for k, v in schema["properties"].items()}
        return st.fixed_dictionaries({k: v for k, v in props.items() if k in required},
                                     optional={k: v for k, v in props.items() if k not in required})
    if kind == "object":
        return st.dictionaries(TEXT, JSON, max_size=3)
    return JSON


def paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*at, i))
    return out


@st.composite
def mutated(draw: Any, bodies: Any) -> Any:
    body = draw(bodies)
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(paths(body)))
        if not where:
            continue
        parent = body
        for key in where[:-1]:
            parent = parent[key]
        how = draw(st.sampled_from(["drop", "replace", "extra"]))
        if how == "drop":
            del parent[where[-1]]
        elif how == "replace":
            parent[where[-1]] = draw(JSON)
        elif isinstance(parent[where[-1]], dict):
            parent[where[-1]][draw(st.text(min_size=1, max_size=6))] = draw(JSON)
    return body


def test_no_body_is_a_5xx(app: tuple[TestClient, dict[str, Any]]) -> None:
    http, spec = app
    schemas = spec["components"]["schemas"]  # the published request schema, as a client reads it
    bodies = from_schema(schemas["ResponsesRequest"], schemas)

    statuses: set[int] = set()
    kinds: set[str] = set()

    @seed(20261203)
    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(mutated(bodies))
    def check(body: Any) -> None:
        r = http.post("/v1/responses", json=body)
        assert r.status_code < 500, (body, r.text)
        statuses.add(r.status_code)
        if isinstance(body, dict) and isinstance(body.get("input"), list):
            kinds.update(str(i.get("type")) for i in body["input"] if isinstance(i, dict))
        if r.status_code == 200 and isinstance(body, dict) and not body.get("stream"):
            rid = r.json()["id"]
            if r.json().get("store") is not False:
                assert http.get(f"/v1/responses/{rid}").status_code == 200
                assert http.get(f"/v1/responses/{rid}/input_items").status_code == 200

    check()
    assert {200, 400} <= statuses  # the generator reaches both accepted and refused bodies
    assert {"message", "function_call", "function_call_output", "mcp_approval_response"} <= kinds, kinds


@pytest.mark.parametrize(("body", "fragment"), [
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": [1, 2]}]}, "input.0.function_call_output"),
    ({"input": "hi", "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": 3}}, "tool_choice"),
    ({"input": [{"type": "mcp_approval_response", "approval_request_id": "mcpr_x"}]}, "approve"),
    ({"input": [{"type": "function_call", "call_id": 5, "name": "f", "arguments": "{}"}]}, "call_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]}, "text"),
    ({"input": "hi", "include": "reasoning.encrypted_content"}, "include"),
    ({"input": "hi", "include": ["reasoning.secret_sauce"]}, "reasoning.secret_sauce"),
])
def test_items_of_the_wrong_shape_are_400s(app: tuple[TestClient, dict[str, Any]], body: dict[str, Any],
                                           fragment: str) -> None:
    http, _ = app
    r = http.post("/v1/responses", json={"model": "flowstate", **body})
    assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text


def test_what_ingress_accepts_egress_returns(app: tuple[TestClient, dict[str, Any]]) -> None:
    http, _ = app
    deep: Any = "x"
    for _ in range(58):
        deep = {"d": deep}
    item = {"role": "user", "content": "hi", "extra": deep}
    r = http.post("/v1/responses", json={"model": "flowstate", "input": [item]})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    assert http.get(f"/v1/responses/{rid}").status_code == 200
    items = http.get(f"/v1/responses/{rid}/input_items")
    assert items.status_code == 200 and json.dumps(items.json()).count('"d"') == 58
    deeper: Any = "x"
    for _ in range(300):
        deeper = {"d": deeper}
    r = http.post("/v1/responses", json={"model": "flowstate", "input": [{**item, "extra": deeper}]})
    assert r.status_code == 400 and "at most 64" in r.json()["error"]["message"]
    chat = http.post("/v1/chat/completions", json={"model": "flowstate", "messages": [
        {"role": "user", "content": "hi", "extra": deeper}]})
    assert chat.status_code == 400  # one limit for every body
    assert http.get("/v1/responses/x", params={"include[]": "nope"}).status_code == 400
    assert http.get(f"/v1/responses/{rid}", params={"include[]": "reasoning.encrypted_content"}).status_code == 200
