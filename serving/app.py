"""The FastAPI app: Chat Completions that remember, model list, health, metrics, memory inspection."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from engine.base import Engine, Usage
from flowstate.errors import SessionNotFound
from flowstate.inspection import session_dump
from flowstate.loop import LoopConfig
from flowstate.repository import Repository
from flowstate.tools import ToolSet
from serving.errors import APIError, bad_request
from serving.graph import render_html
from serving.metrics import Metrics
from serving.sessions import SESSION_HEADER, Keys, Live, load_transcript, new_messages, session_name
from serving.turns import TurnResult, Turns, check_pending
from serving.wire import ChatRequest, canonical_message

log = logging.getLogger("flowstate.serving")
KEEPALIVE_S = 10.0  # an SSE comment while internal steps run, so proxies keep the stream open


@dataclass
class ServerConfig:
    """Everything one server needs; the CLI builds it from ``flowstate serve`` options."""

    engine: Engine
    repo: Repository
    keys: Sequence[str] = ()
    tools: ToolSet = field(default_factory=ToolSet)
    loop: LoopConfig = field(default_factory=LoopConfig)
    model_id: str = "flowstate"
    max_concurrency: int = 64  # turns running at once (worker threads); one session's turns are serialized


class _Sessions:
    """Per-session locks and the live state of sessions held between HTTP calls.

    Idle sessions beyond ``keep`` are dropped from memory (their transcript reloads from the
    database on their next call); a session waiting on tool results is never dropped.
    """

    def __init__(self, repo: Repository, keep: int = 4096) -> None:
        self.repo, self.keep = repo, keep
        self._locks: dict[str, asyncio.Lock] = {}
        self._live: OrderedDict[str, Live] = OrderedDict()

    def lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def live(self, name: str) -> Live:
        """Call with the session's lock held."""
        if name not in self._live:
            transcript = load_transcript(self.repo, name)
            self._live[name] = Live(name, transcript, len(transcript))
            self._evict()
        self._live.move_to_end(name)
        return self._live[name]

    def _evict(self) -> None:
        for old in list(self._live):
            if len(self._live) <= self.keep:
                return
            if self._live[old].run is None and not self.lock(old).locked():
                del self._live[old]
                del self._locks[old]

    def peek(self, name: str) -> Live | None:
        return self._live.get(name)

    def forget(self, name: str) -> None:
        self._live.pop(name, None)


def create_app(config: ServerConfig) -> FastAPI:
    """The app for one engine and one repository."""
    app = FastAPI(title="FlowState", docs_url=None, redoc_url=None)
    keys = Keys(config.keys)
    sessions = _Sessions(config.repo)
    turns = Turns(config.engine, config.repo, config.tools, config.loop)
    metrics = Metrics()
    limiter = anyio.CapacityLimiter(config.max_concurrency)
    running: set[asyncio.Task[TurnResult]] = set()
    models = {config.model_id, getattr(config.engine, "model_name", config.model_id)}

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(exc.status_code, str(exc.detail), type=kind).body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _bug(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return JSONResponse(_internal(exc).body(), status_code=500)

    def namespace(request: Request) -> str:
        return keys.namespace(request.headers.get("authorization"))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "engine": config.engine.name, "model": config.model_id}

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        namespace(request)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, Any]:
        namespace(request)
        return {"object": "list", "data": [
            {"id": config.model_id, "object": "model", "created": 0, "owned_by": "flowstate"}]}

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> JSONResponse | StreamingResponse:
        ns = namespace(request)
        body = await _parse(request)
        if body.model not in models:
            raise APIError(404, f"model {body.model!r} does not exist; this server serves {config.model_id!r}",
                           type="not_found_error", param="model", code="model_not_found")
        if body.n not in (None, 1):
            raise bad_request("n > 1 is not supported: each session has one line of memory", "n")
        if body.tool_choice not in (None, "auto", "none"):
            raise bad_request("tool_choice may be 'auto' or 'none'; the agent decides when to call tools", "tool_choice")
        policy = "\n\n".join(m.text(f"messages[{i}]") for i, m in enumerate(body.messages)
                             if m.role in ("system", "developer"))
        conversation = [canonical_message(m, f"messages[{i}]") for i, m in enumerate(body.messages)
                        if m.role not in ("system", "developer")]
        name = session_name(request.headers.get(SESSION_HEADER), body.user, policy, conversation)
        client_tools = [t.spec() for t in body.tools or ()] if body.tool_choice != "none" else []

        lock = sessions.lock(ns + name)
        await lock.acquire()
        try:
            live = sessions.live(ns + name)
            kind, new = check_pending(live, new_messages(conversation, live.transcript))
        except BaseException:
            lock.release()
            raise

        async def turn() -> TurnResult:
            started = time.perf_counter()
            try:
                if kind == "start":
                    fn = lambda: turns.start(live, new, policy, client_tools)  # noqa: E731
                else:
                    fn = lambda: turns.resume(live, new)  # noqa: E731
                result = await anyio.to_thread.run_sync(fn, limiter=limiter)
            except APIError as exc:
                metrics.failed(exc.code or "error")
                raise
            finally:
                lock.release()
            metrics.observe(result, time.perf_counter() - started)
            return result

        task = asyncio.create_task(turn())  # runs to the end even if the client goes away
        running.add(task)
        task.add_done_callback(running.discard)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        extension = {"session": name, "namespace_keyed": bool(ns)}
        if not body.stream:
            result = await asyncio.shield(task)
            return JSONResponse(_completion(completion_id, body.model, result, extension))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream(completion_id, body.model, task, extension, include_usage),
                                 media_type="text/event-stream")

    @app.get("/v1/sessions")
    async def list_sessions(request: Request) -> dict[str, Any]:
        ns = namespace(request)
        names = await anyio.to_thread.run_sync(config.repo.sessions, ns)
        data = [{"id": n[len(ns):], "object": "session", "requests": config.repo.request_count(n)} for n in names]
        return {"object": "list", "data": data}

    @app.get("/v1/sessions/{session_id}")
    async def get_session(session_id: str, request: Request) -> dict[str, Any]:
        ns = namespace(request)
        dump = await anyio.to_thread.run_sync(_dump, config.repo, ns + session_id, session_id)
        live = sessions.peek(ns + session_id)
        dump["pending"] = None if live is None or live.calls is None else {"tool_call_ids": list(live.calls.client)}
        return {"id": session_id, "object": "session", **dump}

    @app.get("/v1/sessions/{session_id}/graph", response_class=HTMLResponse)
    async def graph(session_id: str, request: Request) -> HTMLResponse:
        ns = namespace(request)
        dump = await anyio.to_thread.run_sync(_dump, config.repo, ns + session_id, session_id)
        return HTMLResponse(render_html(dump, session_id))

    @app.delete("/v1/sessions/{session_id}")
    async def delete_session(session_id: str, request: Request) -> dict[str, Any]:
        ns = namespace(request)
        async with sessions.lock(ns + session_id):
            live = sessions.peek(ns + session_id)
            deleted = await anyio.to_thread.run_sync(config.repo.delete_session, ns + session_id)
            sessions.forget(ns + session_id)
        if not deleted and (live is None or live.run is None):
            raise _unknown(session_id)
        return {"id": session_id, "object": "session.deleted", "deleted": True}

    return app


async def _parse(request: Request) -> ChatRequest:
    raw = await request.body()
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
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


def _dump(repo: Repository, name: str, shown: str) -> dict[str, Any]:
    try:
        dump = session_dump(repo, name)
    except SessionNotFound as exc:
        raise _unknown(shown) from exc
    dump["session"] = shown
    return dump


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def _extension(result: TurnResult, base: dict[str, Any]) -> dict[str, Any]:
    """FlowState's detail of the turn, in a field OpenAI clients ignore."""
    return {
        **base, "request": result.request, "request_finished": result.finished, "model_calls": len(result.steps),
        "steps": [
            {"index": s.index, "decision": s.decision,
             "committed": [f"{op['operation']} {op['state_id']}" for op in s.committed],
             "disclosed": s.disclosed, "rejected": s.rejected + s.refused,
             **({"protocol_error": s.protocol_error} if s.protocol_error else {})}
            for s in result.steps
        ],
        "disclosed": [i for s in result.steps for i in s.disclosed],
        "rejected": [r for s in result.steps for r in (*s.rejected, *s.refused)],
    }


def _completion(completion_id: str, model: str, result: TurnResult, base: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": result.message, "finish_reason": result.finish_reason, "logprobs": None}],
        "usage": _usage(result.usage), "flowstate": _extension(result, base),
    }


async def _stream(
    completion_id: str, model: str, task: asyncio.Task[TurnResult], base: dict[str, Any], include_usage: bool,
) -> AsyncIterator[str]:
    created = int(time.time())

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, **extra: Any) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        body = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": choices, **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    yield chunk({"role": "assistant", "content": ""})
    while not task.done():
        await asyncio.wait({task}, timeout=KEEPALIVE_S)
        if not task.done():
            yield ": keep-alive\n\n"
    try:
        result = task.result()
    except APIError as exc:
        yield f"data: {json.dumps(exc.body())}\n\n"
        return
    except Exception as exc:  # a bug or a storage fault: the stream says so and ends
        log.exception("internal error in a streamed turn")
        yield f"data: {json.dumps(_internal(exc).body())}\n\n"
        return
    message = result.message
    if message.get("tool_calls"):
        calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        yield chunk({"tool_calls": calls})
    elif message.get("content"):
        yield chunk({"content": message["content"]})
    yield chunk({}, result.finish_reason, flowstate=_extension(result, base))
    if include_usage:
        yield chunk(None, usage=_usage(result.usage))
    yield "data: [DONE]\n\n"
