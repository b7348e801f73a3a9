"""The Responses API's request, and its translation into the chat service's request: input items to messages, flat
function tools to chat tools, ``text.format`` to ``response_format``. Item types and tools FlowState does not run
are accepted and left out; what it cannot honour is a 400."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from flowstate.loop import Approval
from serving.chat.wire import Ingress
from serving.errors import bad_request

ROLES = ("user", "assistant", "system", "developer")
# what ``include`` may ask for, as OpenAI's API documents it (Codex sends reasoning.encrypted_content): accepted, and
# nothing more is sent, as FlowState's responses hold none of those parts
INCLUDABLE = ("code_interpreter_call.outputs", "computer_call_output.output.image_url", "file_search_call.results",
              "message.input_image.image_url", "message.output_text.logprobs", "reasoning.encrypted_content",
              "web_search_call.action.sources", "web_search_call.results")
TEXT_PARTS = ("input_text", "output_text", "text")


class TextPart(Ingress):
    """A message's content part: text (``input_text``, ``output_text``, ``text``) or a ``refusal``; other kinds of
    part (images, files) are refused by the message's check, as FlowState's models read text."""

    type: str
    text: str | None = None
    refusal: str | None = None


class MessageItem(Ingress):
    type: Literal["message"] = "message"
    role: str
    content: str | list[TextPart]
    id: str | None = None
    status: str | None = None


class FunctionCallItem(Ingress):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None


class OutputPart(Ingress):
    """A part of a function call's output (a list form of ``output``): text is what the model reads of it."""

    type: str
    text: str | None = None


class FunctionCallOutputItem(Ingress):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[OutputPart]
    id: str | None = None


class McpApprovalResponseItem(Ingress):
    type: Literal["mcp_approval_response"]
    approval_request_id: str
    approve: bool
    reason: str | None = None
    id: str | None = None


class OtherItem(Ingress):
    """An item of a type FlowState does not run (reasoning, item references, hosted tools' items): kept in the
    stored input, left out of the model's messages."""

    type: str


_ITEMS = {"message": MessageItem, "function_call": FunctionCallItem, "function_call_output": FunctionCallOutputItem,
          "mcp_approval_response": McpApprovalResponseItem}


def _item_kind(value: Any) -> str:
    """Which model validates an input item: its ``type`` (a message may leave it out and give a ``role``)."""
    if not isinstance(value, dict):
        return "other"
    kind = value.get("type", "message" if "role" in value else None)
    return kind if isinstance(kind, str) and kind in _ITEMS else "other"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[McpApprovalResponseItem, Tag("mcp_approval_response")] | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind)]


class ToolChoice(Ingress):
    """``tool_choice`` as an object: a function by name, or ``allowed_tools`` (a mode and the tools it keeps)."""

    type: str
    name: str | None = None
    mode: Literal["auto", "required"] | None = None
    tools: list[dict[str, Any]] | None = None


class ResponsesRequest(Ingress):
    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    metadata: dict[str, str] | None = None
    store: bool | None = None  # None: true, as OpenAI's default
    stream: bool = False
    user: str | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None

    def choice(self) -> str | dict[str, Any] | None:
        """``tool_choice`` as it was sent."""
        if isinstance(self.tool_choice, ToolChoice):
            return self.tool_choice.model_dump(exclude_unset=True)
        return self.tool_choice

    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, dict):
            cid = self.conversation.get("id")
            if not isinstance(cid, str):
                raise bad_request('conversation must be an id or {"id": …}', "conversation")
            return cid
        return self.conversation

    def check(self) -> None:
        """What the endpoint refuses outright, before any session is touched."""
        if self.background and self.store is False:
            raise bad_request("a background response is stored (it is polled by its id): send store: true, or no "
                              "background", "background", "background_needs_store")
        check_include(self.include)
        if self.previous_response_id is not None and self.conversation is not None:
            raise bad_request("previous_response_id and conversation cannot be used together", "previous_response_id")
        check_metadata(self.metadata or {})

    def mcp(self) -> list[McpTool]:
        """The ``mcp`` tools: servers the operator configured (``--mcp``) run their tools server-side, never a
        ``server_url`` the request names; ``allowed_tools`` (names, or ``{"tool_names": [...]}``) keeps only those of
        that server callable; ``require_approval`` says which calls wait on the client's approval."""
        out = []
        for i, tool in enumerate(self.tools or []):
            if tool.get("type") != "mcp":
                continue
            if not isinstance(tool.get("server_label"), str):
                raise bad_request(f"tools[{i}]: an mcp tool needs server_label", f"tools[{i}].server_label")
            out.append(McpTool(i, tool["server_label"],
                               _allowed(tool.get("allowed_tools"), f"tools[{i}].allowed_tools"),
                               *_approval(tool.get("require_approval"), f"tools[{i}].require_approval")))
        return out

    def approvals(self, items: list[dict[str, Any]]) -> dict[str, Approval]:
        """The client's answers to approval requests (``mcp_approval_response`` items), by the call they answer."""
        return {_approved_call(item, i): Approval(item["approve"], item.get("reason"))
                for i, item in enumerate(items) if item["type"] == "mcp_approval_response"}

    def items(self) -> list[dict[str, Any]]:
        """The input as items, each with an id (a string input is one user message)."""
        raw = ([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": self.input}]}]
               if isinstance(self.input, str) else [i.model_dump(exclude_unset=True) for i in self.input])
        out = []
        for i, item in enumerate(raw):
            kind = item.get("type", "message" if "role" in item else None)
            if not isinstance(kind, str):
                raise bad_request(f"input[{i}]: an item needs a type", f"input[{i}]")
            item = {**item, "type": kind}
            if kind == "message":
                item = _message_item(item, i)
            item.setdefault("id", f"{_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}")
            out.append(item)
        return out

    def chat(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat service's request (its JSON) for these input items."""
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + _messages(items)
        if not any(m["role"] in ("user", "tool") for m in messages):
            raise bad_request("the input holds no user message and no function_call_output", "input")
        tools, choice = _tools(self.tools or [], self.choice())
        body: dict[str, Any] = {
            "model": self.model, "messages": messages, "tools": tools or None, "tool_choice": choice,
            "stream": self.stream, "user": self.user, "temperature": self.temperature, "top_p": self.top_p,
            "max_tokens": self.max_output_tokens, "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": _format(self.text),
        }
        return body


@dataclass(frozen=True)
class McpTool:
    """A request's ``mcp`` tool: where it stands in ``tools``, the server it names, the tools it allows (None: every
    one), and which of its calls wait on approval: those named in ``always``, and the rest unless named in ``never``
    when ``others`` (``require_approval``'s default, "always", is every call)."""

    position: int
    label: str
    allowed: list[str] | None
    always: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()
    others: bool = True

    def approves(self, name: str) -> bool:
        """Whether a call of this tool waits on the client's approval."""
        return name in self.always or (self.others and name not in self.never)


APPROVAL_PREFIX = "mcpr_"  # an approval request's id: this prefix and the id of the call it holds


def check_include(include: list[str] | None, param: str = "include") -> None:
    """``include``'s values must be ones the API documents (a 400 names the first that is not)."""
    for value in include or ():
        if value not in INCLUDABLE:
            raise bad_request(f"include: unknown value {value[:80]!r}; the values are {', '.join(INCLUDABLE)}", param,
                              "invalid_include")


def check_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """A response's or conversation's metadata, within OpenAI's bounds (else a 400)."""
    if len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        raise bad_request("metadata is up to 16 pairs, keys up to 64 and values up to 512 characters", "metadata")
    return metadata


_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs",
           "mcp_approval_response": "mcpa"}


def _message_item(item: dict[str, Any], i: int) -> dict[str, Any]:
    """A message item in the full shape (``content`` a list of parts), its role and parts checked."""
    if item.get("role") not in ROLES:
        raise bad_request(f"input[{i}]: role must be one of {', '.join(ROLES)}", f"input[{i}].role")
    content = item.get("content")
    if isinstance(content, str):
        part = "output_text" if item["role"] == "assistant" else "input_text"
        content = [{"type": part, "text": content, **({"annotations": []} if part == "output_text" else {})}]
    if not isinstance(content, list):
        raise bad_request(f"input[{i}]: content must be a string or a list of parts", f"input[{i}].content")
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in (*TEXT_PARTS, "refusal"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise bad_request(f"input[{i}].content[{j}]: only text parts are supported, got {kind!r}",
                              f"input[{i}].content")
        if not isinstance(part.get("text", part.get("refusal")), str):
            raise bad_request(f"input[{i}].content[{j}]: a text part needs its text", f"input[{i}].content")
    return {**item, "content": content, "status": item.get("status", "completed")}


def _text(parts: list[dict[str, Any]]) -> str:
    return "".join(str(p.get("text") or p.get("refusal") or "") for p in parts)


def _messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of the input items: consecutive function calls are one assistant message with tool calls, a
    function call's output a tool message; other item types (reasoning, references, hosted tools' items) carry
    nothing the model's next request needs from the client, and are left out."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        kind = item["type"]
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": _text(item["content"])})
        elif kind == "function_call":
            for field in ("call_id", "name", "arguments"):
                if not isinstance(item.get(field), str):
                    raise bad_request(f"input[{i}]: a function_call needs {field}", f"input[{i}].{field}")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "mcp_approval_response":  # the decision reaches the call as an Approval; this keeps its place
            approve = "approved" if item["approve"] else "not approved" + (f": {item['reason']}" if item.get("reason")
                                                                         else "")
            out.append({"role": "tool", "tool_call_id": _approved_call(item, i), "content": approve})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str) or not isinstance(output, str | list):
                raise bad_request(f"input[{i}]: a function_call_output needs call_id and output", f"input[{i}]")
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": output if isinstance(output, str) else _text(output)})
    return out


def _tools(tools: list[dict[str, Any]], choice: str | dict[str, Any] | None) -> tuple[list[dict[str, Any]], Any]:
    """Chat tools of the flat function tools (other tool types are not run by the client and are left out), and the
    chat tool_choice."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if tool.get("type") != "function":  # mcp tools: ResponsesRequest.mcp; hosted tools are not run here
            continue
        function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind == "function":
            return out, {"type": "function", "function": {"name": choice.get("name")}}
        if kind == "allowed_tools":
            allowed = {t.get("name") for t in choice.get("tools") or [] if isinstance(t, dict)}
            mode = choice.get("mode", "auto")
            return [t for t in out if t["function"].get("name") in allowed], mode
        raise bad_request(f"tool_choice of type {kind!r} is not supported: use auto, none, required, a function or "
                          "allowed_tools", "tool_choice")
    return out, choice


def _approved_call(item: dict[str, Any], i: int) -> str:
    """The call an ``mcp_approval_response`` answers (400 for one that is not well formed)."""
    request_id = item.get("approval_request_id")
    if not isinstance(request_id, str) or not request_id.startswith(APPROVAL_PREFIX) or not isinstance(
            item.get("approve"), bool) or not isinstance(item.get("reason"), str | None):
        raise bad_request(f"input[{i}]: an mcp_approval_response needs approval_request_id (an mcp_approval_request's "
                          "id), approve (true or false) and optionally reason (a string)", f"input[{i}]")
    return request_id[len(APPROVAL_PREFIX):]


def _approval(value: Any, where: str) -> tuple[frozenset[str], frozenset[str], bool]:
    """``require_approval`` as (always, never, others): "always" (the default) or "never", or
    ``{"always": {"tool_names": [...]}, "never": {"tool_names": [...]}}`` — a tool named in neither waits on approval
    unless only ``always`` names tools."""
    if value in (None, "always"):
        return frozenset(), frozenset(), True
    if value == "never":
        return frozenset(), frozenset(), False
    if not isinstance(value, dict) or not set(value) <= {"always", "never"}:
        raise bad_request(f'{where} is "always", "never" or {{"always": {{"tool_names": [...]}}, "never": '
                          '{"tool_names": [...]}}', where)
    names = {k: _allowed(v, f"{where}.{k}") or [] for k, v in value.items()}
    return frozenset(names.get("always", ())), frozenset(names.get("never", ())), "always" not in value


def _allowed(value: Any, where: str) -> list[str] | None:
    """An mcp tool's ``allowed_tools``: a list of names or a filter ``{"tool_names": [...]}`` (None: every tool)."""
    if value is None:
        return None
    names = value.get("tool_names") if isinstance(value, dict) else value
    if isinstance(value, dict) and value.get("read_only") is not None:
        raise bad_request(f"{where}: read_only filters are not supported (MCP servers here declare no read-only "
                          "hints FlowState trusts): name the tools", where, "unsupported_parameter")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request(f"{where} is a list of tool names or {{\"tool_names\": [...]}}", where)
    return names


def _format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name", "answer"),
                                                       "schema": fmt.get("schema", {"type": "object"})}}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    raise bad_request('text.format must be {"type": "text" | "json_object"} or {"type": "json_schema", "name": …, '
                      '"schema": {…}}', "text.format")
