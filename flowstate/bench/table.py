"""The benchmarks' one table shape: rows as Markdown under a fixed head."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def table(head: Sequence[str], rows: Sequence[dict[str, Any]], none: str = "–") -> str:
    """Rows as a Markdown table of the ``head`` columns; a missing figure (None, or no such key) reads ``none``."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(none if r.get(h) is None else str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines)
