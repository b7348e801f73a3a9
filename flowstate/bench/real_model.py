"""``flowstate bench real-model``: what a real instruct model does with every method, on the synthetic suites.

One command runs ``flowstate eval`` on a GGUF model through llama.cpp under the per-step grammar and the standard
limits (resumable: a second run with more ``--tasks`` adds tasks) and renders the figures of model behaviour that a
reference policy cannot give: SR and PS with 95% Wilson intervals, the share of subtasks with a tool call, rule
rejections and protocol feedback per step, disclosure steps, calls refused as repeats, requests ended as loops or at
the step budget, decoded tokens per call and the wall time. A model's figures are that model's, at that size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowstate.bench.table import table
from flowstate.eval import metrics
from flowstate.eval.rows import TaskRow as Row
from flowstate.eval.rows import calls_of

SUITES = ("hotel", "chain", "bundle", "shopping")
STRATEGIES = ("flowstate", "full-context", "mage", "bm25", "no-psa")

def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion, in % (0–100 for n = 0)."""
    if n == 0:
        return 0.0, 100.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100.0 * max(0.0, centre - half), 100.0 * min(1.0, centre + half)


def figures(rows: Sequence[Row]) -> dict[str, Any]:
    """One (suite, strategy)'s behaviour figures over its task rows."""
    subtasks = [s for r in rows for s in r.subtasks]
    steps = sum(s.steps for s in subtasks)
    calls = calls_of(subtasks)
    wins, correct = sum(r.success for r in rows), sum(s.correct for s in subtasks)
    cost = metrics.cost(rows)
    return {
        "tasks": len(rows), "subtasks": len(subtasks), "steps": steps,
        "SR": metrics.success_rate(rows), "SR_ci": wilson(wins, len(rows)),
        "PS": 100.0 * correct / len(subtasks) if subtasks else 0.0, "PS_ci": wilson(correct, len(subtasks)),
        "tool_use": cost["tool_use"], "tool_calls": cost["tool_calls"],
        "rejections_per_step": cost["rejected_operations"] / max(steps, 1),
        "protocol_feedback_per_step": cost["parse_failures"] / max(steps, 1),
        "disclosure_steps": sum(s.disclosure_steps for s in subtasks) / max(len(subtasks), 1),
        "repeated_calls": cost["repeated_calls"], "loops": cost["loops"], "budget_ends": cost["budget_ends"],
        "decoded_per_call": sum(c.completion_tokens for c in calls) / max(len(calls), 1),
        "wall_s": metrics.wall_time(rows),
    }


def _ci(value: float, ci: tuple[float, float]) -> str:
    return f"{value:.0f} [{ci[0]:.0f}–{ci[1]:.0f}]"


def render(rows: Sequence[Row]) -> str:
    """The figures of every (suite, strategy) in ``rows``, one table."""
    pairs: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        pairs.setdefault((r.suite, r.strategy), []).append(r)
    header = ["suite", "strategy", "n", "SR [95% CI]", "PS [95% CI]", "tool use", "rejected/step", "protocol fb/step",
              "disclosure steps", "repeated calls", "loops", "budget ends", "steps/subtask", "decoded/call", "min"]
    body = []
    for (suite, strategy), group in sorted(pairs.items(), key=lambda kv: (SUITES.index(kv[0][0])
                                                                           if kv[0][0] in SUITES else 99, kv[0][1])):
        f = figures(group)
        body.append(dict(zip(header, [
            suite, strategy, str(f["tasks"]), _ci(f["SR"], f["SR_ci"]), _ci(f["PS"], f["PS_ci"]),
            "–" if f["tool_use"] is None else f"{100 * f['tool_use']:.0f}%", f"{f['rejections_per_step']:.2f}",
            f"{f['protocol_feedback_per_step']:.2f}", f"{f['disclosure_steps']:.2f}", str(f["repeated_calls"]),
            str(f["loops"]), str(f["budget_ends"]), f"{f['steps'] / max(f['subtasks'], 1):.1f}",
            f"{f['decoded_per_call']:.0f}", f"{f['wall_s'] / 60:.1f}",
        ], strict=True)))
    return table(header, body)


def run(model: str, tasks: int, depth: int, out: Path, suites: Sequence[str] = SUITES,
        strategies: Sequence[str] = STRATEGIES, max_steps: int = 16, progress: Any = print) -> list[Row]:
    """Evaluate ``strategies`` on ``suites`` with the GGUF ``model`` (llama.cpp, per-step grammar, standard limits)."""
    import engine as engines
    from flowstate.config import LoopConfig
    from flowstate.constrain import GrammarMode
    from flowstate.eval.runner import EvalConfig, run_eval
    from flowstate.limits import STANDARD

    engine = engines.load("llamacpp", model=model)
    try:
        config = EvalConfig(suites=tuple(suites), strategies=tuple(strategies), tasks=tasks, depth=depth, out=out,
                            loop=LoopConfig(max_steps=max_steps, grammar=GrammarMode.STEP, limits=STANDARD),
                            engine=f"llamacpp:{Path(model).name}")
        return run_eval(config, [engine], progress)
    finally:
        engine.close()
