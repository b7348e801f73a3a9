"""The memory methods, chosen by name: the registry names each method's module and imports it only when asked.

Families, one module each: ``state`` (flowstate, flowstate-paged, no-psa, no-isu), ``chat`` (full-context), ``retrieval`` (bm25,
mem0-style), ``tracker`` (zipact, zipact-bm25), ``reasoning`` (reasoningbank), ``mage`` (mage and its
ablations); the seam they implement is ``base``.
"""

from __future__ import annotations

import importlib
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flowstate.memory.base import Strategy

# name -> "module:attribute"
METHODS: dict[str, str] = {
    "flowstate": "flowstate.memory.state:FLOWSTATE",
    "flowstate-paged": "flowstate.memory.state:FLOWSTATE_PAGED",
    "full-context": "flowstate.memory.chat:FULL_CONTEXT",
    "no-psa": "flowstate.memory.state:NO_PSA",
    "no-isu": "flowstate.memory.state:NO_ISU",
    "bm25": "flowstate.memory.retrieval:BM25",
    "mem0-style": "flowstate.memory.retrieval:MEM0_STYLE",
    "zipact": "flowstate.memory.tracker:ZIPACT",
    "zipact-bm25": "flowstate.memory.tracker:ZIPACT_BM25",
    "reasoningbank": "flowstate.memory.reasoning:REASONINGBANK",
    "mage": "flowstate.memory.mage:MAGE",
    "mage-no-compress": "flowstate.memory.mage:MAGE_NO_COMPRESS",
    "mage-no-maintain": "flowstate.memory.mage:MAGE_NO_MAINTAIN",
    "mage-no-revise": "flowstate.memory.mage:MAGE_NO_REVISE",
}
DEFAULT = "flowstate"


def get(name: str) -> Strategy:
    """The memory method called ``name`` (unknown names list the valid ones); ``flowstate-paged:N`` is
    flowstate-paged with an index budget of N tokens."""
    base, colon, budget = name.partition(":")
    target = METHODS.get(base)
    if target is None or (colon and (base != "flowstate-paged" or not budget.isdigit() or int(budget) < 1)):
        raise ValueError(f"unknown strategy {name!r}; valid strategies: {', '.join(METHODS)} "
                         "(flowstate-paged:N: an index budget of N tokens)")
    module, _, attr = target.partition(":")
    method: Strategy = getattr(importlib.import_module(module), attr)
    return replace(method, name=name, index_budget=int(budget)) if colon else method  # type: ignore[type-var]


__all__ = ["DEFAULT", "METHODS", "get"]
