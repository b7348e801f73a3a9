"""The bounded Historical State Index: older requests folded into pages that PSA discloses."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from flowstate.config import LoopConfig
from flowstate.eval.rows import calls_of
from flowstate.eval.runner import EvalConfig, run_eval
from flowstate.history import HistoricalIndex, IndexEntry
from flowstate.memory import get
from flowstate.pages import FANOUT, BoundedIndex, Page, estimate, fold
from tests.helpers import add, output


def index(n: int, states: int = 2) -> HistoricalIndex:
    return HistoricalIndex(tuple(
        IndexEntry(k, f"request {k}: book a room in city {k}",
                   tuple((f"st_{k}_{i}", f"book result: price_day{k}, fee_day{k}") for i in range(states)))
        for k in range(1, n + 1)))


def everything(bounded: BoundedIndex) -> set[str]:
    """Every id reachable from the index: what it shows, and what its pages list, at any depth."""
    return set(bounded.ids()) | {i for p in bounded.pages() for i in p.value["listed"]}


def test_a_small_index_is_not_folded_and_renders_as_the_flat_one() -> None:
    flat = index(10)
    bounded = fold(flat, budget=10_000)
    assert bounded.render() == flat.render() and bounded.ids() == flat.ids() and bounded.pages() == ()


def test_folding_keeps_the_index_under_its_budget_and_every_state_reachable() -> None:
    for n, budget in ((40, 1024), (300, 2048), (1000, 4096)):
        flat = index(n)
        bounded = fold(flat, budget=budget)
        assert estimate(bounded.render()) <= budget < estimate(flat.render())
        assert everything(bounded) >= flat.ids()  # nothing unreachable
        first = bounded.units[0]
        assert isinstance(first, Page) and first.first == 1  # the oldest requests are the ones folded
        assert not isinstance(bounded.units[-1], Page)  # the latest request keeps its own line
    deep = fold(index(1000), budget=4096)
    assert any(isinstance(u, Page) and u.level == 2 and u.last - u.first + 1 == FANOUT ** 2 for u in deep.units)


def test_a_budget_below_what_folding_can_reach_leaves_the_index_as_folded_as_it_can_be() -> None:
    bounded = fold(index(1000), budget=100)  # fewer than FANOUT units of each level are left unfolded
    levels = [u.level if isinstance(u, Page) else 0 for u in bounded.units]
    assert all(levels.count(level) < FANOUT for level in set(levels)) and levels == sorted(levels, reverse=True)
    assert everything(bounded) >= index(1000).ids()


def test_a_page_line_names_its_requests_and_what_they_hold() -> None:
    page = next(u for u in fold(index(40), budget=1024).units if isinstance(u, Page))
    assert page.id == "page_r1_16" and page.render().startswith('{"page_id":"page_r1_16","requests":[1,16]')
    summary = page.summary()
    assert "price_day1" in summary.split() and len(summary) <= 240  # ids and codes a later request looks for


def test_folding_only_grows_from_the_oldest_end_so_the_prefix_stays_cached() -> None:
    breaks = 0
    before = ""
    for n in range(1, 400):
        text = fold(index(n), budget=2048).render()
        pages = "".join(line + "\n" for line in text.splitlines() if line.startswith('{"page_id"'))
        if not text.startswith(before):
            breaks += 1
        before = pages
    assert breaks <= 400 // FANOUT  # at most once per page made


def test_a_folded_state_is_reached_through_its_page(tmp_path: Path) -> None:
    """Request 40 needs a state of request 1, folded into page_r1_16: asking for it directly is refused with
    the page to ask for; the page shows request 1's line; then the state itself is disclosed."""
    outputs = [output(delta=[add("kn_first", value=1)], content="ok")]
    outputs += [output(content="ok") for _ in range(38)]
    outputs += [
        output(focus=["kn_first"]),  # folded: refused, naming the page
        output(focus=["page_r1_16"]),
        output(focus=["kn_first"]),
        output(content="done"),
    ]
    engine = ScriptedEngine(outputs)
    with Repository.open(tmp_path / "m.db") as repo:
        agent = Agent(engine, repository=repo, session="s", strategy=get("flowstate-paged:200"),
                      config=LoopConfig(max_steps=6))
        for k in range(1, 40):
            agent.run(f"request {k}: a long enough query so that the index outgrows its small budget quickly")
        record = agent.run("what did request 1 find?")
    assert record.response == "done"
    steps = record.steps
    refused = steps[0].refused[0]
    assert refused["target_id"] == "kn_first" and "request page_r1_16 first" in refused["reason"]
    assert steps[1].disclosed == ["page_r1_16"] and steps[2].disclosed == ["kn_first"]
    prompt = engine.prompts[-1][-1].content
    assert '"page_id":"page_r1_16"' in prompt and '"state_id":"kn_first"' in prompt
    system = engine.prompts[-1][0].content
    assert "folded into pages" in system


@pytest.mark.slow  # whole domains / many tasks: seconds, not milliseconds
def test_the_bounded_index_solves_what_the_flat_one_does_on_deep_sessions(tmp_path: Path) -> None:
    strategies = ("flowstate", "flowstate-paged:1024")
    rows = run_eval(EvalConfig(suites=("reasoning",), strategies=strategies, tasks=2, depth=48, out=tmp_path / "r",
                               policy="oracle"), [])
    rows += run_eval(EvalConfig(suites=("hotel",), strategies=strategies, tasks=1, depth=120, out=tmp_path / "h",
                                policy="oracle"), [])
    assert len(rows) == 6 and all(r.success for r in rows)
    largest = {s: max(c.prompt_tokens for r in rows if (r.suite, r.strategy) == ("hotel", s)
                      for c in calls_of(r.subtasks)) for s in strategies}
    assert largest["flowstate-paged:1024"] < 0.5 * largest["flowstate"]  # the flat index grows, the bounded one not


def test_a_page_is_a_view_of_the_index_not_a_state_a_ref_may_name() -> None:
    from flowstate.active import ActiveState

    bounded = fold(index(40), budget=1024)
    state = ActiveState(request=41, history_ids=frozenset(index(40).ids()), index_ids=bounded.ids(),
                        pages=bounded.pages())
    assert "page_r1_16" in state.index_ids and "page_r1_16" not in state.ref_targets()
    assert state.is_used("page_r1_16")  # no model state may take a page's id


def test_a_state_may_not_take_a_page_id_so_no_fold_makes_it_unreachable(tmp_path: Path) -> None:
    """A model state named like a page (``page_r1_16``) would be shadowed by the page a later fold makes; the id form
    is reserved and the add is fed back with the reason."""
    engine = ScriptedEngine([output(delta=[add("page_r1_16", x=1), add("kept", x=2)], content="noted")])
    with Repository.open(tmp_path / "m.db") as repo:
        record = Agent(engine, repository=repo, session="s", strategy=get("flowstate-paged")).run("note it")
        ids = {n.id for n in repo.nodes("s")}
    (step,) = record.steps
    assert [r["state_id"] for r in step.rejected] == ["page_r1_16"]
    assert "reserved for pages of the index" in step.rejected[0]["reason"]
    assert ids == {"kept"}
    flat = HistoricalIndex((*index(40).entries, IndexEntry(41, "note it", (("kept", "summary of kept"),))))
    assert "kept" in everything(fold(flat, budget=1024))  # reachable across the fold
