"""Every rule of Appendix B.4 as tables of accepted and rejected cases (ISU and PSA)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter

from flowstate.access import disclose, validate_access
from flowstate.active import ActiveState, Disclosed
from flowstate.nodes import Node, Ref, Relation, StateType
from flowstate.protocol import DeltaOp, FocusItem
from flowstate.update import apply_delta, validate_op

OP = TypeAdapter(DeltaOp)


def node(node_id: str, request: int, refs: tuple[tuple[str, str], ...] = (), kind: str = "state") -> Node:
    return Node(
        id=node_id, kind=kind, type=StateType.KNOWLEDGE if kind == "observation" else StateType.JUDGEMENT,
        summary=f"about {node_id}", value={"v": node_id}, refs=tuple(Ref(rel=Relation(r), state_id=t) for r, t in refs),
        request=request,
    )


# M_k after request 1: two states, two raw observations.
H_PREF = node("h_pref", 1, (("derives", "obs_r1_s1_1"),))
H_DEC = node("h_dec", 1, (("follows", "h_pref"), ("supports", "obs_r1_s2_1")))
H_OBS1 = node("obs_r1_s1_1", 1, kind="observation")
H_OBS2 = node("obs_r1_s2_1", 1, kind="observation")
HISTORY = {n.id: n for n in (H_PREF, H_DEC, H_OBS1, H_OBS2)}


class Source:
    def node(self, node_id: str) -> Node | None:
        return HISTORY.get(node_id)

    def incoming(self, node_id: str) -> list[tuple[str, str]]:
        return [(n.id, r.rel.value) for n in HISTORY.values() for r in n.refs if r.state_id == node_id]

    def disclosure(self, node_id: str) -> tuple[Node | None, list[tuple[str, str]]]:
        return self.node(node_id), self.incoming(node_id)


def base_state() -> ActiveState:
    """S_2,t: current states cur_a <- cur_b, observation obs_r2_s1_1, h_pref disclosed."""
    state = ActiveState(request=2, history_ids=frozenset(HISTORY), index_ids=frozenset({"h_pref", "h_dec"}))
    state = state.with_added(node("cur_a", 2)).with_added(node("cur_b", 2, (("derives", "cur_a"),)))
    state = state.with_disclosed(Disclosed(H_PREF))
    return state.with_observations((node("obs_r2_s1_1", 2, kind="observation"),))


def add(state_id: str, *refs: tuple[str, str]) -> dict[str, Any]:
    return {"operation": "add", "state_set": "attribute", "state_id": state_id, "summary": "s", "value": {},
            "refs": [{"rel": r, "state_id": t} for r, t in refs]}


ISU_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("add with a new id", add("new_a"), None),
    ("add reusing a current id", add("cur_a"), "already used"),
    ("add reusing an undisclosed historical id", add("h_dec"), "already used"),
    ("add reusing a disclosed historical id", add("h_pref"), "already used"),
    ("add with a reserved observation id", add("obs_mine"), "reserved"),
    ("add referencing a current state", add("new_a", ("supports", "cur_a")), None),
    ("add referencing a historical state", add("new_a", ("supersedes", "h_dec")), None),
    ("add referencing a current observation", add("new_a", ("derives", "obs_r2_s1_1")), None),
    # Eq. 5's reach: a ref may name a visible state, an id of G_k, a tool result a visible state
    # references, or an observation of this request — nothing else.
    ("add referencing a tool result a disclosed state references", add("new_a", ("supports", "obs_r1_s1_1")), None),
    ("add referencing an unreferenced historical observation", add("new_a", ("supports", "obs_r1_s2_1")),
     "out of reach"),
    ("update with an out-of-reach ref",
     {"operation": "update", "state_id": "cur_a", "refs": [{"rel": "follows", "state_id": "obs_r1_s2_1"}]},
     "out of reach"),
    ("add referencing an unknown id", add("new_a", ("supports", "ghost")), "unknown id"),
    ("add referencing itself", add("new_a", ("follows", "new_a")), "itself"),
    ("add with a duplicate ref", add("new_a", ("supports", "cur_a"), ("supports", "cur_a")), "duplicate"),
    ("update a current state", {"operation": "update", "state_id": "cur_a", "summary": "new"}, None),
    ("update a current state's refs",
     {"operation": "update", "state_id": "cur_a", "refs": [{"rel": "follows", "state_id": "h_dec"}]}, None),
    ("update with an unknown ref",
     {"operation": "update", "state_id": "cur_a", "refs": [{"rel": "follows", "state_id": "ghost"}]}, "unknown id"),
    ("update a disclosed historical state", {"operation": "update", "state_id": "h_pref", "summary": "x"},
     "historical"),
    ("update an undisclosed historical state", {"operation": "update", "state_id": "h_dec", "summary": "x"},
     "historical"),
    ("update a raw observation", {"operation": "update", "state_id": "obs_r2_s1_1", "summary": "x"}, "observation"),
    ("update an unknown state", {"operation": "update", "state_id": "ghost", "summary": "x"}, "no state"),
    ("remove an unreferenced current state", {"operation": "remove", "state_id": "cur_b"}, None),
    ("remove a current state others reference", {"operation": "remove", "state_id": "cur_a"},
     "still referenced by cur_b"),
    ("remove a historical state", {"operation": "remove", "state_id": "h_pref"}, "historical"),
    ("remove a historical observation", {"operation": "remove", "state_id": "obs_r1_s1_1"}, "observation"),
    ("remove an unknown state", {"operation": "remove", "state_id": "ghost"}, "no state"),
]


@pytest.mark.parametrize(("why", "op", "fragment"), ISU_CASES, ids=[c[0] for c in ISU_CASES])
def test_isu_rule(why: str, op: dict[str, Any], fragment: str | None) -> None:
    state = base_state()
    reason = validate_op(state, OP.validate_python(op))
    if fragment is None:
        assert reason is None
    else:
        assert reason is not None and fragment in reason
    result = apply_delta(state, (OP.validate_python(op),))
    assert len(result.committed) == (fragment is None)
    assert len(result.rejected) == (fragment is not None)
    if fragment is not None:
        assert result.state == state  # a rejected operation changes nothing


def test_refs_the_validator_accepts_are_the_refs_the_step_grammar_allows() -> None:
    from flowstate.constrain import step_ids

    state = base_state()
    allowed = set(step_ids(state).refs)
    for target in [*HISTORY, "cur_a", "cur_b", "obs_r2_s1_1", "ghost"]:
        reason = validate_op(state, OP.validate_python(add("new_x", ("supports", target))))
        assert (reason is None) == (target in allowed), target
    assert allowed == {"h_pref", "h_dec", "obs_r1_s1_1", "cur_a", "cur_b", "obs_r2_s1_1"}


def test_delta_applies_in_order() -> None:
    ops = tuple(OP.validate_python(o) for o in [
        add("x"), {"operation": "update", "state_id": "x", "summary": "changed", "value": {"k": 1}},
        add("y", ("derives", "x")), {"operation": "remove", "state_id": "y"},
        add("z", ("follows", "w")), add("w"),  # z names w before w exists
    ])
    result = apply_delta(base_state(), ops)
    assert [op.state_id for op in result.committed] == ["x", "x", "y", "y", "w"]
    assert [r.state_id for r in result.rejected] == ["z"]
    x = result.state.current_node("x")
    assert x is not None and x.summary == "changed" and x.value == {"k": 1}
    assert result.state.current_node("y") is None
    assert result.state.order[-2:] == ("x", "w")  # new entries append, removed ones vanish


def test_update_keeps_fields_left_out_and_position() -> None:
    state = base_state()
    result = apply_delta(state,
                         (OP.validate_python({"operation": "update", "state_id": "cur_a", "state_set": "artifact"}),))
    updated = result.state.current_node("cur_a")
    assert updated is not None and updated.type is StateType.ARTIFACT and updated.summary == "about cur_a"
    assert result.state.order == state.order


PSA_CASES: list[tuple[str, str, str | None]] = [
    ("a historical state listed in G_k", "h_dec", None),
    ("a raw observation referenced by a disclosed state", "obs_r1_s1_1", None),
    ("a historical state already disclosed", "h_pref", "already visible"),
    ("a current-request state", "cur_a", "already visible"),
    ("a historical observation referenced only by an undisclosed state", "obs_r1_s2_1", "not accessible"),
    ("a current observation no state references", "obs_r2_s1_1", "not accessible"),
    ("an id that does not exist", "ghost", "unknown id"),
]


@pytest.mark.parametrize(("why", "target", "fragment"), PSA_CASES, ids=[c[0] for c in PSA_CASES])
def test_psa_rule(why: str, target: str, fragment: str | None) -> None:
    accepted, refused = validate_access(base_state(), (FocusItem(target_id=target),))
    if fragment is None:
        assert accepted == (target,) and refused == ()
    else:
        assert accepted == () and len(refused) == 1
        assert refused[0].target_id == target and fragment in refused[0].reason


def test_current_observation_accessible_once_a_state_references_it() -> None:
    state = base_state()
    state = apply_delta(state, (OP.validate_python(add("kn_x", ("derives", "obs_r2_s1_1"))),)).state
    accepted, refused = validate_access(state, (FocusItem(target_id="obs_r2_s1_1"),))
    assert accepted == ("obs_r2_s1_1",) and refused == ()


def test_same_target_twice_is_one_access() -> None:
    accepted, refused = validate_access(base_state(), (FocusItem(target_id="h_dec"), FocusItem(target_id="h_dec")))
    assert accepted == ("h_dec",) and refused == ()


def test_disclose_gives_content_and_relations_not_neighbours() -> None:
    state = disclose(Source(), base_state(), ("h_dec",))
    entry = state.entries()[-1]
    assert isinstance(entry, Disclosed) and entry.node == H_DEC
    # its relations name obs_r1_s2_1, which becomes accessible; its content is not disclosed
    assert "obs_r1_s2_1" in state.tool_refs()
    assert "obs_r1_s2_1" not in state.visible_ids()
    accepted, _ = validate_access(state, (FocusItem(target_id="obs_r1_s2_1"),))
    assert accepted == ("obs_r1_s2_1",)


def test_disclose_reports_incoming_relations() -> None:
    state = disclose(Source(), base_state(), ("obs_r1_s2_1",))
    entry = state.entries()[-1]
    assert isinstance(entry, Disclosed) and entry.incoming == (("h_dec", "supports"),)
