"""A real instruct model meets the method (the model ``tests/models/qwen2.5-coder-1.5b.py`` assembles, named by
FLOWSTATE_REAL_MODEL; CI requires it): one hotel request per strategy under the per-step grammar — every step
parses, the request ends before the step budget (a loop is refused and ended, never run to the budget), and the
model calls a tool. Without the model the test is skipped, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowstate.config import LoopConfig
from flowstate.constrain import GrammarMode
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.limits import STANDARD
from flowstate.records import BUDGET
from tests.optional import real_model

MODEL = real_model()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(MODEL is None, reason="no real model: set FLOWSTATE_REAL_MODEL to a GGUF "
                                                       "(tests/models/qwen2.5-coder-1.5b.py prints one)")]


def test_a_real_model_acts_under_the_per_step_grammar_in_every_strategy(tmp_path: Path) -> None:
    import engine as engines

    engine = engines.load("llamacpp", model=MODEL)
    try:
        config = EvalConfig(suites=("hotel",), strategies=("flowstate", "full-context"), tasks=1, depth=1,
                            out=tmp_path / "ev", engine="real",
                            loop=LoopConfig(max_steps=8, grammar=GrammarMode.STEP, limits=STANDARD))
        rows = run_eval(config, [engine])
    finally:
        engine.close()
    assert sorted(r.strategy for r in rows) == ["flowstate", "full-context"]
    for row in rows:
        (sub,) = row.subtasks
        assert sub.parse_failures == 0, row.strategy  # the grammar holds the form on a 151k vocabulary
        assert not (sub.error or "").startswith(BUDGET), (row.strategy, sub.error)
        assert sub.tool_calls >= 1, (row.strategy, sub.response)  # it acts, not answers at once
