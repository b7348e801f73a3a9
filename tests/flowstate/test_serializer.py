"""The prompt: byte-stable (golden file), laid out for prefix caching, G_k append-only across requests."""

from __future__ import annotations

import os
from pathlib import Path

from engine.scripted import ScriptedEngine
from engine.text import common_prefix, flatten
from flowstate import Agent, Repository
from flowstate.demo import hotel
from flowstate.history import session_index
from tests.helpers import AgentFactory, add, output

GOLDEN = Path(__file__).parent / "golden" / "hotel_request3_step3.txt"


def hotel_prompts(repo: Repository) -> list[str]:
    engine = ScriptedEngine.from_file(hotel.script_path())
    agent = Agent(engine, repository=repo, session="trip", tools=hotel.TOOLS, task_policy=hotel.POLICY)
    for q in hotel.QUERIES:
        agent.run(q)
    return [flatten(p) for p in engine.prompts]


def test_prompt_matches_the_golden_file(repo: Repository) -> None:
    prompt = hotel_prompts(repo)[-1]
    if os.environ.get("FLOWSTATE_UPDATE_GOLDEN"):
        GOLDEN.write_text(prompt, encoding="utf-8")
    assert prompt == GOLDEN.read_text(encoding="utf-8")


def test_prompts_are_identical_across_runs(tmp_path: Path) -> None:
    runs = []
    for name in ("one.db", "two.db"):
        with Repository.open(tmp_path / name) as repo:
            runs.append(hotel_prompts(repo))
    assert runs[0] == runs[1]


def test_layout_order_and_static_system_part(repo: Repository) -> None:
    prompts = hotel_prompts(repo)
    system = prompts[0].split("<|user|>")[0]
    assert all(p.startswith(system) for p in prompts)
    for p in prompts:
        user = p.split("<|user|>")[1]
        marks = [user.index(t)
                 for t in ("<historical_state_index>", "<user_query>", "<active_state>", "<latest_observation>")]
        assert marks == sorted(marks)
    # within a request, steps share everything up to the Active State
    r3 = prompts[5:]
    head = r3[0].split("<active_state>")[0]
    assert all(p.startswith(head) for p in r3)


def test_index_rendering_is_a_byte_prefix_of_the_next(make_agent: AgentFactory, repo: Repository) -> None:
    renders = [session_index(repo, "s1").render()]
    for k in range(1, 6):
        agent, _ = make_agent([output(delta=[add(f"k{k}_a"), add(f"k{k}_b", refs=[("follows", f"k{k}_a")])],
                                      content=f"r{k}")])
        agent.run(f"query {k} with \"quotes\" and ünïcode")
        renders.append(session_index(repo, "s1").render())
    for before, after in zip(renders, renders[1:]):
        assert after.startswith(before) and len(after) > len(before)
    assert renders[0] == "" and renders[-1].count("\n") == 5


def test_perfect_prefix_cache_share_stays_high_across_requests(repo: Repository) -> None:
    prompts = hotel_prompts(repo)
    # the first call of each later request reuses the system part and the earlier index
    for later in (3, 5):
        shared = common_prefix(prompts[later - 1], prompts[later])
        assert shared / len(prompts[later]) > 0.8
