"""A campaign: each model loaded once, its loop configuration built once, closed before the next loads; every
sweep point in its folder, the sweep and models tables written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.scripted import ScriptedEngine
from flowstate.config import LoopConfig
from flowstate.eval.campaign import run_campaign
from flowstate.eval.runner import EvalConfig
from flowstate.eval.sweep import points

ANSWER = ("<tool_calls>\n[]\n</tool_calls>\n<assistant_message>\n" + json.dumps({"content": "done"})
          + "\n</assistant_message>")


def test_each_model_runs_every_point_loaded_once_and_closed_before_the_next(tmp_path: Path) -> None:
    events: list[str] = []

    class Model(ScriptedEngine):
        def close(self) -> None:
            events.append(f"close {self.model_name}")

    def load(opts: dict[str, Any]) -> Model:
        events.append(f"load {opts['model']}")
        engine = Model([ANSWER] * 50)
        engine.model_name = opts["model"]
        return engine

    def loop(engine: Any, opts: dict[str, Any]) -> LoopConfig:
        events.append(f"loop {engine.model_name}")
        return LoopConfig(max_steps=2)

    base = EvalConfig(suites=("hotel",), strategies=("full-context",), tasks=1, depth=1, out=tmp_path / "ev")
    models = [{"name": "scripted", "model": "a"}, {"name": "scripted", "model": "b"}]
    summaries = run_campaign(base, points([1, 2], {}, [None]), models, compare=True, load=load, loop=loop,
                             decoding=lambda opts: {})
    assert events == ["load a", "loop a", "close a", "load b", "loop b", "close b"]
    assert [name for name, _ in summaries] == ["scripted:a", "scripted:b"]
    for model in ("scripted_a", "scripted_b"):
        assert (tmp_path / "ev" / model / "sweep.md").is_file()
        for point in ("depth-1", "depth-2"):
            settings = json.loads((tmp_path / "ev" / model / point / "summary.json").read_text())
            assert (tmp_path / "ev" / model / point / "report.md").is_file() and settings
    table = (tmp_path / "ev" / "models.md").read_text()
    assert "scripted:a" in table and "PS % per suite" in table and (tmp_path / "ev" / "models.png").stat().st_size
    from flowstate.eval.models import points as model_points

    [(strategy, per_model)] = model_points(summaries).items()
    assert strategy == "full-context" and [m for m, _, _ in per_model] == ["scripted:a", "scripted:b"]
    assert all(tokens > 0 and 0 <= sr <= 100 for _, tokens, sr in per_model)
