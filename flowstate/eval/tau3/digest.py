"""One digest of a τ³ value (a database, a tool's result) that tau2-bench's own environment and ours can both
compute: canonical JSON after dropping absent (None) fields and writing integral floats as integers, so
that a pydantic model's dump and the same data held as plain JSON digest alike. Standard library only: the
fixture script runs it beside tau2-bench's code (``tests/fixtures/tau2/make_digests.py``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def normal(value: Any) -> Any:
    """``value`` with None fields dropped, integral floats as ints, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): normal(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [normal(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        return round(value, 6)
    return value


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(normal(value), sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
