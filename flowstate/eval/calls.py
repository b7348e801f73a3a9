"""A model call's figures in a result row, by name: what each call of a task cost (tokens, cached, forced, times),
written to ``results.jsonl`` as an object, and read back from rows of older runs that wrote a positional list."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

ORDER = ("prompt_tokens", "cached_tokens", "completion_tokens", "ttft_s", "decode_s", "shared_tokens",
         "forced_tokens")
"""The fields in the order older rows listed them (rows before the last two held the first five)."""


@dataclass(frozen=True)
class CallFigures:
    """One model call of a task (an agent step or a memory method's own call)."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    shared_tokens: int = 0  # the prompt's fixed deployment prefix, where the engine counts it
    forced_tokens: int = 0  # completion tokens the grammar forced

    @property
    def context(self) -> int:
        """The tokens its KV cache holds at its end: prompt and completion."""
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, usage: Mapping[str, Any]) -> CallFigures:
        """From a step record's usage (``Usage.to_dict``)."""
        return cls(**{k: usage.get(k, 0) for k in ORDER})

    @classmethod
    def read(cls, value: Mapping[str, Any] | Sequence[float]) -> CallFigures:
        """From a row: an object by name, or an older run's positional list."""
        if isinstance(value, Mapping):
            return cls(**{k: value[k] for k in ORDER if k in value})
        return cls(**dict(zip(ORDER, value, strict=False)))  # type: ignore[arg-type]

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


def calls_of(subtasks: Iterable[Mapping[str, Any]]) -> list[CallFigures]:
    """Every call of these subtask rows, in order."""
    return [CallFigures.read(c) for s in subtasks for c in s["calls"]]
