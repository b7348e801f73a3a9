"""The FastAPI app: Chat Completions that remember, model list, health, metrics, memory inspection.

Routes live on a module-level router; what they serve (engine, repository, sessions, turns,
metrics) sits on ``app.state.services``, built by ``create_app`` for one server.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from engine.base import Engine
from flowstate.config import AgentConfig, LoopConfig
from flowstate.errors import SessionNotFound
from flowstate.inspection import session_dump
from flowstate.memory.base import Strategy
from flowstate.memory.state import FLOWSTATE
from flowstate.repository import Repository
from flowstate.tools import ToolSet
from serving.errors import APIError, bad_request
from serving.graph import render_html
from serving.metrics import Metrics
from serving.registry import Registry
from serving.responses import completion, replayed, stream
from serving.sessions import (
    SESSION_HEADER,
    Keys,
    Live,
    fingerprint,
    header_text,
    match,
    new_messages,
    reply_message,
    session_name,
)
from serving.turns import TurnResult, Turns, check_pending
from serving.wire import ChatRequest, IngressLimits, canonical_message, check_tools, loads

log = logging.getLogger("flowstate.serving")
IDEMPOTENCY_HEADER = "idempotency-key"


@dataclass
class ServerConfig:
    """Everything one server needs; the CLI builds it from ``flowstate serve`` options."""

    engine: Engine
    repo: Repository
    keys: Sequence[str] = ()
    tools: ToolSet = field(default_factory=ToolSet)
    loop: LoopConfig = field(default_factory=LoopConfig)
    strategy: Strategy = FLOWSTATE  # the memory method every session of this server runs
    policy: str = ""  # the deployment's task policy, before each client's system message
    model_id: str = "flowstate"
    max_concurrency: int = 64  # turns running at once (worker threads); one session's turns are serialized
    max_live_sessions: int = 4096  # idle sessions kept in memory (others reload from the database)
    stream_answers: str = "auto"  # token streaming of answers: auto (under a grammar), always, never
    ingress: IngressLimits = field(default_factory=IngressLimits)


@dataclass
class Services:
    """What the routes serve, for one app."""

    config: ServerConfig
    keys: Keys
    sessions: Registry
    turns: Turns
    metrics: Metrics
    limiter: anyio.CapacityLimiter
    models: set[str]
    running: set[asyncio.Task[TurnResult]] = field(default_factory=set)

    def namespace(self, request: Request) -> str:
        return self.keys.namespace(request.headers.get("authorization"))


def create_app(config: ServerConfig) -> FastAPI:
    """The app for one engine and one repository."""
    app = FastAPI(title="FlowState", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.services = Services(
        config=config, keys=Keys(config.keys), sessions=Registry(config.repo, config.max_live_sessions),
        turns=Turns(config.engine, config.repo, AgentConfig(config.engine, strategy=config.strategy, tools=config.tools,
                                                            policy=config.policy, loop=config.loop),
                    config.stream_answers),
        metrics=Metrics(config.engine),
        limiter=anyio.CapacityLimiter(config.max_concurrency),
        models={config.model_id, config.engine.model_name or config.model_id},
    )
    app.include_router(router)
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
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
    return schema


@router.get("/metrics")
async def prometheus(request: Request) -> Response:
    s = _services(request)
    s.namespace(request)
    return Response(s.metrics.render(), media_type="text/plain; version=0.0.4")


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
    body = _parse(await _read(request, s.config.ingress))
    if body.model not in s.models:
        raise APIError(404, f"model {body.model!r} does not exist; this server serves {s.config.model_id!r}",
                       type="not_found_error", param="model", code="model_not_found")
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
    options = body.options({t["name"] for t in client_tools} | set(s.config.tools))
    s.turns.check(client_tools, options)  # before a stream starts: a refusal is a 4xx, not an error event
    named = session_name(header_text(request.headers.get(SESSION_HEADER), SESSION_HEADER), body.user)
    key = header_text(request.headers.get(IDEMPOTENCY_HEADER), IDEMPOTENCY_HEADER)
    if named is not None:
        name = named
        await s.sessions.enter(ns + name)
    else:
        name = await _unnamed(s, ns, fingerprint(policy, conversation), conversation, key)  # entered
    full = ns + name
    try:
        live = s.sessions.live(full)
        earlier = _earlier_reply(live, key, conversation, resent_history=len(conversation) > 1)
        if earlier is None:
            found = new_messages(conversation, live.transcript)
            kind, new = check_pending(live, found.new)
    except BaseException:
        s.sessions.leave(full)
        raise
    extension = {"session": name, "namespace_keyed": bool(ns)}
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    if earlier is not None:  # an exact resend of an answered turn: the same answer, nothing run again
        s.sessions.leave(full)
        message, finish = earlier
        return replayed(completion_id, body.model, message, finish, extension, bool(body.stream))

    deltas: asyncio.Queue[dict[str, Any]] | None = asyncio.Queue() if body.stream else None
    on_delta: Callable[[dict[str, Any]], None] | None = None
    if deltas is not None:
        loop, queue = asyncio.get_running_loop(), deltas

        def on_delta(delta: dict[str, Any]) -> None:  # called from the turn's worker thread
            loop.call_soon_threadsafe(queue.put_nowait, delta)

    async def turn() -> TurnResult:
        started = time.perf_counter()
        try:
            if kind == "start":
                fn = lambda: s.turns.start(live, new, policy, client_tools, key, on_delta, options)  # noqa: E731
            else:
                fn = lambda: s.turns.resume(live, new, key, on_delta)  # noqa: E731
            result = await anyio.to_thread.run_sync(fn, limiter=s.limiter)
        except APIError as exc:
            s.metrics.failed(exc.code or "error", exc.steps)
            raise
        finally:
            s.sessions.leave(full)
        s.metrics.observe(result, time.perf_counter() - started)
        return result

    task = asyncio.create_task(turn())  # runs to the end even if the client goes away
    s.running.add(task)
    task.add_done_callback(s.running.discard)
    if not body.stream:
        result = await asyncio.shield(task)
        return JSONResponse(completion(completion_id, body.model, result, extension))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamingResponse(stream(completion_id, body.model, task, extension, include_usage, deltas),
                             media_type="text/event-stream")


async def _unnamed(s: Services, ns: str, base: str, conversation: list[dict[str, Any]], key: str | None) -> str:
    """The session of a conversation that names none — the one whose history it continues, or whose
    answered turn it resends (with a reply already given, or under the same Idempotency-Key) — else a new
    one: conversations that merely open alike never share a session. Returns with the session entered."""
    guard = ns + base + "#resolve"
    await s.sessions.enter(guard)
    try:
        stored = await anyio.to_thread.run_sync(s.config.repo.sessions, ns + base)
        candidates = [n for n in sorted({*stored, *s.sessions.names(ns + base)})
                      if n == ns + base or n.startswith(ns + base + ".")]
        best, best_rank = None, (-1, -1)
        first_user = next((i for i, m in enumerate(conversation) if m["role"] == "user"), len(conversation))
        # an assistant message after the first user message: the history of one answered conversation
        resent = any(m["role"] == "assistant" for m in conversation[first_user:])
        for full in candidates:
            live = s.sessions.view(full)
            kind = match(conversation, live.transcript).kind
            if (key is not None and key in live.replies) or kind == "continues" and (resent or not live.transcript) \
                    or kind == "replay" and resent:
                if key is not None and key in live.replies:
                    best = full
                    break
                rank = (kind == "continues", len(live.transcript))  # a conversation in progress before a replay
                if rank > best_rank:
                    best, best_rank = full, rank
        if best is None:
            used = set(candidates)
            best = ns + base if ns + base not in used else next(
                f"{ns}{base}.{i}" for i in range(1, len(used) + 2) if f"{ns}{base}.{i}" not in used)
        await s.sessions.enter(best)
        try:
            s.sessions.live(best)  # in memory from now on, so a concurrent new conversation picks another name
        except BaseException:
            s.sessions.leave(best)
            raise
        return best[len(ns):]
    finally:
        s.sessions.leave(guard)


def _earlier_reply(
    live: Live, key: str | None, conversation: list[dict[str, Any]], resent_history: bool,
) -> tuple[dict[str, Any], str] | None:
    """The reply already given to this exact request: by its Idempotency-Key, or (for a client that resends
    its history) because the conversation ends where an answered turn of the transcript ends."""
    if key is not None and key in live.replies and live.replies[key] < len(live.transcript):
        return reply_message(live.transcript[live.replies[key]])
    if resent_history:
        found = match(conversation, live.transcript)
        if found.kind == "replay":
            return reply_message(live.transcript[found.at])
    return None


@router.get("/v1/sessions")
async def list_sessions(request: Request) -> dict[str, Any]:
    s = _services(request)
    ns = s.namespace(request)
    names = await anyio.to_thread.run_sync(s.config.repo.sessions, ns)
    data = [{"id": n[len(ns):], "object": "session", "requests": s.config.repo.request_count(n)} for n in names]
    return {"object": "list", "data": data}


@router.get("/v1/sessions/{session_id}")
async def get_session(session_id: str, request: Request) -> dict[str, Any]:
    s = _services(request)
    ns = s.namespace(request)
    live = await anyio.to_thread.run_sync(s.sessions.view, ns + session_id)  # memory, else the database
    waiting = live is not None and live.calls is not None
    dump = await anyio.to_thread.run_sync(_dump, s.config.repo, ns + session_id, session_id, waiting)
    dump["pending"] = {"tool_call_ids": live.calls} if waiting and live and live.calls else None
    return {"id": session_id, "object": "session", **dump}


@router.get("/v1/sessions/{session_id}/graph", response_class=HTMLResponse)
async def graph(session_id: str, request: Request) -> HTMLResponse:
    s = _services(request)
    ns = s.namespace(request)
    live = s.sessions.peek(ns + session_id)
    dump = await anyio.to_thread.run_sync(_dump, s.config.repo, ns + session_id, session_id,
                                          live is not None and live.run is not None)
    return HTMLResponse(render_html(dump, session_id))


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
    s = _services(request)
    ns = s.namespace(request)
    full = ns + session_id
    await s.sessions.enter(full)
    try:
        live = s.sessions.peek(full)
        deleted = await anyio.to_thread.run_sync(s.config.repo.delete_session, full)
        s.sessions.forget(full)
    finally:
        s.sessions.leave(full)
    if not deleted and (live is None or live.run is None):
        raise _unknown(session_id)
    return {"id": session_id, "object": "session.deleted", "deleted": True}


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


def _parse(raw: bytes) -> ChatRequest:
    try:
        data = loads(raw)
    except ValueError as exc:  # not JSON, not UTF-8, NaN, huge integers, deep nesting, lone surrogates
        raise bad_request(f"the body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object", code="invalid_json")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad_request(f"{where}: {first['msg']}" if where else first["msg"], where or None) from exc


def _internal(exc: Exception) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")


def _unknown(session_id: str) -> APIError:
    return APIError(404, f"no session {session_id!r}", type="not_found_error", param="session_id",
                    code="session_not_found")


def _dump(repo: Repository, name: str, shown: str, live: bool) -> dict[str, Any]:
    """The session's stored memory; a session whose first request is still running shows as empty."""
    try:
        dump = session_dump(repo, name)
    except SessionNotFound as exc:
        if not live:
            raise _unknown(shown) from exc
        dump = {"requests": [], "index": [], "nodes": []}
    dump["session"] = shown
    return dump
