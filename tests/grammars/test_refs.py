"""One reader of JSON Schema references: every local pointer followed, recursion kept as a definition llguidance
decodes, a recursion with no finite value refused by name, and keywords told from property names."""

from __future__ import annotations

from typing import Any

import pytest

from flowstate.protocol import block_schemas
from grammars.check import accepts, validate
from grammars.four_blocks import ToolBounds, protocol_grammar
from grammars.refs import SchemaRefError, inline, pointer
from tests.helpers import output

CITY = {"type": "string", "enum": ["Paris", "Rome"]}


@pytest.mark.parametrize(("ref", "root", "want"), [
    ("#", {"type": "object"}, {"type": "object"}),
    ("#/definitions/city", {"definitions": {"city": CITY}}, CITY),
    ("#/$defs/geo/$defs/City", {"$defs": {"geo": {"$defs": {"City": CITY}}}}, CITY),
    ("#/$defs/a~1b", {"$defs": {"a/b": CITY}}, CITY),
    ("#/$defs/a~0b", {"$defs": {"a~b": CITY}}, CITY),
    ("#/$defs/caf%C3%A9", {"$defs": {"café": CITY}}, CITY),
    ("#/properties/a", {"properties": {"a": CITY}}, CITY),
    ("#/anyOf/1", {"anyOf": [{"type": "null"}, CITY]}, CITY),
])
def test_a_local_pointer_resolves_to_its_target(ref: str, root: Any, want: Any) -> None:
    assert pointer(root, ref) == want


@pytest.mark.parametrize("ref", ["#/$defs/none", "other.json#/x", "#anchor", "#/anyOf/9", 7])
def test_a_pointer_to_nothing_is_an_error_that_names_it(ref: Any) -> None:
    with pytest.raises(SchemaRefError, match="\\$ref") as raised:
        pointer({"$defs": {}, "anyOf": [True]}, ref)
    assert raised.value.code == "unresolved_ref"


def test_inline_follows_every_spelling_and_keeps_properties_named_like_keywords() -> None:
    schema = {"type": "object", "definitions": {"city": CITY}, "$defs": {"geo": {"$defs": {"City": CITY}}},
              "properties": {"title": {"type": "string", "description": "dropped"},
                             "description": {"$ref": "#/definitions/city", "description": "the city"},
                             "properties": {"$ref": "#/$defs/geo/$defs/City"},
                             "again": {"$ref": "#/properties/title"}},
              "required": ["title"]}
    out = inline(schema, frozenset({"title", "description"}))
    assert out == {"type": "object", "required": ["title"], "properties": {
        "title": {"type": "string"}, "description": CITY, "properties": CITY, "again": {"type": "string"}}}


TREE = {"type": "object", "properties": {"value": {"type": "integer"},
                                         "children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["value"]}
LIST = {"type": "object", "$defs": {"node": {"type": "object", "properties": {
    "name": {"type": "string"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
    "required": ["name", "next"]}}, "properties": {"head": {"$ref": "#/$defs/node"}}, "required": ["head"]}


def test_recursion_stays_a_reference_to_one_hoisted_definition() -> None:
    out = inline(LIST, prefix="t0_")
    assert out["properties"]["head"] == {"$ref": "#/$defs/t0_ref0"}
    node = out["$defs"]["t0_ref0"]
    assert node["properties"]["next"]["anyOf"][0] == {"$ref": "#/$defs/t0_ref0"}
    root = inline(TREE)  # '#' inside the root: the root once, then its copy as the definition the children name
    assert root["properties"]["children"]["items"] == {"$ref": "#/$defs/ref0"}
    assert root["$defs"]["ref0"]["properties"]["children"]["items"] == {"$ref": "#/$defs/ref0"}


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]},
    {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
               "b": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/a"}}},
     "type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}},
])
def test_a_recursion_with_no_finite_value_is_refused_naming_its_cycle(schema: dict[str, Any]) -> None:
    with pytest.raises(SchemaRefError, match="recursive schema with no finite value: #") as raised:
        inline(schema)
    assert raised.value.code == "infinite_recursion"


def tool_grammar(parameters: dict[str, Any]) -> str:
    tools = [{"name": "walk", "description": "", "parameters": parameters}]
    return protocol_grammar(block_schemas(), tools, bounds=ToolBounds(text=40, items=4))


@pytest.mark.parametrize(("schema", "good", "bad"), [
    (TREE, {"value": 1, "children": [{"value": 2, "children": [{"value": 3, "children": []}]}]},
     {"value": 1, "children": [{"value": "two", "children": []}]}),
    (LIST, {"head": {"name": "a", "next": {"name": "b", "next": None}}}, {"head": {"name": "a", "next": 3}}),
])
def test_a_recursive_tool_compiles_and_its_grammar_decodes_nested_values_only(schema: dict[str, Any],
                                                                            good: Any, bad: Any) -> None:
    grammar = tool_grammar(schema)
    validate(grammar)
    assert accepts(grammar, output(tools=[{"name": "walk", "arguments": good}]))
    assert not accepts(grammar, output(tools=[{"name": "walk", "arguments": bad}]))


def test_a_tool_property_named_title_is_decoded_not_dropped() -> None:
    grammar = tool_grammar({"type": "object", "properties": {"title": {"type": "string"},
                                                            "description": {"type": "string"}},
                            "required": ["title", "description"]})
    assert accepts(grammar, output(tools=[{"name": "walk", "arguments": {"title": "a", "description": "b"}}]))
    assert not accepts(grammar, output(tools=[{"name": "walk", "arguments": {}}]))


def test_references_shared_along_many_paths_expand_within_a_bound() -> None:
    # each level names the next twice: 2^40 copies unbounded; a clear error instead of a hang
    defs = {f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"},
                                                       "b": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(40)}
    defs["d40"] = {"type": "string"}
    with pytest.raises(SchemaRefError, match="expands past 20,000") as raised:
        inline({"$defs": defs, "$ref": "#/$defs/d0"})
    assert raised.value.code == "schema_too_large"
    small = {**{k: v for k, v in defs.items() if int(k[1:]) >= 30}}  # ten levels: 2^10 copies, within it
    assert inline({"$defs": small, "$ref": "#/$defs/d30"})["properties"]["a"]["properties"]["b"]["type"] == "object"
