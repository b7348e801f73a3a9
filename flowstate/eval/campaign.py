"""A campaign: the comparison once per base model × sweep point, each into its own folder, then the tables that
set them side by side (``sweep.md`` per model over its points, ``models.md`` over the models).

``flowstate eval`` builds one ``EvalConfig`` from its options and hands it here with the grid (depths × suite
options × reference policies, ``flowstate.eval.sweep``) and the models (each ``--engine``). Each
model is loaded once, its loop configuration built once, and closed before the next one loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from engine.base import Engine
from engine.embeddings import Embedder
from engine.spec import label
from flowstate.config import LoopConfig
from flowstate.eval.models import folder, write_models
from flowstate.eval.report import write_report
from flowstate.eval.runner import EvalConfig, OnProgress, run_eval
from flowstate.eval.sweep import Point, write_sweep

Summary = dict[str, Any]


def run_campaign(base: EvalConfig, grid: Sequence[Point], models: Sequence[dict[str, Any]], *, compare: bool,
                 load: Callable[[dict[str, Any]], Engine] | None,
                 loop: Callable[[Engine | None, dict[str, Any]], LoopConfig],
                 decoding: Callable[[dict[str, Any]], dict[str, Any]], progress: OnProgress = lambda _: None,
                 done: Callable[[], None] = lambda: None, user: Engine | None = None,
                 judge: Engine | None = None, embedder: Embedder | None = None) -> list[tuple[str, Summary]]:
    """Every model (its engine options) over every point of the grid; each model's name and last point's summary.

    ``compare``: the models are compared (several ``--engine``), each in its own folder, and ``models.md`` written;
    ``load`` makes a model's engine (None: a reference policy runs, no model); ``loop`` its loop configuration;
    ``decoding`` the engine options that are part of a run's identity; ``done`` is called after each run."""
    summaries = []
    for opts in models:
        name = label(opts)
        loaded = [load(opts)] if load is not None else []
        model_out = base.out / folder(name) if compare else base.out
        try:
            config = replace(base, loop=loop(loaded[0] if loaded else None, opts), decoding=decoding(opts),
                             engine=name if load is not None else "")
            swept = []
            for point in grid:
                where = model_out / point.label if len(grid) > 1 else model_out
                run = replace(config, depth=point.depth, policy=point.policy, sizes=point.sizes, out=where)
                rows = run_eval(run, loaded, progress, user=user, judge=judge, embedder=embedder)
                done()
                swept.append((point, write_report(rows, run)))
        finally:
            for e in loaded:
                e.close()  # the next model may need the memory this one holds
        if len(grid) > 1:
            write_sweep(model_out, swept)
        summaries.append((name, swept[-1][1]))
    if compare:
        base.out.mkdir(parents=True, exist_ok=True)
        write_models(base.out, summaries)
    return summaries

