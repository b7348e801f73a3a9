"""A model call's figures in a result row, by name: each call of a task is written to ``results.jsonl`` as its
``Usage`` (an object of named figures), and read back as one — from the rows of older runs, which wrote a positional
list, too."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.base import Usage

ORDER = ("prompt_tokens", "cached_tokens", "completion_tokens", "ttft_s", "decode_s", "shared_tokens",
         "forced_tokens")
"""The fields in the order older rows listed them (rows before the last two held the first five)."""


def read(value: Mapping[str, Any] | Sequence[float]) -> Usage:
    """A row's call: an object by name, or an older run's positional list."""
    if isinstance(value, Mapping):
        return Usage(**{k: v for k, v in value.items() if k in Usage.__dataclass_fields__})
    return Usage(**dict(zip(ORDER, value, strict=False)))  # type: ignore[arg-type]

