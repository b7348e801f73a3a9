"""A memory method's own model calls (extraction, state tracking, compression, validation): recorded the same
way by every method, as StepRecords whose tokens count for the method, their JSON read back leniently.
The calls themselves go through ``MemoryContext.call_model``, the request's own engine path. A JSON reply's
shape is a pydantic model (beside the method's prompt): its grammar is made from the model's schema
(``grammar``) and the reply read back with it (``reply``), one source of truth as the four blocks have."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from engine.base import Generation
from flowstate.records import StepRecord
from grammars.four_blocks import json_reply

Reply = TypeVar("Reply", bound=BaseModel)


def grammar(model: type[BaseModel]) -> str:
    """The grammar that decodes only ``model``'s JSON (its schema, every field emitted)."""
    return json_reply(model.model_json_schema())


def reply(text: str, model: type[Reply]) -> Reply | None:
    """``model`` read from a model's output (its outermost braces), or None when it is not that shape."""
    value = json_object(text)
    try:
        return model.model_validate(value) if value is not None else None
    except ValidationError:
        return None


def record(generation: Generation, block: str, error: str | None = None) -> StepRecord:
    return StepRecord(index=0, raw=generation.text, usage=generation.usage, truncated=generation.truncated,
                      protocol_error=None if error is None else {"block": block, "message": error})


def json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in a model's output (the outermost braces), or None."""
    found = re.search(r"\{.*\}", text, re.S)
    try:
        value = json.loads(found.group(0)) if found else None
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
