"""One HTTP turn: start or resume a request and run it until the client must act or it answers.

Steps that only update or access state, and calls of the server's own tools, run here and never
reach the client. Everything in this module is synchronous; the app runs it in a worker thread
while it holds the session's lock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.base import Engine, OnText, Usage
from engine.errors import ContextOverflow, EngineError
from flowstate.config import AgentConfig
from flowstate.errors import RequestFailed
from flowstate.loop import Approval, RequestRun, Waiting
from flowstate.nodes import canonical_json
from flowstate.output_stream import AnswerStream, ToolCallStream
from flowstate.records import StepRecord, ToolCallRecord, unfinished_message
from flowstate.request_options import RequestOptions, UnsupportedOption, check_supported
from flowstate.store.repository import Repository
from flowstate.suspend import restore, snapshot
from grammars.check import GrammarError
from serving.chat.messages import AssistantMessage, Delta, FunctionCallOut, FunctionDelta, ToolCallDelta, ToolCallOut
from serving.chat.wire import loads_or_none
from serving.errors import APIError, bad_request, conflict
from serving.live import Live

RETRY_AFTER_S = 5
_SEAM = 8  # tokens of slack before a streamed answer is counted whole against its budget
OnDelta = Callable[[Delta], None]  # one streamed chunk's delta: the answer's text, or the client's tool calls


@dataclass(frozen=True)
class Checked:
    """A request's client tools and options as ``Turns.check`` passed them: what starting its request trusts."""

    client_tools: tuple[dict[str, Any], ...]
    options: RequestOptions


@dataclass(frozen=True)
class TurnResult:
    """What one HTTP call answers: an assistant message (tool calls or the final answer) and its cost."""

    message: AssistantMessage
    usage: Usage  # summed over the model calls of this turn
    steps: tuple[StepRecord, ...]  # the model calls of this turn
    request: int
    finished: bool  # the request ended and was persisted
    unfinished: str | None = None  # why it ended without a final answer (the step budget; the message says so)
    at: int = 0  # the session's transcript length after this turn: where the session's next turn continues
    approved: tuple[tuple[str, ToolCallRecord], ...] = ()  # calls the client's approvals ran or refused, by call id
    memory_calls: tuple[StepRecord, ...] = ()  # the memory method's own model calls in this turn (a tenant's cost too)
    cut: bool = False  # the answer was cut to the client's max_tokens

    @property
    def model_tokens(self) -> int:
        """Prompt and completion tokens of every model call this turn made, the memory method's own included."""
        return sum(s.usage.prompt_tokens + s.usage.completion_tokens for s in (*self.steps, *self.memory_calls))

    @property
    def finish_reason(self) -> str:
        """OpenAI's: "tool_calls", "stop", or "length" for a request cut by its step budget."""
        return "length" if self.unfinished is not None or self.cut else self.message.finish_reason


class Turns:
    """An adapter from OpenAI messages to the one driver, for every session of one server: one engine, one
    repository, one agent configuration (strategy, the server's tools, limits, grammar mode)."""

    def __init__(self, engine: Engine, repo: Repository, agent: AgentConfig, stream_answers: str = "auto") -> None:
        self.engine, self.repo, self.agent = engine, repo, agent
        self.limits = agent.limits
        # an answer streamed while decoded is the final one only under a grammar ("always": stream regardless)
        self.streams_answers = engine.capabilities.streams and (
            stream_answers == "always" or stream_answers == "auto" and agent.constrained)

    def check(self, client_tools: Sequence[dict[str, Any]], options: RequestOptions = RequestOptions()) -> Checked:
        """Client tools may not take a server tool's (or the memory method's) name, the engine must honour the
        sampling asked for, and the tools and answer format must compile into a grammar: the one check a request's
        tools and options get; what it returns, ``start`` trusts."""
        taken = {*self.agent.tools, *(t["name"] for t in self.agent.strategy.tools())}
        clash = {t["name"] for t in client_tools} & taken
        if clash:
            raise bad_request(f"tools {sorted(clash)} are already server-side tools of this endpoint", "tools")
        try:
            check_supported(options, self.engine)  # the core's rule; refused here before the request starts
        except UnsupportedOption as exc:
            raise bad_request(str(exc), exc.param, "unsupported_parameter") from exc
        try:
            self.agent.grammars(self.agent.specs(client_tools), options, validate=True)
        except GrammarError as exc:
            raise bad_request(f"the tools' parameter schemas cannot be decoded under a grammar: {exc}",
                              "tools", "unsupported_schema") from exc
        return Checked(tuple(client_tools), options)

    def start(self, live: Live, users: Sequence[Mapping[str, Any]], policy: str, checked: Checked,
              key: str | None = None, on_delta: OnDelta | None = None) -> TurnResult:
        """A new request q_k from the new user message(s), with the tools and options ``check`` passed; ``key`` is
        the call's Idempotency-Key."""
        if not "".join(str(m["content"] or "") for m in users if m["role"] == "user").strip():
            raise bad_request("the user message is empty", "messages")
        live.start(RequestRun(engine=self.engine, repo=self.repo, session=live.name, query=query_text(users),
                              agent=self.agent, options=checked.options, client_tools=checked.client_tools,
                              policy=policy), [dict(m) for m in users])
        return self._drive(live, key, on_delta)

    def resume(self, live: Live, results: Sequence[Mapping[str, Any]], key: str | None = None,
               on_delta: OnDelta | None = None, approvals: Mapping[str, Approval] | None = None) -> TurnResult:
        """The client's tool messages answer the waiting calls (``approvals``: its answers to the calls that wait on
        its approval, each with a tool message of its own); the request goes on."""
        if live.run is None and live.suspended is not None:  # stored by this server before a restart, or another
            live.take_up(restore(live.suspended["run"], engine=self.engine, repo=self.repo, agent=self.agent))
        run = live.run
        assert run is not None and run.waiting is not None
        answered: dict[str, Any] = {}
        for m in results:
            if m["tool_call_id"] not in run.waiting.client:
                raise bad_request(f"tool message {m['tool_call_id']!r} answers no pending call; pending: "
                                  f"{', '.join(run.waiting.client)}", "messages", "unknown_tool_call_id")
            if m["tool_call_id"] in answered:
                raise bad_request(f"tool call {m['tool_call_id']!r} is answered twice", "messages")
            answered[m["tool_call_id"]] = _answer(run, m, approvals or {})
        missing = [i for i in run.waiting.client if i not in answered]
        if missing:
            raise bad_request(f"no tool message answers pending call(s) {', '.join(missing)}", "messages",
                              "missing_tool_results")
        positions = {i: p for i, p in run.waiting.client.items() if isinstance(answered[i], Approval)}
        run.answer(answered)
        live.answer([dict(m) for m in results])
        ran = tuple((i, run.steps[-1].tool_calls[p]) for i, p in positions.items())
        return self._drive(live, key, on_delta, ran)

    def _drive(self, live: Live, key: str | None, on_delta: OnDelta | None = None,
               approved: tuple[tuple[str, ToolCallRecord], ...] = ()) -> TurnResult:
        run = live.run
        assert run is not None
        first, first_memory = len(run.steps), len(run.memory_calls)
        on_step = None
        if on_delta is not None and self.streams_answers:
            def on_step(step: int) -> OnText:
                return self._live_output(run, step, on_delta, self.engine.count_tokens)
        try:
            waiting = run.advance(live.so_far(key), on_step)
        except RequestFailed as exc:
            self._drop(live)
            raise _failure(exc, (*run.steps[first:], *run.memory_calls[first_memory:])) from exc
        except BaseException:  # a storage fault or a bug: the session must not stay half-advanced
            self._drop(live)
            raise
        if waiting is not None:
            return self._result(run, (first, first_memory), self._wait(live, run, waiting, key), len(live.transcript),
                                approved)
        assert run.record is not None
        response = run.record.response
        cut = False
        if response is None:  # the step budget ran out: say so, with what was kept
            response = unfinished_message(run.record.unfinished, run.record.persisted_states)
        else:  # the client's max_tokens bounds what it receives (memory keeps the whole answer)
            response, cut = run.options.fit(response, self.engine.count_tokens)
        if live.finish(response, key):  # it had waited on the client: its stored snapshot goes
            self.repo.waiting.clear(live.name)
        return replace(self._result(run, (first, first_memory), AssistantMessage(content=response),
                                    len(live.transcript), approved), cut=cut)

    def _drop(self, live: Live) -> None:
        """The unfinished request failed: the session is as before it, its stored snapshot gone."""
        if live.abandon():
            self.repo.waiting.clear(live.name)

    @staticmethod
    def _live_output(run: RequestRun, step: int, on_delta: OnDelta, count: Callable[[str], int]) -> OnText:
        """What the client sees of one step while it decodes: the answer's text, up to a stop sequence and within
        its budget (``count`` counts its tokens), and calls of its own tools (ids and arguments as they come; calls
        of the server's tools never reach it)."""
        client: dict[int, int] = {}  # position in the step's calls -> index among the client's calls

        def on_call(position: int, name: str) -> None:
            if name in run.client_tools:
                client[position] = len(client)
                call_id = run.client_call_id(position - 1, step)  # the stream counts calls from 1
                on_delta(Delta(tool_calls=[ToolCallDelta(index=client[position], id=call_id, type="function",
                                                         function=FunctionDelta(name=name, arguments=""))]))

        def on_arguments(position: int, text: str) -> None:
            if position in client:
                on_delta(Delta(tool_calls=[ToolCallDelta(index=client[position],
                                                         function=FunctionDelta(arguments=text))]))

        hold = max((len(x) - 1 for x in run.options.stop if x), default=0)  # a stop sequence may span pieces
        held, sent, stopped = "", "", False
        used: int | None = None  # the tokens sent, at most (exact where last counted; None: not counted yet)
        budget = run.options.answer_tokens

        def on_text(text: str) -> None:  # the answer as decoded, never past a stop sequence or its budget
            nonlocal held, sent, stopped, used
            if stopped:
                return
            held += text
            cut = run.options.stop_at(held)
            if len(cut) < len(held):
                stopped, ready, held = True, cut, ""
            else:
                ready, held = held[: len(held) - hold], held[len(held) - hold:]
            if ready and budget is not None and len((sent + ready).encode()) > budget:
                guess = None if used is None else used + count(ready) + 1  # a piece's tokens, and one at the seam
                if guess is None or guess + _SEAM > budget:  # near the budget: the longest prefix that fits, counted
                    fitted, over = run.options.fit(sent + ready, count)
                    stopped, ready, used = stopped or over, fitted[len(sent):], count(fitted)
                else:  # far from it: no recount of the whole answer per piece (that was quadratic)
                    used = guess
            if ready:
                sent += ready
                on_delta(Delta(content=ready))

        answer = AnswerStream(on_text)
        calls = ToolCallStream(on_call, on_arguments)

        def feed(piece: str) -> None:
            calls.feed(piece)
            answer.feed(piece)

        return feed

    def _wait(self, live: Live, run: RequestRun, waiting: Waiting, key: str | None) -> AssistantMessage:
        """The assistant message of the client's calls; the waiting request is stored, so that it outlives this
        process and any server sharing the database can go on with it."""
        redaction = self.repo.redaction  # the client's own values for the placeholders the model wrote
        args = {cid: dict(run.pending[i].arguments) for cid, i in waiting.client.items()}
        if redaction is not None:
            args = {cid: dict(redaction.restore(live.name, a)) for cid, a in args.items()}
        calls = [ToolCallOut(id=cid, function=FunctionCallOut(name=run.pending[i].name,
                                                              arguments=canonical_json(args[cid])))
                 for cid, i in waiting.client.items()]
        stored = live.wait([{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in calls],
                           key, snapshot(run))
        self.repo.waiting.save(live.name, run.index_k, stored)
        return AssistantMessage(tool_calls=calls)

    @staticmethod
    def _result(run: RequestRun, first: tuple[int, int], message: AssistantMessage, at: int,
                approved: tuple[tuple[str, ToolCallRecord], ...]) -> TurnResult:
        """This turn's part of the request: its steps and memory calls from ``first`` (their counts at its start)."""
        steps = tuple(run.steps[first[0]:])
        usage = sum((s.usage for s in steps), Usage())
        unfinished = run.record.unfinished if run.record is not None else None
        memory = tuple(run.record.memory_calls if run.record is not None else run.memory_calls)[first[1]:]
        return TurnResult(message, usage, steps, run.index_k, not message.tool_calls, unfinished, at, approved, memory)


def _failure(exc: RequestFailed, steps: tuple[StepRecord, ...]) -> APIError:
    """A failed request as the endpoint's error: 503 where a retry can help (the engine), else 502 (the model)."""
    cause = exc.__cause__
    stored = ("what it did is kept in the session's memory as an unfinished request" if exc.persisted
              else "nothing of this request was stored")
    if isinstance(cause, EngineError) and cause.retryable:  # the engine is down or overloaded, not the model
        error = APIError(503, f"{exc}; {stored}, retry later", type="server_error",
                         code="engine_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)})
    elif isinstance(cause, ContextOverflow):  # the same request fails again however often it is resent
        error = APIError(400, f"{exc}; {stored}. The session's prompt no longer fits the model's context, so resending "
                              "cannot help: start a new session, send a shorter message, or serve a longer context or "
                              "a bounded index (--strategy flowstate-paged)", type="invalid_request_error",
                         code="context_length_exceeded")
    else:
        faults = "; ".join(f"step {s.index}: {s.protocol_error['block']}: {s.protocol_error['message']}"
                           + (" (cut at the token budget)" if s.truncated else "")
                           for s in steps if s.protocol_error)
        error = APIError(502, f"{exc}; {stored}, resend its user message to retry"
                         + (f". Step errors: {faults}" if faults else ""), type="model_error", code="request_failed")
    error.steps = steps
    return error


def query_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The request's query: its user messages, and the assistant messages the client wrote before them
    (context for the model, marked as not its own words)."""
    parts = [str(m["content"] or "") if m["role"] == "user"
             else f"[an assistant message the client wrote, not one of your replies]: {m['content'] or ''}"
             for m in messages]
    return "\n\n".join(p for p in parts if p.strip())


def _answer(run: RequestRun, message: Mapping[str, Any], approvals: Mapping[str, Approval]) -> Any:
    """What a tool message gives the waiting call it answers: the client's approval for a call of a server tool
    that waits on one, else the result of its own tool's call."""
    assert run.waiting is not None
    call_id = message["tool_call_id"]
    name = run.pending[run.waiting.client[call_id]].name
    if (name in run.options.approval) != (call_id in approvals):
        wanted = "an mcp_approval_response" if name in run.options.approval else "its function's output"
        raise bad_request(f"call {call_id!r} of {name!r} waits on {wanted}", "input", "unexpected_tool_answer")
    return approvals[call_id] if call_id in approvals else _observation(message["content"])


def _observation(content: Any) -> Any:
    """A tool message's content as the observation: JSON when it is strict JSON, the text otherwise."""
    if isinstance(content, str):
        value = loads_or_none(content)
        return content if value is None else value
    return content


def check_pending(live: Live, new: Sequence[Mapping[str, Any]]) -> tuple[str, list[Mapping[str, Any]]]:
    """Whether ``new`` starts a request ("start") or answers pending calls ("resume"); 4xx otherwise."""
    if not new:
        raise bad_request("the conversation holds no new message to answer", "messages", "nothing_new")
    roles = {m["role"] for m in new}
    if live.calls is not None:
        if roles != {"tool"}:
            raise conflict(
                f"tool calls {', '.join(live.calls)} are pending: answer them before a new user message (tool "
                "messages; on the Responses API function_call_output or mcp_approval_response items)",
                "tool_calls_pending")
        return "resume", list(new)
    if "tool" in roles:
        tool_id = next(m["tool_call_id"] for m in new if m["role"] == "tool")
        raise bad_request(f"tool message {tool_id!r} answers no pending call", "messages", "unknown_tool_call_id")
    if new[-1]["role"] != "user" or any(m.get("tool_calls") for m in new if m["role"] == "assistant"):
        raise bad_request("new messages must end with a user message; assistant messages the client writes (a "
                          "greeting, examples) may come before it, without tool calls", "messages",
                          "unexpected_assistant_message")
    return "start", list(new)
