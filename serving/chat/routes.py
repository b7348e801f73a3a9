"""``POST /v1/chat/completions``: the body read within the ingress limits, validated, and handed to the service."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from serving.bodies import json_object, read_body
from serving.chat.service import IDEMPOTENCY_HEADER, ChatService
from serving.chat.wire import ChatRequest, validated
from serving.naming import SESSION_HEADER
from serving.services import services_of

router = APIRouter()


@router.post("/v1/chat/completions", response_model=None)
async def chat(request: Request) -> JSONResponse | StreamingResponse:
    s = services_of(request)
    ns = s.namespace(request)
    body = validated(ChatRequest, json_object(await read_body(request, s.config.ingress)))
    chat: ChatService = request.app.state.chat
    return await chat.complete(ns, body, request.headers.get(SESSION_HEADER), request.headers.get(IDEMPOTENCY_HEADER))
