"""Sweeps: the same comparison at several depths or observation sizes, and the ratios as a function of them.

``flowstate eval --depth 4,8,16`` (or ``--suite-option results=5,10,20``, or ``--policy oracle,realistic``: the
two bounds side by side) runs one comparison per point, each
into its own folder (``OUT/depth-8/``, ``OUT/depth-8_results-10/``: resumable on its own, its settings its
identity), then writes ``OUT/sweep.md`` — per suite and strategy, at each point, SR and the ratios to full
context (tokens, uncached prompt tokens, peak context per session) — and ``OUT/sweep.png``, so a reader sees
where FlowState wins and where it does not.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowstate.eval.report import BASELINE, BOUNDS, _table, plots_available, settings


@dataclass(frozen=True)
class Point:
    depth: int
    sizes: dict[str, int]
    policy: str | None = None  # the reference policy (None: a model)
    named: bool = False  # the label names the policy (several policies swept)

    @property
    def label(self) -> str:
        return "_".join([*([str(self.policy)] if self.named else []), f"depth-{self.depth}",
                         *(f"{k}-{v}" for k, v in sorted(self.sizes.items()))])


def numbers(text: str, what: str) -> list[int]:
    """``4`` or ``4,8,16`` as whole numbers."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"{what} takes a whole number or a comma-separated list of them, not {text!r}") from exc
    if not values or min(values) < 1:
        raise ValueError(f"{what} takes whole numbers of at least 1, not {text!r}")
    return values


def points(depths: Sequence[int], options: dict[str, list[int]],
           policies: Sequence[str | None] = (None,)) -> list[Point]:
    """Every combination of the reference policies, the depths and the suite options' values, in the order given."""
    names = sorted(options)
    return [Point(d, dict(zip(names, values, strict=True)), policy, len(policies) > 1)
            for policy in policies for d in depths for values in itertools.product(*(options[n] for n in names))]


def ratios(summary: dict[str, Any]) -> dict[tuple[str, str], dict[str, float | None]]:
    """Per (suite, strategy): SR and the ratios of tokens, uncached prompt tokens and peak context to full context."""
    by = {(p["suite"], p["strategy"]): p for p in summary["pairs"]}
    out: dict[tuple[str, str], dict[str, float | None]] = {}
    for (suite, strategy), p in by.items():
        base = by.get((suite, BASELINE))

        def ratio(get: Any, p: dict[str, Any] = p, base: dict[str, Any] | None = base) -> float | None:
            b = get(base) if base else None
            return get(p) / b if b else None

        out[(suite, strategy)] = {
            "SR": p["quality"]["SR"],
            "tokens": ratio(lambda q: q["cost"]["tokens_per_task"]),
            "uncached": ratio(lambda q: q["cost"]["uncached_prompt_tokens_per_task"]),
            "peak": ratio(lambda q: (q.get("kv") or {}).get("peak_context")),
            "pet": ratio(lambda q: (q.get("gpu") or {}).get("pet_per_task")),
        }
    return out


def sweep_table(results: Sequence[tuple[Point, dict[str, Any]]]) -> str:
    config = results[0][1]["config"]
    table = [ratios(summary) for _, summary in results]
    rows = []
    for suite in config["suites"]:
        for strategy in config["strategies"]:
            if strategy == BASELINE:
                continue
            cells = []
            for r in table:
                v = r.get((suite, strategy))
                cells.append("–" if v is None else " / ".join(
                    [f"{v['SR']:.0f}",
                     *("–" if v[k] is None else f"{v[k]:.2f}×" for k in ("tokens", "uncached", "peak", "pet"))]))
            rows.append([suite, strategy, *cells])
    lines = ["# FlowState sweep", "",
             "Per point: SR % / tokens ×FC / uncached prompt tokens ×FC / peak context per session ×FC / PET ×FC "
             "(prefill-equivalent tokens, what a GPU pays; full-context = 1). Tokens favour a method that sends less; "
             "PET one that decodes less and recomputes less. Each point's folder holds its full report.", ""]
    cost = next((p.get("gpu", {}).get("cost") for _, s in results for p in s["pairs"] if p.get("gpu")), None)
    lines += [f"PET for {cost['label']} (w = {cost['w']:.2f}, κ = {cost['kappa']:.2e}).", ""] if cost else []
    lines += [f"- {point.label}: {settings(summary['config'])}" for point, summary in results]
    policies = list(dict.fromkeys(p.policy for p, _ in results if p.policy))
    lines += ["", *(f"Reference policy {p}: {BOUNDS[p]}." for p in policies)] if policies else []
    lines += ["", _table(["suite", "strategy", *(p.label for p, _ in results)], rows), ""]
    return "\n".join(lines)


def write_sweep(out: Path, results: Sequence[tuple[Point, dict[str, Any]]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.md").write_text(sweep_table(results))
    (out / "sweep.json").write_text(json.dumps([{"point": p.label, "summary": s} for p, s in results], indent=2) + "\n")
    if plots_available():
        figure(out / "sweep.png", results)


def figure(path: Path, results: Sequence[tuple[Point, dict[str, Any]]]) -> None:
    """Per suite, tokens ×FC (solid), uncached ×FC (dashed) and PET ×FC (dotted) per strategy against the sweep's
    points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config = results[0][1]["config"]
    table = [ratios(summary) for _, summary in results]
    suites = config["suites"]
    fig, axes = plt.subplots(1, len(suites), figsize=(4.2 * len(suites), 3.6), squeeze=False)
    xs = list(range(len(results)))
    for ax, suite in zip(axes[0], suites, strict=True):
        for strategy in config["strategies"]:
            if strategy == BASELINE:
                continue
            for key, style in (("tokens", "-"), ("uncached", "--"), ("pet", ":")):
                ys = [(t.get((suite, strategy)) or {}).get(key) for t in table]
                ax.plot(xs, [y if y is not None else float("nan") for y in ys], style, marker="o",
                        label=f"{strategy} {key}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(suite)
        ax.set_xticks(xs, [p.label for p, _ in results], rotation=30, fontsize=7)
        ax.set_ylabel("× full-context")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
