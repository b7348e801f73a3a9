"""Protocol limits as one configuration: profiles, the automatic choice, and a real-agent-sized run."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from engine.base import Capabilities
from engine.scripted import ScriptedEngine
from flowstate import Agent, LoopConfig, Repository
from flowstate.limits import COMPACT, STANDARD, for_engine, get
from grammars.check import accepts
from tests.helpers import add, output


class Embedded(ScriptedEngine):
    """The scripted engine as the embedded tiny model declares itself (the compact profile fits it)."""

    capabilities = Capabilities(grammar=True, embedded=True)


def recorder(outputs: Sequence[str] = (), embedded: bool = False) -> ScriptedEngine:
    """Scripted outputs through an engine that takes grammars (each call's grammar in ``calls``)."""
    return Embedded(outputs) if embedded else ScriptedEngine(outputs, grammar=True)


def grammars(engine: ScriptedEngine) -> list[str | None]:
    return [c["grammar"] for c in engine.calls]


def test_profiles_and_the_automatic_choice() -> None:
    assert STANDARD.content >= 16_000 and STANDARD.ops >= 16 and STANDARD.tool_calls >= 8
    assert STANDARD.focus >= 8 and STANDARD.refs >= 8 and STANDARD.tool_text is None
    assert for_engine(recorder(embedded=True)) is COMPACT
    assert for_engine(recorder()) is STANDARD
    assert for_engine(recorder(embedded=True), "standard") is STANDARD
    with pytest.raises(ValueError, match="valid profiles: standard, compact, auto"):
        get("huge")


def test_the_prompt_states_the_profile_it_runs_under() -> None:
    with Repository.open(":memory:") as repo:
        standard = Agent(recorder(), repository=repo, session="a").system
        compact = Agent(recorder(embedded=True), repository=repo, session="b").system
    assert "final answer ≤ 16000 characters" in standard and "at most 16 state operations" in standard
    assert "final answer ≤ 480 characters" in compact and "at most 4 state operations" in compact


LONG_ANSWER = "The itinerary, leg by leg. " * 111  # 2,997 characters
NESTED = {"legs": [{"from": "LIS", "to": "OPO", "stops": [{"at": "Coimbra", "minutes": 40}]},
                   {"from": "OPO", "to": "MAD", "stops": []}], "budget": {"total": 1200, "currency": "EUR"}}


def test_a_real_agent_sized_run_passes_under_the_default_profile_and_its_grammar_admits_it() -> None:
    script = [
        output(delta=[add("plan_trip", "artifact", **NESTED), add("pref_budget", "preference", total=1200)]),
        output(delta=[{"operation": "update", "state_id": "plan_trip", "summary": "s" * 300}], content=LONG_ANSWER),
    ]
    engine = recorder(script)
    with Repository.open(":memory:") as repo:
        record = Agent(engine, repository=repo, session="trip").run("Plan the trip")
        assert record.response == LONG_ANSWER and len(LONG_ANSWER) >= 2_990
        assert repo.node("trip", "plan_trip").value == NESTED  # type: ignore[union-attr]
    assert all(s.protocol_error is None and not s.malformed and not s.rejected for s in record.steps)
    for text, grammar in zip(script, grammars(engine), strict=True):
        assert grammar is not None and accepts(grammar, text)


def test_the_compact_profile_refuses_what_the_standard_one_admits() -> None:
    engine = recorder([output(content=LONG_ANSWER), output(delta=[add("plan_trip", **NESTED)]),
                       output(content="short")])
    with Repository.open(":memory:") as repo:
        record = Agent(engine, repository=repo, session="c", config=LoopConfig(limits=COMPACT)).run("q")
    assert record.steps[0].protocol_error is not None and "480" in record.steps[0].protocol_error["message"]
    assert "value" in record.steps[1].malformed[0]["reason"]
    assert not accepts(grammars(engine)[0] or "", output(content=LONG_ANSWER))


def test_the_prompt_states_only_the_limits_of_the_blocks_in_use() -> None:
    from flowstate.limits import STANDARD

    full = STANDARD.describe()
    assert "16 state operations" in full and "8 focus items" in full and "refs per state" in full
    two = STANDARD.describe(("tool_calls", "assistant_message"))
    assert two == "Per step at most 8 tool calls; final answer ≤ 16000 characters. Keep outputs short."
    isu = STANDARD.describe(("state_delta", "tool_calls", "assistant_message"))
    assert "focus items" not in isu and "reasons" not in isu and "summaries ≤ 400 characters" in isu
