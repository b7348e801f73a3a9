"""The four-block output protocol (paper Appendix B.3) as pydantic models: the one source of truth.

Every model call returns, in this order::

    <state_focus>[{"target_id": ..., "reason": ...}]</state_focus>
    <state_delta>[{"operation": "add"|"update"|"remove", ...}]</state_delta>
    <tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls>
    <assistant_message>{"content": null | "..."}</assistant_message>

The models below fix the shape; ``bounded(limits)`` derives from them the bounded models of one
limits profile (``flowstate.limits``), which the parser validates each item against and from
which ``grammars/`` gets its JSON schemas. Operations written with the paper's one template
(B.3: every field on every operation) are accepted: a remove ignores the fields it does not
use, and the template's ``artifacts`` spelling is ``artifact``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    TypeAdapter,
    create_model,
    field_validator,
    model_validator,
)

from flowstate.limits import STANDARD, Limits
from flowstate.nodes import ID_PATTERN, Ref, StateType

BLOCKS: tuple[str, ...] = ("state_focus", "state_delta", "tool_calls", "assistant_message")

StateId = Annotated[str, Field(pattern=ID_PATTERN)]
StateValue = dict[str, JsonValue]

STATE_TYPE_ALIASES = {"artifacts": "artifact", "preferences": "preference", "attributes": "attribute",
                      "judgements": "judgement", "judgment": "judgement", "judgments": "judgement"}
"""Spellings models use for the five types (B.3's prompt itself writes ``artifacts``)."""

_TEMPLATE_FIELDS = ("state_set", "summary", "value", "refs")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _state_type(value: Any) -> Any:
    return STATE_TYPE_ALIASES.get(value, value) if isinstance(value, str) else value


class FocusItem(_Strict):
    """A request to disclose one historical state (or referenced raw tool result)."""

    target_id: StateId
    reason: str = ""


class _StateOp(_Strict):
    """An operation that names a state type (its aliases normalized)."""

    @field_validator("state_set", mode="before", check_fields=False)
    @classmethod
    def normalize_state_set(cls, value: Any) -> Any:
        return _state_type(value)


class AddOp(_StateOp):
    operation: Literal["add"]
    state_set: StateType
    state_id: StateId
    summary: str
    value: StateValue = Field(default_factory=dict)
    refs: tuple[Ref, ...] = ()


class UpdateOp(_StateOp):
    """Revise a state of the current request; fields left out (or null) keep their value."""

    operation: Literal["update"]
    state_id: StateId
    state_set: StateType | None = None
    summary: str | None = None
    value: StateValue | None = None
    refs: tuple[Ref, ...] | None = None


class RemoveOp(_Strict):
    operation: Literal["remove"]
    state_id: StateId

    @model_validator(mode="before")
    @classmethod
    def template_fields(cls, data: Any) -> Any:
        """B.3's one template carries every field; a remove uses only its id."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in _TEMPLATE_FIELDS}
        return data


DeltaOp = Annotated[AddOp | UpdateOp | RemoveOp, Field(discriminator="operation")]


class ToolCall(_Strict):
    name: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)


class MessageBlock(_Strict):
    """The ``<assistant_message>`` block: the reply to the user, or null while the request goes on (the wire's
    assistant message is ``serving.chat.messages.AssistantMessage``)."""

    content: str | None = None


@dataclass(frozen=True)
class Malformed:
    """An item of a block that is not a valid item of it: excluded from the step, fed back with its reason."""

    block: str
    position: int  # 1-based within its block
    reason: str
    id: str = ""  # the state_id / target_id / tool name the item names, if it names one

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, "position": self.position, "id": self.id, "reason": self.reason}


class ModelOutput(_Strict):
    """One parsed model output y = (ΔS, R, z), and the items excluded from it as malformed."""

    state_focus: tuple[FocusItem, ...] = ()
    state_delta: tuple[DeltaOp, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    assistant_message: MessageBlock = MessageBlock()
    malformed: tuple[Any, ...] = Field(default=(), exclude=True)

    @property
    def final_response(self) -> str | None:
        return self.assistant_message.content

    def is_empty(self) -> bool:
        """True when ΔS, R and z are all empty: an invalid output."""
        return not (self.state_focus or self.state_delta or self.tool_calls or self.final_response is not None)


def _value_type(limits: Limits) -> Any:
    """A state's value: an object whose members nest ``value_depth`` levels, every size bounded."""
    text = Annotated[str, Field(max_length=limits.value_text)]
    member: Any = text | int | float | bool | None
    for _ in range(limits.value_depth):
        member = (text | int | float | bool | None | Annotated[list[member], Field(max_length=limits.value_items)]
                  | Annotated[dict[str, member], Field(max_length=limits.value_items)])
    return Annotated[dict[str, member], Field(max_length=limits.value_items)]


@dataclass(frozen=True)
class BoundedProtocol:
    """The protocol under one limits profile: per block, the type of one item (or of the whole block)."""

    limits: Limits
    items: dict[str, TypeAdapter[Any]]  # state_focus, state_delta, tool_calls: one item
    message: TypeAdapter[Any]  # assistant_message: the block
    blocks: dict[str, Any]  # each block's whole type, for the grammars' JSON schemas

    def block_schemas(self) -> dict[str, dict[str, Any]]:
        """The JSON schema of each block (``grammars/`` embeds these)."""
        return {name: TypeAdapter(tp).json_schema() for name, tp in self.blocks.items()}

    def item(self, block: str, raw: Any) -> Any:
        """One item of an array block, validated under the limits, as the protocol's own model."""
        return _unbounded(self.items[block].validate_python(raw))

    def assistant_message(self, raw: Any) -> MessageBlock:
        message: MessageBlock = _unbounded(self.message.validate_python(raw))
        return message


_BASES = (FocusItem, AddOp, UpdateOp, RemoveOp, MessageBlock, ToolCall)


def _unbounded(value: Any) -> Any:
    """A bounded subclass instance as its base model (equal to one built directly), fields as validated."""
    for base in _BASES:
        if isinstance(value, base) and type(value) is not base:
            return base.model_construct(_fields_set=value.model_fields_set, **dict(value))
    return value


@lru_cache(maxsize=8)
def bounded(limits: Limits = STANDARD) -> BoundedProtocol:
    """The protocol's models with the bounds of ``limits`` (subclasses of the models above)."""
    text = Annotated[str, Field(max_length=limits.text)]
    value = _value_type(limits)
    refs = Annotated[tuple[Ref, ...], Field(max_length=limits.refs)]
    focus = create_model("FocusItem", __base__=FocusItem, reason=(text, ""))
    add = create_model("AddOp", __base__=AddOp, summary=(text, ...), value=(value, Field(default_factory=dict)),
                       refs=(refs, ()))
    update = create_model("UpdateOp", __base__=UpdateOp, summary=(text | None, None), value=(value | None, None),
                          refs=(refs | None, None))
    op = Annotated[add | update | RemoveOp, Field(discriminator="operation")]  # type: ignore[valid-type]
    message = create_model("MessageBlock", __base__=MessageBlock,
                           content=(Annotated[str, Field(max_length=limits.content)] | None, None))
    blocks: dict[str, Any] = {
        "state_focus": Annotated[list[focus], Field(max_length=limits.focus)],  # type: ignore[valid-type]
        "state_delta": Annotated[list[op], Field(max_length=limits.ops)],
        "tool_calls": Annotated[list[ToolCall], Field(max_length=limits.tool_calls)],
        "assistant_message": message,
    }
    items: dict[str, TypeAdapter[Any]] = {
        "state_focus": TypeAdapter(focus), "state_delta": TypeAdapter(op), "tool_calls": TypeAdapter(ToolCall),
    }
    return BoundedProtocol(limits, items, TypeAdapter(message), blocks)


def block_schemas(limits: Limits = STANDARD) -> dict[str, dict[str, Any]]:
    """The JSON schema of each block under ``limits`` (the grammars embed these)."""
    return bounded(limits).block_schemas()


def dump_op(op: AddOp | UpdateOp | RemoveOp) -> dict[str, Any]:
    """An operation as protocol JSON (update omits the fields it leaves unchanged)."""
    return op.model_dump(mode="json", exclude_none=isinstance(op, UpdateOp))


def render_output(output: ModelOutput, blocks: Sequence[str] = BLOCKS, optional: Sequence[str] = ()) -> str:
    """The raw text of a model output: what a model following the protocol (of ``blocks``) emits; a block of
    ``optional`` with nothing in it is left out (the lean protocol: memory blocks only when they say something)."""
    parts = {
        "state_focus": [f.model_dump(mode="json") for f in output.state_focus],
        "state_delta": [dump_op(op) for op in output.state_delta],
        "tool_calls": [c.model_dump(mode="json") for c in output.tool_calls],
        "assistant_message": output.assistant_message.model_dump(mode="json"),
    }
    return "\n".join(f"<{b}>\n{json.dumps(parts[b], ensure_ascii=False)}\n</{b}>" for b in blocks
                     if b not in optional or parts[b])
