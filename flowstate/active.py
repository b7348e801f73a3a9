"""The Active State S_k,t: this request's states, disclosed historical states, and the request's observations."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from flowstate.nodes import OBSERVATION_PREFIX, Node


@dataclass(frozen=True)
class Disclosed:
    """A historical state or raw observation disclosed by PSA: its content and its relations (ids only)."""

    node: Node
    incoming: tuple[tuple[str, str], ...] = ()  # (source id, relation) of relations pointing at it


@dataclass(frozen=True)
class ActiveState:
    """S_k,t, immutable: every operation returns a new value.

    ``order`` lists the visible ids in the order they entered the state (current and disclosed
    interleaved), so new entries append and the rendering keeps a stable prefix.
    ``history_ids`` are all node ids of M_k; ``index_ids`` those listed in G_k.
    """

    request: int
    history_ids: frozenset[str] = frozenset()
    index_ids: frozenset[str] = frozenset()
    current: tuple[Node, ...] = ()
    disclosed: tuple[Disclosed, ...] = ()
    observations: tuple[Node, ...] = ()  # raw tool results of this request so far (O_k)
    order: tuple[str, ...] = field(default=())
    pages: tuple[Node, ...] = ()  # a bounded index's pages (``flowstate.pages``), disclosable like states

    # -- lookups ---------------------------------------------------------------------------

    def current_node(self, node_id: str) -> Node | None:
        return next((n for n in self.current if n.id == node_id), None)

    def observation(self, node_id: str) -> Node | None:
        return next((n for n in self.observations if n.id == node_id), None)

    def page(self, node_id: str) -> Node | None:
        return next((n for n in self.pages if n.id == node_id), None)

    def page_listing(self, node_id: str) -> Node | None:
        """The innermost page whose lines list ``node_id``, if a page does."""
        return next((p for p in reversed(self.pages) if node_id in p.value["listed"]), None)

    def visible_ids(self) -> frozenset[str]:
        return frozenset(self.order)

    def is_used(self, node_id: str) -> bool:
        """An id is used if any node of the session (historical, current or observation) has it."""
        return (
            node_id in self.history_ids
            or self.current_node(node_id) is not None
            or self.observation(node_id) is not None
            or self.page(node_id) is not None
        )

    def tool_refs(self) -> frozenset[str]:
        """ToolRefs(S): ids of raw tool results referenced by states in the Active State."""
        nodes = [*self.current, *(d.node for d in self.disclosed)]
        return frozenset(
            ref.state_id for n in nodes for ref in n.refs if ref.state_id.startswith(OBSERVATION_PREFIX)
        )

    def ref_targets(self) -> frozenset[str]:
        """What a ref may name (Eq. 5's reach): a visible state, an id of G_k, a tool result that a visible
        state references, or an observation of this request."""
        reach = self.visible_ids() | self.index_ids | self.tool_refs() | {o.id for o in self.observations}
        return reach - {p.id for p in self.pages}  # a page is a view of the index, not a state

    def referrers(self, node_id: str) -> list[str]:
        """Current-request states whose refs point at ``node_id``."""
        return [n.id for n in self.current if any(r.state_id == node_id for r in n.refs)]

    def entries(self) -> list[Node | Disclosed]:
        """The visible entries in order."""
        by_id: dict[str, Node | Disclosed] = {n.id: n for n in self.current}
        by_id.update({d.node.id: d for d in self.disclosed})
        return [by_id[i] for i in self.order]

    # -- transitions -----------------------------------------------------------------------

    def with_added(self, node: Node) -> ActiveState:
        return replace(self, current=(*self.current, node), order=(*self.order, node.id))

    def with_replaced(self, node: Node) -> ActiveState:
        return replace(self, current=tuple(node if n.id == node.id else n for n in self.current))

    def with_removed(self, node_id: str) -> ActiveState:
        return replace(
            self,
            current=tuple(n for n in self.current if n.id != node_id),
            order=tuple(i for i in self.order if i != node_id),
        )

    def with_disclosed(self, item: Disclosed) -> ActiveState:
        """``item`` in view; a disclosed page adds the ids its lines list to those of the index."""
        index = self.index_ids | frozenset(item.node.value["listed"]) if self.page(item.node.id) else self.index_ids
        return replace(self, disclosed=(*self.disclosed, item), order=(*self.order, item.node.id), index_ids=index)

    def with_observations(self, nodes: tuple[Node, ...]) -> ActiveState:
        return replace(self, observations=(*self.observations, *nodes))
