"""Two sessions in one database never see each other's nodes: not in the index, not by access, not by refs."""

from __future__ import annotations

from flowstate import Repository
from tests.helpers import AgentFactory, add, output


def test_sessions_are_isolated(make_agent: AgentFactory, repo: Repository) -> None:
    alice, _ = make_agent([output(delta=[add("secret_plan", "judgement", code=1234)], content="saved")],
                          session="alice")
    alice.run("remember my code 1234")

    bob, engine = make_agent([
        output(focus=["secret_plan"], delta=[add("bob_note", refs=[("supports", "secret_plan")])]),
        output(delta=[add("secret_plan", "judgement", code=1)], content="bob's own"),  # same id, other session: fine
    ], session="bob")
    record = bob.run("what is alice's code?")

    first_prompt = engine.prompts[0][1].content
    assert "secret_plan" not in first_prompt.split("<user_query>")[0]  # not in bob's index
    assert record.steps[0].disclosed == [] and record.steps[0].refused[0] == {"target_id": "secret_plan",
                                                                              "reason": "unknown id"}
    rejected = record.steps[0].rejected[0]
    assert rejected["state_id"] == "bob_note" and "unknown id" in rejected["reason"]
    assert "1234" not in "".join(m.content for p in engine.prompts for m in p)

    assert [n.value for n in repo.nodes("alice")] == [{"code": 1234}]
    assert [n.value for n in repo.nodes("bob")] == [{"code": 1}]
    assert repo.disclosure("alice", "secret_plan")[1] == []
