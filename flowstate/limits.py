"""Protocol limits: the one configuration the protocol models, the grammar, the prompt and the parser derive from.

Two profiles. ``standard`` is sized for real agents (Qwen3.5-class models): long final answers,
summaries of a few hundred characters, nested JSON values, tool arguments bounded only by each
tool's own schema, and the counts per step a real agent needs. ``compact`` keeps the tight bounds
that make a tiny model (the embedded 135M one) terminate inside a small completion budget; the
embedded engines pick it automatically.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.base import Engine


@dataclass(frozen=True)
class Limits:
    """Bounds of one model output. Counts are per step; lengths are characters."""

    name: str
    focus: int  # state_focus items
    ops: int  # state_delta operations
    tool_calls: int
    refs: int  # refs of one state
    text: int  # summaries and reasons
    content: int  # the final answer
    value_depth: int  # nesting below a state's value object (1: its members may be lists/objects of scalars)
    value_items: int  # members of one object, items of one list, inside a state's value
    value_text: int  # one string inside a state's value
    tool_text: int | None  # bound given to tool-argument strings whose schema has none (None: the schema alone)
    tool_items: int | None  # likewise for arrays
    examples: bool = True  # the protocol's worked steps in the prompt (a tiny model copies them into its outputs)

    def __post_init__(self) -> None:
        for name in ("focus", "ops", "tool_calls", "refs", "text", "content", "value_items", "value_text"):
            if getattr(self, name) < 1:
                raise ValueError(f"limit {name} must be at least 1")
        if self.value_depth < 0:
            raise ValueError("limit value_depth must be at least 0")

    def describe(self, blocks: Sequence[str] = ("state_focus", "state_delta", "tool_calls",
                                                 "assistant_message")) -> str:
        """The limits of the blocks in ``blocks``, in words, for the output protocol section of the prompt."""
        per_step = [f"{self.ops} state operations" if "state_delta" in blocks else "",
                    f"{self.focus} focus items" if "state_focus" in blocks else "", f"{self.tool_calls} tool calls"]
        texts = [w for b, w in (("state_delta", "summaries"), ("state_focus", "reasons")) if b in blocks]
        shape = f"nested ≤ {self.value_depth} levels" if self.value_depth else "of scalars"
        state = (f"values: JSON objects {shape}, ≤ {self.value_items} items each, strings ≤ {self.value_text} "
                 f"characters; ≤ {self.refs} refs per state; ") if "state_delta" in blocks else ""
        return (
            f"Per step at most {', '.join(p for p in per_step if p)}; "
            + (f"{' and '.join(texts)} ≤ {self.text} characters; " if texts else "")
            + f"{state}final answer ≤ {self.content} characters. Keep outputs short."
        )


STANDARD = Limits(
    name="standard", focus=8, ops=16, tool_calls=8, refs=8, text=400, content=16_000,
    value_depth=4, value_items=32, value_text=2_000, tool_text=None, tool_items=None,
)
COMPACT = Limits(
    name="compact", focus=3, ops=4, tool_calls=4, refs=4, text=96, content=480,
    value_depth=1, value_items=6, value_text=96, tool_text=96, tool_items=6, examples=False,
)
PROFILES: dict[str, Limits] = {p.name: p for p in (STANDARD, COMPACT)}
AUTO = "auto"


def get(name: str) -> Limits:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown limits profile {name!r}; valid profiles: {', '.join(PROFILES)}, {AUTO}") from None


def for_engine(engine: Engine | None, name: str | None = None) -> Limits:
    """The profile named, or (None / ``auto``) the one that fits the engine: compact for the embedded tiny model."""
    if name is not None and name != AUTO:
        return get(name)
    return COMPACT if engine is not None and engine.capabilities.embedded else STANDARD


def clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, the last an ellipsis where it was cut."""
    return text if len(text) <= n else text[: n - 1] + "…"


def fit(value: Any, limits: Limits, depth: int = 0) -> Any:
    """A JSON value cut to what a state's value may hold under ``limits``: containers to ``value_items`` members
    and ``value_depth`` levels below the top object, strings to ``value_text`` characters."""
    if isinstance(value, dict | list) and depth > limits.value_depth:
        return json.dumps(value)[: limits.value_text]
    if isinstance(value, dict):
        return {str(k): fit(v, limits, depth + 1) for k, v in list(value.items())[: limits.value_items]}
    if isinstance(value, list):
        return [fit(v, limits, depth + 1) for v in value[: limits.value_items]]
    return value[: limits.value_text] if isinstance(value, str) else value
