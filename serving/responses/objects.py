"""The Responses API's objects: output items of a turn's reply (their ids fixed once, so a stream's items and the
final response agree), usage, and the response object itself."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

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


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [text_part(text)] if status == "completed" else []}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def output_items(message: AssistantMessage, ids: ItemIds, approval: dict[str, str]) -> list[dict[str, Any]]:
    """The reply as output items: its function calls and the calls of MCP tools that wait on the client's approval
    (``approval``: their server labels by tool name), or its answer as one message."""
    if message.tool_calls:
        return [{"id": APPROVAL_PREFIX + c.id, "type": "mcp_approval_request",
                 "server_label": approval[c.function.name],
                 "name": c.function.name, "arguments": c.function.arguments} if c.function.name in approval
                else call_item(ids.call(c.id), c.id, c.function.name, c.function.arguments) for c in message.tool_calls]
    return [message_item(ids.message, message.content or "")]


def mcp_items(servers: dict[str, list[dict[str, Any]]], result: TurnResult) -> list[dict[str, Any]]:
    """Each requested MCP server's tools (``mcp_list_tools``), then the turn's calls of them (``mcp_call``: a
    repeat the loop refused is not a call)."""
    out = [{"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": label, "error": None,
            "tools": [{"name": t["name"], "description": t.get("description") or None,
                       "input_schema": t.get("parameters") or {"type": "object"}, "annotations": None} for t in specs]}
           for label, specs in servers.items()]
    label_of = {t["name"]: label for label, specs in servers.items() for t in specs}
    calls = [*((APPROVAL_PREFIX + call_id, call) for call_id, call in result.approved),  # approved in this request
             *((None, call) for step in result.steps for call in step.tool_calls)]
    for approval_id, call in calls:
        if call.name in label_of and call.repeat_of is None:
            output = None if call.error is not None else (
                call.result if isinstance(call.result, str) else canonical_json(call.result))
            out.append({"id": new_id("mcp"), "type": "mcp_call", "server_label": label_of[call.name],
                        "name": call.name, "arguments": canonical_json(call.arguments), "output": output,
                        "error": call.error, "status": "failed" if call.error is not None else "completed",
                        "approval_request_id": approval_id})
    return out


def usage_object(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": usage.cached_tokens},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


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

    def object(self, status: str, output: list[dict[str, Any]] | None = None, usage: Usage | None = None,
               error: dict[str, Any] | None = None, incomplete: str | None = None,
               flowstate: dict[str, Any] | None = None) -> dict[str, Any]:
        b = self.body
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "background": b.background is True, "error": error,
            "incomplete_details": None if incomplete is None else {"reason": incomplete},
            "instructions": b.instructions, "max_output_tokens": b.max_output_tokens, "metadata": b.metadata or {},
            "model": b.model, "output": output or [], "parallel_tool_calls": b.parallel_tool_calls is not False,
            "previous_response_id": b.previous_response_id,
            "conversation": None if self.conversation is None else {"id": self.conversation},
            "reasoning": {"effort": None, "summary": None}, "store": b.store is not False,
            "temperature": b.temperature, "text": b.text or {"format": {"type": "text"}},
            "tool_choice": b.choice() if b.tool_choice is not None else "auto", "tools": b.tools or [],
            "top_p": b.top_p, "truncation": b.truncation or "disabled",
            "usage": None if usage is None else usage_object(usage), "user": b.user,
        }
        if flowstate is not None:
            out["flowstate"] = flowstate  # FlowState's detail of the turn; OpenAI clients ignore it
        if self.request is not None:
            out["flowstate"] = {**out.get("flowstate", {}), "request_digest": self.request}
        return out

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
            out.append({"id": f"msg_t{i}", "type": "message", "role": "user", "status": "completed",
                        "content": [{"type": "input_text", "text": m["content"] or ""}]})
        elif m["role"] == "tool":
            out.append({"id": f"fco_t{i}", "type": "function_call_output", "call_id": m["tool_call_id"],
                        "output": m["content"] if isinstance(m["content"], str) else canonical_json(m["content"]),
                        "status": "completed"})
        elif m.get("tool_calls"):
            out += [call_item(f"fc_t{i}_{j}", c["id"], c["name"], c["arguments"])
                    for j, c in enumerate(m["tool_calls"])]
        else:
            out.append(message_item(f"msg_t{i}", m["content"] or ""))
    return out
