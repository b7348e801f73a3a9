"""The Responses service: ``POST /v1/responses`` on the chat service's driver (its checks, sessions, idempotency
and turns), the response stored in the repository when ``store`` is on, and the stored responses' routes."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import replace
from typing import Any

import anyio
from fastapi.responses import JSONResponse, StreamingResponse

from flowstate.store.repository import StoredResponse
from serving.chat import IDEMPOTENCY_HEADER, Begun, ChatService, Moved
from serving.completions import extension
from serving.errors import APIError, bad_request
from serving.live import fork_point
from serving.naming import SESSION_HEADER, check_name, header_text, session_name
from serving.responses.events import stream
from serving.responses.objects import Draft, page
from serving.responses.wire import ResponsesRequest
from serving.services import Services
from serving.wire import ChatRequest, validated

CHAT_NAMES = {"messages": "input", "response_format": "text.format", "max_tokens": "max_output_tokens"}


def not_found(response_id: str, param: str = "response_id", code: str = "response_not_found") -> APIError:
    return APIError(404, f"no stored response {response_id!r} (never stored, deleted, or another key's)",
                    param=param, code=code)


class ResponsesService:
    """The Responses API over one server's services and its chat service."""

    def __init__(self, services: Services, chat: ChatService) -> None:
        self.s, self.chat = services, chat

    async def create(self, ns: str, data: Any, session_header: str | None,
                     idempotency_header: str | None) -> JSONResponse | StreamingResponse:
        """One response: the next turn of the session it continues (``previous_response_id``), names
        (``conversation``, the session header, ``user``) or resends (a whole history: found by its fingerprint)."""
        body: ResponsesRequest = validated(ResponsesRequest, data)
        body.check()
        items = body.items()
        chat = validated(ChatRequest, body.chat(items), CHAT_NAMES)
        mcp, hidden, approval = self._mcp(body)
        p = await anyio.to_thread.run_sync(self.chat.prepare, chat, hidden, tuple(approval))  # off the event loop
        p = replace(p, approvals=body.approvals(items))
        draft = Draft(body, mcp=mcp, approval=approval)
        previous: StoredResponse | None = None
        if body.previous_response_id is not None:
            previous = await anyio.to_thread.run_sync(self.s.config.repo.response, body.previous_response_id, ns)
            if previous is None:
                raise not_found(body.previous_response_id, "previous_response_id", "previous_response_not_found")
            named: str | None = previous.session[len(ns):]
        elif (conversation := body.conversation_id()) is not None:
            named = draft.conversation = check_name(conversation, "conversation")
        else:
            named = session_name(header_text(session_header, SESSION_HEADER), body.user)
        idem = header_text(idempotency_header, IDEMPOTENCY_HEADER)
        at = None if previous is None else previous.position
        fork: str | None = None
        try:
            begun = await self.chat.begin(ns, p, named, idem, body.stream, at)
        except Moved:  # a later turn continued that response: this one forks the session there
            assert previous is not None and at is not None
            fork = await self._fork(ns, previous, idem)
            try:
                begun = await self.chat.begin(ns, p, fork, idem, body.stream, at)
            except Moved:  # that key's fork went on under another call: the key was used for a different request
                raise APIError(422, f"Idempotency-Key {idem!r} was used for a different request: use a new key for a "
                                    "new request", type="invalid_request_error", param="Idempotency-Key",
                               code="idempotency_key_reused") from None
        finishing = asyncio.create_task(self._finish(ns, draft, begun, items, fork))
        self.s.running.add(finishing)  # stored even if the client goes away
        finishing.add_done_callback(self.s.running.discard)
        if not body.stream:
            return JSONResponse(await asyncio.shield(finishing))
        return StreamingResponse(stream(draft, finishing, begun.deltas), media_type="text/event-stream")

    async def _fork(self, ns: str, previous: StoredResponse, idem: str | None) -> str:
        """A new session that shares the previous response's session up to that response (the requests it had
        finished), named for this call: by its Idempotency-Key when it has one, so that a retry finds its fork."""
        repo = self.s.config.repo
        at = await anyio.to_thread.run_sync(fork_point, repo, previous.session, previous.position)
        if at is None:
            raise bad_request(f"response {previous.id!r} ended inside a request (in function calls) that a later turn "
                              "went on with: a fork starts at the end of a completed response; continue from the "
                              "latest one", "previous_response_id", "previous_response_not_latest")
        seed = f"{ns}\0{previous.id}\0{idem}" if idem is not None else uuid.uuid4().hex
        name = "fork_" + hashlib.sha256(seed.encode()).hexdigest()[:32]
        await anyio.to_thread.run_sync(repo.fork, previous.session, at, ns + name)
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
                      fork: str | None = None) -> dict[str, Any]:
        """The response object of the turn (or of the reply an identical earlier call got), stored unless
        ``store`` is false. A ``fork`` made for this turn is dropped again if the turn fails before it holds
        anything of its own."""
        if begun.earlier is not None:
            obj, position = draft.replayed(begun.earlier, begun.extension), begun.earlier_at
        else:
            assert begun.task is not None
            try:
                result = await begun.task
            except Exception:
                if fork is not None:
                    await anyio.to_thread.run_sync(self.s.config.repo.drop_empty_fork, ns + fork)
                raise
            obj, position = draft.finished(result, extension(result, begun.extension)), result.at
        if draft.body.store is not False:
            stored = StoredResponse(draft.id, ns, begun.session.full, position, obj, items)
            await anyio.to_thread.run_sync(self.s.config.repo.save_response, stored, draft.created_at)
        return obj

    async def stored(self, ns: str, response_id: str) -> StoredResponse:
        found = await anyio.to_thread.run_sync(self.s.config.repo.response, response_id, ns)
        if found is None:
            raise not_found(response_id)
        return found

    async def delete(self, ns: str, response_id: str) -> dict[str, Any]:
        if not await anyio.to_thread.run_sync(self.s.config.repo.delete_response, response_id, ns):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, ns: str, response_id: str, after: str | None, limit: int,
                          order: str) -> dict[str, Any]:
        """A cursor page of the response's input items."""
        items = (await self.stored(ns, response_id)).input_items
        return page(items, after, limit, order, f"response {response_id!r}")
