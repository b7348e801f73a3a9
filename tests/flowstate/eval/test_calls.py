"""Call figures by name: written as objects, and rows of older runs (positional lists of five or seven) read the
same."""

from __future__ import annotations

from engine.base import Usage
from flowstate.eval.calls import read
from flowstate.eval.gpu import GPUCost
from flowstate.eval.rows import SubtaskRow, calls_of


def test_old_and_new_rows_read_as_the_same_figures() -> None:
    new = Usage(120, 40, 12, 0.5, 1.25, 30, 4)
    assert read(new.to_dict()) == new
    assert read([120, 40, 12, 0.5, 1.25, 30, 4]) == new  # a run before names
    assert read([120, 40, 12, 0.5, 1.25]) == Usage(120, 40, 12, 0.5, 1.25)  # before shared and forced tokens
    assert read({"prompt_tokens": 120, "completion_tokens": 12, "mask_s": 0.1}).mask_s == 0.1


def test_a_report_reads_an_old_results_file_as_a_new_one() -> None:
    fields = {"k": 1, "correct": True, "credit": 1.0, "response": "x", "error": None, "steps": 2, "parse_failures": 0,
              "rejected": 0, "usage": {"prompt_tokens": 180, "cached_tokens": 20, "completion_tokens": 15}}
    old = [SubtaskRow.from_dict({**fields, "calls": [[100, 20, 10, 0.1, 0.2, 50, 2], [80, 0, 5, 0.1, 0.1]]})]
    new = [SubtaskRow.from_dict({**fields, "calls": [c.to_dict() for c in calls_of(old)]})]
    cost = GPUCost("x", w=3.0, kappa=0.001, source="test")
    assert cost.pet(calls_of(old)) == cost.pet(calls_of(new))
    assert cost.pet(calls_of(new))["shared_uncached"] == (100 - 50) + (80 - 0)
