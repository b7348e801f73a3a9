"""τ³ tasks as eval suites (``tau3-airline``, ``tau3-retail``): one task is one conversation, one session.

Unlike the generated suites, a τ³ task has no fixed queries: each user message (from a user
simulator) is one FlowState request, and the task is graded when the conversation ends, as τ³
grades it (``evaluate.py``).
"""

from __future__ import annotations

from typing import Any

from flowstate.eval.task import Answer, Call, Decision, Facts, Score, Task
from flowstate.eval.tau3 import airline, retail
from flowstate.eval.tau3.domain import DomainData, load
from flowstate.tools import ToolSet

SUITES = {"tau3-airline": "airline", "tau3-retail": "retail"}


class Tau3Task(Task):
    """One τ³ task (one trial of it): its data, a fresh database per run, the domain's tools."""

    def __init__(self, suite: str, data: DomainData, spec: dict[str, Any], trial: int, trials: int) -> None:
        task_id = f"{spec['id']}" if trials == 1 else f"{spec['id']}/trial{trial}"
        super().__init__(task_id, [])
        self.suite, self.data, self.spec, self.trial = suite, data, spec, trial
        self.base = str(spec["id"])

    @property
    def depth(self) -> int:
        return 0

    @property
    def policy(self) -> str:
        return self.data.policy

    @property
    def actions(self) -> list[dict[str, Any]]:
        return list(self.spec["evaluation_criteria"].get("actions") or [])

    @property
    def scenario(self) -> dict[str, Any]:
        return dict(self.spec["user_scenario"]["instructions"] or {})

    def read_only(self, name: str) -> bool:
        return name in (airline.READ if self.data.domain == "airline" else retail.READ)

    def new_env(self) -> dict[str, Any]:
        return self.data.fresh_db()

    def tools(self, env: Any) -> ToolSet:
        kit = airline.AirlineTools(env) if self.data.domain == "airline" else retail.RetailTools(env)
        return kit.toolset()

    # the subtask interface of the generated suites does not apply: the gold policy (gold.py) drives τ³ tasks
    def solve(self, k: int, facts: Facts) -> Decision:
        raise TypeError("τ³ tasks are conversations; their reference policy is flowstate.eval.tau3.gold")

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        raise TypeError("τ³ tasks are conversations; their reference policy is flowstate.eval.tau3.gold")

    def check(self, k: int, response: str | None, env: Any) -> Score:
        raise TypeError("τ³ tasks are graded when the conversation ends (flowstate.eval.tau3.evaluate)")


def generate(suite: str, tasks: int, data_dir: str | None = None, trials: int = 1) -> list[Task]:
    """The domain's first ``tasks`` tasks (all of them if there are fewer), each ``trials`` times."""
    data = load(SUITES[suite], data_dir)
    specs = data.tasks[:tasks]
    return [Tau3Task(suite, data, spec, trial, trials) for spec in specs for trial in range(1, trials + 1)]
