"""JSON Schema references and subschemas, read one way by every reader: the request check and the grammar builder.

A schema's keywords say which of its values are schemas (``properties`` maps names to schemas, ``enum`` holds
data), so a walk goes through ``subschemas`` and never mistakes a property named ``title`` for an annotation.
``inline`` replaces every local ``$ref`` ('#', '#/$defs/x', '#/definitions/x', '#/properties/a', escaped
pointers) by what it points at; a reference met again inside its own expansion — a recursive schema, a tree
node whose ``next`` is a node — stays a reference, to a definition hoisted into the result's ``$defs``, which
llguidance's ``%json`` decodes itself. A recursion with no finite instance (every path through it required) is
refused, naming its cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SCHEMA_ONE = ("items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
              "not", "if", "then", "else", "contains", "propertyNames")
CONTAINERS = ("$defs", "definitions")  # hold schemas only for references to reach: inlined, then dropped
MAX_NODES = 20_000  # subschemas a schema may expand to with its references followed


class SchemaRefError(ValueError):
    """A ``$ref`` that cannot be followed, or a recursion no finite value satisfies; the message says which."""

    def __init__(self, message: str, ref: str, code: str = "unresolved_ref") -> None:
        super().__init__(message)
        self.ref = ref
        self.code = code  # unresolved_ref, infinite_recursion or schema_too_large


def subschemas(node: dict[str, Any], fn: Callable[[Any], Any]) -> dict[str, Any]:
    """A copy of ``node`` with ``fn`` applied to each of its direct subschemas (its other values as they are)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: fn(sub) for name, sub in value.items()}
        elif key in SCHEMA_LISTS and isinstance(value, list):
            out[key] = [fn(sub) for sub in value]
        elif key == "items" and isinstance(value, list):  # draft 4-7: one schema per position
            out[key] = [fn(sub) for sub in value]
        elif key in SCHEMA_ONE:
            out[key] = fn(value)
        else:
            out[key] = value
    return out


def walk(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema object in ``node``, itself first, at any depth."""
    if not isinstance(node, dict):
        return
    yield node
    found: list[Any] = []
    subschemas(node, found.append)
    for sub in found:
        yield from walk(sub)


def pointer(root: Any, ref: Any) -> Any:
    """What a local ``$ref`` points at in ``root``: '#' is the root, '#/a/b' a JSON Pointer (percent-encoded,
    ``~1`` for '/', ``~0`` for '~'). ``SchemaRefError`` for any other reference or one that points at nothing."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaRefError(f"$ref {ref!r} is not a local reference ('#' or '#/...'): only those are followed",
                             str(ref))
    fragment = unquote(ref[1:])
    if fragment and not fragment.startswith("/"):
        raise SchemaRefError(f"$ref {ref!r} names an anchor: only JSON Pointers ('#/...') are followed", ref)
    node = root
    for part in fragment.split("/")[1:] if fragment else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise SchemaRefError(f"$ref {ref!r} resolves to nothing in the schema", ref)
    return node


def refs(node: Any) -> Iterator[Any]:
    """Every ``$ref`` value in a schema, at any depth."""
    for schema in walk(node):
        if "$ref" in schema:
            yield schema["$ref"]


def inline(root: Any, drop: frozenset[str] = frozenset(), prefix: str = "") -> Any:
    """``root`` with every local ``$ref`` replaced by its target (siblings of a ``$ref`` kept over it) and the
    keywords in ``drop`` and the definition containers removed. A recursive reference becomes
    ``{"$ref": "#/$defs/<prefix>ref<n>"}`` and its definition sits in the result's ``$defs`` (an object result;
    a caller that embeds it lifts them to the embedding document's root)."""
    names: dict[str, str] = {}  # recursive ref -> its hoisted name
    hoisted: dict[str, Any] = {}
    budget = [MAX_NODES]  # references shared along many paths are copied on each: bounded, never exponential

    def expand(node: Any, stack: tuple[str, ...]) -> Any:
        if not isinstance(node, dict):
            return node
        budget[0] -= 1
        if budget[0] < 0:
            raise SchemaRefError(f"the schema expands past {MAX_NODES:,} subschemas once its references are followed "
                                 "(references shared along many paths)", "#", "schema_too_large")
        if "$ref" not in node:
            kept = {k: v for k, v in node.items() if k not in drop and k not in CONTAINERS}
            return subschemas(kept, lambda sub: expand(sub, stack))
        ref = node["$ref"]
        rest = expand({k: v for k, v in node.items() if k != "$ref"}, stack)
        if not isinstance(ref, str):
            raise SchemaRefError(f"$ref {ref!r} is not a string", str(ref))
        if ref in stack or names.get(ref) in hoisted:
            target: Any = {"$ref": f"#/$defs/{names.setdefault(ref, f'{prefix}ref{len(names)}')}"}
        else:
            target = expand(pointer(root, ref), (*stack, ref))
            if ref in names:  # met again inside its own expansion: the expansion is its definition
                hoisted[names[ref]] = target
                target = {"$ref": f"#/$defs/{names[ref]}"}
        if not rest:
            return target
        if not isinstance(target, dict) or "$ref" in target:
            return {"allOf": [target, rest]}
        return {**target, **rest}

    out = expand(root, ())
    if hoisted:
        _check_finite(hoisted, names)
        if isinstance(out, dict) and "$ref" in out and not out.keys() - {"$ref"}:
            out = {"allOf": [out]}  # the root itself recursive: a reference beside its own $defs
        out = {**out, "$defs": hoisted} if isinstance(out, dict) else out
    return out


def lift_defs(schema: Any, into: dict[str, Any]) -> Any:
    """``schema`` without its ``$defs``, which are added to ``into`` (the root of the document it is embedded in)."""
    if isinstance(schema, dict) and "$defs" in schema:
        schema = dict(schema)
        into.update(schema.pop("$defs"))
    return schema


def _check_finite(hoisted: dict[str, Any], names: dict[str, str]) -> None:
    """Refuse a recursion that no finite value satisfies: a definition is finite when some value of it needs no
    infinite chain of definitions (computed as a fixpoint; unknown keywords count as satisfiable)."""
    finite: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, schema in hoisted.items():
            if name not in finite and _satisfiable(schema, finite):
                finite.add(name)
                changed = True
    stuck = [ref for ref, name in names.items() if name in hoisted and name not in finite]
    if stuck:
        raise SchemaRefError(
            f"recursive schema with no finite value: {' → '.join(stuck)} refers to itself through required "
            "properties only (make the recursion optional, e.g. not required or nullable)", stuck[0],
            "infinite_recursion")


def _satisfiable(node: Any, finite: set[str]) -> bool:
    if not isinstance(node, dict):
        return node is not False
    if "$ref" in node and node["$ref"].rsplit("/", 1)[-1] not in finite:
        return False
    if "allOf" in node and not all(_satisfiable(s, finite) for s in node["allOf"]):
        return False
    for key in ("anyOf", "oneOf"):
        if key in node and not any(_satisfiable(s, finite) for s in node[key]):
            return False
    types = node.get("type")
    kinds = types if isinstance(types, list) else [types]
    if "object" in kinds and len(kinds) == 1:
        props = node.get("properties", {})
        if not all(_satisfiable(props.get(name, True), finite) for name in node.get("required", [])):
            return False
    if "array" in kinds and len(kinds) == 1 and node.get("minItems", 0) > 0:
        items = node.get("items", True)
        if not isinstance(items, list) and not _satisfiable(items, finite):
            return False
    return True
