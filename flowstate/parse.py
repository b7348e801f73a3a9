"""Parse a raw model output into a ``ModelOutput``, or say precisely which block is wrong and how."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from flowstate.errors import ProtocolError
from flowstate.protocol import BLOCK_MODELS, BLOCKS, ModelOutput

_ADAPTERS: dict[str, TypeAdapter[Any]] = {name: TypeAdapter(tp) for name, tp in BLOCK_MODELS.items()}
_TAG = re.compile(r"<(/?)([a-z_]+)>")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _json_end(text: str, pos: int, close_tag: str) -> int | None:
    """Where ``close_tag`` starts after the JSON value at ``pos``, if one is there.

    A closing tag inside a JSON string is content, not the end of the block (the grammar allows it).
    """
    try:
        _, end = _DECODER.raw_decode(text, _SPACE.match(text, pos).end())  # type: ignore[union-attr]
    except json.JSONDecodeError:
        return None
    end = _SPACE.match(text, end).end()  # type: ignore[union-attr]
    return end if text.startswith(close_tag, end) else None


def _split_blocks(text: str, blocks: Sequence[str]) -> dict[str, str]:
    """Cut the text into the tagged blocks, in order, with only whitespace between them."""
    bodies: dict[str, str] = {}
    pos = 0
    for name in blocks:
        open_tag, close_tag = f"<{name}>", f"</{name}>"
        start = text.find(open_tag, pos)
        if start < 0:
            raise ProtocolError(name, f"missing {open_tag} (blocks must come in the order {', '.join(blocks)})")
        between = text[pos:start]
        if between.strip():
            found = _TAG.search(between)
            what = f"tag <{found.group(1)}{found.group(2)}>" if found else f"text {between.strip()[:40]!r}"
            raise ProtocolError(name, f"unexpected {what} before {open_tag}")
        body = start + len(open_tag)
        end = _json_end(text, body, close_tag)
        if end is None:  # not JSON followed by the closing tag: cut at the tag, and let the JSON check say why
            end = text.find(close_tag, body)
        if end < 0:
            raise ProtocolError(name, f"missing {close_tag}")
        bodies[name] = text[body:end]
        pos = end + len(close_tag)
    tail = text[pos:].strip()
    if tail:
        raise ProtocolError("assistant_message", f"unexpected text after </assistant_message>: {tail[:40]!r}")
    return bodies


def parse_output(text: str, blocks: Sequence[str] = BLOCKS) -> ModelOutput:
    """Parse one raw model output; raise ``ProtocolError`` naming the faulty block.

    ``blocks`` are the blocks the strategy's protocol has (in protocol order); absent ones are empty.
    """
    bodies = _split_blocks(text, blocks)
    values: dict[str, Any] = {}
    for name in blocks:
        body = bodies[name].strip()
        if not body:
            raise ProtocolError(name, "empty block; use [] for an unused array or {\"content\": null}")
        try:
            raw = json.loads(body)
        except json.JSONDecodeError as exc:
            raise ProtocolError(name, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
        try:
            values[name] = _ADAPTERS[name].validate_python(raw)
        except ValidationError as exc:
            raise ProtocolError(name, _first_error(exc)) from exc
    output = ModelOutput(**values)
    if output.tool_calls and output.final_response is not None:
        raise ProtocolError(
            "assistant_message",
            "tool_calls and a final response in one step; choose one execution decision "
            '(set content to null while calling tools)',
        )
    if output.is_empty():
        parts = [b for b in ("state_focus", "state_delta") if b in blocks] + ["the execution decision"]
        raise ProtocolError("output", f"all of {', '.join(parts)} are empty; at least one must be non-empty")
    return output
