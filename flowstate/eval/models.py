"""The same comparison across base models (the paper's Table 5 / Fig. 3 shape).

``flowstate eval --engine SPEC --engine SPEC …`` runs the whole comparison once per model, each into its own
folder (``OUT/<model>/``, resumable on its own, with its own settings as its identity), then writes
``OUT/models.md`` and ``OUT/models.json``: SR and tokens per task for every model × strategy in each suite,
with, per row, the mean of the per-suite Δs against the same model's full context and the Δ of the summed
totals.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowstate.eval.report import _table, against_baseline, save_tokens_vs_sr, settings


def folder(name: str) -> str:
    """A model's folder name under OUT (its label, made safe for a path)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def table5(summaries: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """models.md: per suite SR % / tokens per task for every model × strategy, and the Δs against the same model's
    full context (mean of per-suite Δs; Δ of summed totals)."""
    suites = summaries[0][1]["config"]["suites"]
    rows = []
    for name, summary in summaries:
        by = {(p["suite"], p["strategy"]): p for p in summary["pairs"]}
        rows += [[name, strategy, *against_baseline(by, suites, strategy)]
                 for strategy in summary["config"]["strategies"]]
    lines = ["# FlowState across base models (Table 5 shape)", "",
             "SR % / tokens per task per suite; Δ against the same model's full-context: the mean of the per-suite "
             "Δs, and the Δ of the summed totals (SR in points, tokens in %). Each model's folder holds its full "
             "report.", ""]
    lines += [f"- {name}: {settings(summary['config'])}" for name, summary in summaries]
    lines += ["", _table(["model", "strategy", *suites, "mean Δ (SR, tokens)", "Δ of totals (SR, tokens)"], rows), ""]
    lines += ["PS % per suite (sPS beside it where the suite has one):", "",
              _table(["model", "strategy", *suites],
                     [[name, strategy, *(_ps(summary, suite, strategy) for suite in suites)]
                                                   for name, summary in summaries
                                                   for strategy in summary["config"]["strategies"]]), ""]
    return "\n".join(lines)


def _ps(summary: dict[str, Any], suite: str, strategy: str) -> str:
    q = next((p["quality"] for p in summary["pairs"] if p["suite"] == suite and p["strategy"] == strategy), None)
    if q is None:
        return "–"
    return f"{q['PS']:.1f}" + (f" / {q['sPS']:.1f}" if "sPS" in q else "")


def points(summaries: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, list[tuple[str, float, float]]]:
    """Per strategy, one point per model: (model, tokens per task summed over the suites, SR averaged over them)."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for name, summary in summaries:
        for strategy in summary["config"]["strategies"]:
            pairs = [p for p in summary["pairs"] if p["strategy"] == strategy]
            if pairs:
                out.setdefault(strategy, []).append((name, sum(p["cost"]["tokens_per_task"] for p in pairs),
                                                     sum(p["quality"]["SR"] for p in pairs) / len(pairs)))
    return out


def figure(path: Path, summaries: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """models.png, the paper's Fig. 3 shape: tokens per task against SR, a point per model, a series per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (strategy, pts) in enumerate(points(summaries).items()):
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="osD^v<>"[i % 7], label=strategy, alpha=0.8)
        for model, x, y in pts:
            ax.annotate(model, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    save_tokens_vs_sr(fig, ax, path, "tokens per task (prompt + completion, summed over suites)",
                      "SR (%, mean over suites)")


def write_models(out: Path, summaries: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """models.md and models.json; models.png with matplotlib (the ``plots`` extra)."""
    from flowstate.eval.report import plots_available

    (out / "models.md").write_text(table5(summaries))
    (out / "models.json").write_text(json.dumps([{"model": n, "summary": s} for n, s in summaries], indent=2) + "\n")
    if plots_available():
        figure(out / "models.png", summaries)
