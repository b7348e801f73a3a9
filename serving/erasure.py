"""``POST /v1/erasure``: everything the caller's tenant stores about a subject (a session name or an end-user id)
removed — from the database in one transaction, from this server's memory (live sessions, their replies by
Idempotency-Key, a streamed background response's events), then from the database's bytes as far as it allows — and
a receipt returned and kept (``GET /v1/erasure/{id}``). A turn running in one of the subject's sessions is waited for
up to ``wait_s``; still running then, the erasure is refused (409 ``subject_busy``) and nothing is removed."""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from flowstate.store.audit import text_digest
from flowstate.store.erasure import Receipt
from serving.errors import APIError, conflict
from serving.services import Services
from serving.tenancy import entry

router = APIRouter()
MAX_WAIT_S = 300.0


class ErasureIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    subject: str = Field(min_length=1, max_length=512, description="a session name, or an end-user id: the `user` "
                         "of chat completions and responses, or a value of a conversation's metadata")
    wait_s: float = Field(30.0, ge=0, le=MAX_WAIT_S, description="how long to wait for a running turn of the subject")
    dry_run: bool = Field(False, description="say what would be erased (sessions, counts per kind) and erase nothing")


@router.post("/v1/erasure")
async def erase(request: Request, body: ErasureIn) -> dict[str, Any]:
    s: Services = request.app.state.services
    return await erase_subject(request, s.namespace(request), body)


async def erase_subject(request: Request, ns: str, body: ErasureIn, tenant: str | None = None) -> dict[str, Any]:
    """Erase ``body.subject`` in the namespace ``ns`` (the caller's own, or ``tenant``'s for an admin), or with
    ``dry_run`` say what would go and remove nothing (recorded in the audit trail by the subject's digest)."""
    s: Services = request.app.state.services
    repo = s.config.repo
    if body.dry_run:
        preview = await anyio.to_thread.run_sync(repo.erasure.preview, ns, body.subject)
        await s.record(entry(request.state.caller, "subject.erase", text_digest(body.subject), tenant, dry_run=True))
        return preview
    names = sorted(await anyio.to_thread.run_sync(repo.erasure.sessions_of, ns, body.subject))
    entered: list[str] = []
    try:
        try:
            with anyio.fail_after(body.wait_s):
                for name in names:  # in one order, as an import takes them: never two erasures waiting on each other
                    await s.sessions.enter(name)
                    entered.append(name)
        except TimeoutError:
            busy = next((n for n in names if n not in entered), names[-1])[len(ns):]
            raise conflict(f"a turn runs in session {busy!r} of this subject beyond wait_s ({body.wait_s:g} s): "
                           "nothing was erased; try again", "subject_busy") from None
        receipt: Receipt = await anyio.to_thread.run_sync(
            repo.erasure.erase, ns, body.subject, entry(request.state.caller, "subject.erase", "", tenant))
        background = request.app.state.responses.background
        for name in names:
            s.sessions.forget(name)  # the live copy: its transcript, waiting request, replies by Idempotency-Key
        for rid in [rid for rid, job in background.streams.items() if job.session in names]:
            del background.streams[rid]  # a streamed background response's events, kept for a resumed stream
    finally:
        for name in reversed(entered):
            s.sessions.leave(name)
    storage = await anyio.to_thread.run_sync(repo.erasure.scrub)
    kept = await anyio.to_thread.run_sync(repo.erasure.keep_storage, receipt, storage)
    return kept.to_dict()


@router.get("/v1/erasure/{receipt_id}")
async def receipt(request: Request, receipt_id: str) -> dict[str, Any]:
    s: Services = request.app.state.services
    ns = s.namespace(request)
    found = await anyio.to_thread.run_sync(s.config.repo.erasure.receipt, receipt_id, ns[:-1] or None)
    if found is None:
        raise APIError(404, f"no erasure receipt {receipt_id!r}", type="not_found_error", param="receipt_id",
                       code="receipt_not_found")
    return found.to_dict()
