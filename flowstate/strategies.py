"""Memory strategies: the same loop, engines and tools; only the memory differs (paper §3.1, B.5).

- ``flowstate``: ISU + PSA — the model keeps typed states; earlier requests are reached through
  the Historical State Index and disclosed on demand.
- ``full-context``: no state — the whole interaction history of earlier requests (queries, every
  tool call and result, responses) in the prompt; a two-block protocol (tool calls, message).
- ``no-psa``: ISU, but every historical state's full content inline from the start; no index,
  no access (three blocks: no state_focus).
- ``no-isu``: PSA over states built by fixed rules when a request ends (one node holding the
  final response, linked to that request's raw tool results); the model makes no states
  (three blocks: no state_delta) and sees all of this request's tool results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.base import Generation, Message
from flowstate.access import disclose
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex, build_index
from flowstate.nodes import Node, Ref, Relation, StateType, canonical_json
from flowstate.limits import COMPACT, STANDARD, Limits
from flowstate.protocol import BLOCKS
from flowstate.records import StepRecord
from flowstate.repository import Repository, RequestRow, SessionView
from flowstate.serializer import layout, memory_rules, system_prompt


@dataclass(frozen=True)
class Start:
    """What a request starts from: its index k, G_k, S_k,1, and the memory block of its prompt."""

    k: int
    index: HistoricalIndex
    state: ActiveState
    memory: tuple[str, str] | None
    documents: tuple[str, ...] = ()  # what a retrieval method chooses from at each step


ModelCall = Callable[[str, str, str], Generation]
"""(system, user, grammar) -> the output of one model call of a memory method, made on the request's engine
path: its routing key, sampling and token budget; the grammar applies where the request decodes under one."""


@dataclass(frozen=True)
class MemoryContext:
    """What a memory method's hooks see of a request: read-only values, its own scratch, and ``call_model``.

    Never the driver itself: a hook returns what changes (``Observed``, ``ToolOutcome``, ``Finish``)."""

    session: SessionView  # the session's M as it was when the request started
    query: str
    k: int
    state: ActiveState  # S_k,t (with the latest observations, once they are in)
    observation: tuple[Node, ...]  # O_k,t
    limits: Limits
    call_model: ModelCall
    scratch: Mapping[str, Any] = field(default_factory=dict)  # the method's own data of this request (JSON)
    response: str | None = None  # at ``finish``: the final response (None: unfinished)


@dataclass(frozen=True)
class Observed:
    """What a method makes of new tool results: a new Active State (None keeps it), and its model calls."""

    state: ActiveState | None = None
    calls: tuple[StepRecord, ...] = ()


@dataclass(frozen=True)
class ToolOutcome:
    """The result of one of a method's own tools, and its scratch afterwards (None keeps it)."""

    result: Any
    error: str | None = None
    scratch: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Finish:
    """What a memory method adds when a request ends: nodes to persist with it, and the model calls it made
    to build them (their tokens count for the method)."""

    nodes: tuple[Node, ...] = ()
    calls: tuple[StepRecord, ...] = ()


class Strategy:
    """The seam every memory method plugs into; ``RequestRun`` is the one driver of a request.

    A method says which protocol blocks the model writes (and so which grammar it decodes under), builds the
    context of each call (``system_prompt``, ``start``, ``prompt``), chooses what the request leaves in the
    repository (``persisted``) and may make model calls of its own when the request ends (``finish``).
    """

    name: str
    blocks: tuple[str, ...]

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        raise NotImplementedError

    def start(self, repo: Repository, session: str) -> Start:
        raise NotImplementedError

    def prompt(
        self, system: str, query: str, start: Start, state: ActiveState,
        feedback: Sequence[dict[str, Any]], observation: Sequence[Node],
    ) -> list[Message]:
        raise NotImplementedError

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        raise NotImplementedError

    def tools(self) -> list[dict[str, Any]]:
        """Tools the method itself gives the agent (their specs), run by ``call_tool``; none by default."""
        return []

    def call_tool(self, ctx: MemoryContext, name: str, arguments: dict[str, Any]) -> ToolOutcome | None:
        """Run one of the method's own tools, or None when ``name`` is not one of them."""
        return None

    def observed(self, ctx: MemoryContext) -> Observed:
        """Once the latest tool results are in (``ctx.observation``): e.g. a state tracker's update."""
        return Observed()

    def finish(self, ctx: MemoryContext) -> Finish:
        """As the request ends, before it is persisted; nothing by default."""
        return Finish()


@dataclass(frozen=True)
class StateStrategy(Strategy):
    """FlowState and its ablations, and full context: typed states, the index, the transcript."""

    name: str
    blocks: tuple[str, ...]
    history: Literal["index", "inline", "transcript"]
    trajectory: bool = False  # all of this request's tool results stay in view
    rule_states: bool = False  # Persist builds one state per request by fixed rules

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        memory = memory_rules(self.blocks, transcript=self.history == "transcript", trajectory=self.trajectory)
        return system_prompt(tools, policy, self.blocks, memory, limits)

    def start(self, repo: Repository, session: str) -> Start:
        requests = repo.requests(session)
        history = repo.nodes(session)
        k = len(requests) + 1
        index = build_index(requests, history) if self.history == "index" else HistoricalIndex()
        state = ActiveState(request=k, history_ids=frozenset(n.id for n in history), index_ids=index.ids())
        memory: tuple[str, str] | None = None
        if self.history == "index":
            memory = ("historical_state_index", index.render())
        elif self.history == "transcript":
            memory = ("interaction_history", transcript(requests, history))
        else:  # inline: every historical state disclosed before the first step
            state = disclose(repo.view(session), state, tuple(n.id for n in history if not n.is_observation))
        return Start(k, index, state, memory)

    def prompt(
        self, system: str, query: str, start: Start, state: ActiveState,
        feedback: Sequence[dict[str, Any]], observation: Sequence[Node],
    ) -> list[Message]:
        trajectory = state.observations[: len(state.observations) - len(observation)] if self.trajectory else None
        shown = None if self.history == "transcript" else state
        user = layout(query, memory=start.memory, state=shown, trajectory=trajectory, feedback=feedback,
                      observation=observation)
        return [Message("system", system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        """Persist's selection of nodes for M_{k+1} (``response`` None: the request ended unfinished)."""
        if self.rule_states:
            return [*state.observations, response_node(state, response)]
        if self.history == "transcript":
            return list(state.observations)
        referenced = {ref.state_id for n in state.current for ref in n.refs}
        return [*(o for o in state.observations if o.id in referenced), *state.current]


def response_node(state: ActiveState, response: str | None) -> Node:
    """no-isu's rule-built state: the final response, deriving from every tool result of the request."""
    summary = f"final response: {response}" if response is not None else "unfinished: no final response"
    short = COMPACT.text  # an index line stays short whatever the profile
    return Node(
        id=f"response_r{state.request}", type=StateType.ARTIFACT,
        summary=summary if len(summary) <= short else summary[: short - 1] + "…",
        value={"response": response}, request=state.request,
        refs=tuple(Ref(rel=Relation.DERIVES, state_id=o.id) for o in state.observations),
    )


def transcript(requests: Sequence[RequestRow], nodes: Sequence[Node]) -> str:
    """full-context's history: per earlier request its query, every tool call and result, its response.

    One JSON line per item, so the rendering only ever grows at its end.
    """
    observations: dict[int, list[Node]] = {}
    for n in nodes:
        if n.is_observation:
            observations.setdefault(n.request, []).append(n)
    lines = []
    for r in requests:
        lines.append({"query_id": r.index, "user_query": r.query})
        lines += [{"observation_id": o.id, **o.value} for o in observations.get(r.index, ())]
        end: dict[str, Any] = {"query_id": r.index, "response": r.response}
        if r.unfinished is not None:
            end["unfinished"] = r.unfinished
        lines.append(end)
    return "".join(canonical_json(line) + "\n" for line in lines)


FLOWSTATE = StateStrategy("flowstate", BLOCKS, "index")
FULL_CONTEXT = StateStrategy("full-context", ("tool_calls", "assistant_message"), "transcript", trajectory=True)
NO_PSA = StateStrategy("no-psa", ("state_delta", "tool_calls", "assistant_message"), "inline")
NO_ISU = StateStrategy("no-isu", ("state_focus", "tool_calls", "assistant_message"), "index", trajectory=True,
                       rule_states=True)
# the baselines plug into the same seam (flowstate/retrieval.py imports what it needs from above)
from flowstate.retrieval import BM25, MEM0_STYLE  # noqa: E402
from flowstate.tracker import ZIPACT  # noqa: E402
from flowstate.mage import MAGE, MAGE_NO_COMPRESS, MAGE_NO_MAINTAIN, MAGE_NO_REVISE  # noqa: E402

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    FLOWSTATE, FULL_CONTEXT, NO_PSA, NO_ISU, BM25, MEM0_STYLE, ZIPACT, MAGE, MAGE_NO_COMPRESS, MAGE_NO_MAINTAIN,
    MAGE_NO_REVISE)}


def get(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown strategy {name!r}; valid strategies: {', '.join(STRATEGIES)}") from None
