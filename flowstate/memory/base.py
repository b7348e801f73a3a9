"""The seam every memory method plugs into: ``Strategy`` and the typed values its hooks take and return.

The driver (``flowstate.loop.RequestRun``) drives a method through this seam only: the protocol blocks the
model writes, the context of each call, what a request leaves in the repository, tools of its own, and its
own model calls before the first step (``begin``), after a tool result (``observed``) and at the request's
end (``finish``). A hook gets a
narrow ``MemoryContext`` — never the driver — and returns what changes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.base import Generation, Message
from engine.purpose import Purpose
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.limits import STANDARD, Limits
from flowstate.nodes import Node, canonical_json
from flowstate.records import StepRecord
from flowstate.serializer import system_prompt
from flowstate.store.repository import RequestRow, SessionView


@dataclass(frozen=True)
class Start:
    """What a request starts from: its index k, G_k, S_k,1, and the memory block of its prompt."""

    k: int
    index: HistoricalIndex
    state: ActiveState
    memory: tuple[str, str] | None
    documents: tuple[str, ...] = ()  # what a retrieval method chooses from at each step
    data: Mapping[str, Any] = field(default_factory=dict)  # what else a method keeps of the session for its prompts


@dataclass(frozen=True)
class StepInput:
    """What one step's prompt is built from (``Strategy.prompt``): the request so far, as the driver holds it."""

    system: str
    query: str
    start: Start
    state: ActiveState  # S_k,t
    feedback: tuple[dict[str, Any], ...] = ()  # on the previous step
    observation: tuple[Node, ...] = ()  # O_k,t: the latest tool results
    scratch: Mapping[str, Any] = field(default_factory=dict)  # the method's own data of this request (JSON)
    steps: tuple[StepRecord, ...] = ()  # this request's earlier steps, their outputs as the model wrote them
    limits: Limits = STANDARD  # the bounds the model's outputs are decoded under (``Strategy.output_limits``)

    @property
    def trajectory(self) -> tuple[Node, ...]:
        """This request's tool results before the latest ones."""
        return self.state.observations[: len(self.state.observations) - len(self.observation)]


ModelCall = Callable[[Purpose, str, str, str], Generation]
"""(purpose, system, user, grammar) -> the output of one model call of a memory method, made on the request's
engine path: its routing key, sampling and token budget; the grammar applies where the request decodes under one.
The purpose declares the call's kind and reply model (each method's own constants), which is what an engine that
answers by rule reads."""


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


class Strategy(ABC):
    """The seam every memory method plugs into; ``RequestRun`` is the one driver of a request.

    ``prompt`` gets the request so far (``StepInput``), the method's scratch included (what its own tools
    changed, e.g. MAGE's Revise).
    A method says which protocol blocks the model writes (and so which grammar it decodes under), builds the
    context of each call (``system_prompt``, ``start``, ``prompt``), chooses what the request leaves in the
    repository (``persisted``) and may make model calls of its own when the request ends (``finish``).
    """

    name: str
    blocks: tuple[str, ...]
    rules: ClassVar[str] = ""  # the method's section of the system prompt (what its memory shows and how)
    facts: bool = False  # the system records each tool result as a knowledge state (the model need not)
    optional: tuple[str, ...] = ()  # blocks the model writes only when they hold something (left out when empty)

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        """The system message: the protocol of ``blocks``, the method's ``rules``, the policy, the tools."""
        return system_prompt(tools, policy, self.blocks, self.rules, limits)

    def output_limits(self, limits: Limits) -> Limits:
        """The bounds the model's outputs are decoded, parsed and described under, from the profile's ``limits`` (a
        method may hold the states the model writes tighter than the profile; the system's own states keep it)."""
        return limits

    @abstractmethod
    def start(self, session: SessionView) -> Start:
        ...

    @abstractmethod
    def prompt(self, step: StepInput) -> list[Message]:
        ...

    @abstractmethod
    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        ...

    def step_blocks(self, k: int) -> tuple[str, ...]:
        """The blocks request ``k``'s grammar admits (a method may leave a memory block out of a request that has no
        use for it); ``blocks`` by default."""
        return self.blocks

    def tools(self) -> list[dict[str, Any]]:
        """Tools the method itself gives the agent (their specs), run by ``call_tool``; none by default."""
        return []

    def call_tool(self, ctx: MemoryContext, name: str, arguments: dict[str, Any]) -> ToolOutcome | None:
        """Run one of the method's own tools, or None when ``name`` is not one of them."""
        return None

    def begin(self, ctx: MemoryContext) -> Observed:
        """Before the request's first step (``ctx.query`` is the new query): e.g. a state tracker's update."""
        return Observed()

    def observed(self, ctx: MemoryContext) -> Observed:
        """Once the latest tool results are in (``ctx.observation``): e.g. a state tracker's update."""
        return Observed()

    def finish(self, ctx: MemoryContext) -> Finish:
        """As the request ends, before it is persisted; nothing by default."""
        return Finish()


def interaction(query: str, observations: Sequence[Node], response: str | None) -> str:
    """One request as the memory methods read it when it ends: the query, each tool result, the response (one
    JSON line each)."""
    lines: list[dict[str, Any]] = [{"user_query": query}]
    lines += [{"observation_id": o.id, **o.value} for o in observations]
    lines.append({"response": response})
    return "".join(canonical_json(line) + "\n" for line in lines)


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
