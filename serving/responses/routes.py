"""The Responses API's routes and its conversations': each a thin call into ``ResponsesService`` or
``ConversationService`` (serving/responses/service.py, conversations.py), with the caller's tenant."""

from __future__ import annotations

import unicodedata
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from serving.bodies import json_object, read_body
from serving.chat.service import IDEMPOTENCY_HEADER
from serving.naming import SESSION_HEADER
from serving.responses.conversations import Conversations
from serving.responses.service import ResponsesService
from serving.responses.wire import check_include
from serving.services import services_of
from serving.tenancy import entry

router = APIRouter()


@router.post("/v1/responses", response_model=None)
async def create_response(request: Request) -> JSONResponse | StreamingResponse:
    s = services_of(request)
    ns = s.namespace(request)
    data = json_object(await read_body(request, s.config.ingress))
    responses: ResponsesService = request.app.state.responses
    return await responses.create(ns, data, request.headers.get(SESSION_HEADER),
                                  request.headers.get(IDEMPOTENCY_HEADER))


@router.get("/v1/responses/{response_id}", response_model=None)
async def get_response(response_id: str, request: Request, stream: bool = False,
                       starting_after: int = -1) -> dict[str, Any] | StreamingResponse:
    """A stored response (a background one: as it stands now); with ``stream``, a streamed background response's
    events after sequence number ``starting_after``, then as they come."""
    responses: ResponsesService = request.app.state.responses
    ns = services_of(request).namespace(request)
    _include(request)
    if stream:
        return await responses.events(ns, response_id, starting_after)
    return (await responses.stored(ns, response_id)).body


def _include(request: Request) -> None:
    """A GET's ``include`` (``include=…`` repeated, or ``include[]=…`` as the openai SDK sends it), checked."""
    check_include(request.query_params.getlist("include") + request.query_params.getlist("include[]"))


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    responses: ResponsesService = request.app.state.responses
    return await responses.delete(services_of(request).namespace(request), response_id)


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request, after: str | None = None, limit: int = 20,
                      order: str = "desc") -> dict[str, Any]:
    responses: ResponsesService = request.app.state.responses
    _include(request)
    return await responses.input_items(services_of(request).namespace(request), response_id, after, limit, order)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> dict[str, Any]:
    responses: ResponsesService = request.app.state.responses
    return await responses.cancel(services_of(request).namespace(request), response_id)


def _conversations(request: Request) -> tuple[Conversations, str]:
    conversations: Conversations = request.app.state.conversations
    return conversations, services_of(request).namespace(request)


@router.post("/v1/conversations")
async def create_conversation(request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    return await conversations.create(ns, json_object(await read_body(request, services_of(request).config.ingress)))


@router.get("/v1/conversations/{conversation_id}")
async def get_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    return await conversations.retrieve(ns, unicodedata.normalize("NFC", conversation_id))


@router.post("/v1/conversations/{conversation_id}")
async def update_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    data = json_object(await read_body(request, services_of(request).config.ingress))
    return await conversations.update(ns, unicodedata.normalize("NFC", conversation_id), data)


@router.delete("/v1/conversations/{conversation_id}")
async def delete_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    cid = unicodedata.normalize("NFC", conversation_id)
    return await conversations.delete(ns, cid, entry(request.state.caller, "session.delete", cid))


@router.get("/v1/conversations/{conversation_id}/items")
async def conversation_items(conversation_id: str, request: Request, after: str | None = None, limit: int = 20,
                             order: str = "desc") -> dict[str, Any]:
    conversations, ns = _conversations(request)
    return await conversations.items(ns, unicodedata.normalize("NFC", conversation_id), after, limit, order)
