"""Every suite is solvable (the oracle scores 100% under every strategy) and needs memory (the
memoryless policy, which never consults history, fails dependent subtasks under every strategy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flowstate.eval.policies import BOUNDED
from flowstate.eval.rows import calls_of
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.eval.suites import SUITES, Spec, generate
from flowstate.eval.suites import suite as suite_named
from flowstate.memory import METHODS as STRATEGIES
from flowstate.memory import get


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
@pytest.mark.parametrize("suite", sorted(SUITES))
def test_oracle_solves_and_memoryless_fails_dependent_subtasks(suite: str, tmp_path: Path) -> None:
    results = {}
    for policy in ("oracle", "memoryless"):
        config = EvalConfig(suites=(suite,), strategies=tuple(STRATEGIES), tasks=6, depth=5, out=tmp_path / policy,
                            policy=policy)
        results[policy] = run_eval(config, [])
    for strategy in STRATEGIES:
        oracle = [r for r in results["oracle"] if r.strategy == strategy]
        blind = [r for r in results["memoryless"] if r.strategy == strategy]
        assert len(oracle) == len(blind) == 6
        if strategy in BOUNDED:  # its memory may not show what a subtask needs: the first subtask is still solved
            assert all(r.subtasks[0].correct for r in oracle), strategy
            continue
        assert all(r.success for r in oracle), strategy
        assert all(s.correct and s.credit == 1.0 and s.parse_failures == 0 and s.rejected == 0
                   for r in oracle for s in r.subtasks), strategy
        # the first subtask needs no memory: both solve it; later ones do
        assert all(r.subtasks[0].correct for r in blind), strategy
        dependent = [s.correct for r in blind for s in r.subtasks[1:]]
        assert sum(dependent) < 0.75 * len(dependent), (strategy, sum(dependent), len(dependent))


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_generation_is_deterministic_per_seed(suite: str) -> None:
    a, b, c = generate(suite, 3, Spec(4, 7)), generate(suite, 3, Spec(4, 7)), generate(suite, 3, Spec(4, 8))
    assert [t.queries for t in a] == [t.queries for t in b]
    assert [t.queries for t in a] != [t.queries for t in c]
    assert all(t.depth == 4 for t in a) and len({t.id for t in a}) == 3


def test_a_later_subtask_cannot_refetch_what_an_earlier_one_was_told() -> None:
    task = generate("chain", 1, 3)[0]
    tools = task.tools(task.new_env())
    first, error = tools.call("measure", {"sample": task.samples[0]})
    assert first == {"reading_1": task.readings[0]} and error is None
    again, error = tools.call("measure", {"sample": task.samples[0]})
    assert again is None and "consumed" in (error or "")


# ---- minimal reference policies, realistic observations, token economy (issue 12)

from typing import Any  # noqa: E402

from engine.base import Generation, Message  # noqa: E402
from engine.purpose import STEP  # noqa: E402
from flowstate.config import LoopConfig  # noqa: E402
from flowstate.eval.policies import Policy, PolicyEngine  # noqa: E402
from flowstate.eval.runner import run_task  # noqa: E402
from flowstate.eval.suites import REALISTIC, options  # noqa: E402
from flowstate.eval.task import Task  # noqa: E402
from flowstate.memory.base import Strategy  # noqa: E402
from flowstate.memory.state import FLOWSTATE  # noqa: E402
from flowstate.store.repository import Repository  # noqa: E402


class Recording(PolicyEngine):
    def __init__(self, policy: Policy) -> None:
        super().__init__(policy)
        self.prompts: list[list[Message]] = []

    def generate(self, messages: Any, **kwargs: Any) -> Generation:
        self.prompts.append(list(messages))
        return super().generate(messages, **kwargs)


def _run(task: Task, strategy: Strategy,
         policy_type: type[Policy] = Policy) -> tuple[Policy, Recording, dict[str, Any]]:
    policy = policy_type(task, strategy, memory=True)
    engine = Recording(policy)
    with Repository.open(":memory:") as repo:
        row = run_task(task, strategy, engine, repo, LoopConfig(), "test")
    return policy, engine, row


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_reference_step_is_needed(suite: str) -> None:
    for strategy in map(get, sorted(set(STRATEGIES) - set(BOUNDED))):
        for task in generate(suite, 3, Spec(6, 1)):
            policy, _, row = _run(task, strategy)
            assert row.success, (suite, strategy.name)
            assert policy.mergeable() == [], (suite, strategy.name)


class AsksLate(Policy):
    """Asks memory only once it is stuck, not together with the search that needs nothing from it."""

    def __call__(self, messages: Any, purpose: Any = STEP) -> str:
        saved = self.task.needs
        self.task.needs = lambda k: ()  # type: ignore[method-assign]
        try:
            return super().__call__(messages, purpose)
        finally:
            self.task.needs = saved  # type: ignore[method-assign]


def test_the_minimality_check_catches_a_step_that_could_have_been_merged() -> None:
    task = generate("shopping", 1, Spec(4, 0))[0]
    minimal, _, row = _run(task, FLOWSTATE)
    late, _, late_row = _run(generate("shopping", 1, Spec(4, 0))[0], FLOWSTATE, AsksLate)
    assert row.success and late_row.success and minimal.mergeable() == []
    found = late.mergeable()
    assert any("waits for ['fact_r1_s2_1'], which it could have asked for a step earlier" in f for f in found)
    assert sum(s.steps for s in late_row.subtasks) > sum(s.steps for s in row.subtasks)
    # a step whose action uses nothing that just arrived is caught too
    trace = list(minimal.trace)
    i = next(i for i, s in enumerate(trace) if s.k == 2 and s.t == 2)
    minimal.trace = trace[: i + 1] + [trace[i]] + trace[i + 1:]  # the same decision again, one step later
    minimal.trace[i + 1] = type(trace[i])(2, 3, trace[i].facts, frozenset(), trace[i].visible, (), trace[i].decision)
    assert any("uses nothing that arrived at this step" in f for f in minimal.mergeable())


@pytest.mark.parametrize("suite", REALISTIC)
def test_realistic_prompts_keep_their_prefix_across_steps_and_requests(suite: str) -> None:
    task = generate(suite, 1, Spec(4, 0))[0]
    _, engine, _ = _run(task, FLOWSTATE)
    system = engine.prompts[0][0].content
    assert all(p[0].content == system for p in engine.prompts)  # the static part never changes
    users = [p[1].content for p in engine.prompts]
    requests: dict[str, list[str]] = {}
    for u in users:
        requests.setdefault(u.split("<user_query>\n")[1].split("\n</user_query>")[0], []).append(u)
    heads = []
    for steps in requests.values():
        head = steps[0].split("<active_state>")[0]  # index + query: fixed within a request
        assert all(s.startswith(head) for s in steps)
        heads.append(head.split("</historical_state_index>")[0])
    assert all(b.startswith(a) for a, b in zip(heads, heads[1:]))  # the index only grows at its end


@pytest.mark.parametrize("suite", REALISTIC)
def test_realistic_observations_are_benchmark_sized_and_their_size_is_an_option(suite: str) -> None:
    def largest(sizes: dict[str, int]) -> int:
        task = generate(suite, 1, Spec(2, 0, sizes))[0]
        _, _, row = _run(task, FLOWSTATE)
        calls = calls_of(row.subtasks)
        return max(c.prompt_tokens for c in calls) - calls[0].prompt_tokens

    defaults = options(suite)
    grown = largest({name: 2 * v for name, v in defaults.items()})
    assert largest({}) > 400  # an observation of hundreds of tokens, not dozens
    assert grown > 1.5 * largest({})


def test_flowstate_costs_less_than_full_context_where_observations_are_realistic(tmp_path: Path) -> None:
    config = EvalConfig(suites=REALISTIC, strategies=("flowstate", "full-context"), tasks=2, depth=8, out=tmp_path,
                        policy="oracle")
    rows = run_eval(config, [])

    def total(suite: str, strategy: str, key: str) -> int:
        return sum(getattr(s.usage, key) for r in rows if (r.suite, r.strategy) == (suite, strategy)
                   for s in r.subtasks)

    for suite in REALISTIC:
        assert all(r.success for r in rows if r.suite == suite)
        tokens = {s: total(suite, s, "prompt_tokens") + total(suite, s, "completion_tokens")
                  for s in ("flowstate", "full-context")}
        assert tokens["flowstate"] <= 0.6 * tokens["full-context"], suite
        # uncached prefill is not compared here: full context in chat order pays only what is new at each call
        # (test_strategies), and its uncached tokens are close to FlowState's (the README gives the figures)


def test_tokens_can_be_counted_with_the_embedded_models_vocabulary(tmp_path: Path) -> None:
    totals = {}
    for count in ("words", "embedded"):
        config = EvalConfig(suites=("shopping",), strategies=("flowstate", "full-context"), tasks=1, depth=4,
                            out=tmp_path / count, policy="oracle", count_tokens=count)
        rows = run_eval(config, [])
        totals[count] = {r.strategy: sum(s.usage.prompt_tokens for s in r.subtasks) for r in rows}
    assert totals["words"] != totals["embedded"]  # another tokenizer: other counts ...
    for counted in totals.values():  # ... and the same conclusion
        assert counted["flowstate"] < counted["full-context"]
    with pytest.raises(ValueError, match="unknown token count"):
        run_eval(EvalConfig(suites=("hotel",), strategies=("flowstate",), tasks=1, depth=1, out=tmp_path / "x",
                            policy="oracle", count_tokens="letters"), [])


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_a_suite_gives_the_depth_asked_or_refuses_it(suite: str) -> None:
    """A depth a suite cannot generate is an error, never a silent cap (the report would say a depth the tasks do
    not have)."""
    for depth in (16, 64):
        try:
            tasks = generate(suite, 2, Spec(depth, 0))
        except ValueError as exc:
            assert "at most" in str(exc)
            continue
        assert all(t.depth == depth for t in tasks)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_the_realistic_policy_is_the_costlier_bound_and_still_solves_every_suite(suite: str, tmp_path: Path) -> None:
    strategies = ("flowstate", "full-context", "no-psa")
    rows = {policy: run_eval(EvalConfig(suites=(suite,), strategies=strategies, tasks=3, depth=5, out=tmp_path / policy,
                                        policy=policy), []) for policy in ("oracle", "realistic")}
    for strategy in strategies:
        assert all(r.success for r in rows["realistic"] if r.strategy == strategy), strategy

    def total(policy: str, key: str) -> int:
        return sum(getattr(s.usage, key) if key != "steps" else s.steps for r in rows[policy]
                   if r.strategy == "flowstate" for s in r.subtasks)

    # it records every result it used and looks history up by words, in steps of their own: more of both
    assert total("realistic", "steps") >= total("oracle", "steps")
    assert total("realistic", "prompt_tokens") > total("oracle", "prompt_tokens")


def test_the_realistic_policy_records_every_result_and_asks_for_history_in_a_step_of_its_own(tmp_path: Path) -> None:
    import json
    import re
    from collections.abc import Sequence

    from flowstate.config import LoopConfig
    from flowstate.eval.policies import Policy, PolicyEngine, sections
    from flowstate.eval.runner import run_task
    from flowstate.history import words
    from flowstate.store.repository import Repository

    task = generate("shopping", 1, Spec(4, 0))[0]
    policy = Policy(task, get("flowstate"), memory=True, realistic=True)
    steps: list[tuple[str, dict[str, Any]]] = []

    def answer(messages: Sequence[Any], purpose: Any) -> str:
        text = policy(messages, purpose)
        blocks = {name: json.loads(body) for name, body in re.findall(r"<([a-z_]+)>\n(.*?)\n</\1>", text, re.S)}
        steps.append((messages[-1].content, blocks))
        return text

    with Repository.open(tmp_path / "m.db") as repo:
        row = run_task(task, get("flowstate"), PolicyEngine(answer), repo, LoopConfig(), "r")
    assert row.success
    looks = [b for _, b in steps if b["state_focus"]]
    assert looks and all(b["tool_calls"] == [] and b["assistant_message"] == {"content": None} for b in looks)
    recorded = [op for _, b in steps for op in b["state_delta"]]
    # every result it used, the search pages' offers too (the oracle keeps only what later subtasks need)
    assert any(any(key.startswith("offer_") for key in op["value"]) for op in recorded)
    # request 2's first step asks only for states whose summaries share a word with its query
    prompt, first = next((p, b) for p, b in steps if task.queries[1] in p)
    summaries = {st["state_id"]: st["summary"] for e in sections(prompt)["historical_state_index"]
                 for st in e["states"]}
    asked = [f["target_id"] for f in first["state_focus"]]
    assert asked and all(words(summaries[a]) & words(task.queries[1]) for a in asked)
    assert len(asked) < len(summaries) or len(summaries) == 1


def test_a_shopping_query_names_the_product_its_fit_depends_on() -> None:
    for task in generate("shopping", 4, Spec(8, 0)):
        for k in range(2, 9):
            j = task.depends[k - 2]
            assert f"for the {task.correct[j - 1].category} I bought earlier" in task.queries[k - 1]
            assert task.needs(k) == (f"{task.correct[j - 1].category}_compatible_with",)


def test_planning_credits_each_constraint_a_booking_meets_as_the_papers_travel_sps() -> None:
    """The paper's Travel scoring on planning: sPS credits the constraints each booking satisfies (its day's table,
    its stated requirement, the cheapest or highest-rated of what meets it); PS over all subtasks (micro)."""
    from flowstate.eval.suites.planning import PlanningTask
    from flowstate.eval.task import Score

    [task] = generate("planning", 1, Spec(6, 0))
    rules = {name: suite_named(name).rules for name in ("planning", "travel", "hotel", "shopping")}
    assert isinstance(task, PlanningTask) and rules["planning"].soft and rules["planning"].micro_ps
    assert rules["travel"].soft and not rules["hotel"].soft and not rules["shopping"].micro_ps
    k = next(k for k in range(2, 7) if task.kind(k) == "stay" and task.relative[k - 1])
    best = task.correct(k)
    assert task.check(k, "ok", {"booked": {k: best}}) == Score(True, 1.0)
    assert task.check(k, None, {"booked": {}}) == Score(False, 0.0)  # nothing booked
    met = task.constraints(k, best)
    room = next(r for r in task.stays[k] if r["name"] == best)["room_type"]
    # a dearer row of the same room type and a high enough review rate meets all but "the cheapest"
    dearer = [r["name"] for r in task.stays[k] if r["room_type"] == room and r["name"] != best
              and task.constraints(k, r["name"])[:-1] == met[:-1]]
    assert dearer  # seed 0's tables offer one
    score = task.check(k, "ok", {"booked": {k: dearer[0]}})
    assert not score.correct and score.credit == (len(met) - 1) / len(met)
    other = next(r["name"] for r in task.stays[k] if r["room_type"] != room)
    assert task.check(k, "ok", {"booked": {k: other}}).credit < 1.0


def test_planning_computes_each_subtasks_right_choice_once() -> None:
    """A subtask's right choice reads every earlier one's: memoised, subtask k costs k choices, not 2^k."""
    from flowstate.eval.suites.planning import PlanningTask

    [task] = generate("planning", 1, Spec(12, 0))
    assert isinstance(task, PlanningTask)
    made: list[int] = []
    choose = task.choice
    task.choice = lambda k, facts: made.append(k) or choose(k, facts)  # type: ignore[method-assign]
    task._correct.clear()
    last = task.correct(12)
    assert sorted(made) == list(range(1, 13)) and task.correct(12) == last and len(made) == 12


def test_every_suite_is_one_protocol_and_declares_its_options() -> None:
    """Generated, τ³, replayed and dataset suites answer the same calls; a generated suite's declared options are the
    size arguments its generator takes, with the same defaults (declared once, not read off a signature)."""
    import inspect

    from flowstate.eval.suites import ALL, REGISTRY, Generated, Spec, suite

    assert set(ALL) == set(REGISTRY) and all(REGISTRY[name].name == name for name in ALL)
    for entry in REGISTRY.values():
        if isinstance(entry, Generated):
            taken = list(inspect.signature(entry.make).parameters.values())[3:]
            assert {p.name: p.default for p in taken} == dict(entry.options), entry.name
    assert [t.id for t in suite("chain").tasks(2, Spec(depth=3))] == [t.id for t in generate("chain", 2, 3)]
    with pytest.raises(ValueError, match="unknown suite 'nope'; valid suites: hotel"):
        suite("nope")


def test_each_suite_declares_the_rules_its_runs_are_checked_against() -> None:
    """Which ``--policy`` a suite runs under, whether it takes ``--mcp``, and which reference plays its tasks: its
    rules say, and the runner asks them (it names no suite)."""
    from flowstate.eval.policies import Policy
    from flowstate.eval.suites import TAU3, check_run, suite
    from flowstate.limits import STANDARD

    for policy in (None, "oracle", "realistic", "memoryless"):
        check_run(["hotel", "shopping"], policy, mcp=False)
    check_run(list(TAU3), "oracle", mcp=True)
    check_run(["tau-replay"], "realistic", mcp=False)
    refused = [(["tau3-retail"], "realistic", False, "replay their gold actions .*not a realistic policy"),
               (["tau-replay"], None, False, "give --policy realistic"),
               (["hotel"], "best", False, "unknown reference policy 'best'"),
               (["tau3-airline", "hotel"], "oracle", True, "tau3-airline, tau3-retail\\); hotel cannot take them")]
    for names, policy, mcp, message in refused:
        with pytest.raises(ValueError, match=message):
            check_run(names, policy, mcp)
    rules = {name: suite(name).rules for name in ("hotel", "tau3-airline", "tau-replay")}
    assert [(r.conversational, r.replayed) for r in rules.values()] == [(False, False), (True, False), (False, True)]
    [task] = generate("hotel", 1, 2)
    played = suite("hotel").reference(task, FLOWSTATE, STANDARD, "memoryless")
    assert isinstance(played, Policy) and not played.memory
    with pytest.raises(TypeError, match="plays τ³ tasks, not HotelTask"):
        suite("tau3-airline").reference(task, FLOWSTATE, STANDARD, "oracle")
