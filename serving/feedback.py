"""Feedback on a request: ``POST /v1/sessions/{id}/requests/{n}/feedback`` and ``POST /v1/responses/{id}/feedback``
(a score in [-1, 1] or a label, a comment), and ``GET`` on both paths for what was given. Per key: every piece is
kept, the key's latest counts (``flowstate/store/feedback.py``). A session or response of another key's is not
found; bad input is a 400 (422 for the body's validation, as everywhere) and stores nothing. With redaction on, the
comment is stored redacted like everything else; the audit trail records who gave feedback on what, never its text."""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from flowstate.errors import SessionNotFound
from flowstate.store.feedback import MAX_COMMENT, MAX_LABEL, BadFeedback, Feedback
from serving.errors import APIError, bad_request, conflict
from serving.naming import check_name
from serving.services import Services
from serving.sessions.service import no_request
from serving.sessions.wire import RequestIndex
from serving.tenancy import entry

router = APIRouter()


class FeedbackIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # a score of true is not 1
    score: float | None = Field(None, ge=-1, le=1, description="from -1 (bad) to 1 (good)")
    label: str | None = Field(None, min_length=1, max_length=MAX_LABEL, description="e.g. wrong_tool, helpful")
    comment: str = Field("", max_length=MAX_COMMENT)


async def _give(request: Request, s: Services, full: str, shown: str, index: int, body: FeedbackIn) -> dict[str, Any]:
    if body.score is None and body.label is None:
        raise bad_request("feedback needs a score (from -1 to 1) or a label", "score")
    caller = request.state.caller
    repo = s.config.repo
    comment = repo.redaction.value(full, body.comment) if repo.redaction is not None else body.comment
    label = repo.redaction.value(full, body.label) if repo.redaction is not None and body.label else body.label
    given = Feedback(full, index, caller.key or "", body.score, label, comment, time.time())
    try:
        await anyio.to_thread.run_sync(repo.feedback.give, given)
    except SessionNotFound:
        raise no_request(shown, index) from None
    except BadFeedback as exc:
        if "no finished request" in str(exc):
            raise no_request(shown, index) from None
        raise bad_request(str(exc), "score") from None
    await anyio.to_thread.run_sync(repo.audit.record, entry(caller, "request.feedback", f"{shown}#{index}",
                                                            score=body.score, label=label))
    return {"object": "feedback", "session": shown, **given.to_dict()}


async def _list(s: Services, full: str, shown: str, index: int) -> dict[str, Any]:
    repo = s.config.repo
    if not await anyio.to_thread.run_sync(repo.has_session, full) or \
            index > await anyio.to_thread.run_sync(repo.request_count, full):
        raise no_request(shown, index)  # as the POST answers: feedback is on a finished request only
    pieces = await anyio.to_thread.run_sync(repo.feedback.of, full, index)
    return {"object": "list", "session": shown, "request": index, "data": [p.to_dict() for p in pieces]}


@router.post("/v1/sessions/{session_id}/requests/{index}/feedback")
async def give_on_request(session_id: str, index: RequestIndex, request: Request, body: FeedbackIn) -> dict[str, Any]:
    s: Services = request.app.state.services
    name = check_name(session_id, "session_id")
    return await _give(request, s, s.namespace(request) + name, name, index, body)


@router.get("/v1/sessions/{session_id}/requests/{index}/feedback")
async def feedback_on_request(session_id: str, index: RequestIndex, request: Request) -> dict[str, Any]:
    s: Services = request.app.state.services
    name = check_name(session_id, "session_id")
    return await _list(s, s.namespace(request) + name, name, index)


async def _responded(request: Request, response_id: str) -> tuple[Services, str, str, int]:
    """The caller's stored response: its session (full and as shown) and the request it answered."""
    s: Services = request.app.state.services
    ns = s.namespace(request)
    found = await anyio.to_thread.run_sync(s.config.repo.responses.get, response_id, ns)
    if found is None:
        raise APIError(404, f"no stored response {response_id!r} (never stored, deleted, or another key's)",
                       param="response_id", code="response_not_found")
    index = (found.body.get("flowstate") or {}).get("request")
    if found.body.get("status") != "completed" or not isinstance(index, int):
        raise conflict(f"response {response_id!r} is {found.body.get('status')}: feedback goes on a completed "
                       "response", "response_not_completed")
    return s, found.session, found.session[len(ns):], index


@router.post("/v1/responses/{response_id}/feedback")
async def give_on_response(response_id: str, request: Request, body: FeedbackIn) -> dict[str, Any]:
    s, full, shown, index = await _responded(request, response_id)
    return {**await _give(request, s, full, shown, index, body), "response": response_id}


@router.get("/v1/responses/{response_id}/feedback")
async def feedback_on_response(response_id: str, request: Request) -> dict[str, Any]:
    s, full, shown, index = await _responded(request, response_id)
    return {**await _list(s, full, shown, index), "response": response_id}
