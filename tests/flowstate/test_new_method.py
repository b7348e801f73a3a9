"""A new memory method is one file and one registry line: ``tests/fixtures/gist.py`` makes a model call of its own,
declared by kind and reply model, and runs under the reference policies with nothing added to the evaluator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.purpose import STEP
from flowstate.eval.policies import Policy, answer, memory_reply
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.memory import METHODS
from flowstate.memory.tracker import TRACK_CALL
from tests.fixtures.gist import GIST_CALL


def test_a_new_method_runs_under_the_oracle_with_one_registry_line(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(METHODS, "gist", "tests.fixtures.gist:GIST")  # the one line
    config = EvalConfig(suites=("hotel",), strategies=("full-context", "gist"), tasks=2, depth=3, out=tmp_path,
                        policy="oracle")
    rows = {(r.strategy, r.task): r for r in run_eval(config, [])}
    assert len(rows) == 4
    for (strategy, task), full in rows.items():
        if strategy != "full-context":
            continue
        gist = rows["gist", task]
        assert gist.success == full.success is True
        for mine, theirs in zip(gist.subtasks, full.subtasks, strict=True):
            assert mine.memory_calls == 1 and theirs.memory_calls == 0  # its own call, once a request
            assert mine.usage.completion_tokens > theirs.usage.completion_tokens  # its tokens count


def test_policies_answer_memory_calls_by_their_declared_kind() -> None:
    """The kind decides, never the prompt's words: a tracker call whose prompt says nothing of tracking gets the
    tracker's reply; a kind no policy names gets its reply model's defaults; an agent step is no memory call; a
    kind without a reply model or defaults is a clear error."""
    from engine.base import Purpose

    assert json.loads(memory_reply(TRACK_CALL, "<user_query>\nbook A\n</user_query>", lambda _: None) or "") == {
        "goal": "book A", "world": {}, "constraints": []}
    assert json.loads(answer(GIST_CALL, "", Policy.__new__(Policy))) == {"gist": ""}
    assert memory_reply(STEP, "anything", lambda _: None) is None
    with pytest.raises(ValueError, match="no reference answer for a memory call of kind 'x.y'"):
        answer(Purpose("x.y"), "", Policy.__new__(Policy))
