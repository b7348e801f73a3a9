"""flowstate bench serve's harness on the scripted engine: sessions through a real server, then the same
calls straight to the engine, counted right."""

from __future__ import annotations

from engine.scripted import ScriptedEngine
from flowstate.config import LoopConfig
from serving.bench import bench_serve, render_table
from tests.helpers import output


def test_bench_serve_replays_the_recorded_calls_directly() -> None:
    engine = ScriptedEngine([output(content="Welcome!")] * 40)
    rows = bench_serve(engine, [3, 5], LoopConfig(max_steps=2))
    assert [r["sessions"] for r in rows] == [3, 5]
    for r in rows:
        assert r["model_calls"] == r["sessions"] and r["failed_turns"] == 0  # one call per one-step turn
        assert r["flowstate_tokens"] == r["direct_tokens"] > 0  # the same calls on both sides
        assert r["ratio"] is not None and r["ratio"] > 0
    assert engine.remaining == 40 - 2 * (3 + 5)
    assert render_table(rows).count("\n") == 3
