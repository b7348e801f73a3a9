"""The four-block output protocol as one llguidance Lark grammar, with a JSON schema per block.

The block schemas come from the protocol's pydantic models (``flowstate.protocol.block_schemas``);
this module only tightens them: all fields emitted, compact whitespace, tool names with each
tool's argument schema, and, per step, the ids each field may name. The grammar also encodes the
execution decision — tool calls (content null), a final answer (no tool calls), or a wait (state
operations only) — so an output with all three parts empty, or with both tools and an answer,
cannot be decoded at all.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grammars.check import GrammarError
from grammars.refs import SchemaRefError, inline, lift_defs, subschemas, walk

WHITESPACE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_DROP = frozenset({"title", "description", "default", "discriminator"})


@dataclass(frozen=True)
class StepIds:
    """The ids the rules admit at one step; the grammar allows nothing else."""

    focus: tuple[str, ...]  # state_focus targets: IDs(G_k) ∪ ToolRefs(S) minus what is visible
    own: tuple[str, ...]  # update/remove targets: states created in this request
    refs: tuple[str, ...]  # ref targets the model can know of
    new: str | None = None  # add's ids: an anchored regex of the ids still unused (None: the protocol's own pattern)


def _inline(schema: Any, prefix: str = "") -> Any:
    """``schema`` with its local $refs resolved (recursion kept as hoisted ``$defs``) and annotations dropped."""
    try:
        return inline(copy.deepcopy(schema), _DROP, prefix)
    except SchemaRefError as exc:
        raise GrammarError(str(exc)) from None


def _require_all(node: Any, keep_optional: Sequence[str] = ()) -> None:
    """Make every property required (the model always emits the full shape), except ``keep_optional``."""
    for schema in walk(node):
        props = schema.get("properties")
        if isinstance(props, dict):
            schema["required"] = [k for k in props if k not in keep_optional or k in schema.get("required", [])]


def _ids(ids: Sequence[str]) -> dict[str, Any]:
    return {"type": "string", "enum": sorted(ids)}


def _set_refs(op: dict[str, Any], targets: Sequence[str] | None) -> None:
    refs = op["properties"].get("refs")
    if refs is None or targets is None:
        return
    inner = refs["anyOf"][0] if "anyOf" in refs else refs  # update: refs | null
    if targets:
        inner["items"]["properties"]["state_id"] = _ids(targets)
    else:
        inner["maxItems"] = 0
        inner.pop("items", None)


def _delta_schema(schema: dict[str, Any], ids: StepIds | None) -> dict[str, Any]:
    items = schema["items"]
    variants = items.pop("oneOf", None) or items.pop("anyOf")
    kept = []
    for op in variants:
        kind = op["properties"]["operation"]["const"]
        if kind == "update":
            op["required"] = ["operation", "state_id"]
        if ids is not None:
            if kind in ("update", "remove"):
                if not ids.own:
                    continue  # nothing of this request to change yet
                op["properties"]["state_id"] = _ids(ids.own)
            elif kind == "add" and ids.new is not None:
                op["properties"]["state_id"] = {"type": "string", "pattern": ids.new}
            _set_refs(op, ids.refs)
        kept.append(op)
    schema["items"] = {"anyOf": kept}
    return schema


@dataclass(frozen=True)
class ToolBounds:
    """Bounds given to a tool argument's strings and arrays whose schema has none (None: the schema's own)."""

    text: int | None = None
    items: int | None = None


def _arguments(node: Any, bounds: ToolBounds) -> Any:
    """A tool's argument schema as strict mode decodes it: objects closed to their declared properties,
    and unbounded strings and arrays given ``bounds``."""
    if not isinstance(node, dict):
        return node
    out = subschemas(node, lambda sub: _arguments(sub, bounds))
    if isinstance(out.get("properties"), dict):
        out.setdefault("additionalProperties", False)
    kind = out.get("type")
    if kind == "string" and bounds.text and "maxLength" not in out and "enum" not in out and "const" not in out:
        out["maxLength"] = bounds.text
    if kind == "array" and bounds.items and "maxItems" not in out:
        out["maxItems"] = bounds.items
    return out


def strict_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool's argument schema with its objects closed to their declared properties, as the grammar decodes
    them (what a schema-described tool checks its arguments against)."""
    return dict(_arguments(schema, ToolBounds()))


def _tools_schema(schema: dict[str, Any], tools: Sequence[Mapping[str, Any]], bounds: ToolBounds) -> dict[str, Any]:
    defs: dict[str, Any] = {}
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t["name"]},
                "arguments": lift_defs(_arguments(_inline(t["parameters"], f"t{i}_"), bounds), defs),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, t in enumerate(tools)
    ]
    out: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}}
    if defs:
        out["$defs"] = defs  # the tools' recursive definitions, at the root of the block's document
    if "maxItems" in schema:
        out["maxItems"] = schema["maxItems"]
    return out


def block_json_schemas(
    schemas: Mapping[str, dict[str, Any]], tools: Sequence[Mapping[str, Any]], ids: StepIds | None = None,
    bounds: ToolBounds = ToolBounds(),
) -> dict[str, dict[str, Any]]:
    """The tightened schema of each block (``ids=None``: the static, id-agnostic grammar)."""
    out = {name: _inline(s) for name, s in schemas.items()}
    _require_all(out["state_focus"])
    _require_all(out["state_delta"])
    _require_all(out["assistant_message"])
    out["state_delta"] = _delta_schema(out["state_delta"], ids)
    if ids is not None:
        if ids.focus:
            out["state_focus"]["items"]["properties"]["target_id"] = _ids(ids.focus)
        else:
            out["state_focus"] = {"type": "array", "maxItems": 0}
    out["tool_calls"] = _tools_schema(out["tool_calls"], tools, bounds) if tools else {"type": "array", "maxItems": 0}
    return out


def _nonempty(schema: dict[str, Any]) -> dict[str, Any] | None:
    if schema.get("maxItems") == 0:
        return None
    return {**schema, "minItems": 1}


def _json_rule(name: str, schema: dict[str, Any]) -> str:
    # no sort_keys: llguidance emits properties in schema order, which must stay the models' order
    return f"{name}: %json {json.dumps({**schema, 'x-guidance': WHITESPACE})}"


def json_reply(schema: dict[str, Any]) -> str:
    """One JSON value as a whole grammar (a memory method's own calls): a pydantic model's schema made as the
    blocks' are — refs inlined, annotations dropped, every field emitted, compact whitespace."""
    out = _inline(schema)
    _require_all(out)
    return _json_rule("start", out)


ALL_BLOCKS = ("state_focus", "state_delta", "tool_calls", "assistant_message")


# Every literal is a whole tag, shared by all alternatives; what differs between them lives in
# the JSON nonterminals. (Overlapping literals would make the lexer commit to one too early.)
_STRUCTURE = {
    "focus": "FOCUS focus_json END_FOCUS",
    "focus_some": "FOCUS focus_some_json END_FOCUS",
    "focus_none": "FOCUS empty_json END_FOCUS",
    "focus_opt": "focus_some?",  # an optional block: left out, or holding something
    "delta_opt": "delta_some?",
    "delta": "DELTA delta_json END_DELTA",
    "delta_some": "DELTA delta_some_json END_DELTA",
    "act": "TOOLS calls_json END_TOOLS MESSAGE null_json END_MESSAGE",
    "answer": "TOOLS empty_json END_TOOLS MESSAGE answer_json END_MESSAGE",
    "answer_noted": "TOOLS empty_json END_TOOLS delta MESSAGE answer_json END_MESSAGE",  # decides first, then records
    "answer_noted_opt": "TOOLS empty_json END_TOOLS delta_opt MESSAGE answer_json END_MESSAGE",
    "act_noted": "TOOLS calls_json END_TOOLS delta MESSAGE null_json END_MESSAGE",  # (tools required)
    "act_noted_opt": "TOOLS calls_json END_TOOLS delta_opt MESSAGE null_json END_MESSAGE",
    "wait": "TOOLS empty_json END_TOOLS MESSAGE null_json END_MESSAGE",
}
_TAGS = {
    "FOCUS": r'"<state_focus>\n"', "END_FOCUS": r'"\n</state_focus>\n"',
    "DELTA": r'"<state_delta>\n"', "END_DELTA": r'"\n</state_delta>\n"',
    "TOOLS": r'"<tool_calls>\n"', "END_TOOLS": r'"\n</tool_calls>\n"',
    "MESSAGE": r'"<assistant_message>\n"', "END_MESSAGE": r'"\n</assistant_message>"',
}


def decides_first(blocks: Sequence[str]) -> bool:
    """Whether ``blocks`` put tool_calls before state_delta: the step decides (calls, or answers) before it records,
    and records only with its answer (the lean protocol: a model that began a record is never forced to answer)."""
    return "state_delta" in blocks and "tool_calls" in blocks and blocks.index("tool_calls") < blocks.index(
        "state_delta")


_ANSWERS = frozenset({"answer", "answer_noted", "answer_noted_opt"})
_ACTS = frozenset({"act", "act_noted", "act_noted_opt"})


def _alternatives(b: Mapping[str, dict[str, Any]], rules: dict[str, dict[str, Any]], blocks: Sequence[str],
                  require_tools: bool, final: bool = False, hold: bool = False,
                  optional: Sequence[str] = ()) -> list[list[str]]:
    """The outputs a step may take (act, answer, wait on focus or delta), each a list of parts; adds the JSON
    rules of non-empty blocks to ``rules``. A ``final`` step decides: it answers, or (tools required) calls; a
    ``hold`` step calls nothing (unless tools are required). A block of ``optional`` is written only when it holds
    something: left out, or non-empty. Where ``blocks`` decide first (``decides_first``), state_delta comes after
    tool_calls and only in the step that answers — or, with tools required (no step answers), with the calls."""
    has_focus, has_delta = "state_focus" in blocks, "state_delta" in blocks
    focus_some, delta_some, calls_some = (_nonempty(b[k]) for k in ("state_focus", "state_delta", "tool_calls"))
    first = decides_first(blocks)
    noted = "_noted_opt" if "state_delta" in optional else "_noted"
    answer, act = (f"answer{noted}", f"act{noted}" if require_tools else "act") if first else ("answer", "act")
    before = [] if first else ["delta"]  # the parts of a step before its decision
    alternatives = [] if require_tools else [["focus", *before, answer]]
    if calls_some is not None:
        rules["calls_json"] = calls_some
        alternatives.insert(0, ["focus", *before, act])
    if focus_some is not None and has_focus:
        rules["focus_some_json"] = focus_some
        alternatives.append(["focus_some", *before, "wait"])
    if delta_some is not None and has_delta and not first:
        rules["delta_some_json"] = delta_some
        alternatives.append(["focus_none", "delta_some", "wait"])
    absent = ({"focus", "focus_some", "focus_none"} if not has_focus else set()) | (
        {"delta", "delta_some"} if not has_delta else set())
    if final:
        decided = [alt for alt in alternatives if alt[-1] in (_ACTS if require_tools else _ANSWERS)]
        alternatives = decided or alternatives
    if hold and not require_tools:
        alternatives = [alt for alt in alternatives if alt[-1] not in _ACTS]
    lean: dict[str, str | None] = {}  # an optional block's parts: left out, or holding something
    if "state_focus" in optional and has_focus:
        lean |= {"focus": "focus_opt" if focus_some is not None else None, "focus_none": None}
        if focus_some is not None:
            rules["focus_some_json"] = focus_some
    if "state_delta" in optional and has_delta:
        lean |= {"delta": "delta_opt" if delta_some is not None else None}
        if delta_some is not None:
            rules["delta_some_json"] = delta_some
        if first and delta_some is None:  # nothing a record could hold: the decision alone
            lean |= {answer: "answer", act: "act"}
    parts = [[lean.get(part, part) for part in alt if part not in absent] for alt in alternatives]
    return [[part for part in alt if part is not None] for alt in parts]


def protocol_grammar(
    schemas: Mapping[str, dict[str, Any]], tools: Sequence[Mapping[str, Any]], ids: StepIds | None = None,
    blocks: Sequence[str] = ALL_BLOCKS, bounds: ToolBounds = ToolBounds(), *, require_tools: bool = False,
    max_calls: int | None = None, answer_schema: dict[str, Any] | None = None, final: bool = False,
    hold: bool = False, optional: Sequence[str] = (),
) -> str:
    """The Lark grammar (llguidance dialect) of one model output.

    ``blocks`` may leave out state_focus and/or state_delta (the ablation strategies' protocols);
    tool_calls and assistant_message are always there. ``bounds`` bound tool-argument strings and
    arrays that a tool's own schema leaves unbounded (tiny models need it to terminate).
    ``require_tools`` drops the final-answer alternative (a step calls tools or only updates/accesses
    state), ``optional``: state_focus and/or state_delta written only when they hold something (left out, never
    ``[]``: the lean protocol; with ``blocks`` that decide first, state_delta only with the answer),
    ``max_calls`` caps tool calls per step, ``answer_schema`` makes the answer's content that JSON.
    ``final``: the request's last allowed step, which must decide — a final answer, or where tools are
    required the calls (no step that only updates or accesses state).
    ``hold``: the step after one whose every call was refused as a repeat: it answers or only updates/accesses
    state — no tool call (where tools are required, the request's contract wins and it calls).
    """
    b = block_json_schemas(schemas, tools, ids, bounds)
    if max_calls is not None and b["tool_calls"].get("maxItems", max_calls) >= max_calls:
        b["tool_calls"]["maxItems"] = max_calls
    message = b["assistant_message"]
    answer = copy.deepcopy(message)
    defs: dict[str, Any] = {}
    answer["properties"]["content"] = (
        lift_defs(_inline(answer_schema, "answer_"), defs) if answer_schema is not None
        else {"type": "string", "minLength": 1, "maxLength": _max_content(message)}
    )
    if defs:
        answer["$defs"] = defs

    rules: dict[str, dict[str, Any]] = {
        "focus_json": b["state_focus"], "delta_json": b["state_delta"], "answer_json": answer,
        "null_json": {"type": "object", "properties": {"content": {"type": "null"}}, "required": ["content"],
                      "additionalProperties": False},
        "empty_json": {"type": "array", "maxItems": 0},
    }
    alternatives = _alternatives(b, rules, blocks, require_tools, final, hold, optional)
    used: set[str] = set()
    todo = [name for alt in alternatives for name in alt]
    while todo:  # the structures the alternatives name, and those they name in turn
        name = todo.pop()
        if name not in used:
            used.add(name)
            todo += [part.rstrip("?") for part in _STRUCTURE[name].split() if part.rstrip("?") in _STRUCTURE]
    needed = {part.rstrip("?") for name in used for part in _STRUCTURE[name].split()}
    lines = ["start: " + " | ".join(" ".join(alt) for alt in alternatives)]
    lines += [f"{name}: {body}" for name, body in _STRUCTURE.items() if name in used]
    lines += [f"{name}: {literal}" for name, literal in _TAGS.items() if name in needed]
    lines += [_json_rule(name, schema) for name, schema in rules.items() if name in needed]
    return "\n".join(lines) + "\n"


def _max_content(message: dict[str, Any]) -> int:
    for option in message["properties"]["content"].get("anyOf", []):
        if option.get("type") == "string":
            return int(option.get("maxLength", 4000))
    return 4000
