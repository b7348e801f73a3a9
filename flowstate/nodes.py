"""The state model: five state types, four relations, nodes and raw tool observations."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

ID_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"
"""Shape of every node id: a short lowercase semantic name, e.g. ``dec_book_hotel_a``."""

OBSERVATION_PREFIX = "obs_"
PAGE_PREFIX = "page_"  # a bounded index's pages (flowstate.pages): no state may take such an id
"""Ids with this prefix are reserved for raw tool observations, named by the runtime."""



class StateType(str, Enum):
    """Source and role of a state (paper Appendix B.2)."""

    PREFERENCE = "preference"  # user requirements, constraints, preferences
    KNOWLEDGE = "knowledge"  # observations recorded from tool outputs
    ATTRIBUTE = "attribute"  # entity properties distilled from tool outputs
    JUDGEMENT = "judgement"  # goals, plans, decisions, risks
    ARTIFACT = "artifact"  # reusable outputs produced by the agent


class Relation(str, Enum):
    """A directed edge from the state that declares it (source) to ``state_id`` (target)."""

    SUPPORTS = "supports"
    DERIVES = "derives"
    FOLLOWS = "follows"
    SUPERSEDES = "supersedes"


class Ref(BaseModel):
    """One outgoing relation of a state."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rel: Relation
    state_id: str = Field(pattern=ID_PATTERN)


class Node(BaseModel):
    """A node of the repository: a model-made state, or a raw tool observation (``kind='observation'``).

    An observation's ``value`` is ``{"tool", "arguments", "result"}``; its type is knowledge.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: str = "state"
    type: StateType
    summary: str
    value: Any
    refs: tuple[Ref, ...] = ()
    request: int = Field(ge=1, description="index of the request that created the node")
    # the declared kind of a memory method's own node (e.g. "mage.summary"), which no model output can write;
    # None for the model's states and raw observations
    mark: str | None = None

    @property
    def is_observation(self) -> bool:
        return self.kind == "observation"


def observation_id(request: int, step: int, call: int) -> str:
    """The id of the ``call``-th tool result of ``step`` in ``request`` (all 1-based)."""
    return f"{OBSERVATION_PREFIX}r{request}_s{step}_{call}"


def json_depth(value: Any) -> int:
    """How deeply a JSON value nests (a scalar: 0), without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            todo.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


def canonical_json(obj: Any) -> str:
    """Deterministic compact JSON: sorted keys, fixed separators, UTF-8 kept as is."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
