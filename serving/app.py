"""The FastAPI app: Chat Completions and Responses that remember, model list, health, metrics, memory inspection.

Routes live on a module-level router; what they serve (engine, repository, sessions, turns,
metrics) sits on ``app.state.services``, built by ``create_app`` for one server.
"""

from __future__ import annotations

import hmac
import logging
import time
import unicodedata
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from flowstate.store.server_lock import Serving
from serving import admin, console, erasure, feedback, sessions
from serving.bodies import JSONBodies, json_object, read_body
from serving.chat import IDEMPOTENCY_HEADER, ChatService
from serving.errors import APIError
from serving.naming import SESSION_HEADER
from serving.responses.conversations import Conversations
from serving.responses.service import ResponsesService
from serving.responses.wire import ResponsesRequest, check_include
from serving.services import ServerConfig, Services, build
from serving.sessions import SessionsService
from serving.tenancy import Authenticated, entry
from serving.traced import Traced
from serving.wire import ChatRequest, Ingress, validated

log = logging.getLogger("flowstate.serving")


def create_app(config: ServerConfig) -> FastAPI:
    """The app for one engine and one repository."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        serving = Serving(app.state.services.config.repo.path)  # a SQLite database: the shell sees it is in use
        app.state.responses.background.keep()  # background responses' leases: a stopped server's are failed
        app.state.services.sweeper.start()  # what outlived its retention policy goes
        yield
        app.state.services.sweeper.stop()
        app.state.responses.background.stop()
        serving.release()

    app = FastAPI(title="FlowState", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.services = build(config)
    app.state.chat = ChatService(app.state.services)
    app.state.responses = ResponsesService(app.state.services, app.state.chat)
    app.state.conversations = Conversations(app.state.services)
    app.state.sessions = SessionsService(app.state.services)
    app.include_router(router)
    app.include_router(admin.router)
    app.include_router(erasure.router)
    app.include_router(feedback.router)
    app.include_router(sessions.router)
    app.include_router(console.router)
    app.add_middleware(Authenticated, auth=app.state.services.auth)  # who calls, resolved once before any route
    app.add_middleware(Traced)  # nothing while tracing is off
    app.add_middleware(JSONBodies)  # curl -d's form content type read as the JSON it holds
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnect, _gone)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _bug)
    return app


router = APIRouter()


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return JSONResponse(APIError(exc.status_code, str(exc.detail), type=kind).body(), status_code=exc.status_code)


async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A typed route's parameters or body that do not validate: 422, in OpenAI's error shape, naming the first."""
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
    message = f"{where or 'request'}: {first.get('msg', 'invalid')}"
    return JSONResponse(APIError(422, message, param=where, code="invalid_value").body(), status_code=422)


async def _gone(_: Request, exc: ClientDisconnect) -> Response:
    log.info("client went away before its request was read")
    return Response(status_code=400)


async def _bug(_: Request, exc: Exception) -> JSONResponse:
    log.exception("internal error")
    return JSONResponse(_internal(exc).body(), status_code=500)


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    s = _services(request)
    return {"status": "ok", "engine": s.config.engine.name, "model": s.config.model_id}


@router.get("/openapi.json")
async def openapi(request: Request) -> dict[str, Any]:
    if not request.state.caller.admin:  # an operator reads the API it manages
        _services(request).namespace(request)  # like every endpoint but /health, it needs a key
    schema: dict[str, Any] = request.app.openapi()
    return _with_bodies(schema)


_BODIES: dict[str, type[Ingress]] = {"/v1/chat/completions": ChatRequest, "/v1/responses": ResponsesRequest}
"""The request bodies of the routes that read their own (within the ingress limits, as strict as before) and so
declare none to FastAPI: the schema documents them from the same wire models the routes validate with."""


def _with_bodies(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, model in _BODIES.items():
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        schema["paths"][path]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
    return schema


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    """The whole server's figures for a metrics key (or on a server without keys); a client key's own otherwise."""
    s = _services(request)
    scheme, _, token = (request.headers.get("authorization") or "").partition(" ")
    operator = s.auth.open or request.state.caller.admin or (scheme.lower() == "bearer" and any(
        hmac.compare_digest(token.encode(), k.encode()) for k in s.config.metrics_keys if k))
    body = s.metrics.render(None if operator else s.namespace(request))
    return Response(body, media_type="text/plain; version=0.0.4")


@router.get("/v1/usage")
async def usage(request: Request) -> dict[str, Any]:
    """The caller's tenant's quota and where it stands: this minute's requests, running turns, today's model tokens
    (UTC), each limit null where there is none."""
    s = _services(request)
    ns = s.namespace(request)
    sessions.only(request)  # a parameter it does not take is a 400, as on every other route
    if not ns:
        return {"object": "usage", "tenant": None, "quota": None, "usage": None}
    tenant = ns[:-1]
    quota, now = await anyio.to_thread.run_sync(s.config.repo.quotas.quota, tenant), time.time()
    used = await anyio.to_thread.run_sync(s.config.repo.quotas.usage, tenant)
    return {"object": "usage", "tenant": tenant, "quota": asdict(quota),
            "usage": {"requests_this_minute": used.requests, "running_turns": used.turns, "tokens_today": used.tokens,
                      "minute_resets_in_s": round(used.minute_ends - now, 1),
                      "day_resets_in_s": round(used.day_ends - now, 1)}}


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    s = _services(request)
    s.namespace(request)
    return {"object": "list", "data": [
        {"id": s.config.model_id, "object": "model", "created": 0, "owned_by": "flowstate"}]}


@router.post("/v1/chat/completions", response_model=None)
async def chat(request: Request) -> JSONResponse | StreamingResponse:
    s = _services(request)
    ns = s.namespace(request)
    body = validated(ChatRequest, json_object(await read_body(request, s.config.ingress)))
    chat: ChatService = request.app.state.chat
    return await chat.complete(ns, body, request.headers.get(SESSION_HEADER), request.headers.get(IDEMPOTENCY_HEADER))


@router.post("/v1/responses", response_model=None)
async def create_response(request: Request) -> JSONResponse | StreamingResponse:
    s = _services(request)
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
    ns = _services(request).namespace(request)
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
    return await responses.delete(_services(request).namespace(request), response_id)


@router.get("/v1/responses/{response_id}/input_items")
async def input_items(response_id: str, request: Request, after: str | None = None, limit: int = 20,
                      order: str = "desc") -> dict[str, Any]:
    responses: ResponsesService = request.app.state.responses
    _include(request)
    return await responses.input_items(_services(request).namespace(request), response_id, after, limit, order)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(response_id: str, request: Request) -> dict[str, Any]:
    responses: ResponsesService = request.app.state.responses
    return await responses.cancel(_services(request).namespace(request), response_id)


def _conversations(request: Request) -> tuple[Conversations, str]:
    conversations: Conversations = request.app.state.conversations
    return conversations, _services(request).namespace(request)


@router.post("/v1/conversations")
async def create_conversation(request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    return await conversations.create(ns, json_object(await read_body(request, _services(request).config.ingress)))


@router.get("/v1/conversations/{conversation_id}")
async def get_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    return await conversations.retrieve(ns, unicodedata.normalize("NFC", conversation_id))


@router.post("/v1/conversations/{conversation_id}")
async def update_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    data = json_object(await read_body(request, _services(request).config.ingress))
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


def _internal(exc: Exception) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")
