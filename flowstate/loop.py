"""The execution loop (Algorithm 1): serialize → generate → parse → validate → commit and disclose → act.

``RequestRun`` is the one driver of a request q_k, for the Python API, the endpoint and the evaluator:
it advances until the client must act (calls of the client's tools) or the request ends, running the
memory method's own tools and the configuration's tools itself. Everything of the request stays in
memory until it ends; Persist then writes it in one transaction. A request that runs out of its step
budget is persisted as it stands and marked unfinished in the index (``on_budget="fail"`` persists
nothing instead); so is a request that fails (repeated protocol errors, an engine fault), its reason
marked as a failure (``records.FAILED``), before ``RequestFailed`` is raised: Algorithm 1 always ends
with Persist, and the next request has its own k.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.base import Engine, Generation, Message, OnText
from engine.errors import EngineError
from engine.purpose import STEP, Purpose
from flowstate import tracing
from flowstate.access import disclose, validate_access
from flowstate.active import ActiveState
from flowstate.config import AgentConfig, LoopConfig, Wiring
from flowstate.errors import ProtocolError, RequestFailed
from flowstate.limits import Limits
from flowstate.memory.base import Finish, MemoryContext, Observed, StepInput, Strategy
from flowstate.nodes import Node, StateType, canonical_json, observation_id
from flowstate.parse import parse_output
from flowstate.protocol import ModelOutput, ToolCall
from flowstate.records import BUDGET, CANCELLED, FAILED, LOOPING, RunRecord, StepRecord, ToolCallRecord
from flowstate.request_options import RequestOptions, check_supported
from flowstate.store.repository import Repository, Transcript
from flowstate.update import apply_delta


@dataclass(frozen=True)
class Approval:
    """The client's answer to a call of a server tool that waits on its approval (``RequestOptions.approval``)."""

    approve: bool
    reason: str | None = None

    def refusal(self) -> str:
        """The tool error the model sees for a call the client did not approve."""
        return "the user did not approve this call" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class Waiting:
    """The calls of the latest step that wait on the client: ids by position, and the rest already run."""

    client: dict[str, int]  # tool_call_id -> position (0-based) in the step's calls
    done: dict[int, ToolCallRecord]  # calls run here (the method's, the configuration's, refused ones)

    def to_dict(self) -> dict[str, Any]:
        return {"client": dict(self.client), "done": {str(i): r.to_dict() for i, r in self.done.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Waiting:
        return cls(dict(d["client"]), {int(i): ToolCallRecord.from_dict(r) for i, r in d["done"].items()})


@dataclass
class Progress:
    """The mutable part of a request: everything ``suspend`` stores and restores."""

    state: ActiveState  # S_k,t
    steps: list[StepRecord] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)
    observation: tuple[Node, ...] = ()  # O_k,t
    pending: tuple[ToolCall, ...] = ()  # the latest step's calls, until their results are observed
    waiting: Waiting | None = None  # the part of ``pending`` the client runs
    errors: int = 0  # consecutive protocol errors
    memory_calls: list[StepRecord] = field(default_factory=list)  # the memory method's own model calls
    scratch: dict[str, Any] = field(default_factory=dict)  # the memory method's own data of this request (JSON)


OnStep = Callable[[int], OnText | None]  # the step's index -> who receives its output while it decodes


def _observation_node(call: ToolCallRecord, request: int) -> Node:
    args = ", ".join(f"{k}={canonical_json(v)}" for k, v in sorted(call.arguments.items()))
    summary = f"{call.name}({args if len(args) <= 120 else args[:119] + '…'})"
    value: dict[str, Any] = {"tool": call.name, "arguments": call.arguments}
    if call.repeat_of is not None:  # not run again: the earlier call's outcome, shown once more
        value["repeat_of"] = call.repeat_of
    if call.error is None:
        value["result"] = call.result
    else:
        value["error"] = call.error
    return Node(
        id=call.observation_id, kind="observation", type=StateType.KNOWLEDGE, summary=summary,
        value=value, request=request,
    )


log = logging.getLogger("flowstate.loop")
_WARNED: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines warned about (gone with them)


def _no_prefix_reuse(engine: Engine) -> None:
    """Warn once per engine: a call whose prompt repeats the previous call's prefix got nothing from the cache."""
    if engine in _WARNED:
        return
    _WARNED.add(engine)
    log.warning(
        "the %s engine reported 0 cached prompt tokens for a call whose prompt repeats the previous call's prefix: "
        "prefix caching is off or ineffective (vLLM: --enable-prefix-caching, and --enable-prompt-tokens-details for "
        "the count; hybrid-attention models such as Qwen3.5: see docs/deployment.md)", engine.name)


def _repeated(history: Sequence[ToolCallRecord], call: ToolCallRecord,
              reads: Callable[[str], bool] = lambda _: False) -> ToolCallRecord | None:
    """The earlier call that ``call`` repeats: one with the same tool and arguments after which no other call was
    made, or — made twice already — only calls of tools declared read-only (``reads``). A call after one that may
    change the world may see it changed (a reservation read again after its update); a read made once more after
    other reads is an agent checking again (τ³'s gold does), a third time a cycle (A B C A B C A) that sees nothing
    new."""
    between = False
    for earlier in reversed(history):
        if earlier.key != call.key:
            if reads(earlier.name):
                between = True
                continue
            return None
        if earlier.repeat_of is None:
            return earlier if not between or sum(c.key == call.key for c in history) >= 2 else None
    return None


def _same_step_again(steps: Sequence[StepRecord],
                     calls: Sequence[ToolCallRecord]) -> dict[tuple[str, str], ToolCallRecord]:
    """Where a step of several calls makes exactly the calls of the latest step that made any (a loop of parallel
    calls), those earlier calls by key; else nothing."""
    latest = next((s.tool_calls for s in reversed(steps) if s.tool_calls), [])
    if len(calls) < 2 or sorted(c.key for c in calls) != sorted(c.key for c in latest):
        return {}
    ran = {c.observation_id: c for s in steps for c in s.tool_calls if c.repeat_of is None}
    return {c.key: ran.get(c.repeat_of, c) if c.repeat_of else c for c in latest}


def require_query(query: str) -> None:
    """A request needs a non-blank query."""
    if not query.strip():
        raise ValueError("the query is empty")


class RequestRun:
    """One request q_k as a resumable state machine, so that tool calls may run anywhere.

    ``advance()`` steps until the client must act or the request ends. A step's calls of the memory
    method's tools and of the configuration's tools run here; calls of the client's tools (named in
    ``client_tools``) wait in ``waiting`` until ``answer()`` brings their results. When a step answers,
    the request is persisted and ``record`` is set.
    """

    def __init__(
        self,
        *,
        engine: Engine,
        repo: Repository,
        session: str,
        query: str,
        agent: AgentConfig,
        options: RequestOptions = RequestOptions(),
        client_tools: Sequence[Mapping[str, Any]] = (),
        policy: str = "",
        wiring: Wiring | None = None,
    ) -> None:
        """``policy``: the request's own policy (an endpoint client's system message); ``wiring``: what a
        restored request was started under (else built from ``agent``)."""
        require_query(query)
        check_supported(options, engine)
        self.wiring = wiring if wiring is not None else agent.wiring(client_tools, policy, options)
        self.engine, self.repo, self.session, self.query = engine, repo, session, query
        self.agent, self.options = agent, options
        self.strategy: Strategy = agent.strategy
        self.config: LoopConfig = agent.loop
        self.limits: Limits = agent.limits
        self.client_tools = frozenset(t["name"] for t in client_tools)
        self.start = self.strategy.start(repo.view(session))
        self.index_k = self.start.k
        self.source = repo.view(session)
        self.progress = Progress(self.start.state)
        self.record: RunRecord | None = None
        self.response: str | None = None  # the final response, once the request ends
        self.cancelled = threading.Event()  # set from another thread: the request ends at its next step boundary

    # read access to the progress; only the driver writes it
    @property
    def state(self) -> ActiveState:
        return self.progress.state

    @property
    def steps(self) -> list[StepRecord]:
        return self.progress.steps

    @property
    def pending(self) -> tuple[ToolCall, ...]:
        return self.progress.pending

    @property
    def waiting(self) -> Waiting | None:
        return self.progress.waiting

    @property
    def memory_calls(self) -> list[StepRecord]:
        return self.progress.memory_calls

    @property
    def system(self) -> str:
        return self.wiring.system

    @property
    def tool_specs(self) -> list[dict[str, Any]]:
        return [dict(t) for t in self.wiring.specs]

    @property
    def done(self) -> bool:
        return self.record is not None

    def failed(self, message: str) -> RequestFailed:
        partial = RunRecord(self.session, self.index_k, self.query, None, tuple(self.steps))
        return RequestFailed(
            f"request {self.index_k} of session {self.session!r} failed: {message}", partial.to_dict(),
            persisted=self.record is not None,
        )

    def advance(self, transcript: Transcript | None = None, on_step: OnStep | None = None) -> Waiting | None:
        """Step until the client must run tools (returns what waits) or the request ends (returns None).

        ``transcript`` (the endpoint's record of the request) is persisted with it;
        ``on_step`` gives, per step, who receives its output while it decodes (where the engine streams)."""
        if self.waiting is not None:
            raise RuntimeError("advance() while client tool calls wait; answer() them first")
        with tracing.span("flowstate.turn", {"flowstate.session": tracing.hashed(self.session),
                                             "flowstate.request": self.index_k,
                                             "flowstate.strategy": self.strategy.name,
                                             "flowstate.engine": self.engine.name} if tracing.on() else None):
            while not self.done:
                if self.cancelled.is_set():  # between steps: what the request did so far is kept, as for a failure
                    raise self._fail(CANCELLED)
                with tracing.span("flowstate.step", {"flowstate.step": len(self.steps) + 1}):  # its calls inside
                    record = self.step(transcript, on_step(len(self.steps) + 1) if on_step is not None else None)
                    if record is not None and record.protocol_error is not None:
                        tracing.event("flowstate.protocol_error", record.protocol_error)
                    if self.pending:
                        waiting = self._dispatch()
                        if waiting is not None:
                            tracing.annotate({"flowstate.waiting_calls": len(waiting.client)})
                            return waiting
            return None

    def client_call_id(self, position: int, step: int | None = None) -> str:
        """The tool_call_id the client sees for the call at ``position`` (0-based) of ``step`` (default: the latest
        step; a step still decoding names itself)."""
        return f"call_{observation_id(self.index_k, step or len(self.steps), position + 1)}"

    def _dispatch(self) -> Waiting | None:
        """Run the pending calls of the method's and the configuration's tools; the client's wait."""
        client: dict[str, int] = {}
        done: dict[int, ToolCallRecord] = {}
        history = [c for s in self.steps[:-1] for c in s.tool_calls]  # this request's calls, in order
        records = [ToolCallRecord(c.name, dict(c.arguments), self.observation_id(i + 1))
                   for i, c in enumerate(self.pending)]
        again = _same_step_again(self.steps[:-1], records)
        for i, (call, record) in enumerate(zip(self.pending, records, strict=True)):
            first = again.get(record.key) if again else _repeated(history, record, self.agent.tools.read_only)
            history.append(record)
            if first is not None:  # the same call again: refused, its earlier outcome shown once more
                done[i] = replace(record, result=first.result, error=first.error, repeat_of=first.observation_id)
                history[-1] = done[i]
                continue
            if call.name in self.client_tools or call.name in self.options.approval:  # the client runs or approves
                client[self.client_call_id(i)] = i
                continue
            result, error = self._call_tool(call)
            done[i] = ToolCallRecord(call.name, dict(call.arguments), self.observation_id(i + 1), result, error)
        ran = {r.observation_id: r for r in done.values() if r.repeat_of is None}
        for i, r in list(done.items()):  # a duplicate within this step: the outcome of the call it repeats, now run
            if r.repeat_of in ran:
                done[i] = replace(r, result=ran[r.repeat_of].result, error=ran[r.repeat_of].error)
        if not client:
            self.observe([done[i] for i in range(len(self.pending))])
            return None
        self.progress.waiting = Waiting(client, done)
        return self.progress.waiting

    def repeated(self) -> int:
        """Calls of this request refused as repeats of an earlier call with the same arguments."""
        return sum(s.repeated for s in self.steps)

    def _call_tool(self, call: ToolCall) -> tuple[Any, str | None]:
        with tracing.span("flowstate.tool_call", {"flowstate.tool": call.name, "flowstate.step": len(self.steps)}):
            result, error = self._run_tool(call)
            if error is not None:
                tracing.annotate({"flowstate.tool.error": error[:500]})
            return result, error

    def _run_tool(self, call: ToolCall) -> tuple[Any, str | None]:
        own = self.strategy.call_tool(self.memory_context(), call.name, dict(call.arguments))  # the method's first
        if own is not None:
            if own.scratch is not None:
                self.progress.scratch = dict(own.scratch)
            return own.result, own.error
        if call.name in self.agent.tools:
            return self.agent.tools.call(call.name, call.arguments, self.session)
        known = ", ".join(t["name"] for t in self.wiring.specs) or "none"
        return None, f"unknown tool {call.name!r}; available: {known}"

    def answer(self, results: Mapping[str, Any]) -> None:
        """The client's results of the waiting calls, by tool_call_id; then ``advance()`` goes on. A call of a server
        tool that waits on approval takes an ``Approval``: approved, it runs here; refused, the model is told so."""
        waiting = self.waiting
        if waiting is None:
            raise RuntimeError("no client tool calls wait")
        unknown = sorted(set(results) - set(waiting.client))
        if unknown:
            raise ValueError(f"results for calls that do not wait: {', '.join(unknown)}")
        missing = [i for i in waiting.client if i not in results]
        if missing:
            raise ValueError(f"no result for waiting call(s) {', '.join(missing)}")
        answered = dict(waiting.done)
        for call_id, position in waiting.client.items():
            call, given = self.pending[position], results[call_id]
            if (call.name in self.options.approval) != isinstance(given, Approval):
                raise ValueError(f"call {call_id} of {call.name!r} waits on "
                                 f"{'an approval' if call.name in self.options.approval else 'a result'}")
            result, error = given, None
            if isinstance(given, Approval):
                result, error = self._call_tool(call) if given.approve else (None, given.refusal())
            answered[position] = ToolCallRecord(call.name, dict(call.arguments), self.observation_id(position + 1),
                                                result, error)
        self.progress.waiting = None
        self.observe([answered[i] for i in range(len(self.pending))])

    def memory_context(self) -> MemoryContext:
        """What the memory method's hooks see of this request."""
        p = self.progress
        return MemoryContext(self.source, self.query, self.index_k, p.state, p.observation, self.limits,
                             self.call_model, dict(p.scratch), self.response)

    def _generate(self, messages: Sequence[Message], grammar: str | None, on_text: OnText | None = None,
                  purpose: Purpose = STEP) -> Generation:
        """Every model call of the request, the memory method's included: its sampling, token budget, routing id
        (several servers: this session's calls stay on one), cache partition and priority."""
        with tracing.span("flowstate.model_call", {"flowstate.engine": self.engine.name,
                                                   "flowstate.purpose": purpose.kind}):
            generation = self.engine.generate(
                messages, grammar=grammar, max_tokens=self.options.max_tokens or self.config.max_tokens,
                on_text=on_text, sampling=self.options.sampling if self.options.sampling.given() else None,
                affinity=self.agent.routing(self.session), purpose=purpose,
                cache_salt=self.agent.cache_salt(self.session),
                priority=self.agent.priorities.of(self.options.lane or self.agent.lane, purpose))
            if self.agent.told_cached is not None and generation.usage.cached_tokens > self.agent.told_cached:
                generation = replace(generation, usage=replace(generation.usage, cached_tokens=self.agent.told_cached))
            u = generation.usage
            tracing.annotate({"gen_ai.usage.input_tokens": u.prompt_tokens, "gen_ai.usage.output_tokens":
                              u.completion_tokens, "flowstate.cached_tokens": u.cached_tokens,
                              "flowstate.forced_tokens": u.forced_tokens, "flowstate.ttft_s": u.ttft_s,
                              "flowstate.truncated": generation.truncated})
            return generation

    def call_model(self, purpose: Purpose, system: str, user: str, grammar: str) -> Generation:
        """A memory method's own model call (``purpose``: its declared kind and reply model), under ``grammar``
        where the request decodes under grammars."""
        return self._generate([Message("system", system), Message("user", user)],
                              grammar if self.wiring.grammars is not None else None, purpose=purpose)

    def step(self, transcript: Transcript | None = None, on_text: OnText | None = None) -> StepRecord | None:
        """One model call and everything the runtime does with its output (raises ``RequestFailed``).

        Past the step budget no call is made: the request is persisted unfinished (``record`` is
        set, None is returned) or fails, as ``on_budget`` says — and fails always where its options promise
        more than text (``RequestOptions.contract``).
        """
        if self.pending:
            raise RuntimeError("step() while tool calls are pending; observe() their results first")
        if self.done:
            raise RuntimeError("the request is finished")
        p = self.progress
        t = len(p.steps) + 1
        if self.repeated() > self.config.max_repeats and self.wiring.grammars is None:  # a grammar forces an answer
            self._over_budget(transcript, f"{LOOPING}{self.repeated()} calls repeated an earlier call of the request "
                                          "with the same arguments")
            return None
        if t > self.config.max_steps:
            self._over_budget(transcript, f"{BUDGET} of {self.config.max_steps} steps")
            return None
        if t == 1:
            try:
                self._apply(self.strategy.begin(self.memory_context()))  # e.g. a state tracker reads the new query
            except EngineError as exc:
                raise self._fail(f"engine error before step 1: {exc}") from exc
        try:  # a method's prompt may call an engine of its own (an embedding server ranking what it shows)
            messages = self.strategy.prompt(StepInput(self.system, self.query, self.start, p.state, tuple(p.feedback),
                                                      p.observation, dict(p.scratch), tuple(p.steps),
                                                      self.agent.output_limits))
        except EngineError as exc:
            raise self._fail(f"engine error in the memory method's prompt at step {t}: {exc}") from exc
        started = time.perf_counter()
        grammars = self.wiring.grammars
        # the last allowed step decides: a final answer, or the calls a tool choice requires
        # the step after one whose every call was refused as a repeat holds (it answers or records, calling nothing);
        # once max_repeats were refused, the next step decides as the budget's last one does
        last = p.steps[-1] if p.steps else None
        hold = last is not None and bool(last.tool_calls) and last.repeated == len(last.tool_calls)
        final = t == self.config.max_steps or (self.repeated() >= self.config.max_repeats > 0 and (
            hold or self.repeated() > self.config.max_repeats))
        blocks = self.strategy.step_blocks(self.index_k)  # what this request may write (lean: a record a block)
        grammar = grammars.for_step(p.state, final=final, hold=hold, blocks=blocks) if grammars is not None else None
        grammar_ms = (time.perf_counter() - started) * 1000
        try:
            generation = self._generate(messages, grammar, on_text)
        except EngineError as exc:
            raise self._fail(f"engine error at step {t}: {exc}") from exc
        try:
            output = self.options.enforce(
                parse_output(generation.text, self.strategy.blocks, self.agent.output_limits,
                             self.options.answer_schema, self.strategy.optional))
        except ProtocolError as exc:
            return self._unparsed(t, generation, grammar_ms, exc)
        except Exception as exc:  # whatever else a model's text can trigger is the model's fault too, fed back
            log.warning("an output the parser did not expect (%s): fed back as a protocol error", exc, exc_info=True)
            return self._unparsed(t, generation, grammar_ms, ProtocolError("output", f"unreadable output: {exc}"))
        return self._commit(t, generation, grammar_ms, output, transcript)

    def _commit(self, t: int, generation: Generation, grammar_ms: float, output: ModelOutput,
                transcript: Transcript | None) -> StepRecord:
        """A parsed output applied: focus checked, the delta applied, what was accepted disclosed, tool calls
        pending; the step recorded, and the request persisted when it answered."""
        p = self.progress
        p.errors = 0
        if t > 1 and generation.usage.prompt_tokens and not generation.usage.cached_tokens:
            _no_prefix_reuse(self.engine)

        accepted, refused = validate_access(p.state, output.state_focus)  # against S_k,t
        update = apply_delta(p.state, output.state_delta)  # S+_k,t
        p.state = disclose(self.source, update.state, accepted)  # S_k,t+1
        malformed = [m.to_dict() for m in output.malformed]
        p.observation = ()
        p.pending = output.tool_calls
        record = StepRecord(
            index=t, raw=generation.text, usage=generation.usage, grammar_ms=grammar_ms,
            truncated=generation.truncated, malformed=malformed,
            committed=update.committed_dicts(), rejected=[r.to_dict() for r in update.rejected],
            disclosed=list(accepted), refused=[r.to_dict() for r in refused],
            final_response=None if output.final_response is None else self.options.stop_at(output.final_response),
        )
        p.steps.append(record)
        p.feedback = record.feedback()
        for r in record.rejected:  # what ISU refused and why, what PSA disclosed or refused: the step's events
            tracing.event("flowstate.isu.rejected", {k: str(v) for k, v in r.items() if v is not None})
        if accepted:
            tracing.event("flowstate.psa.disclosed", {"flowstate.state_ids": list(accepted)})
        for r in record.refused:
            tracing.event("flowstate.psa.refused", {k: str(v) for k, v in r.items() if v is not None})
        if record.final_response is not None:
            self._persist(record.final_response, transcript)
        return record

    def _over_budget(self, transcript: Transcript | None, reason: str) -> None:
        """The step budget is spent, or the request loops: persist it unfinished, or fail it (``on_budget``, or a
        contract the budget message would break)."""
        if self.options.contract is not None:
            raise self.failed(f"{reason}, and the request's {self.options.contract} admits no budget message")
        if self.config.on_budget == "fail":
            raise self.failed(reason)
        self._persist(None, transcript, unfinished=reason)

    def _fail(self, message: str) -> RequestFailed:
        """A failed request: persisted unfinished, its reason marked as a failure; the error to raise.

        A request that failed before any model output (an engine down at its first call) did nothing to keep: it
        is not persisted, and a retry is the same request. The endpoint's transcript is not kept with a failed
        one: its client got an error, not a reply to continue from."""
        if self.steps:
            self._persist(None, None, unfinished=FAILED + message, failing=True)
        return self.failed(message)

    def _unparsed(self, t: int, generation: Generation, grammar_ms: float, exc: ProtocolError) -> StepRecord:
        """An output that is not the protocol: fed back (a cut one as truncation), or the request fails."""
        p = self.progress
        p.errors += 1
        record = StepRecord(t, generation.text, generation.usage, grammar_ms, protocol_error=exc.to_dict(),
                            truncated=generation.truncated)
        p.steps.append(record)
        if p.errors >= self.config.max_protocol_errors:
            raise self._fail(f"{p.errors} consecutive outputs broke the protocol; last: {exc}") from exc
        p.feedback = record.feedback()
        return record  # the latest observation stays in view: the model has not acted on it yet

    def observation_id(self, i: int) -> str:
        """The id of the raw observation of the i-th (1-based) pending tool call."""
        return observation_id(self.index_k, len(self.steps), i)

    def observe(self, calls: Sequence[ToolCallRecord]) -> None:
        """The results of the pending tool calls, in their order, become O_k,t."""
        p = self.progress
        if len(calls) != len(p.pending):
            raise ValueError(f"{len(p.pending)} tool calls are pending, got {len(calls)} results")
        p.steps[-1] = replace(p.steps[-1], tool_calls=list(calls))
        p.feedback = p.steps[-1].feedback()  # with the calls refused as repeats
        p.observation = tuple(_observation_node(c, self.index_k) for c in calls)
        p.state = p.state.with_observations(p.observation)
        p.pending = ()
        try:
            self._apply(self.strategy.observed(self.memory_context()))  # e.g. a state tracker's update
        except EngineError as exc:  # the method's own call failed: the request is persisted unfinished
            raise self._fail(f"engine error in the memory method's call after step {len(p.steps)}: {exc}") from exc

    def _apply(self, observed: Observed) -> None:
        """What a memory method's hook made: a new Active State (or none), and its model calls."""
        if observed.state is not None:
            self.progress.state = observed.state
        self.progress.memory_calls.extend(observed.calls)

    def _persist(self, response: str | None, transcript: Transcript | None, unfinished: str | None = None,
                 failing: bool = False) -> None:
        """Persist the request; a memory method's own call that fails at its end fails it (persisted as failed)."""
        self.response = response
        error: EngineError | None = None
        reason = ""
        try:
            # the method's own work at the end (may call the model)
            finish = self.strategy.finish(self.memory_context())
        except EngineError as exc:
            finish = Finish()  # the method's nodes cannot be built; the request is kept all the same
            if not failing:  # the answer is in, the method's call is not: persisted as failed, not as answered
                error, reason = exc, f"engine error in the memory method's call at the request's end: {exc}"
                response, transcript, self.response = None, None, None
                unfinished = FAILED + reason
        nodes = [*self.strategy.persisted(self.state, response), *finish.nodes]
        record = RunRecord(
            self.session, self.index_k, self.query, response, tuple(self.steps),
            persisted_states=tuple(n.id for n in nodes if not n.is_observation),
            persisted_observations=tuple(n.id for n in nodes if n.is_observation),
            unfinished=unfinished, memory_calls=(*self.memory_calls, *finish.calls),
        )
        stored = record.to_dict()
        own = {t["name"] for t in self.strategy.tools()}
        tools = [dict(t) for t in self.wiring.specs if t["name"] not in own]
        if tools:  # the tools the request offered (the server's and its client's): what a replay offers again
            stored["tools"] = tools
        if self.wiring.policy:  # and the policy it ran under (the server's and its client's system message)
            stored["policy"] = self.wiring.policy
        self.repo.persist_request(
            self.session, self.index_k, self.query, response, nodes, stored, unfinished, transcript,
            strategy=self.strategy.name,
        )
        self.record = record
        if error is not None:
            raise self.failed(reason) from error


def run_request(*, engine: Engine, repo: Repository, session: str, query: str, agent: AgentConfig) -> RunRecord:
    """Run one request of ``session`` to its end, running its tools here, and persist it.

    The record's ``response`` is None (and ``unfinished`` says why) when the step budget ran out."""
    run = RequestRun(engine=engine, repo=repo, session=session, query=query, agent=agent)
    run.advance()
    assert run.record is not None  # no client tools: nothing waits
    return run.record
