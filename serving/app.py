"""The FastAPI app for one server, assembled: each endpoint family's router (Chat Completions in serving/chat/,
the Responses API and conversations in serving/responses/, sessions and memory in serving/sessions/, the
operator's admin.py and erasure.py, feedback.py, the server's own routes in operations.py, the console), the
middleware, and the errors in OpenAI's shape. What the routes serve (engine, repository, sessions, turns, metrics)
sits on ``app.state.services``, built by ``create_app``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from flowstate.store.server_lock import Serving
from serving import admin, console, erasure, feedback, operations
from serving.bodies import JSONBodies
from serving.chat import routes as chat_routes
from serving.chat.service import ChatService
from serving.errors import APIError
from serving.responses import routes as responses_routes
from serving.responses.conversations import Conversations
from serving.responses.service import ResponsesService
from serving.services import ServerConfig, build
from serving.sessions import routes as sessions_routes
from serving.sessions.service import SessionsService
from serving.tenancy import Authenticated
from serving.traced import Traced

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
    app.include_router(operations.router)
    app.include_router(chat_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(admin.router)
    app.include_router(erasure.router)
    app.include_router(feedback.router)
    app.include_router(sessions_routes.router)
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


def _internal(exc: Exception) -> APIError:
    return APIError(500, f"internal error: {type(exc).__name__}", type="server_error")
