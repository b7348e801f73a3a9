"""flowstate bench serve's harness on the scripted engine: sessions through a real server, then the same
calls straight to the engine, counted right."""

from __future__ import annotations

import pytest

from engine.scripted import ScriptedEngine
from flowstate.bench.serve import bench_serve, render_table
from flowstate.config import LoopConfig
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



@pytest.mark.slow
def test_bench_load_runs_sessions_at_once_and_checks_what_was_stored(db_target: str) -> None:
    """``flowstate bench load`` on each backend: real servers, the official client, storage checked exact."""
    from flowstate.bench.load import bench_load

    label = "postgresql" if db_target.startswith("postgresql") else "sqlite"
    (row,) = bench_load(3, 2, [(label, db_target if label == "postgresql" else "")], [None], progress=lambda _: None)
    assert row["database"] == label and row["stored_exactly"] and (row["sessions"], row["turns"]) == (3, 2)
    assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"] and row["turns_per_s"] > 0
