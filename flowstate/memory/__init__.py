"""The memory methods, chosen by name: the registry names each method's module and imports it only when asked.

Families, one module each: ``state`` (flowstate, flowstate-paged, flowstate-facts, no-psa, no-isu), ``lean``
(flowstate-lean: the paper's states, written and carried where they pay), ``chat``
(full-context), ``retrieval`` (bm25, mem0-style), ``tracker`` (zipact, zipact-bm25), ``reasoning`` (reasoningbank),
``mage`` (mage and its ablations); the seam they implement is ``base``.
"""

from __future__ import annotations

import importlib
from dataclasses import fields, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.embeddings import Embedder
    from flowstate.memory.base import Strategy

# name -> "module:attribute"
METHODS: dict[str, str] = {
    "flowstate": "flowstate.memory.state:FLOWSTATE",
    "flowstate-paged": "flowstate.memory.state:FLOWSTATE_PAGED",
    "flowstate-facts": "flowstate.memory.state:FLOWSTATE_FACTS",
    "flowstate-lean": "flowstate.memory.lean:FLOWSTATE_LEAN",
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
EMBEDDING = ("mem0-style", "reasoningbank")  # the methods whose sources rank by embeddings (--embed)
STATE_METHODS = ("flowstate", "flowstate-paged", "flowstate-facts", "no-psa", "no-isu")
PARAMETERS = {"flowstate-paged": ("index_budget", 1), "flowstate-lean": ("crossover", 0)}
"""Methods named with a number (``NAME:N``): the field it sets, and its least value."""


APPEND = "+append"
"""A state method's name with this suffix is that method in the request-local append-only layout
(``flowstate.memory.append``): ``flowstate+append``, ``flowstate-paged:N+append``."""
LAYOUTS = ("latest", "append")


def get(name: str) -> Strategy:
    """The memory method called ``name`` (unknown names list the valid ones); ``flowstate-paged:N`` is
    flowstate-paged with an index budget of N tokens, ``flowstate-lean:N`` flowstate-lean sending states past N
    earlier requests; ``+append`` a state method in the append-only layout."""
    stem = name[: -len(APPEND)] if name.endswith(APPEND) else name
    base, colon, number = stem.partition(":")
    target = METHODS.get(base)
    field, least = PARAMETERS.get(base, ("", 0))
    if target is None or (colon and (not field or not number.isdigit() or int(number) < least)):
        raise ValueError(f"unknown strategy {name!r}; valid strategies: {', '.join(METHODS)} "
                         f"(flowstate-paged:N: an index budget of N tokens; flowstate-lean:N: states past N earlier "
                         f"requests; {APPEND}: a state method, {', '.join(STATE_METHODS)}, in the append-only layout)")
    if stem != name and base not in STATE_METHODS:
        raise ValueError(f"{name!r}: the append-only layout ({APPEND}) is a layout of the state methods "
                         f"({', '.join(STATE_METHODS)}); {base} lays out its own prompt")
    module, _, attr = target.partition(":")
    method: Strategy = getattr(importlib.import_module(module), attr)
    changes: dict[str, object] = {"name": name} if stem != base or stem != name else {}
    if colon:
        changes[field] = int(number)
    if stem != name:
        changes["layout"] = "append"
    return replace(method, **changes) if changes else method  # type: ignore[type-var]


def embedded(strategy: Strategy, embedder: Embedder | None) -> Strategy:
    """``strategy`` ranking by ``embedder``'s vectors where its source embeds (``EMBEDDING``); else as it is."""
    if embedder is None or "ranker" not in {f.name for f in fields(strategy)}:  # type: ignore[arg-type]
        return strategy
    from flowstate.memory.ranking import Embeddings

    return replace(strategy, ranker=Embeddings(embedder))  # type: ignore[type-var]


def laid_out(names: tuple[str, ...], layout: str) -> tuple[str, ...]:
    """Strategy names in ``layout`` (``--layout``): ``append`` moves every state method into the append-only layout
    (other methods keep their own); it is refused where no state method is named."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; valid layouts: {', '.join(LAYOUTS)}")
    if layout == "latest":
        return names
    state = [n for n in names if n.partition(":")[0] in STATE_METHODS]
    if not state:
        raise ValueError(f"--layout append is a layout of the state methods ({', '.join(STATE_METHODS)}); none of "
                         f"{', '.join(names)} is one")
    return tuple(n + APPEND if n in state and not n.endswith(APPEND) else n for n in names)


__all__ = ["APPEND", "DEFAULT", "EMBEDDING", "LAYOUTS", "METHODS", "PARAMETERS", "STATE_METHODS", "embedded", "get",
           "laid_out"]
