"""A real evaluation on the embedded model (transformers + SmolLM2-135M-Instruct): small, but end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flowstate.eval.rows import TaskRow, calls_of

pytestmark = pytest.mark.slow


def test_eval_on_the_embedded_model_writes_report_and_figures(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "flowstate.cli", "eval", "--suite", "chain", "--strategy", "flowstate,full-context",
           "--tasks", "1", "--depth", "2", "--max-steps", "2", "--engine", "llamacpp,max-tokens=160", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [TaskRow.from_dict(json.loads(line)) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r.strategy for r in rows) == ["flowstate", "full-context"]
    calls = calls_of([s for r in rows for s in r.subtasks])
    assert calls and all(c.completion_tokens > 0 and c.ttft_s > 0 for c in calls)  # real completions, measured TTFT
    for s in (s for r in rows for s in r.subtasks):  # under the grammar only an output cut at 160 tokens fails to parse
        assert s.parse_failures <= sum(c.completion_tokens == 160 for c in calls_of([s])), s
    summary = json.loads((out / "summary.json").read_text())
    assert [p["strategy"] for p in summary["pairs"]] == ["flowstate", "full-context"]
    assert all(p["speed"]["output_tok_per_s"] > 0 and p["cost"]["completion_tokens"] > 0 for p in summary["pairs"])
    report = (out / "report.md").read_text()
    assert "## chain" in report and "| full-context |" in report and "output tok/s" in report
    assert done.stdout == report + "\n"
    for png in ("accuracy_by_depth.png", "tokens_vs_success.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
