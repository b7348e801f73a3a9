"""The chat service under ``POST /v1/chat/completions``: check the request, find its session, run its turn
on the one driver (``serving.turns``), and answer — whole, streamed, or replayed."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
from fastapi.responses import JSONResponse, StreamingResponse

from flowstate.loop import Approval
from serving.chat.completions import completion, replayed, stream
from serving.chat.messages import AssistantMessage, Delta
from serving.chat.wire import ChatRequest, canonical_message, check_tools
from serving.errors import APIError, bad_request
from serving.history import fingerprint, new_messages
from serving.live import Live, reply_message
from serving.naming import SESSION_HEADER, SessionKey, header_text, session_name
from serving.quotas import Admitted
from serving.services import Services
from serving.turns import Checked, TurnResult, check_pending

IDEMPOTENCY_HEADER = "idempotency-key"


@dataclass(frozen=True)
class Prepared:
    """What a checked request asks: the client's policy, its conversation, its tools and options."""

    body: ChatRequest
    policy: str
    conversation: list[dict[str, Any]]
    checked: Checked  # its client tools and options, as the one check passed them
    approvals: dict[str, Approval] = field(default_factory=dict)  # the client's answers to approval requests
    seen: list[dict[str, Any]] | None = None  # the conversation as the session stores it (redacted): what it matches

    @property
    def stored(self) -> list[dict[str, Any]]:
        return self.conversation if self.seen is None else self.seen

    def real(self, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation's last ``len(new)`` messages as the client sent them (what the model sees this turn)."""
        return self.conversation[len(self.conversation) - len(new):] if new else []


class Moved(Exception):
    """The session's transcript is not where the request continues from (another turn came in between)."""

    def __init__(self, length: int) -> None:
        super().__init__(f"the session's transcript has {length} messages")
        self.length = length


@dataclass
class Begun:
    """A call's turn as set going in its session: the reply an identical earlier call got (nothing runs; it ends at
    ``earlier_at`` in the transcript), or the running turn and the deltas it streams."""

    session: SessionKey
    extension: dict[str, Any]
    earlier: AssistantMessage | None = None
    earlier_at: int = 0
    task: asyncio.Task[TurnResult] | None = None
    deltas: asyncio.Queue[Delta] | None = None


class ChatService:
    """``POST /v1/chat/completions`` over one server's services: check the request, find its session, run its turn
    on the one driver, answer."""

    def __init__(self, services: Services) -> None:
        self.s = services

    def prepare(self, body: ChatRequest, hidden: tuple[str, ...] = (), approval: tuple[str, ...] = (),
                ns: str = "") -> Prepared:
        """Every check a request can fail before a session is touched or a stream starts (4xx, never an error
        event). It compiles the grammar of tools it has not seen: run it in a worker thread. ``hidden``: server
        tools this request may not call (a Responses request's ``allowed_tools``); ``approval``: server tools whose
        calls wait on the client's approval (its ``require_approval``)."""
        s = self.s
        if body.model not in s.models:
            raise APIError(404, f"model {body.model!r} does not exist; this server serves {s.config.model_id!r}",
                           type="not_found_error", param="model", code="model_not_found")
        if body.n is not None and body.n < 1:
            raise bad_request(f"n must be at least 1, not {body.n}", "n")
        if body.n not in (None, 1):
            raise bad_request("n > 1 is not supported: each session has one line of memory", "n")
        if len(body.messages) > s.config.ingress.max_messages:
            raise bad_request(f"at most {s.config.ingress.max_messages} messages per request", "messages")
        check_tools(body.tools or [], s.config.ingress)
        policy = "\n\n".join(m.text(f"messages[{i}]") for i, m in enumerate(body.messages)
                             if m.role in ("system", "developer"))
        conversation = [canonical_message(m, f"messages[{i}]") for i, m in enumerate(body.messages)
                        if m.role not in ("system", "developer")]
        client_tools = [t.spec() for t in body.tools or ()]
        options = replace(body.options({t["name"] for t in client_tools} | set(s.config.tools)), hidden=hidden,
                          approval=approval)
        redaction = s.config.repo.redaction  # a redacting server's sessions store, and so match, redacted messages
        seen = None if redaction is None else redaction.value(ns, conversation)
        return Prepared(body, policy, conversation, s.turns.check(client_tools, options), seen=seen)


    async def complete(self, ns: str, body: ChatRequest, session_header: str | None,
                       idempotency_header: str | None) -> JSONResponse | StreamingResponse:
        """One chat completion call: the session's next turn, or the reply an identical earlier call got."""
        p = await anyio.to_thread.run_sync(  # new tools' grammar compiles (and redaction runs): off the event loop
            lambda: self.prepare(body, ns=ns))
        named = session_name(header_text(session_header, SESSION_HEADER), body.user)
        idem = header_text(idempotency_header, IDEMPOTENCY_HEADER)
        admitted = await self.s.admissions.admit(ns)  # the tenant's quota: a 429 before anything is stored
        try:
            begun = await self.begin(ns, p, named, idem, bool(body.stream), admitted=admitted)
        except BaseException:
            await admitted.end(0)
            raise
        if begun.task is None:  # nothing runs (an identical earlier call's reply): its slot is free at once
            await admitted.end(0)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if begun.earlier is not None:  # an exact resend of an answered turn: the same answer, nothing run again
            return replayed(completion_id, body.model, begun.earlier, begun.extension, bool(body.stream))
        assert begun.task is not None
        if not body.stream:
            result = await asyncio.shield(begun.task)
            return JSONResponse(completion(completion_id, body.model, result, begun.extension))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(stream(completion_id, body.model, begun.task, begun.extension, include_usage,
                                        begun.deltas), media_type="text/event-stream")

    async def begin(self, ns: str, p: Prepared, named: str | None, idem: str | None, streamed: bool,
                    continue_at: int | None = None, admitted: Admitted | None = None) -> Begun:
        """Find the call's session (``named``, else by the conversation's fingerprint) and set its turn going, or
        find the reply an identical earlier call got. With ``continue_at`` the conversation is only the new
        messages of a session whose transcript must have that length (``Moved`` otherwise)."""
        s = self.s
        if named is not None:
            session = SessionKey(ns, named)
            await s.sessions.enter(session.full)
        else:  # returns with the session entered
            full = await s.sessions.resolve(ns + fingerprint(p.policy, p.stored), p.stored, idem)
            session = SessionKey(ns, full[len(ns):])
        try:
            live = await s.sessions.live(session.full)
            # a retry finds its reply wherever the session is
            if continue_at is not None and len(live.transcript) != continue_at and not live.replied(idem):
                raise Moved(len(live.transcript))
            earlier = live.earlier_reply(idem, p.stored,
                                         resent_history=continue_at is None and len(p.stored) > 1)
            if earlier is None:
                fresh = p.conversation if continue_at is not None else p.real(new_messages(p.stored,
                                                                                           live.transcript).new)
                kind, new = check_pending(live, fresh)
                live.hold(idem)  # a retry under this key that resolves meanwhile waits for this turn
        except BaseException:
            self._forget_if_empty(session)
            s.sessions.leave(session.full)
            raise
        extension = {"session": session.name, "namespace_keyed": bool(ns)}
        if earlier is not None:
            s.sessions.leave(session.full)
            return Begun(session, extension, earlier=reply_message(live.transcript[earlier]), earlier_at=earlier + 1)
        deltas: asyncio.Queue[Delta] | None = asyncio.Queue() if streamed else None
        task = asyncio.create_task(self._turn(session, live, p, kind, new, idem, _feed(deltas), admitted))
        s.running.add(task)  # runs to the end even if the client goes away
        task.add_done_callback(s.running.discard)
        return Begun(session, extension, task=task, deltas=deltas)

    def _forget_if_empty(self, session: SessionKey) -> None:
        """A call refused before its session held anything (a new name, its first request refused) leaves nothing
        in memory either: errors before a response starts store nothing, in the database or here."""
        live = self.s.sessions.peek(session.full)
        if live is not None and not live.transcript and live.run is None and live.suspended is None \
                and live.requests == 0:
            self.s.sessions.forget(session.full)

    async def _turn(self, session: SessionKey, live: Live, p: Prepared, kind: str, new: list[Any],
                    idem: str | None, on_delta: Callable[[Delta], None] | None,
                    admitted: Admitted | None = None) -> TurnResult:
        """The turn in a worker thread while the session is held; counted in the metrics and, with its model tokens,
        against its tenant's quota."""
        s = self.s
        started = time.perf_counter()
        tokens, refund = 0, False
        try:
            if kind == "start":
                fn = lambda: s.turns.start(live, new, p.policy, p.checked, idem, on_delta)  # noqa: E731
            else:
                fn = lambda: s.turns.resume(live, new, idem, on_delta, p.approvals)  # noqa: E731
            result = await anyio.to_thread.run_sync(fn, limiter=s.limiter)
            tokens = result.model_tokens
        except APIError as exc:
            s.metrics.failed(session.namespace, exc.code or "error", exc.steps)
            tokens = sum(c.usage.prompt_tokens + c.usage.completion_tokens for c in exc.steps)
            # the model or the engine failed, not the tenant: the request is not counted in its minute
            refund = exc.code in ("request_failed", "engine_unavailable")
            self._forget_if_empty(session)
            raise
        finally:
            live.release(idem)
            s.sessions.leave(session.full)
            if admitted is not None:
                await admitted.end(tokens, refund)
        s.metrics.observe(session.namespace, result, time.perf_counter() - started)
        return result


def _feed(deltas: asyncio.Queue[Delta] | None) -> Callable[[Delta], None] | None:
    """Who hands the turn's worker thread's deltas to the stream, on this event loop."""
    if deltas is None:
        return None
    loop = asyncio.get_running_loop()

    def on_delta(delta: Delta) -> None:
        loop.call_soon_threadsafe(deltas.put_nowait, delta)

    return on_delta
