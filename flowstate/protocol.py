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
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from flowstate.nodes import ID_PATTERN, Ref, StateType

BLOCKS: tuple[str, ...] = ("state_focus", "state_delta", "tool_calls", "assistant_message")

StateId = Annotated[str, Field(pattern=ID_PATTERN)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FocusItem(_Strict):
    """A request to disclose one historical state (or referenced raw tool result)."""

    target_id: StateId
    reason: str = ""


class AddOp(_Strict):
    operation: Literal["add"]
    state_set: StateType
    state_id: StateId
    summary: str
    value: dict[str, JsonValue] = Field(default_factory=dict)
    refs: tuple[Ref, ...] = ()


class UpdateOp(_Strict):
    """Revise a state of the current request; fields left out keep their value."""

    operation: Literal["update"]
    state_id: StateId
    state_set: StateType | None = None
    summary: str | None = None
    value: dict[str, JsonValue] | None = None
    refs: tuple[Ref, ...] | None = None


class RemoveOp(_Strict):
    operation: Literal["remove"]
    state_id: StateId


DeltaOp = Annotated[AddOp | UpdateOp | RemoveOp, Field(discriminator="operation")]


class ToolCall(_Strict):
    name: str
    arguments: dict[str, JsonValue] = Field(default_factory=dict)


class AssistantMessage(_Strict):
    content: str | None = None


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
    "state_focus": list[FocusItem],
    "state_delta": list[DeltaOp],
    "tool_calls": list[ToolCall],
    "assistant_message": AssistantMessage,
}
"""The type of each block's JSON, in protocol order: what parser and grammars both use."""


def dump_op(op: AddOp | UpdateOp | RemoveOp) -> dict[str, Any]:
    """An operation as protocol JSON (update omits the fields it leaves unchanged)."""
    return op.model_dump(mode="json", exclude_none=isinstance(op, UpdateOp))


def render_output(output: ModelOutput) -> str:
    """The raw text of a model output: what a model following the protocol emits."""
    parts = {
        "state_focus": [f.model_dump(mode="json") for f in output.state_focus],
        "state_delta": [dump_op(op) for op in output.state_delta],
        "tool_calls": [c.model_dump(mode="json") for c in output.tool_calls],
        "assistant_message": output.assistant_message.model_dump(mode="json"),
    }
    return "\n".join(f"<{b}>\n{json.dumps(parts[b], ensure_ascii=False)}\n</{b}>" for b in BLOCKS)
