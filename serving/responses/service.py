"""The Responses service: ``POST /v1/responses`` on the chat service's driver (its checks, sessions, idempotency
and turns), the response stored in the repository when ``store`` is on, and the stored responses' routes."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from fastapi.responses import JSONResponse, StreamingResponse

from flowstate.store.repository import StoredResponse
from serving.chat import IDEMPOTENCY_HEADER, Begun, ChatService, Moved
from serving.completions import extension
from serving.errors import APIError, bad_request
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
        mcp, hidden = self._mcp(body)
        p = await anyio.to_thread.run_sync(self.chat.prepare, chat, hidden)  # off the event loop, as on chat
        draft = Draft(body, mcp=mcp)
        continue_at: int | None = None
        if body.previous_response_id is not None:
            previous = await anyio.to_thread.run_sync(self.s.config.repo.response, body.previous_response_id, ns)
            if previous is None:
                raise not_found(body.previous_response_id, "previous_response_id", "previous_response_not_found")
            named: str | None = previous.session[len(ns):]
            continue_at = previous.position
        elif (conversation := body.conversation_id()) is not None:
            named = draft.conversation = check_name(conversation, "conversation")
        else:
            named = session_name(header_text(session_header, SESSION_HEADER), body.user)
        idem = header_text(idempotency_header, IDEMPOTENCY_HEADER)
        try:
            begun = await self.chat.begin(ns, p, named, idem, body.stream, continue_at)
        except Moved:
            raise bad_request(f"response {body.previous_response_id!r} is not the latest of its conversation: a later "
                              "turn continued it. Continue from the latest response (forking an earlier one is not "
                              "supported yet)", "previous_response_id", "previous_response_not_latest") from None
        finishing = asyncio.create_task(self._finish(ns, draft, begun, items))
        self.s.running.add(finishing)  # stored even if the client goes away
        finishing.add_done_callback(self.s.running.discard)
        if not body.stream:
            return JSONResponse(await asyncio.shield(finishing))
        return StreamingResponse(stream(draft, finishing, begun.deltas), media_type="text/event-stream")

    def _mcp(self, body: ResponsesRequest) -> tuple[dict[str, list[dict[str, Any]]], tuple[str, ...]]:
        """The tool specs of the MCP servers the request names, each one this server runs (``--mcp``), as the
        request's ``allowed_tools`` leave them; and the tools it hides (callable by no step of this request)."""
        sources = {src.name: src for src in self.s.config.tools.sources}
        found: dict[str, list[dict[str, Any]]] = {}
        hidden: list[str] = []
        for i, label, allowed in body.mcp():
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
        return found, tuple(sorted(hidden))

    async def _finish(self, ns: str, draft: Draft, begun: Begun, items: list[dict[str, Any]]) -> dict[str, Any]:
        """The response object of the turn (or of the reply an identical earlier call got), stored unless
        ``store`` is false."""
        if begun.earlier is not None:
            obj, position = draft.replayed(begun.earlier, begun.extension), begun.earlier_at
        else:
            assert begun.task is not None
            result = await begun.task
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
