"""The Responses service: ``POST /v1/responses`` on the chat service's driver (its checks, sessions, idempotency
and turns), the response stored in the repository when ``store`` is on, and the stored responses' routes."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import replace
from functools import partial
from typing import Any

import anyio
from fastapi.responses import JSONResponse, StreamingResponse

from flowstate.errors import StorageError
from flowstate.nodes import canonical_json
from flowstate.store.responses import StoredResponse
from serving.chat.completions import extension
from serving.chat.service import IDEMPOTENCY_HEADER, Begun, ChatService, Moved
from serving.chat.wire import ChatRequest, validated
from serving.errors import APIError, bad_request
from serving.live import fork_point
from serving.naming import SESSION_HEADER, check_name, header_text, session_name
from serving.quotas import Admitted
from serving.responses.background import Background, Job, follow
from serving.responses.events import stream
from serving.responses.objects import Draft, page
from serving.responses.wire import ResponsesRequest
from serving.services import Services

RUNNING = ("queued", "in_progress")  # a background response's statuses before it ends
CHAT_NAMES = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}


def not_found(response_id: str, param: str = "response_id", code: str = "response_not_found") -> APIError:
    return APIError(404, f"no stored response {response_id!r} (never stored, deleted, or another key's)",
                    param=param, code=code)


class ResponsesService:
    """The Responses API over one server's services and its chat service."""

    def __init__(self, services: Services, chat: ChatService) -> None:
        self.s, self.chat = services, chat
        self.background = Background(services.config.repo, services.config.background_lease_s)
        self.keyed: dict[str, tuple[str, asyncio.Future[None]]] = {}  # response id -> (request digest, its end)

    async def create(self, ns: str, data: Any, session_header: str | None,
                     idempotency_header: str | None) -> JSONResponse | StreamingResponse:
        """One response: the next turn of the session it continues (``previous_response_id``), names
        (``conversation``, the session header, ``user``) or resends (a whole history: found by its fingerprint)."""
        body: ResponsesRequest = validated(ResponsesRequest, data)
        body.check()
        items = body.items()
        chat = validated(ChatRequest, body.chat(items), CHAT_NAMES)
        mcp, hidden, approval = self._mcp(body)
        p = await anyio.to_thread.run_sync(lambda: self.chat.prepare(chat, hidden, tuple(approval), ns))  # off the loop
        p = replace(p, approvals=body.approvals(items))
        draft = Draft(body, mcp=mcp, approval=approval)
        previous: StoredResponse | None = None
        if body.previous_response_id is not None:
            previous = await anyio.to_thread.run_sync(self.s.config.repo.responses.get, body.previous_response_id, ns)
            if previous is None:
                raise not_found(body.previous_response_id, "previous_response_id", "previous_response_not_found")
            if previous.body.get("status") in RUNNING:
                raise bad_request(f"response {previous.id!r} is still {previous.body['status']} (a background "
                                  "response): continue from it once it has ended", "previous_response_id",
                                  "previous_response_in_progress")
            if previous.body.get("status") in ("failed", "cancelled"):  # a background one that ended so
                raise bad_request(f"response {previous.id!r} {previous.body['status']}: it has no reply to continue "
                                  "from; continue from the response before it", "previous_response_id",
                                  "previous_response_not_continuable")
            named: str | None = previous.session[len(ns):]
        elif (conversation := body.conversation_id()) is not None:
            named = draft.conversation = check_name(conversation, "conversation")
        else:
            named = session_name(header_text(session_header, SESSION_HEADER), body.user)
        idem = header_text(idempotency_header, IDEMPOTENCY_HEADER)
        if idem is None:
            return await self._create(ns, body, p, draft, items, previous, named, None)
        # a key names one response of the API key: its id, whatever session the request lands in
        draft.id = "resp_" + hashlib.sha256(f"{ns}\0{idem}".encode()).hexdigest()[:32]
        draft.request = hashlib.sha256(canonical_json({k: v for k, v in data.items() if k != "stream"}).encode()
                                       ).hexdigest()[:32]
        while (running := self.keyed.get(draft.id)) is not None:  # a call with this key runs: this one waits
            if running[0] != draft.request:
                raise _reused(idem)
            await asyncio.shield(running[1])
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.keyed[draft.id] = (draft.request, ended)  # no await since the check: one call of a key runs at a time
        try:
            again = await self._again(ns, draft.id, idem, draft.request)
            if again is not None:
                self._settle(draft.id, ended)
                return _sent(again, body.stream, draft)
            return await self._create(ns, body, p, draft, items, previous, named, idem, ended)
        except BaseException:
            self._settle(draft.id, ended)
            raise

    async def _again(self, ns: str, rid: str, idem: str, digest: str) -> dict[str, Any] | None:
        """The response a call with this Idempotency-Key already made and stored, or None; the key used for another
        request is a 422."""
        stored = await anyio.to_thread.run_sync(self.s.config.repo.responses.get, rid, ns)
        if stored is None:
            return None  # never stored, or the call failed: this one runs
        if (stored.body.get("flowstate") or {}).get("request_digest") != digest:
            raise _reused(idem)
        return stored.body

    def _settle(self, rid: str, ended: asyncio.Future[None]) -> None:
        if self.keyed.get(rid, (None, None))[1] is ended:
            del self.keyed[rid]
        if not ended.done():
            ended.set_result(None)

    async def _create(self, ns: str, body: ResponsesRequest, p: Any, draft: Draft, items: list[dict[str, Any]],
                      previous: StoredResponse | None, named: str | None, idem: str | None,
                      ended: asyncio.Future[None] | None = None) -> JSONResponse | StreamingResponse:
        admitted = await self.s.admissions.admit(ns)  # the tenant's quota: a 429 before anything is stored
        if body.background:  # its engine calls wait behind interactive turns' (engine.priority)
            p = replace(p, checked=replace(p.checked, options=replace(p.checked.options, lane="background")))
        try:
            begun, fork = await self._begin(ns, body, p, previous, named, idem, admitted)
        except BaseException:
            await admitted.end(0)
            raise
        if begun.task is None:  # nothing runs: its slot is free at once
            await admitted.end(0)
        job = None
        if body.background:  # stored in progress before the turn can end and store it again
            job = Job(begun.session.full)
            started = StoredResponse(draft.id, ns, begun.session.full, -1, draft.object("in_progress"), items)
            await anyio.to_thread.run_sync(self.s.config.repo.responses.save, started, draft.created_at,
                                           int(time.time()))
        finishing = asyncio.create_task(self._finish(ns, draft, begun, items, fork, job))
        self.s.running.add(finishing)  # stored even if the client goes away
        finishing.add_done_callback(self.s.running.discard)
        if ended is not None:
            finishing.add_done_callback(lambda _: self._settle(draft.id, ended))
        if job is not None:
            job.task = finishing
            self.background.start(draft.id, job)
            if not body.stream:
                return JSONResponse(draft.object("in_progress"))
            self.background.pump(draft.id, job, stream(draft, finishing, begun.deltas))
            return StreamingResponse(follow(job, -1), media_type="text/event-stream")
        if not body.stream:
            return JSONResponse(await asyncio.shield(finishing))
        return StreamingResponse(stream(draft, finishing, begun.deltas), media_type="text/event-stream")

    async def _begin(self, ns: str, body: ResponsesRequest, p: Any, previous: StoredResponse | None,
                     named: str | None, idem: str | None, admitted: Admitted) -> tuple[Begun, str | None]:
        """The response's turn set going in its session, or in a fork of it where a later turn went on from the
        previous response: (what began, the fork's name or None)."""
        at = None if previous is None else previous.position
        fork: str | None = None
        try:
            begun = await self.chat.begin(ns, p, named, idem, body.stream, at, admitted)
        except Moved:  # a later turn continued that response: this one forks the session there
            assert previous is not None and at is not None
            fork = await self._fork(ns, previous, idem)
            try:
                begun = await self.chat.begin(ns, p, fork, idem, body.stream, at, admitted)
            except Moved:  # that key's fork went on under another call: the key was used for a different request
                raise APIError(422, f"Idempotency-Key {idem!r} was used for a different request: use a new key for a "
                                    "new request", type="invalid_request_error", param="Idempotency-Key",
                               code="idempotency_key_reused") from None
            except BaseException:  # refused before its turn started: the fork made for it goes again
                await anyio.to_thread.run_sync(self.s.config.repo.lineage.drop_empty_fork, ns + fork)
                raise
        return begun, fork

    async def _fork(self, ns: str, previous: StoredResponse, idem: str | None) -> str:
        """A new session that shares the previous response's session up to that response (the requests it had
        finished), named for this call: by its Idempotency-Key when it has one, so that a retry finds its fork."""
        repo = self.s.config.repo
        if not await anyio.to_thread.run_sync(repo.has_session, previous.session):  # its session was deleted
            raise APIError(404, f"response {previous.id!r} belongs to a session that was deleted: there is nothing "
                                "to continue from", param="previous_response_id", code="previous_response_not_found")
        if previous.position < 0:
            raise bad_request(f"response {previous.id!r} has no place in its session to continue from (it ended "
                              "without a reply)", "previous_response_id", "previous_response_not_continuable")
        at = await anyio.to_thread.run_sync(fork_point, repo, previous.session, previous.position)
        if at is None:
            raise bad_request(f"response {previous.id!r} ended inside a request (in function calls) that a later turn "
                              "went on with: a fork starts at the end of a completed response; continue from the "
                              "latest one", "previous_response_id", "previous_response_not_latest")
        seed = f"{ns}\0{previous.id}\0{idem}" if idem is not None else uuid.uuid4().hex
        name = "fork_" + hashlib.sha256(seed.encode()).hexdigest()[:32]
        await anyio.to_thread.run_sync(repo.lineage.fork, previous.session, at, ns + name)
        return name

    def _mcp(self, body: ResponsesRequest) -> tuple[dict[str, list[dict[str, Any]]], tuple[str, ...], dict[str, str]]:
        """The tool specs of the MCP servers the request names, each one this server runs (``--mcp``), as the
        request's ``allowed_tools`` leave them; the tools it hides (callable by no step of this request); and the
        server label of each tool whose calls wait on the client's approval."""
        sources = {src.name: src for src in self.s.config.tools.sources}
        found: dict[str, list[dict[str, Any]]] = {}
        hidden: list[str] = []
        approval: dict[str, str] = {}
        for tool in body.mcp():
            i, label, allowed = tool.position, tool.label, tool.allowed
            source = sources.get(label)
            if source is None:
                known = ", ".join(sources) or "none"
                raise bad_request(f"tools[{i}]: no MCP server {label!r} runs on this server (flowstate serve --mcp "
                                  f"NAME=COMMAND|URL; running: {known}); a request's server_url is never dialled",
                                  f"tools[{i}].server_label", "unknown_mcp_server")
            names = [s["name"] for s in source.specs]
            unknown = sorted(set(allowed or ()) - set(names))
            if unknown:
                raise bad_request(f"tools[{i}].allowed_tools names {', '.join(unknown)}, which MCP server {label!r} "
                                  f"does not have (it has {', '.join(names)})", f"tools[{i}].allowed_tools",
                                  "unknown_tool")
            found[label] = [s for s in source.specs if allowed is None or s["name"] in allowed]
            hidden += [n for n in names if allowed is not None and n not in allowed]
            approval.update({s["name"]: label for s in found[label] if tool.approves(s["name"])})
        return found, tuple(sorted(hidden)), approval

    async def _finish(self, ns: str, draft: Draft, begun: Begun, items: list[dict[str, Any]],
                      fork: str | None = None, job: Job | None = None) -> dict[str, Any]:
        """The response object of the turn (or of the reply an identical earlier call got), stored unless
        ``store`` is false. A ``fork`` made for this turn is dropped again if the turn fails before it holds
        anything of its own. A background response (``job``) that fails is stored failed, or cancelled."""
        if begun.earlier is not None:
            obj, position = draft.replayed(begun.earlier, begun.extension), begun.earlier_at
            if draft.request is not None:  # a keyed retry: the response the first call stored (another server's
                return await self._first(ns, draft) or obj  # maybe, storing it now), else the earlier reply, same id
        else:
            assert begun.task is not None
            try:
                result = await begun.task
            except Exception as exc:
                if fork is not None:
                    await anyio.to_thread.run_sync(self.s.config.repo.lineage.drop_empty_fork, ns + fork)
                if job is None:
                    raise
                await self._ended(ns, draft, begun, items, job, exc)
                raise
            obj, position = draft.finished(result, extension(result, begun.extension)), result.at
        if draft.body.store is not False:
            stored = StoredResponse(draft.id, ns, begun.session.full, position, obj, items)
            if job is not None:  # stored in progress: stored again, unless it was deleted meanwhile
                await anyio.to_thread.run_sync(self.s.config.repo.responses.update, stored)
            else:  # a session deleted while the turn ran (the DELETE waited for it) keeps nothing of it
                try:
                    await anyio.to_thread.run_sync(partial(self.s.config.repo.responses.save, stored, draft.created_at,
                                                           if_session=True))
                except StorageError:
                    if draft.request is None:
                        raise
                    first = await self._first(ns, draft)
                    if first is None:
                        raise
                    return first  # another server stored this key's response first: that one is the reply
        return obj

    async def _first(self, ns: str, draft: Draft, patience_s: float = 2.0) -> dict[str, Any] | None:
        """The response stored under a keyed call's id (by the call that ran its turn, on this server or another,
        which stores it as its turn ends: waited for a moment); a 422 when it was made for another body."""
        deadline = time.monotonic() + patience_s
        while True:
            found = await anyio.to_thread.run_sync(self.s.config.repo.responses.get, draft.id, ns)
            if found is not None:
                if (found.body.get("flowstate") or {}).get("request_digest") != draft.request:
                    raise _reused(None)
                return found.body
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)

    async def _ended(self, ns: str, draft: Draft, begun: Begun, items: list[dict[str, Any]], job: Job,
                     exc: Exception) -> None:
        """A background response whose turn failed, or was cancelled: stored so (its poller sees how it ended)."""
        if isinstance(exc, APIError):
            error = {"code": exc.code or exc.type, "message": exc.message}
        else:
            error = {"code": "server_error", "message": f"internal error: {type(exc).__name__}"}
        obj = draft.object("cancelled" if job.cancelling else "failed", error=None if job.cancelling else error)
        stored = StoredResponse(draft.id, ns, begun.session.full, -1, obj, items)
        await anyio.to_thread.run_sync(self.s.config.repo.responses.update, stored)

    async def cancel(self, ns: str, response_id: str) -> dict[str, Any]:
        """``POST /v1/responses/{id}/cancel``: a background response's turn stopped at its next step boundary (what
        it did is kept); cancelling one that has ended gives it as it ended."""
        found = await self.stored(ns, response_id)
        if not found.body.get("background"):
            raise bad_request(f"response {response_id!r} is not a background response: only those can be cancelled",
                              "response_id", "response_not_cancellable")

        def run_of(session: str) -> Any:
            live = self.s.sessions.peek(session)
            return None if live is None else live.run

        if not await self.background.cancel(response_id, run_of) and found.body.get("status") in RUNNING:
            raise APIError(409, f"response {response_id!r} runs on another server of this database: cancel it there",
                           param="response_id", code="response_runs_elsewhere")
        return (await self.stored(ns, response_id)).body

    async def events(self, ns: str, response_id: str, starting_after: int) -> StreamingResponse:
        """``GET /v1/responses/{id}?stream=true``: a streamed background response's events after ``starting_after``,
        then as they come."""
        found = await self.stored(ns, response_id)
        job = self.background.events(response_id)
        if job is None:
            how = "it was not streamed" if not found.body.get("background") else \
                "this server does not hold its events (it ended long ago, ran on another server, or was not streamed)"
            raise bad_request(f"response {response_id!r} cannot be streamed again: {how}; GET it without stream",
                              "stream", "stream_not_available")
        if starting_after < -1:
            raise bad_request("starting_after is a sequence number the stream sent (0 or more)", "starting_after")
        return StreamingResponse(follow(job, starting_after), media_type="text/event-stream")

    async def stored(self, ns: str, response_id: str) -> StoredResponse:
        found = await anyio.to_thread.run_sync(self.s.config.repo.responses.get, response_id, ns)
        if found is None:
            raise not_found(response_id)
        return found

    async def delete(self, ns: str, response_id: str) -> dict[str, Any]:
        if not await anyio.to_thread.run_sync(self.s.config.repo.responses.delete, response_id, ns):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, ns: str, response_id: str, after: str | None, limit: int,
                          order: str) -> dict[str, Any]:
        """A cursor page of the response's input items."""
        items = (await self.stored(ns, response_id)).input_items
        return page(items, after, limit, order, f"response {response_id!r}")


def _reused(idem: str | None) -> APIError:
    key = "the Idempotency-Key" if idem is None else f"Idempotency-Key {idem!r}"
    return APIError(422, f"{key} was used for a different request: a retry must send the same "
                         "body; use a new key for a new request", type="invalid_request_error",
                    param="Idempotency-Key", code="idempotency_key_reused")


def _sent(obj: dict[str, Any], streamed: bool, draft: Draft) -> JSONResponse | StreamingResponse:
    """The response a keyed retry gets: the stored one, as a body or as its events."""
    if not streamed:
        return JSONResponse(obj)
    done: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    done.set_result(obj)
    return StreamingResponse(stream(draft, done, None), media_type="text/event-stream")  # type: ignore[arg-type]
