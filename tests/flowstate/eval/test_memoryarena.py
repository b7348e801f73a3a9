"""MemoryArena's own data format (--suite memoryarena --data FILE): each question one request of the task's
session, shown as MemoryArena's MathAgent shows it, graded as its MathEnvironment grades it (a judge model with the
released prompt; without one, exact match after normalisation); SR the last subtask, PS the share correct."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.scripted import ScriptedEngine
from flowstate.eval.memoryarena import JUDGE_SYSTEM, read
from flowstate.eval.runner import EvalConfig, run_eval

ROWS = [
    {"id": 7, "paper_name": "p", "questions": ["Compute 2+3.", "Multiply the first result by 4."],
     "answers": ["5", "$20$"], "backgrounds": ["Integers only.", None]},
    {"id": 8, "questions": ["### PROBLEM: x if 2x = 8?"], "answers": ["4"], "backgrounds": [""]},
]


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def answer(text: str) -> str:
    return ("<tool_calls>\n[]\n</tool_calls>\n<assistant_message>\n" + json.dumps({"content": text})
            + "\n</assistant_message>")


def test_each_question_is_a_request_shown_as_memoryarena_shows_it(tmp_path: Path) -> None:
    first, second = read(write(tmp_path / "a.jsonl", ROWS), tasks=10)
    assert first.id == "7" and first.depth == 2 and second.queries == ["### PROBLEM: x if 2x = 8?"]
    assert first.queries[0] == "### BACKGROUND:\nIntegers only.\n### PROBLEM:\nCompute 2+3."
    assert first.queries[1].startswith("### BACKGROUND:\nNo information provided.\n")
    assert len(read(tmp_path / "a.jsonl", tasks=1)) == 1


@pytest.mark.parametrize(("text", "message"), [
    ("{not json\n", "line 1: not JSON"),
    ('{"questions": ["a", "b"], "answers": ["1"]}\n', "line 1: expected questions, answers and backgrounds"),
    ("\n", "holds no task"),
])
def test_a_malformed_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read(path, tasks=1)
    with pytest.raises(ValueError, match="give --data FILE"):
        read(None, tasks=1)


def test_graded_by_the_judge_with_memoryarenas_prompt_or_by_exact_match(tmp_path: Path) -> None:
    [task, _] = read(write(tmp_path / "a.jsonl", ROWS), tasks=2)
    assert task.check(2, " 20. ", {}).correct and not task.check(2, "21", {}).correct  # "$20$" normalised
    assert not task.check(1, None, {}).correct  # a failed request
    judge = ScriptedEngine(["Yes, they are.", "no"], record=True)
    [judged, _] = read(tmp_path / "a.jsonl", tasks=2, judge=judge)
    assert judged.check(1, "five", {}).correct and not judged.check(1, "5", {}).correct  # the judge decides
    system, user = judge.prompts[0]
    assert system.content == JUDGE_SYSTEM and "Question: None" in user.content  # as MemoryArena calls it
    assert "Expression 1: five" in user.content and "Expression 2: 5" in user.content


def test_sr_is_the_last_subtask_and_ps_the_share_correct(tmp_path: Path) -> None:
    data = write(tmp_path / "a.jsonl", ROWS[:1])
    config = EvalConfig(suites=("memoryarena",), strategies=("full-context",), tasks=1, depth=1,
                        out=tmp_path / "ev", replay=str(data))
    [row] = run_eval(config, [ScriptedEngine([answer("5"), answer("24")])])
    assert [s.correct for s in row.subtasks] == [True, False] and row.success is False
    oracle = run_eval(EvalConfig(suites=("memoryarena",), strategies=("flowstate", "full-context"), tasks=1,
                                 depth=1, out=tmp_path / "oracle", replay=str(data), policy="oracle"), [])
    assert all(r.success for r in oracle) and len(oracle) == 2
