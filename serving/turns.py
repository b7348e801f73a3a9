"""One HTTP turn: start or resume a request and run it until the client must act or it answers.

Steps that only update or access state, and calls of the server's own tools, run here and never
reach the client. Everything in this module is synchronous; the app runs it in a worker thread
while it holds the session's lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.base import Engine, OnText, Usage, sampling_fields, streams
from engine.errors import EngineError
from flowstate.constrain import GrammarMode, Grammars
from flowstate.errors import RequestFailed
from flowstate.loop import LoopConfig, RequestRun
from flowstate.nodes import canonical_json, observation_id
from flowstate.output_stream import AnswerStream, ToolCallStream
from flowstate.records import StepRecord, ToolCallRecord, unfinished_message
from flowstate.request_options import RequestOptions
from flowstate.repository import Repository
from flowstate.serializer import system_prompt
from flowstate.suspend import options_from, restore, snapshot
from flowstate.tools import ToolSet
from grammars.check import GrammarError
from serving.errors import APIError, bad_request, conflict
from serving.sessions import Live, PendingCalls
from serving.wire import loads_or_none


RETRY_AFTER_S = 5
OnDelta = Callable[[dict[str, Any]], None]  # one streamed chunk's delta: {"content": …} or {"tool_calls": […]}


@dataclass(frozen=True)
class TurnResult:
    """What one HTTP call answers: an assistant message (tool calls or the final answer) and its cost."""

    message: dict[str, Any]  # OpenAI's assistant message
    finish_reason: str  # "tool_calls" or "stop"
    usage: Usage  # summed over the model calls of this turn
    steps: tuple[StepRecord, ...]  # the model calls of this turn
    request: int
    finished: bool  # the request ended and was persisted
    unfinished: bool = False  # it ended at the step budget (the message says so)


class Turns:
    """Runs turns for every session of one server: one engine, one repository, the server's tools."""

    def __init__(self, engine: Engine, repo: Repository, server_tools: ToolSet, config: LoopConfig,
                 stream_answers: str = "auto") -> None:
        self.engine, self.repo, self.server_tools = engine, repo, server_tools
        self.config = config.for_engine(engine)
        assert self.config.limits is not None
        self.limits = self.config.limits
        # an answer streamed while decoded is the final one only under a grammar ("always": stream regardless)
        constrained = engine.supports_grammar and self.config.grammar is not GrammarMode.NONE
        self.streams_answers = streams(engine) and (stream_answers == "always" or stream_answers == "auto" and constrained)
        self._grammars: OrderedDict[str, Grammars] = OrderedDict()

    def check(self, client_tools: Sequence[Mapping[str, Any]], options: RequestOptions = RequestOptions()) -> None:
        """Client tools may not take a server tool's name, the engine must honour the sampling asked for, and
        the tools and answer format must compile into a grammar."""
        clash = {t["name"] for t in client_tools} & set(self.server_tools)
        if clash:
            raise bad_request(f"tools {sorted(clash)} are already server-side tools of this endpoint", "tools")
        refused = options.sampling.given() - sampling_fields(self.engine)
        if refused:
            raise bad_request(f"the {self.engine.name} engine cannot honour {', '.join(sorted(refused))} per request",
                              sorted(refused)[0], "unsupported_parameter")
        self._grammars_for([*self.server_tools.specs(), *client_tools], options)

    def start(self, live: Live, users: Sequence[Mapping[str, Any]], policy: str,
              client_tools: Sequence[dict[str, Any]], key: str | None = None,
              on_delta: OnDelta | None = None, options: RequestOptions = RequestOptions()) -> TurnResult:
        """A new request q_k from the new user message(s); ``key`` is the call's Idempotency-Key."""
        self.check(client_tools, options)
        if not "".join(str(m["content"] or "") for m in users if m["role"] == "user").strip():
            raise bad_request("the user message is empty", "messages")
        query = query_text(users)
        specs = [*self.server_tools.specs(), *client_tools]
        live.run = RequestRun(
            engine=self.engine, repo=self.repo, session=live.name, query=query,
            system=system_prompt(specs, _with_format(policy, options), limits=self.limits), tool_specs=specs,
            config=self.config, grammars=self._grammars_for(specs, options), options=options,
        )
        live.client_tools = frozenset(t["name"] for t in client_tools)
        live.transcript.extend(dict(m) for m in users)
        return self._drive(live, key, on_delta)

    def resume(self, live: Live, results: Sequence[Mapping[str, Any]], key: str | None = None,
               on_delta: OnDelta | None = None) -> TurnResult:
        """The client's tool messages answer the pending calls; the request goes on."""
        if live.run is None and live.suspended is not None:  # stored by this server before a restart, or another
            live.run = self._restore(live.suspended["run"])
        run, calls = live.run, live.calls
        assert run is not None and calls is not None
        answered: dict[int, ToolCallRecord] = dict(calls.done)
        for m in results:
            position = calls.client.get(m["tool_call_id"])
            if position is None:
                raise bad_request(
                    f"tool message {m['tool_call_id']!r} answers no pending call; pending: {', '.join(calls.client)}",
                    "messages", "unknown_tool_call_id")
            if position in answered:
                raise bad_request(f"tool call {m['tool_call_id']!r} is answered twice", "messages")
            call = run.pending[position]
            answered[position] = ToolCallRecord(
                call.name, dict(call.arguments), run.observation_id(position + 1), _observation(m["content"]))
        missing = [i for i, p in calls.client.items() if p not in answered]
        if missing:
            raise bad_request(f"no tool message answers pending call(s) {', '.join(missing)}", "messages",
                              "missing_tool_results")
        run.observe([answered[i] for i in range(len(run.pending))])
        live.calls = None
        live.transcript.extend(dict(m) for m in results)
        return self._drive(live, key, on_delta)

    def _drive(self, live: Live, key: str | None, on_delta: OnDelta | None = None) -> TurnResult:
        run = live.run
        assert run is not None
        first = len(run.steps)
        try:
            while True:
                keys = {**live.request_keys(), **({key: len(live.transcript) - live.finished} if key else {})}
                feed = self._live_output(live, run, on_delta) if on_delta is not None and self.streams_answers else None
                run.step(extra={"transcript": live.transcript[live.finished:], "idempotency": keys}, on_text=feed)
                if run.record is not None:
                    response = run.record.response
                    if response is None:  # the step budget ran out: say so, with what was kept
                        response = unfinished_message(run.record.unfinished, run.record.persisted_states)
                    self._remember(live, key)
                    live.transcript.append({"role": "assistant", "content": response})
                    live.finished, live.run = len(live.transcript), None
                    live.requests += 1
                    self._unsuspend(live)
                    return self._result(run, first, {"role": "assistant", "content": response}, "stop")
                if run.pending:
                    message = self._act(live, run, key)
                    if message is not None:
                        return self._result(run, first, message, "tool_calls")
        except RequestFailed as exc:
            self._unsuspend(live)
            live.abandon()
            steps = tuple(run.steps[first:])
            cause = exc.__cause__
            if isinstance(cause, EngineError) and cause.retryable:  # the engine is down or overloaded, not the model
                error = APIError(503, f"{exc}; nothing of this request was stored, retry later", type="server_error",
                                 code="engine_unavailable", headers={"Retry-After": str(RETRY_AFTER_S)})
            else:
                faults = "; ".join(f"step {s.index}: {s.protocol_error['block']}: {s.protocol_error['message']}"
                                   + (" (cut at the token budget)" if s.truncated else "")
                                   for s in steps if s.protocol_error)
                error = APIError(502, f"{exc}; nothing of this request was stored, resend its user message to retry"
                                 + (f". Step errors: {faults}" if faults else ""), type="model_error",
                                 code="request_failed")
            error.steps = steps
            raise error from exc
        except BaseException:  # a storage fault or a bug: the session must not stay half-advanced
            try:
                self._unsuspend(live)
            finally:
                live.abandon()
            raise

    def _restore(self, snap: dict[str, Any]) -> RequestRun:
        specs, options = snap["tool_specs"], options_from(snap["options"])
        return restore(snap, engine=self.engine, repo=self.repo, config=self.config,
                       grammars=self._grammars_for(specs, options))

    def _unsuspend(self, live: Live) -> None:
        """The waiting request ended (answered, failed or dropped): its stored snapshot goes."""
        if live.suspended is not None:
            live.suspended = None
            self.repo.clear_pending(live.name)

    @staticmethod
    def _live_output(live: Live, run: RequestRun, on_delta: OnDelta) -> OnText:
        """What the client sees of one step while it decodes: the answer's text, and calls of its own tools
        (ids and arguments as they come; calls of the server's tools never reach it)."""
        step = len(run.steps) + 1
        client: dict[int, int] = {}  # position in the step's calls -> index among the client's calls

        def on_call(position: int, name: str) -> None:
            if name in live.client_tools:
                client[position] = len(client)
                call_id = f"call_{observation_id(run.index_k, step, position)}"
                on_delta({"tool_calls": [{"index": client[position], "id": call_id, "type": "function",
                                          "function": {"name": name, "arguments": ""}}]})

        def on_arguments(position: int, text: str) -> None:
            if position in client:
                on_delta({"tool_calls": [{"index": client[position], "function": {"arguments": text}}]})

        hold = max((len(x) - 1 for x in run.options.stop if x), default=0)  # a stop sequence may span pieces
        held, stopped = "", False

        def on_text(text: str) -> None:  # the answer as decoded, never past a stop sequence
            nonlocal held, stopped
            if stopped:
                return
            held += text
            cut = run.options.stop_at(held)
            if len(cut) < len(held):
                stopped, ready, held = True, cut, ""
            else:
                ready, held = held[: len(held) - hold], held[len(held) - hold:]
            if ready:
                on_delta({"content": ready})

        answer = AnswerStream(on_text)
        calls = ToolCallStream(on_call, on_arguments)

        def feed(piece: str) -> None:
            calls.feed(piece)
            answer.feed(piece)

        return feed

    @staticmethod
    def _remember(live: Live, key: str | None) -> None:
        """The reply about to be appended to the transcript answers the call with ``key``."""
        if key:
            live.replies[key] = len(live.transcript)

    def _act(self, live: Live, run: RequestRun, key: str | None) -> dict[str, Any] | None:
        """Run server-side calls; return the assistant message for the client's calls, if any."""
        client: dict[str, int] = {}
        done: dict[int, ToolCallRecord] = {}
        for i, call in enumerate(run.pending):
            if call.name in live.client_tools:
                client[f"call_{run.observation_id(i + 1)}"] = i
                continue
            if call.name in self.server_tools:
                result, error = self.server_tools.call(call.name, call.arguments)
            else:
                known = sorted({*self.server_tools, *live.client_tools})
                result, error = None, f"unknown tool {call.name!r}; available: {', '.join(known) or 'none'}"
            done[i] = ToolCallRecord(call.name, dict(call.arguments), run.observation_id(i + 1), result, error)
        if not client:
            run.observe([done[i] for i in range(len(run.pending))])
            return None
        live.calls = PendingCalls(client, done)
        tool_calls: list[dict[str, Any]] = [
            {"id": cid, "type": "function",
             "function": {"name": run.pending[i].name, "arguments": canonical_json(dict(run.pending[i].arguments))}}
            for cid, i in client.items()
        ]
        self._remember(live, key)
        live.transcript.append({
            "role": "assistant", "content": None,
            "tool_calls": [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                           for c in tool_calls],
        })
        # stored, so that the request outlives this process and any server sharing the database can go on with it
        live.suspended = {"run": snapshot(run), "live": live.waiting()}
        self.repo.save_pending(live.name, run.index_k, live.suspended)
        return {"role": "assistant", "content": None, "tool_calls": tool_calls}

    @staticmethod
    def _result(run: RequestRun, first: int, message: dict[str, Any], finish: str) -> TurnResult:
        steps = tuple(run.steps[first:])
        usage = sum((s.usage for s in steps), Usage())
        unfinished = run.record is not None and run.record.unfinished is not None
        return TurnResult(message, finish, usage, steps, run.index_k, finish == "stop", unfinished)

    def _grammars_for(self, specs: Sequence[Mapping[str, Any]], options: RequestOptions) -> Grammars | None:
        if not self.engine.supports_grammar or self.config.grammar is GrammarMode.NONE:
            return None
        key = canonical_json([list(specs), options.tool_choice, options.parallel_tool_calls, options.answer_schema])
        grammars = self._grammars.pop(key, None)
        if grammars is None:
            grammars = Grammars(specs, self.config.grammar, limits=self.limits, options=options)
            try:
                grammars.validate()
            except GrammarError as exc:
                raise bad_request(f"the tools' parameter schemas cannot be decoded under a grammar: {exc}",
                                  "tools", "unsupported_schema") from exc
        self._grammars[key] = grammars
        while len(self._grammars) > 16:
            self._grammars.popitem(last=False)
        return grammars


def query_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The request's query: its user messages, and the assistant messages the client wrote before them
    (context for the model, marked as not its own words)."""
    parts = [str(m["content"] or "") if m["role"] == "user"
             else f"[an assistant message the client wrote, not one of your replies]: {m['content'] or ''}"
             for m in messages]
    return "\n\n".join(p for p in parts if p.strip())


def _with_format(policy: str, options: RequestOptions) -> str:
    """The task policy, plus the answer format a request asks for (the grammar enforces it)."""
    if options.answer_schema is None:
        return policy
    rule = ("Your final answer's content is a JSON value (not a string holding JSON) matching this JSON Schema: "
            + canonical_json(options.answer_schema))
    return f"{policy}\n\n{rule}" if policy.strip() else rule


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
                f"tool calls {', '.join(live.calls.client)} are pending: answer them with tool messages before "
                "a new user message", "tool_calls_pending")
        return "resume", list(new)
    if "tool" in roles:
        tool_id = next(m["tool_call_id"] for m in new if m["role"] == "tool")
        raise bad_request(f"tool message {tool_id!r} answers no pending call", "messages", "unknown_tool_call_id")
    if new[-1]["role"] != "user" or any(m.get("tool_calls") for m in new if m["role"] == "assistant"):
        raise bad_request("new messages must end with a user message; assistant messages the client writes (a "
                          "greeting, examples) may come before it, without tool calls", "messages",
                          "unexpected_assistant_message")
    return "start", list(new)
