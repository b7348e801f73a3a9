"""The execution loop (Algorithm 1): serialize → generate → parse → validate → commit and disclose → act.

One call of ``run_request`` is one request q_k. Everything of the request stays in memory until
it ends; Persist then writes it in one transaction. A request that fails (step budget, repeated
protocol errors, engine fault) persists nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from engine.base import Engine
from engine.errors import EngineError
from flowstate.access import disclose, validate_access
from flowstate.active import ActiveState
from flowstate.constrain import GrammarMode, Grammars
from flowstate.errors import ProtocolError, RequestFailed
from flowstate.history import build_index
from flowstate.nodes import Node, StateType, canonical_json, observation_id
from flowstate.parse import parse_output
from flowstate.protocol import ToolCall
from flowstate.records import RunRecord, StepRecord, ToolCallRecord
from flowstate.repository import Repository
from flowstate.serializer import serialize
from flowstate.tools import ToolSet
from flowstate.update import apply_delta


@dataclass(frozen=True)
class LoopConfig:
    """Limits of one request."""

    max_steps: int = 16
    max_protocol_errors: int = 3  # consecutive unparsable outputs before the request fails
    max_tokens: int | None = None  # per model call; None leaves it to the engine
    grammar: GrammarMode = GrammarMode.STEP  # for engines that support grammars

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.max_protocol_errors < 1:
            raise ValueError("max_protocol_errors must be at least 1")


def _run_tools(tools: ToolSet, calls: tuple[ToolCall, ...], request: int, step: int) -> list[ToolCallRecord]:
    records = []
    for i, call in enumerate(calls, start=1):
        result, error = tools.call(call.name, call.arguments)
        records.append(ToolCallRecord(call.name, dict(call.arguments), observation_id(request, step, i), result, error))
    return records


def _observation_node(call: ToolCallRecord, request: int) -> Node:
    args = ", ".join(f"{k}={canonical_json(v)}" for k, v in sorted(call.arguments.items()))
    summary = f"{call.name}({args if len(args) <= 120 else args[:119] + '…'})"
    value: dict[str, Any] = {"tool": call.name, "arguments": call.arguments}
    if call.error is None:
        value["result"] = call.result
    else:
        value["error"] = call.error
    return Node(
        id=call.observation_id, kind="observation", type=StateType.KNOWLEDGE, summary=summary,
        value=value, request=request,
    )


def _persisted_nodes(state: ActiveState) -> list[Node]:
    """Persist's selection: this request's states, and the raw tool results they reference."""
    referenced = {ref.state_id for n in state.current for ref in n.refs}
    observations = [o for o in state.observations if o.id in referenced]
    return [*observations, *state.current]


def require_query(query: str) -> None:
    """A request needs a non-blank query."""
    if not query.strip():
        raise ValueError("the query is empty")


def run_request(
    *,
    engine: Engine,
    repo: Repository,
    session: str,
    query: str,
    system: str,
    tools: ToolSet,
    config: LoopConfig = LoopConfig(),
    grammars: Grammars | None = None,
) -> RunRecord:
    """Run one request of ``session`` to its final response and persist it."""
    require_query(query)
    if grammars is None and engine.supports_grammar and config.grammar is not GrammarMode.NONE:
        grammars = Grammars(tools.specs(), config.grammar)
    requests = repo.requests(session)
    history = repo.nodes(session)
    k = len(requests) + 1
    index = build_index(requests, history)
    state = ActiveState(request=k, history_ids=frozenset(n.id for n in history), index_ids=index.ids())
    source = repo.view(session)

    steps: list[StepRecord] = []
    feedback: list[dict[str, Any]] = []
    observation: tuple[Node, ...] = ()
    consecutive_errors = 0

    def failed(message: str) -> RequestFailed:
        partial = RunRecord(session, k, query, None, tuple(steps))
        return RequestFailed(f"request {k} of session {session!r} failed: {message}", partial.to_dict())

    for t in range(1, config.max_steps + 1):
        messages = serialize(system, index, query, state, feedback, observation)
        started = time.perf_counter()
        grammar = grammars.for_step(state) if grammars is not None and engine.supports_grammar else None
        grammar_ms = (time.perf_counter() - started) * 1000
        try:
            generation = engine.generate(messages, grammar=grammar, max_tokens=config.max_tokens)
        except EngineError as exc:
            raise failed(f"engine error at step {t}: {exc}") from exc
        try:
            output = parse_output(generation.text)
        except ProtocolError as exc:
            consecutive_errors += 1
            steps.append(StepRecord(t, generation.text, generation.usage, grammar_ms, protocol_error=exc.to_dict()))
            if consecutive_errors >= config.max_protocol_errors:
                raise failed(f"{consecutive_errors} consecutive outputs broke the protocol; last: {exc}") from exc
            feedback = [{"kind": "protocol_error", "step": t, **exc.to_dict()}]
            continue  # the latest observation stays in view: the model has not acted on it yet
        consecutive_errors = 0

        accepted, refused = validate_access(state, output.state_focus)  # against S_k,t
        update = apply_delta(state, output.state_delta)  # S+_k,t
        state = disclose(source, update.state, accepted)  # S_k,t+1
        feedback = [{"kind": "rejected", "step": t, **r.to_dict()} for r in update.rejected]
        feedback += [{"kind": "refused_access", "step": t, **r.to_dict()} for r in refused]

        calls = _run_tools(tools, output.tool_calls, k, t) if output.tool_calls else []
        observation = tuple(_observation_node(c, k) for c in calls)
        state = state.with_observations(observation)
        steps.append(
            StepRecord(
                index=t, raw=generation.text, usage=generation.usage, grammar_ms=grammar_ms,
                committed=update.committed_dicts(), rejected=[r.to_dict() for r in update.rejected],
                disclosed=list(accepted), refused=[r.to_dict() for r in refused],
                tool_calls=calls, final_response=output.final_response,
            )
        )
        if output.final_response is not None:
            nodes = _persisted_nodes(state)
            record = RunRecord(
                session, k, query, output.final_response, tuple(steps),
                persisted_states=tuple(n.id for n in nodes if not n.is_observation),
                persisted_observations=tuple(n.id for n in nodes if n.is_observation),
            )
            repo.persist_request(session, k, query, output.final_response, nodes, record.to_dict())
            return record
    raise failed(f"no final response within the step budget of {config.max_steps} steps")
