"""Incremental State Update: Validate_upd and Commit with the rules of Appendix B.4.

Operations apply in order; each is validated against the state as committed so far in the
delta, so a delta may add a state and then refer to it. A rejected operation is returned with
its reason (fed back to the model), never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowstate.active import ActiveState
from flowstate.nodes import OBSERVATION_PREFIX, PAGE_PREFIX, Node, Ref
from flowstate.protocol import AddOp, DeltaOp, RemoveOp, UpdateOp, dump_op


@dataclass(frozen=True)
class Rejected:
    """An operation excluded from the validated delta, and why."""

    operation: str
    state_id: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"operation": self.operation, "state_id": self.state_id, "reason": self.reason}


@dataclass(frozen=True)
class UpdateResult:
    state: ActiveState
    committed: tuple[DeltaOp, ...]
    rejected: tuple[Rejected, ...]

    def committed_dicts(self) -> list[dict[str, Any]]:
        return [dump_op(op) for op in self.committed]


def _check_refs(state: ActiveState, source: str, refs: tuple[Ref, ...]) -> str | None:
    seen: set[tuple[str, str]] = set()
    for ref in refs:
        if ref.state_id == source:
            return "a state cannot reference itself"
        if (ref.rel.value, ref.state_id) in seen:
            return f"duplicate ref {ref.rel.value} -> {ref.state_id}"
        seen.add((ref.rel.value, ref.state_id))
        if ref.state_id not in state.ref_targets():
            if not state.is_used(ref.state_id):
                return f"ref to unknown id {ref.state_id!r} (refs must name an existing state or tool result)"
            return (
                f"ref to {ref.state_id!r}, which is out of reach: a ref may name a visible state, an id of the "
                "Historical State Index, a tool result a visible state references, or a tool result of this request"
            )
    return None


def _check_own(state: ActiveState, node_id: str, verb: str) -> str | None:
    """Update and Remove only touch states created in the current request."""
    if state.current_node(node_id) is not None:
        return None
    if node_id.startswith(OBSERVATION_PREFIX) and (node_id in state.history_ids or state.observation(node_id)):
        return f"{node_id} is a raw tool observation; observations cannot be {verb}d"
    if node_id in state.history_ids:
        return (
            f"{node_id} is a historical state; historical states cannot be {verb}d "
            "(add a new state that supersedes it)"
        )
    return f"no state {node_id!r} was created in this request"


def validate_op(state: ActiveState, op: DeltaOp) -> str | None:
    """The reason ``op`` violates the execution rules against ``state``, or None if admissible."""
    if isinstance(op, AddOp):
        if op.state_id.startswith(OBSERVATION_PREFIX):
            return f"ids starting with {OBSERVATION_PREFIX!r} are reserved for tool observations"
        if op.state_id.startswith(PAGE_PREFIX):  # a later fold may name a page so: the state would be unreachable
            return f"ids starting with {PAGE_PREFIX!r} are reserved for pages of the index"
        if state.is_used(op.state_id):
            return f"id {op.state_id!r} is already used in this session; choose a new id"
        return _check_refs(state, op.state_id, op.refs)
    if isinstance(op, UpdateOp):
        reason = _check_own(state, op.state_id, "update")
        if reason is None and op.refs is not None:
            reason = _check_refs(state, op.state_id, op.refs)
        return reason
    reason = _check_own(state, op.state_id, "remove")
    if reason is None:
        referrers = [i for i in state.referrers(op.state_id) if i != op.state_id]
        if referrers:
            return f"{op.state_id} is still referenced by {', '.join(referrers)}; update or remove them first"
    return reason


def commit_op(state: ActiveState, op: DeltaOp) -> ActiveState:
    """Apply an already validated operation."""
    if isinstance(op, AddOp):
        node = Node(
            id=op.state_id, type=op.state_set, summary=op.summary, value=op.value, refs=op.refs, request=state.request
        )
        return state.with_added(node)
    if isinstance(op, UpdateOp):
        old = state.current_node(op.state_id)
        assert old is not None, "commit_op called with an unvalidated update"
        changes: dict[str, Any] = {}
        if op.state_set is not None:
            changes["type"] = op.state_set
        if op.summary is not None:
            changes["summary"] = op.summary
        if op.value is not None:
            changes["value"] = op.value
        if op.refs is not None:
            changes["refs"] = op.refs
        return state.with_replaced(old.model_copy(update=changes))
    assert isinstance(op, RemoveOp)
    return state.with_removed(op.state_id)


def apply_delta(state: ActiveState, delta: tuple[DeltaOp, ...]) -> UpdateResult:
    """Validate_upd then Commit, operation by operation: S+ with what was committed and rejected."""
    committed: list[DeltaOp] = []
    rejected: list[Rejected] = []
    for op in delta:
        reason = validate_op(state, op)
        if reason is None:
            state = commit_op(state, op)
            committed.append(op)
        else:
            rejected.append(Rejected(op.operation, op.state_id, reason))
    return UpdateResult(state, tuple(committed), tuple(rejected))
