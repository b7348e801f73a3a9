"""The four-block output protocol (paper Appendix B.3) as pydantic models: the one source of truth.

Every model call returns, in this order::

    <state_focus>[{"target_id": ..., "reason": ...}]</state_focus>
    <state_delta>[{"operation": "add"|"update"|"remove", ...}]</state_delta>
    <tool_calls>[{"name": ..., "arguments": {...}}]</tool_calls>
    <assistant_message>{"content": null | "..."}</assistant_message>

``grammars/`` derives its grammars from these models' JSON schemas.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from flowstate.nodes import ID_PATTERN, Ref, StateType

BLOCKS: tuple[str, ...] = ("state_focus", "state_delta", "tool_calls", "assistant_message")

StateId = Annotated[str, Field(pattern=ID_PATTERN)]

# Bounds keep every output finite, so constrained generation always terminates.
MAX_FOCUS = 3
MAX_DELTA = 4
MAX_TOOL_CALLS = 4
MAX_REFS = 4
MAX_VALUE_KEYS = 6
MAX_TEXT = 96
MAX_CONTENT = 480

Text = Annotated[str, Field(max_length=MAX_TEXT)]
Scalar = Text | int | float | bool | None
Leaf = Scalar | Annotated[list[Scalar], Field(max_length=MAX_VALUE_KEYS)]
StateValue = Annotated[dict[str, Leaf], Field(max_length=MAX_VALUE_KEYS)]
"""A state's structured value: a flat JSON object of scalars and lists of scalars."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FocusItem(_Strict):
    """A request to disclose one historical state (or referenced raw tool result)."""

    target_id: StateId
    reason: Text = ""


class AddOp(_Strict):
    operation: Literal["add"]
    state_set: StateType
    state_id: StateId
    summary: Text
    value: StateValue = Field(default_factory=dict)
    refs: Annotated[tuple[Ref, ...], Field(max_length=MAX_REFS)] = ()


class UpdateOp(_Strict):
    """Revise a state of the current request; fields left out keep their value."""

    operation: Literal["update"]
    state_id: StateId
    state_set: StateType | None = None
    summary: Text | None = None
    value: StateValue | None = None
    refs: Annotated[tuple[Ref, ...], Field(max_length=MAX_REFS)] | None = None


class RemoveOp(_Strict):
    operation: Literal["remove"]
    state_id: StateId


DeltaOp = Annotated[AddOp | UpdateOp | RemoveOp, Field(discriminator="operation")]


class ToolCall(_Strict):
    name: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)


class AssistantMessage(_Strict):
    content: Annotated[str, Field(max_length=MAX_CONTENT)] | None = None


class ModelOutput(_Strict):
    """One parsed model output y = (ΔS, R, z)."""

    state_focus: tuple[FocusItem, ...] = ()
    state_delta: tuple[DeltaOp, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    assistant_message: AssistantMessage = AssistantMessage()

    @property
    def final_response(self) -> str | None:
        return self.assistant_message.content

    def is_empty(self) -> bool:
        """True when ΔS, R and z are all empty: an invalid output."""
        return not (self.state_focus or self.state_delta or self.tool_calls or self.final_response is not None)


BLOCK_MODELS: dict[str, Any] = {
    "state_focus": Annotated[list[FocusItem], Field(max_length=MAX_FOCUS)],
    "state_delta": Annotated[list[DeltaOp], Field(max_length=MAX_DELTA)],
    "tool_calls": Annotated[list[ToolCall], Field(max_length=MAX_TOOL_CALLS)],
    "assistant_message": AssistantMessage,
}
"""The type of each block's JSON, in protocol order: what parser and grammars both use."""


def block_schemas() -> dict[str, dict[str, Any]]:
    """The JSON schema of each block, derived from the models above (grammars embed these)."""
    return {name: TypeAdapter(tp).json_schema() for name, tp in BLOCK_MODELS.items()}


def dump_op(op: AddOp | UpdateOp | RemoveOp) -> dict[str, Any]:
    """An operation as protocol JSON (update omits the fields it leaves unchanged)."""
    return op.model_dump(mode="json", exclude_none=isinstance(op, UpdateOp))


def render_output(output: ModelOutput, blocks: Sequence[str] = BLOCKS) -> str:
    """The raw text of a model output: what a model following the protocol (of ``blocks``) emits."""
    parts = {
        "state_focus": [f.model_dump(mode="json") for f in output.state_focus],
        "state_delta": [dump_op(op) for op in output.state_delta],
        "tool_calls": [c.model_dump(mode="json") for c in output.tool_calls],
        "assistant_message": output.assistant_message.model_dump(mode="json"),
    }
    return "\n".join(f"<{b}>\n{json.dumps(parts[b], ensure_ascii=False)}\n</{b}>" for b in blocks)
