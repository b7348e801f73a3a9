"""What a report says of itself: the commit of its code and each pair's n; a reference policy's run shows no speed
table (no model ran) and says where the tokens break even; a replay of stored sessions scores agreement, not SR;
report.md names only the figures written, and the figures by subtask have integer ticks and are not drawn for one
point."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from engine.distribution import commit
from flowstate.eval import report
from flowstate.eval.report import _suite_section, markdown, write_report
from flowstate.eval.runner import EvalConfig, run_eval


def oracle(tmp_path: Path, depth: int = 3, **more: Any) -> tuple[EvalConfig, dict[str, Any]]:
    config = EvalConfig(suites=("hotel",), strategies=("flowstate", "full-context"), tasks=2, depth=depth,
                        out=tmp_path, policy="oracle", **more)
    return config, write_report(run_eval(config, []), config)


def test_a_policys_report_names_its_code_and_n_shows_no_speed_and_says_where_tokens_break_even(
        tmp_path: Path) -> None:
    _, summary = oracle(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert f"Code: commit {commit()}." in text and summary["commits"] == [commit()]
    assert "n per strategy: hotel 2 tasks, 6 subtasks." in text
    assert "Speed (" not in text and "tok/s" not in text
    assert "No speed table: the reference policy oracle answers without a model" in text
    assert "break even with full context at about 10 requests" in text and "depth 3" in text
    as_model = copy.deepcopy(summary)
    as_model["config"].update(policy=None, engine="llamacpp:default")
    rendered = markdown(as_model)
    assert "Speed (" in rendered and "No speed table" not in rendered and "break even" not in rendered


def test_a_deep_enough_run_is_not_told_of_the_crossover(tmp_path: Path) -> None:
    _, summary = oracle(tmp_path, depth=12)
    assert "break even" not in markdown(summary)


def test_a_replay_of_stored_sessions_reports_agreement_not_success(tmp_path: Path) -> None:
    _, summary = oracle(tmp_path)
    pairs = [{**p, "suite": "sessions"} for p in summary["pairs"]]
    header = next(line for line in _suite_section("sessions", pairs) if line.startswith("| strategy"))
    assert "| last request agrees | agreement |" in header and "| SR |" not in header
    assert "| SR | PS |" in next(line for line in _suite_section("hotel", summary["pairs"])
                                 if line.startswith("| strategy"))


def test_without_the_plots_extra_the_report_lists_no_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "plots_available", lambda: False)
    oracle(tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "Figures: none" in text and ".png" not in text and not list(tmp_path.glob("*.png"))


def test_figures_by_subtask_have_integer_ticks_and_one_point_is_no_figure(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    drawn: list[Any] = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), save(fig, *a, **k))[1])
    (tmp_path / "deep").mkdir()
    oracle(tmp_path / "deep", depth=3)
    axes = [ax for fig in drawn for ax in fig.axes if ax.get_xlabel() == "subtask k"]
    assert axes
    for ax in axes:
        low, high = ax.get_xlim()
        assert all(float(x).is_integer() for x in ax.get_xticks() if low <= x <= high), ax.get_xticks()
    (tmp_path / "flat").mkdir()
    oracle(tmp_path / "flat", depth=1)
    written = sorted(p.name for p in (tmp_path / "flat").glob("*.png"))
    assert written == ["tokens_vs_success.png"]
    assert "Figures: `tokens_vs_success.png`." in (tmp_path / "flat" / "report.md").read_text()
