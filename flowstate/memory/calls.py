"""A memory method's own model calls (extraction, state tracking, compression, validation): recorded the same
way by every method, as StepRecords whose tokens count for the method, their JSON read back leniently.
The calls themselves go through ``MemoryContext.call_model``, the request's own engine path."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.base import Generation
from flowstate.records import StepRecord


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
