"""The state methods: FlowState and its ablations (paper §3.1, B.5); full context is ``chat``.

- ``flowstate``: ISU + PSA — the model keeps typed states; earlier requests are reached through
  the Historical State Index and disclosed on demand.
- ``flowstate-paged``: FlowState with a bounded index (``flowstate.pages``): older requests folded into pages
  that PSA discloses, so the index stays under a budget however long the session (``flowstate-paged:N``).
- ``no-psa``: ISU, but every historical state's full content inline from the start; no index,
  no access (three blocks: no state_focus).
- ``no-isu``: PSA over states built by fixed rules when a request ends (one node holding the
  final response, linked to that request's raw tool results); the model makes no states
  (three blocks: no state_delta) and sees all of this request's tool results.
- ``flowstate-facts``: FlowState where the system writes the knowledge: each tool result, once it is in,
  becomes a knowledge state by rule (``fact_…``, its summary the call and its result, citing the raw result);
  the model adds what only it can — preferences, judgements, attributes, artifacts — and the relations. A variant
  measured beside the paper's ISU (where writing states is what a small model fails at, or what costs decode),
  never in its place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.base import Message
from flowstate import tags
from flowstate.access import disclose
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex, build_index
from flowstate.limits import COMPACT, STANDARD, Limits, clip, fit
from flowstate.memory.append import APPEND_RULE, appended
from flowstate.memory.base import MemoryContext, Observed, Start, StepInput, Strategy
from flowstate.nodes import OBSERVATION_PREFIX, Node, Ref, Relation, StateType, canonical_json
from flowstate.pages import BoundedIndex, fold
from flowstate.protocol import BLOCKS
from flowstate.serializer import PAGES_RULE, layout, memory_rules, system_prompt
from flowstate.store.repository import SessionView


@dataclass(frozen=True)
class StateStrategy(Strategy):
    """FlowState and its ablations: typed states, and the index or every state inline."""

    name: str
    blocks: tuple[str, ...]
    history: Literal["index", "inline"]
    trajectory: bool = False  # all of this request's tool results stay in view
    rule_states: bool = False  # Persist builds one state per request by fixed rules
    index_budget: int | None = None  # a bounded index: older requests folded into pages to stay under it (tokens)
    layout: Literal["latest", "append"] = "latest"  # append: each call extends the previous one (memory.append)
    facts: bool = False  # each tool result becomes a knowledge state by rule, as it comes in

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        memory = memory_rules(self.blocks, trajectory=self.trajectory)
        if self.index_budget is not None:
            memory += "\n" + PAGES_RULE
        if self.layout == "append":
            memory += "\n" + APPEND_RULE
        if self.facts:
            memory += "\n" + FACTS_RULE
        return system_prompt(tools, policy, self.blocks, memory, limits)

    def start(self, session: SessionView) -> Start:
        requests = session.requests()
        history = session.nodes()
        k = len(requests) + 1
        index = build_index(requests, history) if self.history == "index" else HistoricalIndex()
        if self.index_budget is not None:
            index = fold(index, self.index_budget)
        pages = index.pages() if isinstance(index, BoundedIndex) else ()
        state = ActiveState(request=k, history_ids=frozenset(n.id for n in history), index_ids=index.ids(), pages=pages)
        memory: tuple[str, str] | None = None
        if self.history == "index":
            memory = (tags.HISTORICAL_INDEX, index.render())
        else:  # inline: every historical state disclosed before the first step
            state = disclose(session, state, tuple(n.id for n in history if not n.is_observation))
        return Start(k, index, state, memory)

    def prompt(self, step: StepInput) -> list[Message]:
        if self.layout == "append":
            return appended(step)
        user = layout(step.query, memory=step.start.memory, state=step.state,
                      trajectory=step.trajectory if self.trajectory else None, feedback=step.feedback,
                      observation=step.observation)
        return [Message("system", step.system), Message("user", user)]

    def observed(self, ctx: MemoryContext) -> Observed:
        """flowstate-facts: each new tool result (not an error) recorded as a knowledge state citing it."""
        if not self.facts:
            return Observed()
        state = ctx.state
        for obs in ctx.observation:
            if "result" in obs.value and not state.is_used(fact_id(obs.id)):
                state = state.with_added(fact_node(obs, ctx.limits))
        return Observed(state=state)

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        """Persist's selection of nodes for M_{k+1} (``response`` None: the request ended unfinished)."""
        if self.rule_states:
            return [*state.observations, response_node(state, response)]
        referenced = {ref.state_id for n in state.current for ref in n.refs}
        return [*(o for o in state.observations if o.id in referenced), *state.current]


def response_node(state: ActiveState, response: str | None) -> Node:
    """no-isu's rule-built state: the final response, deriving from every tool result of the request."""
    summary = f"final response: {response}" if response is not None else "unfinished: no final response"
    return Node(
        id=f"response_r{state.request}", mark="no-isu.response", type=StateType.ARTIFACT,
        summary=clip(summary, COMPACT.text),  # an index line stays short whatever the profile
        value={"response": response}, request=state.request,
        refs=tuple(Ref(rel=Relation.DERIVES, state_id=o.id) for o in state.observations),
    )


FACTS_RULE = ("- The system records each tool result as a knowledge state (fact_ ids, citing the result): do not "
              "restate results; add what only you know — the user's preferences, your judgements, attributes, "
              "artifacts — with relations to the facts.")


def fact_id(observation_id: str) -> str:
    return "fact_" + observation_id.removeprefix(OBSERVATION_PREFIX)


def fact_node(obs: Node, limits: Limits) -> Node:
    """flowstate-facts' rule-built state of one tool result: the call and its result as the summary (cut to the
    index's line length), the result as the value (cut to what a state's value may hold), supported by the raw
    observation."""
    result = canonical_json(obs.value["result"])
    return Node(id=fact_id(obs.id), mark="flowstate-facts.fact", type=StateType.KNOWLEDGE,
                summary=clip(f"{obs.summary} → {result}", COMPACT.text),  # an index line stays short
                value=fit({"tool": obs.value["tool"], "result": obs.value["result"]}, limits),
                request=obs.request, refs=(Ref(rel=Relation.SUPPORTS, state_id=obs.id),))


FLOWSTATE = StateStrategy("flowstate", BLOCKS, "index")
FLOWSTATE_FACTS = StateStrategy("flowstate-facts", BLOCKS, "index", facts=True)
PAGED_BUDGET = 4096
"""flowstate-paged's index budget (estimated tokens) unless its name gives one (``flowstate-paged:N``)."""
FLOWSTATE_PAGED = StateStrategy("flowstate-paged", BLOCKS, "index", index_budget=PAGED_BUDGET)
NO_PSA = StateStrategy("no-psa", ("state_delta", "tool_calls", "assistant_message"), "inline")
NO_ISU = StateStrategy("no-isu", ("state_focus", "tool_calls", "assistant_message"), "index", trajectory=True,
                       rule_states=True)
