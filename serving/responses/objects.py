"""The Responses API's objects: output items of a turn's reply (their ids fixed once, so a stream's items and the
final response agree), usage, and the response object itself — each a typed wire model (``…Out``, as the Chat
ones are), dumped to the JSON a stream sends and the store keeps."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from engine.base import Usage
from flowstate.nodes import canonical_json
from serving.chat.messages import AssistantMessage
from serving.errors import bad_request
from serving.responses.wire import APPROVAL_PREFIX, ResponsesRequest
from serving.turns import TurnResult


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class ItemIds:
    """The ids of one response's output items: its message's, and each function call's by call_id."""

    message: str = field(default_factory=lambda: new_id("msg"))
    calls: dict[str, str] = field(default_factory=dict)

    def call(self, call_id: str) -> str:
        return self.calls.setdefault(call_id, new_id("fc"))


class OutputTextOut(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


class MessageItemOut(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputTextOut]


class FunctionCallItemOut(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"]


class ApprovalRequestItemOut(BaseModel):
    """A call of an MCP tool that waits on the client's approval."""

    id: str
    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    server_label: str
    name: str
    arguments: str


class McpToolOut(BaseModel):
    name: str
    description: str | None
    input_schema: dict[str, Any]
    annotations: None = None


class McpListToolsItemOut(BaseModel):
    id: str
    type: Literal["mcp_list_tools"] = "mcp_list_tools"
    server_label: str
    error: None = None
    tools: list[McpToolOut]


class McpCallItemOut(BaseModel):
    id: str
    type: Literal["mcp_call"] = "mcp_call"
    server_label: str
    name: str
    arguments: str
    output: str | None
    error: str | None
    status: Literal["completed", "failed"]
    approval_request_id: str | None


class InputTextOut(BaseModel):
    type: Literal["input_text"] = "input_text"
    text: str


class UserMessageItemOut(BaseModel):
    """A user's message as a conversation holds it."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["user"] = "user"
    status: Literal["completed"] = "completed"
    content: list[InputTextOut]


class FunctionCallOutputItemOut(BaseModel):
    id: str
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str
    status: Literal["completed"] = "completed"


class InputTokensDetailsOut(BaseModel):
    cached_tokens: int


class OutputTokensDetailsOut(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsageOut(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetailsOut
    output_tokens: int
    output_tokens_details: OutputTokensDetailsOut
    total_tokens: int


Status = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]


class ResponseOut(BaseModel):
    """The response object, in the order of OpenAI's fields; ``flowstate`` (FlowState's detail of the turn, which
    OpenAI clients ignore) only where there is some."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Status
    background: bool
    error: dict[str, Any] | None
    incomplete_details: dict[str, str] | None
    instructions: Any
    max_output_tokens: int | None
    metadata: dict[str, Any]
    model: str | None
    output: list[dict[str, Any]]
    parallel_tool_calls: bool
    previous_response_id: str | None
    conversation: dict[str, str] | None
    reasoning: dict[str, None]
    store: bool
    temperature: int | float | None  # as sent: 1 stays 1
    text: dict[str, Any]
    tool_choice: Any
    tools: list[Any]
    top_p: int | float | None
    truncation: str
    usage: ResponseUsageOut | None
    user: str | None
    flowstate: dict[str, Any] | None = None

    def body(self) -> dict[str, Any]:
        out = self.model_dump()
        if out["flowstate"] is None:
            del out["flowstate"]
        return out


def text_part(text: str) -> dict[str, Any]:
    return OutputTextOut(text=text).model_dump()


def message_item(item_id: str, text: str, status: Literal["in_progress", "completed"] = "completed") -> dict[str, Any]:
    return MessageItemOut(id=item_id, status=status,
                          content=[OutputTextOut(text=text)] if status == "completed" else []).model_dump()


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: Literal["in_progress", "completed"] = "completed") -> dict[str, Any]:
    return FunctionCallItemOut(id=item_id, call_id=call_id, name=name, arguments=arguments,
                               status=status).model_dump()


def output_items(message: AssistantMessage, ids: ItemIds, approval: dict[str, str]) -> list[dict[str, Any]]:
    """The reply as output items: its function calls and the calls of MCP tools that wait on the client's approval
    (``approval``: their server labels by tool name), or its answer as one message."""
    if message.tool_calls:
        return [ApprovalRequestItemOut(id=APPROVAL_PREFIX + c.id, server_label=approval[c.function.name],
                                       name=c.function.name, arguments=c.function.arguments).model_dump()
                if c.function.name in approval
                else call_item(ids.call(c.id), c.id, c.function.name, c.function.arguments) for c in message.tool_calls]
    return [message_item(ids.message, message.content or "")]


def mcp_items(servers: dict[str, list[dict[str, Any]]], result: TurnResult) -> list[dict[str, Any]]:
    """Each requested MCP server's tools (``mcp_list_tools``), then the turn's calls of them (``mcp_call``: a
    repeat the loop refused is not a call)."""
    out = [McpListToolsItemOut(id=new_id("mcpl"), server_label=label, tools=[
        McpToolOut(name=t["name"], description=t.get("description") or None,
                   input_schema=t.get("parameters") or {"type": "object"}) for t in specs]).model_dump()
           for label, specs in servers.items()]
    label_of = {t["name"]: label for label, specs in servers.items() for t in specs}
    calls = [*((APPROVAL_PREFIX + call_id, call) for call_id, call in result.approved),  # approved in this request
             *((None, call) for step in result.steps for call in step.tool_calls)]
    for approval_id, call in calls:
        if call.name in label_of and call.repeat_of is None:
            output = None if call.error is not None else (
                call.result if isinstance(call.result, str) else canonical_json(call.result))
            out.append(McpCallItemOut(id=new_id("mcp"), server_label=label_of[call.name], name=call.name,
                                      arguments=canonical_json(call.arguments), output=output, error=call.error,
                                      status="failed" if call.error is not None else "completed",
                                      approval_request_id=approval_id).model_dump())
    return out


def usage_object(usage: Usage) -> ResponseUsageOut:
    return ResponseUsageOut(input_tokens=usage.prompt_tokens,
                            input_tokens_details=InputTokensDetailsOut(cached_tokens=usage.cached_tokens),
                            output_tokens=usage.completion_tokens, output_tokens_details=OutputTokensDetailsOut(),
                            total_tokens=usage.prompt_tokens + usage.completion_tokens)


@dataclass
class Draft:
    """One response as it is made: its id, when, what was asked, and the session it lands in."""

    body: ResponsesRequest
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))
    ids: ItemIds = field(default_factory=ItemIds)
    conversation: str | None = None
    mcp: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # requested MCP servers' tool specs, by label
    approval: dict[str, str] = field(default_factory=dict)  # tools whose calls wait on approval: their server labels
    request: str | None = None  # the digest of a request sent with an Idempotency-Key: what a retry must match

    def object(self, status: Status, output: list[dict[str, Any]] | None = None, usage: Usage | None = None,
               error: dict[str, Any] | None = None, incomplete: str | None = None,
               flowstate: dict[str, Any] | None = None) -> dict[str, Any]:
        b = self.body
        if self.request is not None:
            flowstate = {**(flowstate or {}), "request_digest": self.request}
        return ResponseOut(
            id=self.id, created_at=self.created_at, status=status, background=b.background is True, error=error,
            incomplete_details=None if incomplete is None else {"reason": incomplete},
            instructions=b.instructions, max_output_tokens=b.max_output_tokens, metadata=b.metadata or {},
            model=b.model, output=output or [], parallel_tool_calls=b.parallel_tool_calls is not False,
            previous_response_id=b.previous_response_id,
            conversation=None if self.conversation is None else {"id": self.conversation},
            reasoning={"effort": None, "summary": None}, store=b.store is not False, temperature=b.temperature,
            text=b.text or {"format": {"type": "text"}},
            tool_choice=b.choice() if b.tool_choice is not None else "auto",
            tools=b.tools or [], top_p=b.top_p, truncation=b.truncation or "disabled",
            usage=None if usage is None else usage_object(usage), user=b.user, flowstate=flowstate).body()

    def finished(self, result: TurnResult, flowstate: dict[str, Any]) -> dict[str, Any]:
        """The response of a turn that ran: completed, or incomplete when the request ended without an answer; the
        requested MCP servers' tools and their calls in the turn come first."""
        incomplete = None
        if result.unfinished is not None:  # the step budget ran out, or the last call was cut at its token budget
            incomplete = "max_output_tokens" if result.steps and result.steps[-1].truncated else "max_steps"
        elif result.cut:  # the answer cut to the client's max_output_tokens
            incomplete = "max_output_tokens"
        output = mcp_items(self.mcp, result) + output_items(result.message, self.ids, self.approval)
        return self.object("incomplete" if incomplete else "completed", output, result.usage, incomplete=incomplete,
                           flowstate=flowstate)

    def replayed(self, message: AssistantMessage, flowstate: dict[str, Any]) -> dict[str, Any]:
        """The response to an exact resend of an answered turn: the earlier reply, nothing run again."""
        return self.object("completed", output_items(message, self.ids, self.approval), Usage(),
                           flowstate={**flowstate, "replayed": True})


def page(items: list[dict[str, Any]], after: str | None, limit: int, order: str, owner: str) -> dict[str, Any]:
    """A cursor page of ``items`` (oldest first), as OpenAI lists them: newest first unless ``order`` is asc, from
    the item after ``after``."""
    if not 1 <= limit <= 100:
        raise bad_request("limit is 1 to 100", "limit")
    if order not in ("asc", "desc"):
        raise bad_request('order is "asc" or "desc"', "order")
    items = items if order == "asc" else items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(items) if item.get("id") == after), None)
        if at is None:
            raise bad_request(f"after names no item of {owner}", "after")
        items = items[at + 1:]
    chosen = items[:limit]
    return {"object": "list", "data": chosen, "first_id": chosen[0]["id"] if chosen else None,
            "last_id": chosen[-1]["id"] if chosen else None, "has_more": len(items) > limit}


def transcript_items(transcript: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session's transcript as conversation items; an item's id is its place in the transcript (stable: the
    transcript only grows)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(transcript):
        if m["role"] == "user":
            out.append(UserMessageItemOut(id=f"msg_t{i}", content=[InputTextOut(text=m["content"] or "")]).model_dump())
        elif m["role"] == "tool":
            output = m["content"] if isinstance(m["content"], str) else canonical_json(m["content"])
            out.append(FunctionCallOutputItemOut(id=f"fco_t{i}", call_id=m["tool_call_id"], output=output).model_dump())
        elif m.get("tool_calls"):
            out += [call_item(f"fc_t{i}_{j}", c["id"], c["name"], c["arguments"])
                    for j, c in enumerate(m["tool_calls"])]
        else:
            out.append(message_item(f"msg_t{i}", m["content"] or ""))
    return out
