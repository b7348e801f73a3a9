"""``/v1/conversations``: the Responses API's conversations, a second view of FlowState's sessions — a
conversation's id is its session's name, its items are the session's transcript, deleting it forgets the session."""

from __future__ import annotations

import time
from typing import Any

import anyio

from flowstate.errors import SessionNotFound
from flowstate.store.audit import Entry
from serving.chat.wire import Ingress, validated
from serving.errors import APIError, bad_request
from serving.naming import SessionKey, check_name
from serving.responses.objects import new_id, page, transcript_items
from serving.responses.wire import check_metadata
from serving.services import Services


class ConversationBody(Ingress):
    metadata: dict[str, str] | None = None
    items: list[dict[str, Any]] | None = None


def _metadata(body: ConversationBody) -> dict[str, str]:
    return check_metadata(body.metadata or {})


def _object(cid: str, metadata: dict[str, str], created_at: int) -> dict[str, Any]:
    return {"id": cid, "object": "conversation", "created_at": created_at, "metadata": metadata}


def _unknown(cid: str) -> APIError:
    return APIError(404, f"no conversation {cid!r}", param="conversation_id", code="conversation_not_found")


class Conversations:
    """The conversation routes over one server's services."""

    def __init__(self, services: Services) -> None:
        self.s = services

    async def create(self, ns: str, data: Any) -> dict[str, Any]:
        body: ConversationBody = validated(ConversationBody, data)
        if body.items:
            raise bad_request("items on create are not supported: send them as the input of the conversation's first "
                              "response", "items", "unsupported_parameter")
        cid, created = new_id("conv"), int(time.time())
        metadata = _metadata(body)
        await anyio.to_thread.run_sync(self.s.config.repo.conversations.save, ns + cid, metadata, created)
        return _object(cid, metadata, created)

    async def retrieve(self, ns: str, cid: str) -> dict[str, Any]:
        key = SessionKey(ns, check_name(cid, "conversation_id"))
        found = await anyio.to_thread.run_sync(self.s.config.repo.conversations.get, key.full)
        if found is not None:
            return _object(cid, *found)
        if not await self._exists(key):
            raise _unknown(cid)
        return _object(cid, {}, 0)  # a session used as a conversation without being created

    async def update(self, ns: str, cid: str, data: Any) -> dict[str, Any]:
        metadata = _metadata(validated(ConversationBody, data))
        current = await self.retrieve(ns, cid)
        await anyio.to_thread.run_sync(self.s.config.repo.conversations.save, ns + cid, metadata,
                                       current["created_at"] or int(time.time()))
        return _object(cid, metadata, current["created_at"])

    async def delete(self, ns: str, cid: str, audit: Entry | None = None) -> dict[str, Any]:
        """Forget the conversation's session (``audit`` recorded with the deletion, or as refused)."""
        if not await self.s.forget(SessionKey(ns, check_name(cid, "conversation_id")).full, audit):
            if audit is not None:
                await self.s.record(audit.refused("no such conversation"))
            raise _unknown(cid)
        return {"id": cid, "object": "conversation.deleted", "deleted": True}

    async def items(self, ns: str, cid: str, after: str | None, limit: int, order: str) -> dict[str, Any]:
        key = SessionKey(ns, check_name(cid, "conversation_id"))
        if not await self._exists(key) and await anyio.to_thread.run_sync(self.s.config.repo.conversations.get,
                                                                          key.full) is None:
            raise _unknown(cid)
        try:
            live = await self.s.sessions.view(key.full)
            transcript = list(live.transcript)
        except SessionNotFound:
            transcript = []
        return page(transcript_items(transcript), after, limit, order, f"conversation {cid!r}")

    async def _exists(self, key: SessionKey) -> bool:
        live = self.s.sessions.peek(key.full)
        return live is not None or await anyio.to_thread.run_sync(self.s.config.repo.has_session, key.full) or \
            await anyio.to_thread.run_sync(self.s.config.repo.waiting.get, key.full) is not None
