"""A ZipAct-style state tracker on the strategy seam (``zipact``, ``zipact-bm25``).

After ZipAct (Pan et al., 2026): the growing interaction history is compressed into one structured state —
goal, world, constraints — by a separate model call after every new piece of the interaction ("state
updating decoupled from action generation"): the user's new query (``begin``), every tool result
(``observed``) and the agent's final response (``finish``). The agent acts on that state and the latest
tool result alone, not on the history. The state of the last request carries over to the next (one node per
request, ``zipact_r{k}``). Reduced to its core: one tracker call per update with a JSON schema for the
state, no domain injectables.

``zipact-bm25`` (the paper's hybrid): the same tracker, plus BM25 retrieval over the interaction history,
chunked as ``bm25`` chunks it, shown beside the tracked state.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from engine.base import Message
from engine.purpose import Purpose
from flowstate import tags
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.memory import calls as memory_calls
from flowstate.memory.base import Finish, MemoryContext, Observed, Start, StepInput, Strategy
from flowstate.memory.reference import sections
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.serializer import layout, render_observation
from flowstate.store.repository import SessionView
from flowstate.tags import TRACK

EMPTY: dict[str, Any] = {"goal": "", "world": {}, "constraints": []}
MARK = "zipact.state"  # the mark of the tracked state's node

RULES = """\
## memory
<tracked_state> is your state of the task, kept by a state tracker from every request and tool result so \
far: goal, world (facts), constraints. It is all you see of earlier steps and requests; the newest tool \
results are in <latest_observation>."""

TRACK_PROMPT = f"""{TRACK}
You track an agent's state. Given the state so far, the current request and what just happened (a new \
request, the newest tool results, or the agent's final response), write the new state: goal (what the current \
request asks), world (every fact later steps or requests may need: \
identifiers, numbers, results, choices made — keep earlier facts unless they changed), constraints (the \
user's requirements). Reply with JSON only: {{"goal": "...", "world": {{...}}, "constraints": ["..."]}}."""



class TrackedState(BaseModel):
    """The tracker's reply: the new state of the task."""

    model_config = ConfigDict(extra="forbid")
    goal: str = Field(default="", max_length=2000)
    world: dict[str, Any]
    constraints: list[Annotated[str, Field(max_length=400)]] = Field(default=[], max_length=32)


STATE_GRAMMAR = memory_calls.grammar(TrackedState)


def _tracked(user: str, ref: Any) -> str:
    """A state tracker's update as a reference policy answers it: the goal is the request, the world what the
    policy keeps of the newest tool results."""
    parts = sections(user)
    before = dict(((parts.get(tags.TRACKED_STATE) or [{}])[0]).get("world") or {})
    query = tags.read(user, tags.USER_QUERY) or ""
    return json.dumps({"goal": query, "world": ref.world(query, before, parts.get(tags.NEW_OBSERVATION, [])),
                       "constraints": []})


TRACK_CALL = Purpose("zipact.track", TrackedState, _tracked)


def tracked(state: ActiveState) -> dict[str, Any]:
    node = next((n for n in state.current if n.mark == MARK), None)
    return dict(node.value) if node is not None else dict(EMPTY)


def _with(state: ActiveState, value: dict[str, Any]) -> ActiveState:
    node = Node(id=f"zipact_r{state.request}", mark=MARK, type=StateType.JUDGEMENT, summary="tracked state",
                value=value, request=state.request)
    kept = tuple(n for n in state.current if n.id != node.id)
    order = state.order if node.id in state.order else (*state.order, node.id)
    return ActiveState(request=state.request, history_ids=state.history_ids, index_ids=state.index_ids,
                       current=(*kept, node), disclosed=state.disclosed, observations=state.observations, order=order,
                       pages=state.pages)


@dataclass(frozen=True)
class StateTracker(Strategy):
    name: str = "zipact"
    blocks: tuple[str, ...] = ("tool_calls", "assistant_message")
    rules: ClassVar[str] = RULES

    def start(self, session: SessionView) -> Start:
        k = session.request_count() + 1
        last = next((n for n in reversed(session.nodes()) if n.mark == MARK), None)
        state = _with(ActiveState(request=k), dict(last.value) if last is not None else dict(EMPTY))
        return Start(k, HistoricalIndex(), state, None)

    def prompt(self, step: StepInput) -> list[Message]:
        user = layout(step.query, memory=(tags.TRACKED_STATE, canonical_json(tracked(step.state)) + "\n"), state=None,
                      feedback=step.feedback, observation=step.observation)
        return [Message("system", step.system), Message("user", user)]

    def begin(self, ctx: MemoryContext) -> Observed:
        """The tracker reads the new query (the goal changes with it) before the agent acts."""
        return self._track(ctx, "")

    def observed(self, ctx: MemoryContext) -> Observed:
        """The tracker reads the newest tool results."""
        return self._track(ctx, tags.block(tags.NEW_OBSERVATION, render_observation(ctx.observation)))

    def finish(self, ctx: MemoryContext) -> Finish:
        """The tracker reads the final response (what the agent told the user is part of the state); the state
        after it is what carries over."""
        said = ctx.response if ctx.response is not None else "(none: the request ended unfinished)"
        observed = self._track(ctx, tags.block(tags.RESPONSE, said + "\n"))
        state = observed.state if observed.state is not None else ctx.state
        return Finish(tuple(n for n in state.current if n.mark == MARK), observed.calls)

    @staticmethod
    def _track(ctx: MemoryContext, new: str) -> Observed:
        """One tracker call: the state so far, the request and what is new give the new state."""
        before = tracked(ctx.state)
        user = (tags.block(tags.TRACKED_STATE, canonical_json(before) + "\n")
                + tags.block(tags.USER_QUERY, ctx.query + "\n") + new)[:-1]
        generation = ctx.call_model(TRACK_CALL, TRACK_PROMPT, user, STATE_GRAMMAR)
        after, error = _state(generation.text)
        state = _with(ctx.state, after if after is not None else before)  # a failed update keeps the old state
        return Observed(state, (memory_calls.record(generation, "state", error),))

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return []  # the tracked state carries over, as ``finish`` leaves it; nothing else


def _state(text: str) -> tuple[dict[str, Any] | None, str | None]:
    state = memory_calls.reply(text, TrackedState)
    if state is None:
        return None, f"not the state JSON asked for: {text[:120]!r}"
    return state.model_dump(), None


RETRIEVAL_RULES = RULES + """ The earlier requests' histories (each its query, tool calls with results, \
response) most similar to this request are in <retrieved_memory>, the most similar first."""


@dataclass(frozen=True)
class TrackerWithRetrieval(StateTracker):
    """``zipact-bm25``: the tracked state, and the entries ``bm25`` retrieves for the request beside it."""

    name: str = "zipact-bm25"
    rules: ClassVar[str] = RETRIEVAL_RULES

    def start(self, session: SessionView) -> Start:
        from flowstate.memory.retrieval import entries

        tracked_start = super().start(session)
        return replace(tracked_start, documents=entries(session.requests(), session.nodes()))

    def prompt(self, step: StepInput) -> list[Message]:
        from flowstate.memory.ranking import okapi

        chosen = "".join(step.start.documents[i] for i in okapi(step.start.documents, step.query))
        user = layout(step.query, memory=(tags.TRACKED_STATE, canonical_json(tracked(step.state)) + "\n"), state=None,
                      feedback=step.feedback, observation=step.observation,
                      retrieved=(tags.RETRIEVED_MEMORY, chosen or "none\n"))
        return [Message("system", step.system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return list(state.observations)  # the history BM25 retrieves from; the tracked state comes from ``finish``


ZIPACT: Strategy = StateTracker()
ZIPACT_BM25: Strategy = TrackerWithRetrieval()
