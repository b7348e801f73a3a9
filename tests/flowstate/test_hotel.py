"""The hotel case of Figure 1, end to end on the scripted engine with the shipped script."""

from __future__ import annotations

from engine.scripted import ScriptedEngine
from flowstate import Agent, Repository
from flowstate.demo import hotel
from flowstate.nodes import Relation


def test_request_three_reaches_the_old_decision_and_its_evidence(repo: Repository) -> None:
    agent = Agent(ScriptedEngine.from_file(hotel.script_path()), repository=repo, session="trip",
                  tools=hotel.TOOLS, task_policy=hotel.POLICY)
    records = [agent.run(q) for q in hotel.QUERIES]
    assert all(not s.rejected and not s.refused and s.protocol_error is None for r in records for s in r.steps)

    third = records[2]
    # hop 1: the booking decision from the Historical State Index
    assert third.steps[0].disclosed == ["dec_book_a"]
    # hop 2: the cancellation-policy evidence, reachable only through dec_book_a's relation
    assert third.steps[1].disclosed == ["obs_r1_s2_1"]
    evidence = repo.node("trip", "obs_r1_s2_1")
    assert evidence is not None and evidence.request == 1
    assert evidence.value["result"]["cancellation_policy"]["fee_usd"] == 80
    # a new judgement supersedes the old decision, which stays as it was
    keep = repo.node("trip", "dec_keep_a")
    assert keep is not None and keep.request == 3 and keep.type.value == "judgement"
    assert (Relation.SUPERSEDES, "dec_book_a") in {(r.rel, r.state_id) for r in keep.refs}
    old = repo.node("trip", "dec_book_a")
    assert old is not None and old.request == 1 and old.value["booked"] == "A"
    assert "$240" in (third.response or "") and "Keep hotel A" in (third.response or "")
    # the evidence itself was never in the index: only PSA through a relation reaches it
    assert "obs_r1_s2_1" not in agent.engine.prompts[5][1].content.split("</historical_state_index>")[0]  # type: ignore[attr-defined]


def test_the_tools_are_deterministic() -> None:
    before = hotel.search_hotels("Lisbon", "2026-09-20", "2026-09-22", "2026-09-01")
    after = hotel.search_hotels("Lisbon", "2026-09-20", "2026-09-22", "2026-09-12")
    assert [h["total_price_usd"] for h in before] == [200, 240]
    assert [h["total_price_usd"] for h in after] == [200, 160]
    assert hotel.book_hotel("A", "2026-09-20", "2026-09-22")["cancellation_policy"]["fee_usd"] == 80
    assert hotel.cancel_booking("BK-A-20260920")["fee_charged_usd"] == 80
