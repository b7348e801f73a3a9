"""A memory method's own model calls (extraction, state tracking, compression, validation): made the same way
by every method, recorded as StepRecords whose tokens count for the method, their JSON read back leniently."""

from __future__ import annotations

import json
import re
from typing import Any

from engine.base import Generation, Message
from flowstate.records import StepRecord


def call(run: Any, system: str, user: str, grammar: str) -> Generation:
    """One call on the request's engine and budget; under ``grammar`` where the request decodes under grammars."""
    constrained = getattr(run.engine, "supports_grammar", False) and run.grammars is not None
    return run.engine.generate([Message("system", system), Message("user", user)],  # type: ignore[no-any-return]
                               grammar=grammar if constrained else None,
                               max_tokens=run.options.max_tokens or run.config.max_tokens)


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
