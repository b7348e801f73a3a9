"""The realistic reference policy against a real model, figure by figure, on the same tasks.

Both runs are ``flowstate eval`` folders whose memory holds every request's record (``memory.db``); for one strategy
(FlowState by default) this reads, per run: the tokens a step decodes, the tokens of its ``state_delta`` block (the
state writes and their summaries) and of its summaries alone, counted in one vocabulary (a GGUF's: the real
model's); the share of steps that disclose; states written per request; and how much of a tool result the state
that cites it keeps (the characters of its value over those of the result). The ratio real / realistic says where
the policy is off.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from flowstate.store.repository import Repository

_DELTA = re.compile(r"<state_delta>\n(.*?)\n</state_delta>", re.S)
FIGURES = ("decoded tokens per step", "state_delta tokens per step", "summary tokens per state", "states per request",
           "disclosing steps", "value / cited result (chars)")


def _records(folder: Path, strategy: str) -> list[dict[str, Any]]:
    with Repository.open(folder / "memory.db", create=False) as repo:
        out = []
        for session in repo.sessions():
            if f"/{strategy}/" not in f"/{session}":
                continue
            for row in repo.requests(session):
                record = repo.records.request(session, row.index)
                if record is not None:
                    out.append(record)
        return out


def figures(records: Sequence[dict[str, Any]], count: Callable[[str], Sequence[Any]]) -> dict[str, float | None]:
    """The behaviour figures of one run's request records, tokens counted with ``count`` (None: nothing to
    measure, e.g. no state cites a tool result)."""
    steps = [s for r in records for s in r["steps"] if s.get("protocol_error") is None]
    results = {c["observation_id"]: c.get("result") for s in steps for c in s.get("tool_calls", ())}
    decoded, delta, summaries, kept = [], [], [], []
    for s in steps:
        decoded.append(len(count(s["raw"])))
        block = _DELTA.search(s["raw"])
        delta.append(len(count(block.group(1))) if block and block.group(1).strip() != "[]" else 0)
        for op in s["committed"]:
            if op.get("summary"):
                summaries.append(len(count(op["summary"])))
            cited = [results[ref["state_id"]] for ref in op.get("refs") or () if ref["state_id"] in results]
            size = sum(len(json.dumps(c, ensure_ascii=False)) for c in cited)
            if size and op.get("value") is not None:
                kept.append(len(json.dumps(op["value"], ensure_ascii=False)) / size)
    adds = [op for s in steps for op in s["committed"] if op.get("operation") == "add"]

    def mean(xs: Sequence[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return dict(zip(FIGURES, (mean(decoded), mean(delta), mean(summaries), len(adds) / max(len(records), 1),
                              mean([float(bool(s["disclosed"])) for s in steps]), mean(kept)), strict=True))


def compare(real: Path, realistic: Path, count: Callable[[str], Sequence[Any]],
            strategy: str = "flowstate") -> list[dict[str, str]]:
    """Per figure: the real model's, the realistic policy's, and their ratio."""
    a, b = (figures(_records(folder, strategy), count) for folder in (real, realistic))

    def shown(x: float | None) -> str:
        return "–" if x is None else f"{x:.2f}"

    def ratio(x: float | None, y: float | None) -> float | None:
        return None if x is None or not y else x / y

    return [{"figure": name, "real model": shown(a[name]), "realistic policy": shown(b[name]),
             "real / realistic": shown(ratio(a[name], b[name]))} for name in FIGURES]
