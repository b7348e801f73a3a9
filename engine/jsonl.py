"""JSON Lines files (scripts, traces, datasets) read as numbered objects, each bad line a clear error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def objects(path: str | Path, what: str, error: type[Exception] = ValueError) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each non-blank line of ``path`` as (its line number, its JSON object); ``error`` names ``what`` the file
    is, the file and the line when it cannot be read or a line is not a JSON object."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise error(f"cannot read {what} {p}: {exc.strerror or exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{what} {p} line {number}: not JSON ({exc.msg})") from exc
        if not isinstance(value, dict):
            raise error(f"{what} {p} line {number}: not a JSON object")
        yield number, value
