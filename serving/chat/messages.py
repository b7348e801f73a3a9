"""The assistant's side of the wire, typed: the reply message with its tool calls, and the deltas a stream
sends (each field only when it says something, as OpenAI's server sends them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class _Sparse(BaseModel):
    """Fields left None are not sent."""

    @model_serializer(mode="wrap")
    def _sparse(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    """The reply: a final answer (``content``), or calls of the client's tools (``content`` null)."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _no_empty_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if not out.get("tool_calls"):
            out.pop("tool_calls", None)
        return out

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    def delta(self) -> Delta:
        """All of the message as one stream delta (a replayed or unstreamed reply)."""
        if self.tool_calls:
            return Delta(tool_calls=[ToolCallDelta(index=i, id=c.id, type=c.type,
                                                   function=FunctionDelta(name=c.function.name,
                                                                          arguments=c.function.arguments))
                                     for i, c in enumerate(self.tool_calls)])
        return Delta(content=self.content or "")


class FunctionDelta(_Sparse):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Sparse):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class Delta(_Sparse):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
