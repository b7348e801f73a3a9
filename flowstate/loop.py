"""The execution loop (Algorithm 1): serialize → generate → parse → validate → commit and disclose → act.

One call of ``run_request`` is one request q_k. Everything of the request stays in memory until
it ends; Persist then writes it in one transaction. A request that runs out of its step budget is
persisted as it stands and marked unfinished in the index (``on_budget="fail"`` persists nothing
instead); a request that fails (repeated protocol errors, engine fault) persists nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from engine.base import Engine, Generation, OnText, sampling_fields, streams
from engine.errors import EngineConfigError, EngineError
from flowstate.access import disclose, validate_access
from flowstate.constrain import GrammarMode, Grammars
from flowstate.errors import ProtocolError, RequestFailed
from flowstate.limits import Limits, for_engine
from flowstate.nodes import Node, StateType, canonical_json, observation_id
from flowstate.parse import parse_output
from flowstate.protocol import ToolCall
from flowstate.records import RunRecord, StepRecord, ToolCallRecord
from flowstate.request_options import RequestOptions
from flowstate.repository import Repository
from flowstate.strategies import FLOWSTATE, Strategy
from flowstate.tools import ToolSet
from flowstate.update import apply_delta


@dataclass(frozen=True)
class LoopConfig:
    """Limits of one request."""

    max_steps: int = 16
    max_protocol_errors: int = 3  # consecutive unparsable outputs before the request fails
    max_tokens: int | None = None  # per model call; None leaves it to the engine
    grammar: GrammarMode = GrammarMode.STEP  # for engines that support grammars
    limits: Limits | None = None  # protocol limits; None: the profile that fits the engine (compact for tiny models)
    on_budget: Literal["persist", "fail"] = "persist"  # at the step budget: persist as unfinished, or fail

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError("max_steps must be at least 1")
        if self.max_protocol_errors < 1:
            raise ValueError("max_protocol_errors must be at least 1")
        if self.on_budget not in ("persist", "fail"):
            raise ValueError(f"on_budget must be persist or fail, not {self.on_budget!r}")

    def for_engine(self, engine: Engine) -> LoopConfig:
        """This configuration with its limits resolved for ``engine``."""
        return self if self.limits is not None else replace(self, limits=for_engine(engine))


def _run_tools(tools: ToolSet, calls: Sequence[ToolCall], run: RequestRun) -> list[ToolCallRecord]:
    records = []
    for i, call in enumerate(calls, start=1):
        own = run.strategy.call_tool(run, call.name, dict(call.arguments))  # the memory method's own tools first
        result, error = own if own is not None else tools.call(call.name, call.arguments)
        records.append(ToolCallRecord(call.name, dict(call.arguments), run.observation_id(i), result, error))
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


log = logging.getLogger("flowstate.loop")
_WARNED: set[int] = set()


def _no_prefix_reuse(engine: Engine) -> None:
    """Warn once per engine: a call whose prompt repeats the previous call's prefix got nothing from the cache."""
    if id(engine) in _WARNED:
        return
    _WARNED.add(id(engine))
    log.warning(
        "the %s engine reported 0 cached prompt tokens for a call whose prompt repeats the previous call's prefix: "
        "prefix caching is off or ineffective (vLLM: --enable-prefix-caching, and --enable-prompt-tokens-details for "
        "the count; hybrid-attention models such as Qwen3.5: see the README)", engine.name)


def require_query(query: str) -> None:
    """A request needs a non-blank query."""
    if not query.strip():
        raise ValueError("the query is empty")


class RequestRun:
    """One request q_k as a resumable state machine, so that tool calls may run anywhere.

    ``step()`` makes one model call. When the step asks for tools, ``pending`` holds the calls
    until ``observe()`` receives their records (run here by ``run_request``, or by an API client
    in ``serving/``). When a step answers, the request is persisted and ``record`` is set.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        repo: Repository,
        session: str,
        query: str,
        system: str,
        tool_specs: Sequence[Mapping[str, Any]] = (),
        config: LoopConfig = LoopConfig(),
        grammars: Grammars | None = None,
        strategy: Strategy = FLOWSTATE,
        options: RequestOptions = RequestOptions(),
    ) -> None:
        require_query(query)
        refused = options.sampling.given() - sampling_fields(engine)
        if refused:
            raise EngineConfigError(f"the {engine.name} engine cannot honour {', '.join(sorted(refused))} per request")
        config = config.for_engine(engine)
        assert config.limits is not None
        self.limits: Limits = config.limits
        if grammars is None and engine.supports_grammar and config.grammar is not GrammarMode.NONE:
            grammars = Grammars(tool_specs, config.grammar, strategy.blocks, self.limits, options)
        if grammars is not None and grammars.blocks != strategy.blocks:
            raise ValueError(f"grammars for blocks {grammars.blocks} do not fit strategy {strategy.name!r}")
        if grammars is not None and grammars.limits != self.limits:
            raise ValueError(f"grammars for limits {grammars.limits.name!r} do not fit limits {self.limits.name!r}")
        if grammars is not None and grammars.options != options:
            raise ValueError("grammars built for other request options (tool choice, answer format)")
        self.options = options
        self.engine, self.repo, self.session, self.query = engine, repo, session, query
        self.tool_specs = [dict(t) for t in tool_specs]
        self.system, self.config, self.grammars, self.strategy = system, config, grammars, strategy
        self.start = strategy.start(repo, session)
        self.index_k = self.start.k
        self.state = self.start.state
        self.source = repo.view(session)
        self.steps: list[StepRecord] = []
        self.feedback: list[dict[str, Any]] = []
        self.observation: tuple[Node, ...] = ()
        self.pending: tuple[ToolCall, ...] = ()
        self.record: RunRecord | None = None
        self.response: str | None = None  # the final response, once the request ends
        self.memory_calls: list[StepRecord] = []  # model calls the memory method made during the request
        self.memory_state: dict[str, Any] = {}  # the memory method's own data of this request (JSON)
        self.consecutive_errors = 0  # consecutive protocol errors

    @property
    def done(self) -> bool:
        return self.record is not None

    def failed(self, message: str) -> RequestFailed:
        partial = RunRecord(self.session, self.index_k, self.query, None, tuple(self.steps))
        return RequestFailed(
            f"request {self.index_k} of session {self.session!r} failed: {message}", partial.to_dict()
        )

    def step(self, extra: Mapping[str, Any] | None = None, on_text: OnText | None = None) -> StepRecord | None:
        """One model call and everything the runtime does with its output (raises ``RequestFailed``).

        Past the step budget no call is made: the request is persisted unfinished (``record`` is
        set, None is returned) or fails, as ``on_budget`` says.
        ``extra`` is stored with the final run record (e.g. the server's transcript of the request);
        ``on_text`` receives the output as it is decoded, where the engine streams.
        """
        if self.pending:
            raise RuntimeError("step() while tool calls are pending; observe() their results first")
        if self.done:
            raise RuntimeError("the request is finished")
        t = len(self.steps) + 1
        if t > self.config.max_steps:
            reason = f"no final response within the step budget of {self.config.max_steps} steps"
            if self.config.on_budget == "fail":
                raise self.failed(reason)
            self._persist(None, extra or {}, unfinished=reason)
            return None
        messages = self.strategy.prompt(self.system, self.query, self.start, self.state, self.feedback, self.observation)
        started = time.perf_counter()
        grammar = self.grammars.for_step(self.state) if self.grammars is not None else None
        grammar_ms = (time.perf_counter() - started) * 1000
        try:
            per_call: dict[str, Any] = {"on_text": on_text} if on_text is not None and streams(self.engine) else {}
            if self.options.sampling.given():
                per_call["sampling"] = self.options.sampling
            if getattr(self.engine, "routes", False):  # several servers: this session's calls stay on one
                per_call["affinity"] = self.session
            generation = self.engine.generate(messages, grammar=grammar, max_tokens=self.options.max_tokens or
                                              self.config.max_tokens, **per_call)
        except EngineError as exc:
            raise self.failed(f"engine error at step {t}: {exc}") from exc
        try:
            output = self.options.enforce(
                parse_output(generation.text, self.strategy.blocks, self.limits, self.options.answer_schema))
        except ProtocolError as exc:
            return self._unparsed(t, generation, grammar_ms, exc)
        self.consecutive_errors = 0
        if t > 1 and generation.usage.prompt_tokens and not generation.usage.cached_tokens:
            _no_prefix_reuse(self.engine)

        accepted, refused = validate_access(self.state, output.state_focus)  # against S_k,t
        update = apply_delta(self.state, output.state_delta)  # S+_k,t
        self.state = disclose(self.source, update.state, accepted)  # S_k,t+1
        malformed = [m.to_dict() for m in output.malformed]
        self.feedback = [{"kind": "malformed", "step": t, **m} for m in malformed]
        self.feedback += [{"kind": "rejected", "step": t, **r.to_dict()} for r in update.rejected]
        self.feedback += [{"kind": "refused_access", "step": t, **r.to_dict()} for r in refused]
        self.observation = ()
        self.pending = output.tool_calls
        record = StepRecord(
            index=t, raw=generation.text, usage=generation.usage, grammar_ms=grammar_ms,
            truncated=generation.truncated, malformed=malformed,
            committed=update.committed_dicts(), rejected=[r.to_dict() for r in update.rejected],
            disclosed=list(accepted), refused=[r.to_dict() for r in refused],
            final_response=None if output.final_response is None else self.options.stop_at(output.final_response),
        )
        self.steps.append(record)
        if record.final_response is not None:
            self._persist(record.final_response, extra or {})
        return record

    def _unparsed(self, t: int, generation: Generation, grammar_ms: float, exc: ProtocolError) -> StepRecord:
        """An output that is not the protocol: fed back (a cut one as truncation), or the request fails."""
        self.consecutive_errors += 1
        record = StepRecord(t, generation.text, generation.usage, grammar_ms, protocol_error=exc.to_dict(),
                            truncated=generation.truncated)
        self.steps.append(record)
        if self.consecutive_errors >= self.config.max_protocol_errors:
            raise self.failed(f"{self.consecutive_errors} consecutive outputs broke the protocol; last: {exc}") from exc
        if generation.truncated:
            self.feedback = [{
                "kind": "truncated", "step": t,
                "message": f"your output was cut off at the limit of {generation.usage.completion_tokens} tokens "
                           f"before it was complete ({exc}); write a shorter output: fewer operations, shorter "
                           "summaries, values and messages",
            }]
        else:
            self.feedback = [{"kind": "protocol_error", "step": t, **exc.to_dict()}]
        return record  # the latest observation stays in view: the model has not acted on it yet

    def observation_id(self, i: int) -> str:
        """The id of the raw observation of the i-th (1-based) pending tool call."""
        return observation_id(self.index_k, len(self.steps), i)

    def observe(self, calls: Sequence[ToolCallRecord]) -> None:
        """The results of the pending tool calls, in their order, become O_k,t."""
        if len(calls) != len(self.pending):
            raise ValueError(f"{len(self.pending)} tool calls are pending, got {len(calls)} results")
        self.steps[-1] = replace(self.steps[-1], tool_calls=list(calls))
        self.observation = tuple(_observation_node(c, self.index_k) for c in calls)
        self.state = self.state.with_observations(self.observation)
        self.pending = ()
        self.memory_calls.extend(self.strategy.observed(self))  # e.g. a state tracker's update

    def _persist(self, response: str | None, extra: Mapping[str, Any], unfinished: str | None = None) -> None:
        self.response = response
        finish = self.strategy.finish(self)  # the memory method's own work at the end (may call the model)
        nodes = [*self.strategy.persisted(self.state, response), *finish.nodes]
        record = RunRecord(
            self.session, self.index_k, self.query, response, tuple(self.steps),
            persisted_states=tuple(n.id for n in nodes if not n.is_observation),
            persisted_observations=tuple(n.id for n in nodes if n.is_observation),
            unfinished=unfinished, memory_calls=(*self.memory_calls, *finish.calls),
        )
        self.repo.persist_request(
            self.session, self.index_k, self.query, response, nodes, {**record.to_dict(), **extra}, unfinished
        )
        self.record = record


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
    strategy: Strategy = FLOWSTATE,
) -> RunRecord:
    """Run one request of ``session`` to its end, running its tools here, and persist it.

    The record's ``response`` is None (and ``unfinished`` says why) when the step budget ran out."""
    run = RequestRun(
        engine=engine, repo=repo, session=session, query=query, system=system,
        tool_specs=[*tools.specs(), *strategy.tools()], config=config, grammars=grammars, strategy=strategy,
    )
    while run.record is None:
        run.step()
        if run.pending:
            run.observe(_run_tools(tools, run.pending, run))
    return run.record
