"""flowstate bench serve's harness on the scripted engine: sessions through a real server, then the same
calls straight to the engine, counted right."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.scripted import ScriptedEngine
from flowstate.bench.serve import bench_serve, render_table
from flowstate.config import LoopConfig
from tests.helpers import output


def test_bench_serve_replays_the_recorded_calls_directly() -> None:
    engine = ScriptedEngine([output(content="Welcome!")] * 40)
    rows = bench_serve(engine, [3, 5], LoopConfig(max_steps=2), apis=("chat", "responses"))
    assert [(r["sessions"], r["api"]) for r in rows] == [(3, "chat"), (3, "responses"), (5, "chat"), (5, "responses")]
    for r in rows:
        assert r["model_calls"] == r["sessions"] and r["failed_turns"] == 0  # one call per one-step turn
        assert r["flowstate_tokens"] == r["direct_tokens"] > 0  # the same calls on both sides
        # the ratio is FlowState's rate over the direct one (not inverted), and each rate is tokens over seconds
        assert r["ratio"] == pytest.approx(r["flowstate_tok_s"] / r["direct_tok_s"], rel=0.02, abs=0.0006)  # 3 places
        assert r["ratio"] < 1  # the scripted engine answers at once: the endpoint costs more than it
        s_low, s_high = r["flowstate_s"] - 0.005, r["flowstate_s"] + 0.005  # seconds rounded to 2 places
        assert r["flowstate_tokens"] / s_high <= r["flowstate_tok_s"] + 0.05
        assert s_low <= 0 or r["flowstate_tok_s"] - 0.05 <= r["flowstate_tokens"] / s_low
    assert engine.remaining == 40 - 1 - 2 * 2 * (3 + 5)  # one untimed warm-up turn, then both sides of each row
    assert render_table(rows).count("\n") == 5
    with pytest.raises(ValueError, match="unknown API"):
        bench_serve(engine, [1], LoopConfig(), apis=("grpc",))


@pytest.mark.slow
def test_bench_load_runs_sessions_at_once_and_checks_what_was_stored(db_target: str) -> None:
    """``flowstate bench load`` on each backend: real servers, the official client, storage checked exact."""
    from flowstate.bench.load import bench_load

    label = "postgresql" if db_target.startswith("postgresql") else "sqlite"
    none, new = bench_load(3, 2, [(label, db_target if label == "postgresql" else "")], [None], progress=lambda _: None,
                           tools=("none", "new"))
    for row in (none, new):
        assert row["database"] == label and row["stored_exactly"] and (row["sessions"], row["turns"]) == (3, 2)
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"] and row["turns_per_s"] > 0
        assert row["health_p99_ms"] is not None and row["health_p99_ms"] > 0  # the loop was probed throughout
    assert (none["tools"], new["tools"]) == ("none", "new")
    with pytest.raises(ValueError, match="--tools takes"):
        bench_load(1, 1, [(label, "")], [None], progress=lambda _: None, tools=("all",))


def test_bench_responses_stores_a_chain_and_reads_it_back() -> None:
    """``flowstate bench responses`` on SQLite: a chain of stored responses, each read back by GET and input_items
    (the bench asserts every read returns what it asked for), forks of earlier responses (each numbered after what
    it shares, in a session of its own), latencies ordered."""
    from flowstate.bench.responses import bench_responses, render_table

    (row,) = bench_responses(12, 20, [("sqlite", "")], progress=lambda _: None, forks=3)
    assert (row["database"], row["chain"], row["reads"], row["forks"]) == ("sqlite", 12, 20, 3)
    for kind in ("create", "get", "input_items", "fork"):
        assert 0 < row[f"{kind}_p50_ms"] <= row[f"{kind}_p99_ms"]
    assert render_table([row]).count("\n") == 2


@pytest.mark.slow
def test_bench_mcp_stays_within_the_bound_and_released_sessions_call_again() -> None:
    """``flowstate bench mcp``: a real server with per-session MCP servers, more sessions than its bound; live
    connections and child processes never pass it, and every released session's next call works on a fresh server."""
    pytest.importorskip("mcp")
    from flowstate.bench.mcp import bench_mcp

    row = bench_mcp(6, 2, 3, progress=lambda _: None)
    # a released server closes in the background: one may still be exiting when the processes are counted
    assert row["peak_live"] == 2 and row["peak_processes"] <= 3 and row["released"] == 6 + 3 - 2
    assert row["first_calls_ok"] == 6  # every first call counted 1 on its own server
    assert row["later_calls_ok"] == row["later_fresh"] == 3  # released sessions: a fresh server, counting from 1


@pytest.mark.slow
def test_bench_retention_sweeps_the_seeded_backlog_and_nothing_of_the_traffic(tmp_path: Path) -> None:
    """``flowstate bench retention`` on SQLite: off and on side by side on alike seeded databases; with retention on
    the seeded sessions all go and the traffic's stay (the bench checks both), figures ordered."""
    from flowstate.bench.retention import bench_retention, render_table

    made = iter(str(tmp_path / f"r{i}.db") for i in range(2))
    off, on = bench_retention({"sqlite": lambda: next(made)}, 2, 2, 60, progress=lambda _: None)
    assert (off["retention"], on["retention"]) == ("off", "idle=30d")
    assert off["removed_all"] is None and on["removed_all"] is True and 0 <= on["removed_during"] <= 60
    for row in (off, on):
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
    assert render_table([off, on]).count("\n") == 3


def test_bench_console_times_a_full_read_a_304_poll_and_the_console_opening() -> None:
    """``flowstate bench console`` on a small session: the route answers it whole and then 304 to its tag (the
    bench asserts the 304), each figure measured; where a browser is installed, the console's open time, the states
    it drew, a find by id and a zoom out."""
    from flowstate.bench.console import bench_console, render_table

    row = bench_console(6, 3, 4, progress=lambda _: None)
    assert (row["requests"], row["states"]) == (6, 18) and row["answer_mb"] > 0
    assert row["full_read_ms"] > 0 and row["poll_304_ms"] > 0
    if row["console_open_s"] != "no browser":  # what is in view of 24 boxes drawn, the last state found
        assert 0 < row["console_open_s"] < 60 and 0 < row["drawn_states"] <= 6 * 4
        assert 0 < row["find_s"] < 60 and 0 < row["zoom_out_s"] < 60
    assert render_table(row).count("\n") == 2
