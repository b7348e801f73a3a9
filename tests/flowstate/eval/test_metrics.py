"""The metrics against values computed by hand on small fixed inputs."""

from __future__ import annotations

from typing import Any

import pytest

from flowstate.eval import metrics
from flowstate.eval.rows import TaskRow


def row(correct: list[bool], credit: list[float] | None = None, success: bool | None = None, **extra: Any) -> TaskRow:
    """A task's row as an early run wrote it to results.jsonl (no tool calls, truncations or memory calls counted),
    read through the one adapter."""
    credit = credit or [float(c) for c in correct]
    subtasks = [
        {"k": k, "correct": c, "credit": cr, "response": "x", "error": None, "steps": 2, "parse_failures": 0,
         "rejected": 1,
         "usage": {"prompt_tokens": 100, "cached_tokens": 40, "completion_tokens": 10},
         "calls": [[60, 20, 6, 0.5, 1.0], [40, 20, 4, 0.1, 0.3]]}
        for k, (c, cr) in enumerate(zip(correct, credit, strict=True), 1)
    ]
    return TaskRow.from_dict({"suite": "hotel", "strategy": "flowstate", "task": "t", "depth": len(correct),
                              "subtasks": subtasks, "success": correct[-1] if success is None else success,
                              "run": "a", "started": 0.0, "ended": 10.0, **extra})


ROWS = [row([True, True, False]), row([True, False, True]), row([False, True]), row([True, True, True])]


def test_sr_ps_sps() -> None:
    assert metrics.success_rate(ROWS) == 75.0  # final subtask correct in rows 2, 3 and 4
    # per task: 2/3, 2/3, 1/2, 3/3 -> mean 0.7083
    assert metrics.progress_score(ROWS) == pytest.approx(100 * (2 / 3 + 2 / 3 + 1 / 2 + 1) / 4)
    assert metrics.progress_score(ROWS, micro=True) == pytest.approx(100 * 8 / 11)
    soft = [row([False, True], credit=[0.5, 1.0]), row([False], credit=[0.25])]
    assert metrics.soft_progress_score(soft) == pytest.approx(100 * 1.75 / 3)


def test_accuracy_by_depth_counts_only_tasks_that_reach_k() -> None:
    # k=1: 3/4; k=2: 3/4; k=3: rows 1, 2, 4 have a third subtask, 2 of them correct
    assert metrics.accuracy_by_depth(ROWS) == pytest.approx([75.0, 75.0, 100 * 2 / 3])


def test_retention_nauc_and_decline_rate() -> None:
    acc = [80.0, 60.0, 40.0]
    r = metrics.retention(acc)
    assert r == pytest.approx([100.0, 75.0, 50.0])
    assert metrics.nauc(r) == pytest.approx(((100 + 75) / 2 + (75 + 50) / 2) / 2)  # 75.0
    assert metrics.decline_rate(r) == pytest.approx(25.0)  # slope of a straight line: -25 points per subtask
    assert metrics.decline_rate([100.0, 50.0, 50.0, 0.0]) == pytest.approx(30.0)  # least squares: slope -30
    assert metrics.retention([0.0, 10.0]) is None and metrics.nauc([100.0]) is None


def test_percentiles_interpolate_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert metrics.percentile(values, 50) == 3.0
    assert metrics.percentile(values, 90) == pytest.approx(7.6)  # between 4 and 10 at 0.6
    assert metrics.distribution(values)["mean"] == 4.0


def test_cost_and_speed() -> None:
    rows = [row([True, True]), row([True], run="b", started=100.0, ended=105.0)]
    c = metrics.cost(rows)
    assert (c["prompt_tokens"], c["cached_tokens"], c["completion_tokens"]) == (300, 120, 30)
    assert c["tokens_per_task"] == 165.0 and c["steps_per_subtask"] == 2.0 and c["rejected_operations"] == 3
    s = metrics.speed(rows)
    assert s["wall_s"] == 15.0  # two runs: 10 s and 5 s
    assert s["model_calls"] == 6 and s["requests_per_s"] == pytest.approx(6 / 15)
    assert s["output_tok_per_s"] == pytest.approx(30 / 15) and s["total_tok_per_s"] == pytest.approx(330 / 15)
    assert s["ttft_s"]["mean"] == pytest.approx(0.3)
    assert s["tpot_s"]["p50"] == pytest.approx((1.0 / 5 + 0.3 / 3) / 2)
    # end-to-end latencies 0.4, 0.4, 0.4, 1.5, 1.5, 1.5: the median interpolates halfway
    assert s["e2el_s"]["p50"] == pytest.approx(0.95) and s["e2el_s"]["p99"] == pytest.approx(1.5)
