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
from dataclasses import asdict, replace
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from flowstate.errors import SessionNotFound
from flowstate.inspection import session_dump
from flowstate.store import transfer
from flowstate.store.audit import text_digest
from flowstate.store.repository import Repository, SessionSummary
from flowstate.store.search import BadSearch, Search
from serving import admin, console, erasure, feedback
from serving.chat import IDEMPOTENCY_HEADER, ChatService
from serving.errors import APIError, bad_request, conflict
from serving.graph import render_html
from serving.naming import SESSION_HEADER, SessionKey, check_name
from serving.responses.conversations import Conversations
from serving.responses.service import ResponsesService
from serving.responses.wire import ResponsesRequest, check_include
from serving.services import ServerConfig, Services, build
from serving.tenancy import Authenticated, entry
from serving.traced import Traced
from serving.wire import MAX_DEPTH, ChatRequest, Ingress, IngressLimits, loads, validated

log = logging.getLogger("flowstate.serving")


def create_app(config: ServerConfig) -> FastAPI:
    """The app for one engine and one repository."""
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.responses.background.keep()  # background responses' leases: a stopped server's are failed
        app.state.services.sweeper.start()  # what outlived its retention policy goes
        yield
        app.state.services.sweeper.stop()
        app.state.responses.background.stop()

    app = FastAPI(title="FlowState", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.services = build(config)
    app.state.chat = ChatService(app.state.services)
    app.state.responses = ResponsesService(app.state.services, app.state.chat)
    app.state.conversations = Conversations(app.state.services)
    app.include_router(router)
    app.include_router(admin.router)
    app.include_router(erasure.router)
    app.include_router(feedback.router)
    app.include_router(console.router)
    app.add_middleware(Authenticated, auth=app.state.services.auth)  # who calls, resolved once before any route
    app.add_middleware(Traced)  # nothing while tracing is off
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
    body = validated(ChatRequest, _json(await _read(request, s.config.ingress)))
    chat: ChatService = request.app.state.chat
    return await chat.complete(ns, body, request.headers.get(SESSION_HEADER), request.headers.get(IDEMPOTENCY_HEADER))


@router.post("/v1/responses", response_model=None)
async def create_response(request: Request) -> JSONResponse | StreamingResponse:
    s = _services(request)
    ns = s.namespace(request)
    data = _json(await _read(request, s.config.ingress))
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
    return await conversations.create(ns, _json(await _read(request, _services(request).config.ingress)))


@router.get("/v1/conversations/{conversation_id}")
async def get_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    return await conversations.retrieve(ns, unicodedata.normalize("NFC", conversation_id))


@router.post("/v1/conversations/{conversation_id}")
async def update_conversation(conversation_id: str, request: Request) -> dict[str, Any]:
    conversations, ns = _conversations(request)
    data = _json(await _read(request, _services(request).config.ingress))
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


@router.get("/v1/sessions")
async def list_sessions(request: Request, limit: int = 100, after: str | None = None, name: str = "") -> dict[str, Any]:
    """The key's sessions, the most recently active first, ``limit`` (1–1000) a page after the session ``after``;
    ``name`` keeps those whose name contains it (ignoring case)."""
    s = _services(request)
    ns = s.namespace(request)
    if not 1 <= limit <= 1000:
        raise bad_request(f"limit is {limit}: 1 to 1000", "limit", "invalid_limit")
    if len(name) > 200:
        raise bad_request("name is longer than a session name can be (200 characters)", "name", "invalid_name")

    def listed() -> tuple[list[SessionSummary], bool]:  # storage, in a worker thread: never on the event loop
        return s.config.repo.session_page(ns, contains=name, limit=limit,
                                          after=None if after is None else ns + unicodedata.normalize("NFC", after))

    rows, more = await anyio.to_thread.run_sync(listed)
    data = [{"id": r.name[len(ns):], "object": "session", "requests": r.requests, "states": r.states,
             "created_at": r.created_at, "last_activity": r.active_at or None, "strategy": r.strategy,
             "forked_from": None if r.forked_from is None else {"session": r.forked_from[0][len(ns):],
                                                                 "requests": r.forked_from[1]},
             "running": s.sessions.running(r.name)} for r in rows]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": more}


@router.get("/v1/memory/search")
async def search_memory(request: Request) -> dict[str, Any]:
    """The key's states (and, with ``in=states,observations``, raw tool observations) that match ``q``, best first."""
    s = _services(request)
    ns = s.namespace(request)
    p = request.query_params
    unknown = sorted(set(p) - {"q", "type", "session", "since", "until", "limit", "after", "in"})
    if unknown:
        raise bad_request(f"unknown parameter {unknown[0]!r}: q, type, session, since, until, limit, after, in",
                          unknown[0], "unknown_parameter")
    try:
        search = Search.parse(p.get("q"), type=p.get("type"), session=p.get("session"), since=p.get("since"),
                              until=p.get("until"), limit=p.get("limit"), after=p.get("after"), in_=p.get("in"))
    except BadSearch as exc:
        raise bad_request(str(exc), None, "invalid_search") from None
    if search.session is not None:
        search = replace(search, session=unicodedata.normalize("NFC", search.session))
    hits, more = await anyio.to_thread.run_sync(s.config.repo.search, ns, search)
    await s.record(entry(request.state.caller, "memory.search", text_digest(p.get("q") or ""), hits=len(hits)))
    return {"object": "list", "data": [{
        "object": "memory.hit", "session": h.session[len(ns):], "request": h.request, "state_id": h.state_id,
        "kind": h.kind, "type": h.type, "summary": h.summary, "score": h.score, "created": h.created} for h in hits],
        "has_more": more, "next": search.cursor(search.offset + search.limit) if more else None}


def _session(request: Request, session_id: str) -> tuple[Services, SessionKey]:
    """The services and the caller's session named in the path (NFC, as names in headers and bodies are)."""
    s = _services(request)
    return s, SessionKey(s.namespace(request), unicodedata.normalize("NFC", session_id))


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> dict[str, Any]:
    s, key = _session(request, session_id)
    live = await s.sessions.view(key.full)  # memory, else the database
    waiting = live is not None and live.calls is not None
    held = s.sessions.peek(key.full)  # a turn runs in this server's memory (on a shared database, view reads anew)
    run = held.run if held is not None else None
    dump = await anyio.to_thread.run_sync(_dump, s.config.repo, key, waiting or run is not None)
    dump["pending"] = {"tool_call_ids": live.calls} if waiting and live and live.calls else None
    dump["running"] = None if run is None else {  # the request a turn runs (or that waits on tool results) now
        "index": run.index_k, "query": run.query, "waiting": waiting, "steps": [st.to_dict() for st in list(run.steps)]}
    redaction = s.config.repo.redaction
    if redaction is not None and run is not None:  # what runs in memory is shown as it will be stored
        dump["running"] = await anyio.to_thread.run_sync(redaction.value, key.full, dump["running"])
    return {"id": key.name, "object": "session", **dump}


@router.get("/v1/sessions/{session_id}/requests/{index}")
async def get_request(session_id: str, index: int, request: Request) -> dict[str, Any]:
    """One finished request of the session with its run record: every step's output and what became of it."""
    s, key = _session(request, session_id)

    def read() -> dict[str, Any] | None:
        repo = s.config.repo
        record = repo.request_record(key.full, index)
        if record is None:
            return None
        row = next(r for r in repo.requests(key.full) if r.index == index)
        return {"index": index, "query": row.query, "response": row.response, "unfinished": row.unfinished,
                "created_at": row.created_at, "strategy": row.strategy, "record": record}

    found = await anyio.to_thread.run_sync(read)
    if found is None:
        raise APIError(404, f"session {key.name!r} has no finished request {index}", type="not_found_error",
                       param="index", code="request_not_found")
    found.setdefault("record", {}).pop("session", None)  # the repository's name: the key's namespace is not shown
    return {"object": "session.request", "session": key.name, **found}


GRAPH_HEADERS = {
    # the page is inline SVG and inline styles, nothing else: no script, image, frame, form or base may load
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


@router.get("/v1/sessions/{session_id}/graph", response_class=HTMLResponse)
async def graph(session_id: str, request: Request) -> HTMLResponse:
    s, key = _session(request, session_id)
    live = s.sessions.peek(key.full)
    dump = await anyio.to_thread.run_sync(_dump, s.config.repo, key, live is not None and live.run is not None)
    return HTMLResponse(render_html(dump, key.name), headers=GRAPH_HEADERS)


EXPORT_TYPE = "application/x-ndjson"
MAX_IMPORT_BYTES = 256 << 20


@router.get("/v1/sessions/{session_id}/export")
async def export_session(session_id: str, request: Request) -> Response:
    """The session as a portable file (flowstate/store/transfer.py): what ``POST /v1/sessions/import`` reads."""
    s, key = _session(request, session_id)
    did = entry(request.state.caller, "session.export", key.name)
    try:
        lines = await anyio.to_thread.run_sync(s.config.repo.export_sessions, [key.full], key.namespace)
    except SessionNotFound:
        await s.record(did.refused("no such session"))
        raise _unknown(key.name) from None
    await s.record(did)  # before a line of it leaves
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key.name)[:80] or "session"
    return Response("".join(lines), media_type=EXPORT_TYPE,
                    headers={"Content-Disposition": f'attachment; filename="{safe}.flowstate.jsonl"'})


@router.post("/v1/sessions/import")
async def import_sessions(request: Request) -> dict[str, Any]:
    """A session file into the key's namespace, all or nothing: ``rename=OLD=NEW`` (repeatable) renames on the way."""
    s = _services(request)
    ns = s.namespace(request)
    try:
        renames = transfer.renames(unicodedata.normalize("NFC", v) for v in request.query_params.getlist("rename"))
    except ValueError as exc:
        raise bad_request(str(exc), "rename", "invalid_rename") from None
    unknown = sorted(set(request.query_params) - {"rename"})
    if unknown:
        raise bad_request(f"unknown parameter {unknown[0]!r}: rename", unknown[0], "unknown_parameter")
    raw = await _read(request, replace(s.config.ingress, max_body_bytes=MAX_IMPORT_BYTES))
    try:
        text = raw.decode("utf-8")
        file = await anyio.to_thread.run_sync(transfer.read_file, transfer.lines_of(text), renames, MAX_DEPTH)
    except UnicodeDecodeError:
        raise bad_request("the body is not UTF-8 text", None, "invalid_session_file") from None
    except transfer.BadSessionFile as exc:
        raise bad_request(str(exc), None, "invalid_session_file") from None
    for name in file.names:  # a name the API can address, as every session a client makes
        if check_name(name, "rename") != name:
            raise bad_request(f"session name {name[:60]!r} is not in NFC form: rename it", "rename", "invalid_session")
    did = entry(request.state.caller, "session.import", ",".join(file.names)[:500], sessions=len(file.names))
    try:
        names = await s.take_in(file, ns, did)
    except (transfer.SessionExists, transfer.BadSessionFile, APIError) as exc:
        await s.record(did.refused(str(exc)))
        if isinstance(exc, transfer.SessionExists):
            raise conflict(str(exc), "session_exists") from None
        if isinstance(exc, transfer.BadSessionFile):
            raise bad_request(str(exc), None, "invalid_session_file") from None
        raise
    return {"object": "session.import", "sessions": names}


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
    s, key = _session(request, session_id)
    did = entry(request.state.caller, "session.delete", key.name)
    if not await s.forget(key.full, did):
        await s.record(did.refused("no such session"))
        raise _unknown(key.name)
    return {"id": key.name, "object": "session.deleted", "deleted": True}


async def _read(request: Request, limits: IngressLimits) -> bytes:
    """The body, within the size limit (413) and the time limit (408)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
        raise APIError(413, f"the body is larger than {limits.max_body_bytes} bytes", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise APIError(413, f"the body is larger than {limits.max_body_bytes} bytes", code="body_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the body did not arrive within {limits.body_timeout_s:.0f} s",
                       code="body_timeout") from None
    return b"".join(chunks)


def _json(raw: bytes) -> dict[str, Any]:
    try:
        data = loads(raw)
    except ValueError as exc:  # not JSON, not UTF-8, NaN, huge integers, deep nesting, lone surrogates
        raise bad_request(f"the body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object", code="invalid_json")
    return data


def _internal(exc: Exception) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")


def _unknown(session_id: str) -> APIError:
    return APIError(404, f"no session {session_id!r}", type="not_found_error", param="session_id",
                    code="session_not_found")


def _dump(repo: Repository, key: SessionKey, live: bool) -> dict[str, Any]:
    """The session's stored memory; a session whose first request is still running shows as empty."""
    try:
        dump = session_dump(repo, key.full)
    except SessionNotFound as exc:
        if not live:
            raise _unknown(key.name) from exc
        dump = {"requests": [], "index": [], "nodes": [], "forked_from": None, "forks": []}
    dump["session"] = key.name
    if dump.get("forked_from"):  # the sessions of one key are forked from its own
        dump["forked_from"]["session"] = dump["forked_from"]["session"][len(key.namespace):]
    for fork in dump.get("forks", []):
        fork["session"] = fork["session"][len(key.namespace):]
    given: dict[int, list[dict[str, Any]]] = {}
    for f in repo.feedback.of(key.full):  # what users said of each request (serving/feedback.py)
        given.setdefault(f.request, []).append({k: v for k, v in f.to_dict().items() if k != "request"})
    for req in dump["requests"]:
        req["feedback"] = given.get(req["index"], [])
    return dump
