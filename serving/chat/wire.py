"""Wire models of the Chat Completions ingress (lenient: extra fields are accepted, as OpenAI's are)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.base import Sampling
from flowstate.nodes import canonical_json, json_depth
from flowstate.request_options import RequestOptions
from grammars.refs import SchemaRefError, inline
from serving.errors import bad_request

TOOL_NAME = r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$"


class Ingress(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionSpec(Ingress):
    name: str = Field(pattern=TOOL_NAME)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolSpec(Ingress):
    type: Literal["function"]
    function: FunctionSpec

    def spec(self) -> dict[str, Any]:
        """The tool as the agent's system prompt and grammar take it."""
        return {"name": self.function.name, "description": self.function.description,
                "parameters": self.function.parameters}


class FunctionCall(Ingress):
    name: str
    arguments: str


class ToolCallIn(Ingress):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Ingress):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None

    def text(self, where: str) -> str:
        """The message's text; content parts must all be text."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}: only text content parts are supported, got {part.get('type')!r}", where)
            parts.append(part["text"])
        return "".join(parts)


class StreamOptions(Ingress):
    include_usage: bool = False


class ChatRequest(Ingress):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: str | dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None

    def options(self, tool_names: set[str]) -> RequestOptions:
        """What this request asks of each model call of its turn (400 for what cannot be asked)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stop) > 4 or any(not isinstance(s, str) or not s for s in stop):
            raise bad_request("stop is up to 4 non-empty strings", "stop")
        choice = self.tool_choice if self.tool_choice is not None else "auto"
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
            if not isinstance(name, str):
                raise bad_request('tool_choice must be "auto", "none", "required" or {"type": "function", '
                                  '"function": {"name": …}}', "tool_choice")
            choice = name
        elif choice not in ("auto", "none", "required"):
            raise bad_request('tool_choice must be "auto", "none", "required" or a function', "tool_choice")
        if choice not in ("auto", "none", "required") and choice not in tool_names:
            raise bad_request(f"tool_choice names {choice!r}, which is not among this request's tools", "tool_choice")
        if choice == "required" and not tool_names:
            raise bad_request('tool_choice "required" needs tools', "tool_choice")
        return RequestOptions(
            sampling=Sampling(temperature=self.temperature, top_p=self.top_p, seed=self.seed),
            answer_tokens=self.max_completion_tokens or self.max_tokens, stop=tuple(stop), tool_choice=choice,
            parallel_tool_calls=self.parallel_tool_calls is not False, answer_schema=self.answer_schema(),
        )

    def answer_schema(self) -> dict[str, Any] | None:
        fmt = self.response_format
        if fmt is None or fmt.get("type") == "text":
            return None
        if fmt.get("type") == "json_object":
            return {"type": "object"}
        if fmt.get("type") != "json_schema" or not isinstance(fmt.get("json_schema"), dict):
            raise bad_request('response_format must be {"type": "text" | "json_object"} or {"type": "json_schema", '
                              '"json_schema": {"name": …, "schema": {…}}}', "response_format")
        schema = fmt["json_schema"].get("schema", {"type": "object"})
        _check_schema(schema, "response_format.json_schema.schema")
        return dict(schema)


def validated(model: type[BaseModel], data: Any, names: Mapping[str, str] | None = None) -> Any:
    """``data`` as ``model``, or a 400 naming the first field that is wrong (``names``: how the client calls a field
    the server translated)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        # a union's branches each report: the one that got furthest into the value says what is wrong with it
        first = max(exc.errors(), key=lambda e: len(_path(e["loc"])))
        where = ".".join(_path(first["loc"]))
        for ours, theirs in (names or {}).items():
            where = where.replace(ours, theirs)
        raise bad_request(f"{where}: {first['msg']}" if where else first["msg"], where or None) from exc


_BRANCHES = {"str", "int", "float", "bool", "none", "dict[str,any]"}


def _path(loc: tuple[int | str, ...]) -> list[str]:
    """A validation error's place in the body as the client wrote it: without the union branches pydantic names
    (``str``, ``list[…]``, a model's class name)."""
    return [str(p) for p in loc if not (isinstance(p, str) and (p in _BRANCHES or "[" in p or p[:1].isupper()))]


def canonical_message(message: ChatMessage, where: str) -> dict[str, Any]:
    """A message reduced to what identifies it in a conversation, for recognising resent history."""
    if message.role == "user":
        return {"role": "user", "content": message.text(where)}
    if message.role == "tool":
        if not message.tool_call_id:
            raise bad_request(f"{where}: a tool message needs tool_call_id", where)
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text(where)}
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.text(where) or None}
        if message.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "name": c.function.name, "arguments": _canonical_arguments(c.function.arguments)}
                for c in message.tool_calls
            ]
        return out
    raise bad_request(f"{where}: role {message.role!r} is not part of the conversation", where)


def _canonical_arguments(arguments: str) -> str:
    value = loads_or_none(arguments)
    return arguments if value is None else canonical_json(value)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


MAX_DEPTH = 64  # JSON nesting a request may hold: whatever ingress accepts, every route that returns it can encode


depth = json_depth


def loads(text: str | bytes) -> Any:
    """Strict JSON: NaN and Infinity refused, as are integers past Python's digit limit and nesting past
    ``MAX_DEPTH`` (each a ``ValueError``), and strings that are not valid Unicode (lone surrogates)."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"nested too deeply (at most {MAX_DEPTH} levels)") from None
    if depth(value) > MAX_DEPTH:
        raise ValueError(f"nested {depth(value)} levels deep: at most {MAX_DEPTH}")
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds a lone surrogate (not valid Unicode)") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    return value


def loads_or_none(text: str) -> Any:
    """``loads``, or None for text that is not strict JSON."""
    try:
        return loads(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class IngressLimits:
    """What one chat completion request may hold; past these it gets a clear 4xx."""

    max_body_bytes: int = 8 << 20
    max_messages: int = 2048
    max_tools: int = 128
    body_timeout_s: float = 60.0  # a client must send its whole body within this


def _check_schema(schema: Any, where: str, owner: str = "") -> None:
    """A valid JSON Schema whose every ``$ref`` resolves within it (``owner`` names what it belongs to)."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    if not isinstance(schema, dict):
        raise bad_request(f"{owner}{where} is not a valid JSON Schema: not an object", where)
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        raise bad_request(f"{owner}{where} is not a valid JSON Schema: {exc.message}", where) from None
    try:
        inline(schema)  # every $ref followed, any recursion finite: what the grammar builder will do
    except SchemaRefError as exc:
        raise bad_request(f"{owner}{where}: {exc}", where, exc.code) from None


def check_tools(tools: list[ToolSpec], limits: IngressLimits) -> None:
    """At most ``max_tools``, unique names, parameters that are valid JSON Schemas of an object."""
    if len(tools) > limits.max_tools:
        raise bad_request(f"at most {limits.max_tools} tools per request, got {len(tools)}", "tools")
    names = [t.function.name for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise bad_request(f"tool names must be unique; repeated: {', '.join(dupes)}", "tools")
    for i, tool in enumerate(tools):
        schema = tool.function.parameters
        _check_schema(schema, f"tools[{i}].function.parameters", f"tool {tool.function.name!r}: ")
        if schema.get("type", "object") != "object":
            raise bad_request(f"tools[{i}].function.parameters must describe an object",
                              f"tools[{i}].function.parameters")
