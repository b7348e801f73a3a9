"""The session and memory routes, each a thin call into ``SessionsService``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, Response

from serving.sessions.service import SessionsService, only
from serving.sessions.wire import (
    Deleted,
    HitPage,
    Imported,
    RequestIndex,
    RequestView,
    SearchQuery,
    SessionList,
    SessionQuery,
    SessionsQuery,
    SessionViewOut,
)

router = APIRouter()


def _service(request: Request) -> SessionsService:
    return request.app.state.sessions  # type: ignore[no-any-return]


# -- the routes ----------------------------------------------------------------------------------------------------

@router.get("/v1/sessions")
async def list_sessions(request: Request, query: Annotated[SessionsQuery, Query()]) -> SessionList:
    """The key's sessions, the most recently active first, ``limit`` (1–1000) a page after the session ``after``;
    ``name`` keeps those whose name contains it (ignoring case)."""
    only(request, "limit", "after", "name")
    return await _service(request).list(request, query)


@router.get("/v1/memory/search")
async def search_memory(request: Request, query: Annotated[SearchQuery, Query()]) -> HitPage:
    """The key's states (and, with ``in=states,observations``, raw tool observations) that match ``q``, best first."""
    only(request, "q", "type", "session", "since", "until", "limit", "after", "in")
    return await _service(request).search(request, query)


@router.get("/v1/sessions/{session_id}", response_model=SessionViewOut)
async def get_session(session_id: str, request: Request, query: Annotated[SessionQuery, Query()]) -> Response:
    only(request, "layout")
    service = _service(request)
    return await service.view(service.key(request, session_id), query.layout, request.headers.get("if-none-match"))


@router.get("/v1/sessions/{session_id}/requests/{index}")
async def get_request(session_id: str, index: RequestIndex, request: Request) -> RequestView:
    """One finished request of the session with its run record: every step's output and what became of it."""
    only(request)
    service = _service(request)
    return await service.finished(service.key(request, session_id), index)


@router.get("/v1/sessions/{session_id}/graph", response_class=HTMLResponse)
async def graph(session_id: str, request: Request) -> HTMLResponse:
    """The session's state graph as a page of its own: inline SVG, no script."""
    only(request)
    service = _service(request)
    return await service.page(service.key(request, session_id))


@router.get("/v1/sessions/{session_id}/export")
async def export_session(session_id: str, request: Request) -> Response:
    """The session as a portable file (flowstate/store/transfer.py): what ``POST /v1/sessions/import`` reads."""
    only(request)
    service = _service(request)
    return await service.export(request, service.key(request, session_id))


@router.post("/v1/sessions/import")
async def import_sessions(request: Request) -> Imported:
    """A session file into the key's namespace, all or nothing: ``rename=OLD=NEW`` (repeatable) renames on the way."""
    only(request, "rename")
    return await _service(request).take_in(request)


@router.delete("/v1/sessions/{session_id}")
async def delete_session(session_id: str, request: Request) -> Deleted:
    only(request)
    service = _service(request)
    return await service.delete(request, service.key(request, session_id))
