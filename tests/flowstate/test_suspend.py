"""A request waiting on client tool results, stored as JSON and taken up again: the restored run is the
same run — its next prompt, its records and what it persists."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.scripted import ScriptedEngine
from flowstate import Repository
from flowstate.config import AgentConfig
from flowstate.loop import RequestRun
from flowstate.memory.state import FLOWSTATE
from flowstate.records import ToolCallRecord
from flowstate.suspend import restore, snapshot
from grammars.check import GrammarError
from tests.helpers import add, output

TOOLS = [{"name": "get_price", "description": "Price.", "parameters": {
    "type": "object", "properties": {"hotel": {"type": "string"}}, "required": ["hotel"]}}]


def script() -> list[str]:
    return [
        output(delta=[add("want_a", hotel="A")], tools=[{"name": "get_price", "arguments": {"hotel": "A"}}]),
        output(delta=[add("price_a", refs=[("supports", "obs_r2_s1_1")], price=120)], content="A costs 120."),
    ]


def start(repo: Repository, engine: ScriptedEngine) -> RequestRun:
    repo.persist_request("s", 1, "earlier", "ok", [], {})
    run = RequestRun(engine=engine, repo=repo, session="s", query="What does A cost?",
                     agent=AgentConfig(engine, FLOWSTATE),
                     client_tools=TOOLS)
    run.step()
    assert [c.name for c in run.pending] == ["get_price"]
    return run


def untimed(record: dict[str, Any]) -> dict[str, Any]:
    """A run record without the measured times (two runs never take the same time)."""
    return {**record, "steps": [{k: v for k, v in s.items() if k != "grammar_ms"} for s in record["steps"]]}


def test_a_restored_run_goes_on_exactly_as_the_original(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = [ToolCallRecord("get_price", {"hotel": "A"}, "obs_r2_s1_1", {"price": 120})]
    with Repository.open(tmp_path / "a.db") as a, Repository.open(tmp_path / "b.db") as b:
        original_engine, other_engine = ScriptedEngine(script()), ScriptedEngine(script())
        original = start(a, original_engine)
        twin = start(b, other_engine)
        stored = json.loads(json.dumps(snapshot(twin)))  # through JSON, as the database keeps it
        restored = restore(stored, engine=other_engine, repo=b, agent=AgentConfig(other_engine, FLOWSTATE))
        assert restored.index_k == 2 and [s.to_dict() for s in restored.steps] == [s.to_dict() for s in twin.steps]
        assert restored.state == twin.state and restored.pending == twin.pending
        for run in (original, restored):
            run.observe(result)
            run.step()
        assert original_engine.prompts[-1] == other_engine.prompts[-1]  # the same next prompt, byte for byte
        assert original.record is not None and restored.record is not None
        assert untimed(original.record.to_dict()) == untimed(restored.record.to_dict())
        assert [n.id for n in a.nodes("s")] == [n.id for n in b.nodes("s")] == ["obs_r2_s1_1", "want_a", "price_a"]


def test_the_repository_keeps_a_waiting_request_until_it_ends(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with Repository.open(tmp_path / "m.db") as repo:
        repo.waiting.save("s", 1, {"x": 1})
        assert repo.waiting.get("s") == {"x": 1}
        repo.waiting.save("s", 1, {"x": 2})  # a later step of the same request replaces it
        assert repo.waiting.get("s") == {"x": 2}
        repo.persist_request("s", 1, "q", "r", [], {})  # finished meanwhile (elsewhere): no longer waiting
        assert repo.waiting.get("s") is None
        repo.waiting.save("t", 1, {"y": 1})
        assert repo.delete_session("t") is True and repo.waiting.get("t") is None  # a session only waiting is a session
        repo.waiting.clear("s")
        assert repo.waiting.get("s") is None


def test_a_call_that_waits_on_approval_runs_when_approved_and_is_a_tool_error_when_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A server tool named in ``RequestOptions.approval`` waits like a client's call (and through a snapshot); the
    client's ``Approval`` runs it here, or refuses it with the reason the model reads; a plain result for it, or an
    approval for a client's call, is refused."""
    import pytest

    from flowstate.loop import Approval
    from flowstate.request_options import RequestOptions
    from flowstate.tools import ToolSet

    ran: list[str] = []

    def lookup(hotel: str) -> dict[str, Any]:
        """Price of a hotel."""
        ran.append(hotel)
        return {"hotel": hotel, "price": 120}

    calls = [output(tools=[{"name": "lookup", "arguments": {"hotel": h}}]) for h in ("A", "B")]
    engine = ScriptedEngine([calls[0], output(content="A costs 120."), calls[1], output(content="Not allowed.")])
    with Repository.open(tmp_path / "a.db") as repo:
        agent = AgentConfig(engine, FLOWSTATE, tools=ToolSet([lookup]))
        for query, decision, result, error in (("A?", Approval(True), {"hotel": "A", "price": 120}, None),
                                               ("B?", Approval(False, "too dear"), None,
                                                "the user did not approve this call: too dear")):
            run = RequestRun(engine=engine, repo=repo, session="s", query=query, agent=agent,
                             options=RequestOptions(approval=("lookup",)))
            waiting = run.advance()
            assert waiting is not None and list(waiting.client) == ["call_obs_r%d_s1_1" % run.index_k] and not ran[1:]
            run = restore(json.loads(json.dumps(snapshot(run))), engine=engine, repo=repo, agent=agent)
            call_id = next(iter(waiting.client))
            with pytest.raises(ValueError, match="waits on an approval"):
                run.answer({call_id: {"price": 1}})
            run.answer({call_id: decision})
            record = run.steps[-1].tool_calls[0]
            assert (record.result, record.error) == (result, error)
            assert run.advance() is None
        assert ran == ["A"]  # the refused call never ran


UNDECODABLE = {"name": "get_price", "description": "Price.", "parameters": {  # llguidance has no propertyNames
    "type": "object", "properties": {}, "propertyNames": {"pattern": "a"}}}


def test_a_grammar_is_validated_wherever_it_was_cached_first(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A snapshot's tools are checked as a new request's are, and a grammar cached unvalidated (by a restore or a
    caller that did not ask) is still checked when a request asks for the check."""
    engine = ScriptedEngine(script(), grammar=True)
    agent = AgentConfig(engine, FLOWSTATE)
    with Repository.open(tmp_path / "m.db") as repo:
        stored = json.loads(json.dumps(snapshot(start(repo, engine))))
        assert restore(stored, engine=engine, repo=repo, agent=agent).index_k == 2
        stored["tool_specs"] = [UNDECODABLE]
        with pytest.raises(ValueError, match="suspended request's tools cannot be decoded under a grammar"):
            restore(stored, engine=engine, repo=repo, agent=agent)
    specs = agent.specs([UNDECODABLE])
    assert agent.grammars(specs) is not None  # cached, not compiled
    with pytest.raises(GrammarError, match="propertyNames"):
        agent.grammars(specs, validate=True)
