"""Property: random deltas and accesses, through the real loop and repository, never commit a
violation of B.4, never reject an admissible operation, and never change a historical node.
Malformed items mixed in (not valid operations at all) are excluded alone: the good ones around
them commit exactly as if the bad ones were not there.

An independent oracle re-derives, from the raw outputs alone, what the rules admit.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.scripted import ScriptedEngine
from flowstate import Agent, LoopConfig, Repository, RequestFailed
from flowstate.parse import parse_output
from flowstate.protocol import AddOp, UpdateOp
from tests.helpers import output

IDS = ["a", "b", "c", "d", "obs_r1_s1_1", "obs_r2_s1_1", "obs_r2_s2_1", "obs_r1_s2_1", "ghost", "obs_x"]
RELS = ["supports", "derives", "follows", "supersedes"]

ids = st.sampled_from(IDS)
refs = st.lists(st.fixed_dictionaries({"rel": st.sampled_from(RELS), "state_id": ids}), max_size=2)
ops = st.one_of(
    st.fixed_dictionaries({"operation": st.just("add"), "state_set": st.sampled_from(["preference", "judgement"]),
                           "state_id": ids, "summary": st.just("s"), "value": st.just({}), "refs": refs}),
    st.fixed_dictionaries({"operation": st.just("update"), "state_id": ids, "summary": st.just("u")},
                          optional={"refs": refs}),
    st.fixed_dictionaries({"operation": st.just("remove"), "state_id": ids}),
)
MALFORMED = [
    {"operation": "upsert", "state_id": "a"},
    {"operation": "add", "state_set": "opinion", "state_id": "a", "summary": "s", "value": {}, "refs": []},
    {"operation": "add", "state_id": "a"},
    {"operation": "update", "state_id": "Not An Id"},
    {"operation": "add", "state_set": "judgement", "state_id": "a", "summary": "s", "value": {},
     "refs": [{"rel": "causes", "state_id": "b"}]},
    "remove a",
    None,
]
ops = st.one_of(ops, ops, st.sampled_from(MALFORMED))
ADD_A = {"operation": "add", "state_set": "judgement", "state_id": "a", "summary": "s", "value": {},
         "refs": [{"rel": "derives", "state_id": "obs_r1_s1_1"}]}
steps = st.tuples(st.lists(ids, max_size=2), st.lists(ops, max_size=3), st.booleans())
requests = st.lists(st.lists(steps, min_size=1, max_size=3), min_size=1, max_size=3)


def echo() -> str:
    """Return a constant."""
    return "seen"


def raw(focus: list[str], delta: list[Any], call: bool) -> str:
    """The four blocks as a model writes them, malformed items included (no validation on the way)."""
    blocks = {"state_focus": [{"target_id": f, "reason": "r"} for f in focus], "state_delta": delta,
              "tool_calls": [{"name": "echo", "arguments": {}}] if call else [], "assistant_message": {"content": None}}
    return "\n".join(f"<{k}>\n{json.dumps(v)}\n</{k}>" for k, v in blocks.items())


def script(plan: list[list[tuple[list[str], list[Any], bool]]]) -> list[str]:
    texts = []
    for request in plan:
        for focus, delta, call in request:
            texts.append(raw(focus, delta, call))
        texts.append(output(content="done"))
    return texts


class Oracle:
    """The rules of B.4, restated over plain dicts for one request."""

    def __init__(self, history: dict[str, list[str]], index_ids: set[str]) -> None:
        self.history = history  # id -> ref targets, all of M_k
        self.index_ids = index_ids
        self.current: dict[str, list[str]] = {}
        self.disclosed: set[str] = set()
        self.observations: set[str] = set()

    def known(self, node_id: str) -> bool:
        return node_id in self.history or node_id in self.current or node_id in self.observations

    def reachable(self, node_id: str) -> bool:
        """Eq. 5's reach for refs: visible, listed in G_k, referenced by a visible state, or observed now."""
        visible = set(self.current) | self.disclosed
        return node_id in visible | self.index_ids | self.accessible() | self.observations

    def admissible(self, op: Any) -> bool:
        targets = [r.state_id for r in (op.refs or ())] if isinstance(op, AddOp | UpdateOp) else []
        pairs = [(r.rel, r.state_id) for r in (op.refs or ())] if isinstance(op, AddOp | UpdateOp) else []
        refs_ok = all(self.reachable(t) and t != op.state_id for t in targets) and len(set(pairs)) == len(pairs)
        if isinstance(op, AddOp):
            return not op.state_id.startswith("obs_") and not self.known(op.state_id) and refs_ok
        if op.state_id not in self.current:
            return False
        if isinstance(op, UpdateOp):
            return refs_ok
        return not any(op.state_id in t for i, t in self.current.items() if i != op.state_id)

    def apply(self, op: Any) -> None:
        if isinstance(op, AddOp):
            self.current[op.state_id] = [r.state_id for r in op.refs]
        elif isinstance(op, UpdateOp):
            if op.refs is not None:
                self.current[op.state_id] = [r.state_id for r in op.refs]
        else:
            del self.current[op.state_id]

    def accessible(self) -> set[str]:
        visible_refs = [t for refs in self.current.values() for t in refs]
        visible_refs += [t for d in self.disclosed for t in self.history.get(d, [])]
        return self.index_ids | {t for t in visible_refs if t.startswith("obs_")}


def _delta(text: str) -> list[Any]:
    body: list[Any] = json.loads(text.split("<state_delta>")[1].split("</state_delta>")[0])
    return body


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests)
@example([  # request 2 refs request 1's tool result without disclosing the state that references it: out of reach
    [([], [], True), ([], [ADD_A, MALFORMED[0]], False)],
    [([], [{**ADD_A, "state_id": "b"}], False), (["a"], [], False), ([], [{**ADD_A, "state_id": "c"}], False)],
])
def test_random_outputs_never_violate_the_rules(plan: list[list[tuple[list[str], list[dict[str, Any]], bool]]]) -> None:
    repo = Repository.open(":memory:")
    agent = Agent(ScriptedEngine(script(plan)), repository=repo, session="p", tools=[echo],
                  config=LoopConfig(max_steps=10, max_protocol_errors=10))
    for _ in plan:
        before = repo.nodes("p")
        oracle = Oracle({n.id: [r.state_id for r in n.refs] for n in before},
                        {n.id for n in before if not n.is_observation})
        try:
            record = agent.run("q")
        except RequestFailed:  # not expected: every request ends with a final answer
            raise
        for step in record.steps:
            if step.protocol_error is not None:
                continue
            parsed = parse_output(step.raw)
            # PSA: validated against S_k,t, before this step's delta
            allowed = oracle.accessible()
            visible = set(oracle.current) | oracle.disclosed
            for target in step.disclosed:
                assert target in allowed and target not in visible
            expected_disclosed = list(dict.fromkeys(f.target_id for f in parsed.state_focus
                                                    if f.target_id in allowed - visible))
            assert step.disclosed == expected_disclosed
            # ISU: sequential, every admissible op committed, every other rejected
            assert len(step.malformed) == sum(1 for op in _delta(step.raw) if op in MALFORMED)
            committed, rejected = [], []
            for op in parsed.state_delta:
                if oracle.admissible(op):
                    oracle.apply(op)
                    committed.append(op.state_id)
                else:
                    rejected.append(op.state_id)
            assert [c["state_id"] for c in step.committed] == committed
            assert [r["state_id"] for r in step.rejected] == rejected
            oracle.disclosed |= set(step.disclosed)
            oracle.observations |= {c.observation_id for c in step.tool_calls}
        after = repo.nodes("p")
        assert after[: len(before)] == before  # history never changes
        new_states = [n.id for n in after[len(before):] if not n.is_observation]
        assert sorted(new_states) == sorted(oracle.current)
        for n in after:  # every persisted ref resolves inside the session
            assert all(any(m.id == r.state_id for m in after) for r in n.refs)
    repo.close()
