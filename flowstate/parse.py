"""Parse a raw model output into a ``ModelOutput``, or say precisely which block is wrong and how."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from flowstate.errors import ProtocolError
from flowstate.limits import STANDARD, Limits
from flowstate.protocol import BLOCKS, BoundedProtocol, Malformed, MessageBlock, ModelOutput, bounded

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
    except (ValueError, RecursionError):  # not JSON, or an integer past Python's digit limit
        return None
    end = _SPACE.match(text, end).end()  # type: ignore[union-attr]
    return end if text.startswith(close_tag, end) else None


def _split_blocks(text: str, blocks: Sequence[str], optional: Sequence[str] = ()) -> dict[str, str]:
    """Cut the text into the tagged blocks, in order, with only whitespace between them; a block of ``optional``
    may be left out (it reads as empty)."""
    bodies: dict[str, str] = {}
    pos = 0
    for name in blocks:
        open_tag, close_tag = f"<{name}>", f"</{name}>"
        start = text.find(open_tag, pos)
        if name in optional and (start < 0 or text[pos:start].strip()):
            continue  # left out: what follows must be the next block
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


def _json_answer(raw: Any, schema: dict[str, Any]) -> Any:
    """A JSON answer checked against its schema, as the text the client receives."""
    from jsonschema.validators import validator_for

    if not isinstance(raw, dict) or raw.get("content") is None:
        return raw
    content = raw["content"]
    error = next(iter(validator_for(schema)(schema).iter_errors(content)), None)
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise ProtocolError("assistant_message", f"the answer does not match the response format at "
                                                 f"'{where or '/'}': {error.message}")
    return {**raw, "content": json.dumps(content, ensure_ascii=False, separators=(",", ":"))}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _item_id(item: Any) -> str:
    if isinstance(item, dict):
        for key in ("state_id", "target_id", "name"):
            if isinstance(item.get(key), str):
                return str(item[key])[:64]
    return ""


def _items(name: str, raw: Any, protocol: BoundedProtocol) -> tuple[list[Any], list[Malformed]]:
    """Validate each item of an array block on its own: the good ones, and the others with their reasons."""
    if not isinstance(raw, list):
        raise ProtocolError(name, f"expected a JSON array, got {type(raw).__name__}")
    limit = {"state_focus": protocol.limits.focus, "state_delta": protocol.limits.ops,
             "tool_calls": protocol.limits.tool_calls}[name]
    good: list[Any] = []
    bad: list[Malformed] = []
    for position, item in enumerate(raw, start=1):
        if position > limit:
            bad.append(Malformed(name, position, f"more than {limit} items in one step; this one was not applied",
                                 _item_id(item)))
            continue
        try:
            good.append(protocol.item(name, item))
        except ValidationError as exc:
            bad.append(Malformed(name, position, _first_error(exc), _item_id(item)))
    return good, bad


def parse_output(
    text: str, blocks: Sequence[str] = BLOCKS, limits: Limits = STANDARD, answer_schema: dict[str, Any] | None = None,
    optional: Sequence[str] = (),
) -> ModelOutput:
    """Parse one raw model output under ``limits``; raise ``ProtocolError`` naming the faulty block.

    ``blocks`` are the blocks the strategy's protocol has (in protocol order); absent ones are empty.
    Items are validated one by one (B.4: operations failing the conditions are excluded): a malformed
    focus item, operation or tool call is left out and listed in ``malformed``; the rest stands. Only
    text that is not the blocks, a block that is not JSON of its kind, or an invalid final message
    is a protocol error. With ``answer_schema`` the answer's content is a JSON value matching it (returned
    as its compact JSON text). A block of ``optional`` may be left out, which says it is empty.
    """
    protocol = bounded(limits)
    bodies = _split_blocks(text, blocks, optional)
    values: dict[str, Any] = {}
    malformed: list[Malformed] = []
    for name in (b for b in blocks if b in bodies):  # an optional block left out is not there
        body = bodies[name].strip()
        if not body:
            raise ProtocolError(name, "empty block; use [] for an unused array or {\"content\": null}")
        try:
            raw = json.loads(body, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise ProtocolError(name, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from exc
        except RecursionError as exc:
            raise ProtocolError(name, "JSON nested too deeply") from exc
        except ValueError as exc:  # NaN / Infinity, or an integer past Python's digit limit
            raise ProtocolError(name, f"not JSON: {exc}") from exc
        try:
            json.dumps(raw, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ProtocolError(name, "a string holds a lone surrogate (not valid Unicode)") from exc
        except ValueError as exc:  # 1e400 parses as infinity, which no JSON reader takes back
            raise ProtocolError(name, "a number is out of range (not a finite JSON number)") from exc
        if name == "assistant_message":
            if answer_schema is not None:
                raw = _json_answer(raw, answer_schema)
            try:
                values[name] = protocol.assistant_message(raw)
            except ValidationError as exc:
                raise ProtocolError(name, _first_error(exc)) from exc
        else:
            values[name], bad = _items(name, raw, protocol)
            malformed += bad
    message = values.get("assistant_message")
    if values.get("tool_calls") and message is not None and message.content is not None:
        malformed.append(Malformed("assistant_message", 1, "a final answer in the same step as tool calls was "
                                   "not given; answer once you have seen the tool results"))
        values["assistant_message"] = MessageBlock()
    output = ModelOutput.model_construct(
        state_focus=tuple(values.get("state_focus", ())), state_delta=tuple(values.get("state_delta", ())),
        tool_calls=tuple(values.get("tool_calls", ())),
        assistant_message=values.get("assistant_message", MessageBlock()), malformed=tuple(malformed),
    )
    if output.is_empty() and not malformed:
        parts = [b for b in ("state_focus", "state_delta") if b in blocks] + ["the execution decision"]
        raise ProtocolError("output", f"all of {', '.join(parts)} are empty; at least one must be non-empty")
    return output
