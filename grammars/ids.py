"""Regular expressions of the ids an Add may still take: every id of the protocol's shape except those in use and
those that start with a reserved prefix — a finite set's complement is regular, so the per-step grammar can refuse
a used id outright (B.4: "an Add needs an unused id") instead of decoding it and rejecting it afterwards."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

_END, _BLOCKED = "\0end", "\0blocked"


@dataclass(frozen=True)
class IdShape:
    """An id's shape: its first character from ``first``, then up to ``max_len - 1`` from ``rest``."""

    first: str
    rest: str
    max_len: int


def _class(chars: Iterable[str]) -> str:
    """A character class of ``chars``, runs of consecutive code points written as ranges."""
    codes = sorted({ord(c) for c in chars})
    parts, i = [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        lo, hi = (_escape(chr(codes[i])), _escape(chr(codes[j])))
        parts.append(lo if i == j else f"{lo}{hi}" if j == i + 1 else f"{lo}-{hi}")
        i = j + 1
    return "[" + "".join(parts) + "]"


def _escape(c: str) -> str:
    return "\\" + c if c in "\\]^-[" else c


def _trie(used: Iterable[str], reserved: Iterable[str]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for word, mark in [*((w, _END) for w in used), *((p, _BLOCKED) for p in reserved)]:
        node = root
        for c in word:
            node = node.setdefault(c, {})
        node[mark] = True
    return root


def unused_id_pattern(shape: IdShape, used: Iterable[str], reserved: Iterable[str] = ()) -> str:
    """An anchored regex of the ids of ``shape`` that are not in ``used`` and start with none of ``reserved``."""
    rest = _class(shape.rest)

    def emit(node: dict[str, Any], depth: int) -> str | None:
        alternatives: list[str] = []
        can_end = depth >= 1 and not node.get(_END)
        if depth < shape.max_len:
            alphabet = shape.first if depth == 0 else shape.rest
            children = [c for c in node if c in alphabet]
            free = [c for c in alphabet if c not in children]
            tail = shape.max_len - depth - 1
            if free:  # off every used id's path: any tail of the shape will do
                alternatives.append(_class(free) + (f"{rest}{{0,{tail}}}" if tail > 0 else ""))
            for c in sorted(children):
                if node[c].get(_BLOCKED):
                    continue
                sub = emit(node[c], depth + 1)
                if sub is not None:
                    alternatives.append(_escape(c) + sub)
        if not alternatives:
            return "" if can_end else None
        body = "(?:" + "|".join(alternatives) + ")"
        return body + "?" if can_end else body

    body = emit(_trie(used, reserved), 0)
    if body is None:
        raise ValueError("no id of the shape is left unused")
    return f"^{body}$"
