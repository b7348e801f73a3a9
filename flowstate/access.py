"""Progressive State Access: Validate_acc and Disclose with the rules of Appendix B.4.

An access is admissible iff its target is in IDs(G_k) ∪ ToolRefs(S_k,t) and not already
visible. Validation runs against S_k,t (before this step's delta), so a ref added in the same
step makes a tool result accessible only from the next step, and disclosed content is first
visible in the next prompt. Disclosure gives the target's content and its relations (types and
ids only), never a neighbour's content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from flowstate.active import ActiveState, Disclosed
from flowstate.nodes import Node
from flowstate.protocol import FocusItem


class HistorySource(Protocol):
    """Read access to M_k of one session."""

    def node(self, node_id: str) -> Node | None: ...

    def incoming(self, node_id: str) -> list[tuple[str, str]]: ...

    def disclosure(self, node_id: str) -> tuple[Node | None, list[tuple[str, str]]]:
        """The node and the relations that point at it, at once (one read of the repository)."""
        ...


@dataclass(frozen=True)
class Refused:
    """An access request excluded from the validated access set, and why."""

    target_id: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"target_id": self.target_id, "reason": self.reason}


def validate_access(state: ActiveState, focus: tuple[FocusItem, ...]) -> tuple[tuple[str, ...], tuple[Refused, ...]]:
    """R̂ = R ∩ (IDs(G_k) ∪ ToolRefs(S)) minus what is already visible; the rest refused with reasons."""
    allowed = state.index_ids | state.tool_refs()
    visible = state.visible_ids()
    accepted: list[str] = []
    refused: list[Refused] = []
    for item in focus:
        target = item.target_id
        if target in accepted:
            continue  # the same target twice in one step is one access
        if target in visible:
            refused.append(Refused(target, "already visible in the Active State; do not request it again"))
        elif target in allowed:
            accepted.append(target)
        elif (page := state.page_listing(target)) is not None:
            refused.append(Refused(target, f"listed in {page.id} of the index: request {page.id} first"))
        elif target in state.history_ids or state.observation(target) is not None:
            refused.append(
                Refused(target,
                        "not accessible: neither in the Historical State Index nor referenced by an Active State entry")
            )
        else:
            refused.append(Refused(target, "unknown id"))
    return tuple(accepted), tuple(refused)


def disclose(source: HistorySource, state: ActiveState, targets: tuple[str, ...]) -> ActiveState:
    """Add the validated targets' contents and relations to the state."""
    for target in targets:
        node: Node | None = state.observation(target) or state.page(target)
        incoming: list[tuple[str, str]] = []  # nothing stored points at a result of this request yet
        if node is None:
            node, incoming = source.disclosure(target)
        if node is None:  # validated ids always resolve; a miss means the repository changed underneath
            raise LookupError(f"validated access target {target!r} not found")
        state = state.with_disclosed(Disclosed(node, tuple(incoming)))
    return state
