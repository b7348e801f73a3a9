"""The eval runner: resumable after a kill, refuses to mix configurations, writes the report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.base import Capabilities, Engine
from flowstate.config import LoopConfig
from flowstate.constrain import GrammarMode
from flowstate.eval.policies import Policy, PolicyEngine
from flowstate.eval.report import write_report
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.eval.suites import generate
from flowstate.limits import COMPACT
from flowstate.memory import get

ARGS = ["--policy", "oracle", "--suite", "hotel,bundle,travel,chain", "--strategy",
        "flowstate,full-context,no-psa,no-isu",
        "--tasks", "12", "--depth", "6"]
TOTAL = 4 * 4 * 12


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_resume_after_a_kill_redoes_nothing_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    results = out / "results.jsonl"
    cmd = [sys.executable, "-m", "flowstate.cli", "eval", *ARGS, "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(lines(results)) < 12 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before = {(r["suite"], r["strategy"], r["task"]): r for r in map(json.loads, lines(results))}
    assert 12 <= len(before) < TOTAL, "the run was not interrupted mid-way"
    with results.open("a") as f:
        f.write('{"suite": "hotel", "strategy": "flow')  # a line cut by the kill

    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = []
    for line in lines(results):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            assert line == '{"suite": "hotel", "strategy": "flow'  # only the cut line is not JSON
    keys = [(r["suite"], r["strategy"], r["task"]) for r in rows]
    assert len(keys) == len(set(keys)) == TOTAL  # nothing redone, nothing missing
    after = dict(zip(keys, rows, strict=True))
    assert all(after[k] == r for k, r in before.items())  # finished tasks kept as they were
    assert len({r["run"] for r in rows}) == 2
    summary = json.loads((out / "summary.json").read_text())
    assert all(p["quality"]["SR"] == 100.0 and p["quality"]["tasks"] == 12 for p in summary["pairs"])
    assert "| flowstate | 100.0 (+0.0) |" in (out / "report.md").read_text()
    for png in ("accuracy_by_depth.png", "tokens_vs_success.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rerun_with_another_configuration_is_refused(tmp_path: Path) -> None:
    config = EvalConfig(suites=("chain",), strategies=("flowstate",), tasks=2, depth=3, out=tmp_path, policy="oracle")
    rows = run_eval(config, [])
    summary = write_report(rows, config)
    assert summary["pairs"][0]["quality"]["Acc_k"] == [100.0, 100.0, 100.0]
    more = EvalConfig(suites=("chain",), strategies=("flowstate",), tasks=3, depth=3, out=tmp_path, policy="oracle")
    assert len(run_eval(more, [])) == 3  # more tasks of the same configuration: only the new one runs
    with pytest.raises(ValueError, match="other settings \\(depth was 3, now 4\\)"):
        run_eval(EvalConfig(suites=("chain",), strategies=("flowstate",), tasks=2, depth=4, out=tmp_path,
                            policy="oracle"), [])


def test_another_runs_folder_is_never_overwritten_only_extended(tmp_path: Path) -> None:
    """A run into a folder that holds another's results (other suites or strategies) is refused before anything is
    written; naming the folder's suites and strategies and more extends it, and its report keeps them all."""
    first = EvalConfig(suites=("hotel",), strategies=("flowstate",), tasks=1, depth=2, out=tmp_path, policy="oracle")
    write_report(run_eval(first, []), first)
    report = (tmp_path / "report.md").read_text()
    for suites, strategies, said in [(("chain",), ("flowstate",), "suites hotel"),
                                     (("hotel",), ("full-context",), "strategies flowstate")]:
        with pytest.raises(ValueError, match=f"holds another run's results \\({said}\\)"):
            run_eval(replace(first, suites=suites, strategies=strategies), [])
    assert (tmp_path / "report.md").read_text() == report
    wider = replace(first, suites=("hotel", "chain"), strategies=("flowstate", "full-context"))
    summary = write_report(run_eval(wider, []), wider)
    assert {(p["suite"], p["strategy"]) for p in summary["pairs"]} == {
        ("hotel", "flowstate"), ("hotel", "full-context"), ("chain", "flowstate"), ("chain", "full-context")}
    with pytest.raises(ValueError, match="holds another run's results \\(suites chain; strategies full-context\\)"):
        run_eval(first, [])  # the folder now holds the wider run


@pytest.mark.parametrize("change", [
    {"loop": LoopConfig(max_tokens=256)}, {"loop": LoopConfig(max_protocol_errors=5)},
    {"loop": LoopConfig(grammar=GrammarMode.NONE)}, {"loop": LoopConfig(limits=COMPACT)},
    {"loop": LoopConfig(on_budget="fail")}, {"decoding": {"temperature": 0.7}}, {"decoding": {"preset": "qwen3"}},
])
def test_resuming_with_other_decoding_settings_is_refused(tmp_path: Path, change: dict[str, Any]) -> None:
    base = EvalConfig(suites=("chain",), strategies=("flowstate",), tasks=1, depth=2, out=tmp_path, policy="oracle")
    run_eval(base, [])
    with pytest.raises(ValueError, match="other settings .*would mix"):
        run_eval(replace(base, tasks=2, **change), [])
    assert len(run_eval(replace(base, tasks=2), [])) == 2  # the same settings resume


def test_the_report_states_every_setting_at_every_table(tmp_path: Path) -> None:
    config = EvalConfig(suites=("chain", "hotel"), strategies=("flowstate", "full-context"), tasks=1, depth=2,
                        out=tmp_path, policy="oracle", decoding={"temperature": 0.0, "preset": "qwen3"})
    text = write_report(run_eval(config, []), config) and (tmp_path / "report.md").read_text()
    settings = [line for line in text.splitlines() if line.startswith("Settings: ")]
    assert len(settings) == 1 + 1 + 2  # the header, the overview, each suite
    assert all("temperature=0.0" in s and "preset=qwen3" in s and "max_steps=16" in s and "grammar=step" in s
               and "max_protocol_errors=3" in s and "policy=oracle" in s for s in settings)
    # what a session holds on a GPU, per suite: its peak context and how many such sessions fit
    assert text.count("What a session holds on a GPU, for qwen3.5-9b (32,768 KV bytes per token") == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    kv = next(p["kv"] for p in summary["pairs"] if p["strategy"] == "full-context")
    assert kv["peak_context"] >= kv["context_per_call"] > 0 and kv["sessions_fit"] > 0


class Router(Engine):
    """One engine shared by many tasks (as a model server is): the oracle of whichever task asks."""

    name = "router"
    capabilities = Capabilities()

    def __init__(self, tasks: list[Any], strategy: Any) -> None:
        self.engines = {t.queries[0]: (t.id, PolicyEngine(Policy(t, strategy, memory=True))) for t in tasks}
        self.served: set[str] = set()

    def generate(self, messages: Any, *, grammar: str | None = None, max_tokens: int | None = None, purpose: Any = None,
                 **_: Any) -> Any:
        # a bundle task's first query names its own camera, and every later prompt lists it in the index
        task, engine = next(v for q, v in self.engines.items() if q in messages[-1].content)
        self.served.add(task)
        return engine.generate(messages, **({"purpose": purpose} if purpose is not None else {}))

    def count_tokens(self, text: str) -> int:
        return 0


def test_tasks_in_flight_are_spread_over_several_engines(tmp_path: Path) -> None:
    config = EvalConfig(suites=("bundle",), strategies=("flowstate",), tasks=6, depth=3, out=tmp_path, concurrency=4,
                        engine="router")
    tasks = generate("bundle", 6, 3)
    engines = [Router(tasks, get("flowstate")), Router(tasks, get("flowstate"))]
    rows = run_eval(config, engines)
    assert len(rows) == 6 and all(r.success for r in rows)
    for i, engine in enumerate(engines):  # task i went to engine i % 2, all of its subtasks
        assert engine.served == {t.id for t in tasks[i::2]}


def test_the_delta_of_summed_totals_differs_from_the_mean_of_per_suite_deltas() -> None:
    from flowstate.eval.report import _overview

    def pair(suite: str, strategy: str, sr: float, tokens: float, tasks: int) -> dict[str, Any]:
        return {"suite": suite, "strategy": strategy, "quality": {"SR": sr, "tasks": tasks},
                "cost": {"tokens_per_task": tokens}}

    summary = {"config": {"suites": ["a", "b"], "strategies": ["x", "full-context"]}, "pairs": [
        pair("a", "x", 100.0, 1_000, 4), pair("a", "full-context", 50.0, 2_000, 4),  # -50% of a small suite
        pair("b", "x", 0.0, 110_000, 4), pair("b", "full-context", 0.0, 100_000, 4),  # +10% of a big one
    ]}
    row = next(line for line in "\n".join(_overview(summary)).splitlines() if line.startswith("| x |"))
    # mean of per-suite Δs: SR +25.0, tokens (-50 + 10) / 2 = -20%; summed: SR +25.0, (111k - 102k) / 102k = +8.8%
    assert row.endswith("| +25.0, -20.0% | +25.0, +8.8% |")
