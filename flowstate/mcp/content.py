"""What an MCP tool's result becomes: the observation the model sees, or the tool error it is told.

- ``isError``: the error, in the server's words (its text parts).
- Structured content, where the server gives it: that JSON value.
- Otherwise the content's parts: a text part that is a JSON object or array is that value, any other text part
  the text itself (an embedded text resource counts as its text). One part is the observation; several are a
  list of them; none is an empty list. (A FastMCP server sends a returned list as one part per item, and a
  result of None as no parts.)
- A part that is not text (an image, audio, a binary resource, a link) cannot be shown to a text model: the call
  is a tool error that says so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from flowstate.tools import ToolError


def _value(text: str) -> Any:
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except ValueError:
            pass
    return text


def _text(part: Any) -> str:
    kind = getattr(part, "type", None)
    if kind == "text":
        return str(part.text)
    text = getattr(getattr(part, "resource", None), "text", None)
    if kind == "resource" and isinstance(text, str):
        return text
    what = f"{kind} content" if kind else f"a {type(part).__name__}"
    raise ToolError(f"the tool returned {what}, which cannot be shown to the model as text")


def observation(result: Any) -> Any:
    """The observation of an ``mcp.types.CallToolResult``; ``ToolError`` for an error or unusable content."""
    parts: Sequence[Any] = result.content or ()
    if result.is_error:
        texts = [p.text for p in parts if getattr(p, "type", None) == "text"]
        raise ToolError(" ".join(texts).strip() or "the tool reported an error without a message")
    if result.structured_content is not None:
        return result.structured_content
    values = [_value(_text(p)) for p in parts]
    return values[0] if len(values) == 1 else values


def through_fastmcp(value: Any) -> Any:
    """The observation a Python tool's result would be had a FastMCP server sent it: a list (or tuple) one part per
    item, flattened, None no parts, anything else one part (a string as it is, any other value as its JSON). How a
    native tool's result is compared with what an MCP server returned for the same call (``flowstate.eval.tau3``)."""
    def flat(v: Any) -> list[Any]:
        if isinstance(v, list | tuple):
            return [x for item in v for x in flat(item)]
        return [] if v is None else [v]

    values = [_value(v if isinstance(v, str) else json.dumps(v)) for v in flat(value)]
    return values[0] if len(values) == 1 else values
