"""``SessionsService``: what the session and memory routes do, in the caller's namespace."""

from __future__ import annotations

import hashlib
import json
import secrets
import unicodedata
from dataclasses import asdict, replace
from typing import Any

import anyio
from fastapi import Request
from fastapi.responses import HTMLResponse, Response

from flowstate.errors import SessionNotFound
from flowstate.inspection import session_dump
from flowstate.store import transfer
from flowstate.store.audit import text_digest
from flowstate.store.repository import Repository
from flowstate.store.search import BadSearch, Search
from serving.bodies import read_body
from serving.chat.wire import MAX_DEPTH
from serving.errors import APIError, bad_request, conflict
from serving.graph import layout, render_html
from serving.naming import SessionKey, check_name
from serving.services import Services
from serving.sessions.wire import (
    Deleted,
    ForkPoint,
    HitPage,
    Imported,
    MemoryHit,
    RequestView,
    SearchQuery,
    SessionList,
    SessionRow,
    SessionsQuery,
    SessionViewOut,
)
from serving.tenancy import entry

EXPORT_TYPE = "application/x-ndjson"
MAX_IMPORT_BYTES = 256 << 20
GRAPH_HEADERS = {
    # the page is inline SVG and inline styles, nothing else: no script, image, frame, form or base may load
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


def unknown_session(name: str) -> APIError:
    return APIError(404, f"no session {name!r}", type="not_found_error", param="session_id", code="session_not_found")


def no_request(session: str, index: int) -> APIError:
    return APIError(404, f"session {session!r} has no finished request {index}", type="not_found_error",
                    param="index", code="request_not_found")


def only(request: Request, *names: str) -> None:
    """A 400 for a query parameter the route does not take (a typo would otherwise be ignored)."""
    unknown = sorted(set(request.query_params) - set(names))
    if unknown:
        raise bad_request(f"unknown parameter {unknown[0]!r}: {', '.join(names) or 'none'}", unknown[0],
                          "unknown_parameter")


_EPOCH = secrets.token_hex(8)  # this process's: a restarted server (perhaps a newer layout) tags every session anew


def etag(session: str, with_layout: bool, stored: tuple[int, ...] | None, running: Any, pending: Any) -> str:
    """A session view's entity tag: its name, stored version and what runs in it now, as a digest."""
    what = json.dumps([_EPOCH, session, with_layout, stored, running, pending], sort_keys=True, default=str)
    return '"' + hashlib.sha256(what.encode("utf-8", "surrogatepass")).hexdigest()[:32] + '"'


def stored_dump(repo: Repository, key: SessionKey, live: bool) -> dict[str, Any]:
    """The session's stored memory as its key knows it; a session whose first request still runs shows as empty."""
    try:
        dump = session_dump(repo, key.full)
    except SessionNotFound as exc:
        if not live:
            raise unknown_session(key.name) from exc
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


class SessionsService:
    """The session and memory routes' work over one server's services, for the caller of each request."""

    def __init__(self, services: Services) -> None:
        self.s = services

    def key(self, request: Request, session_id: str) -> SessionKey:
        """The caller's session named in the path (NFC, as names in headers and bodies are)."""
        return SessionKey(self.s.namespace(request), unicodedata.normalize("NFC", session_id))

    async def list(self, request: Request, query: SessionsQuery) -> SessionList:
        ns = self.s.namespace(request)
        if not 1 <= query.limit <= 1000:
            raise bad_request(f"limit is {query.limit}: 1 to 1000", "limit", "invalid_limit")
        if len(query.name) > 200:
            raise bad_request("name is longer than a session name can be (200 characters)", "name", "invalid_name")
        after = None if query.after is None else ns + unicodedata.normalize("NFC", query.after)
        rows, more = await anyio.to_thread.run_sync(lambda: self.s.config.repo.catalog.page(
            ns, contains=query.name, limit=query.limit, after=after))  # storage: never on the event loop
        data = [SessionRow(id=r.name[len(ns):], requests=r.requests, states=r.states, created_at=r.created_at,
                           last_activity=r.active_at or None, strategy=r.strategy,
                           forked_from=None if r.forked_from is None else ForkPoint(
                               session=r.forked_from[0][len(ns):], requests=r.forked_from[1]),
                           running=self.s.sessions.running(r.name)) for r in rows]
        return SessionList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                           has_more=more)

    async def search(self, request: Request, query: SearchQuery) -> HitPage:
        ns = self.s.namespace(request)
        try:
            search = Search.parse(query.q, type=query.type, session=query.session, since=query.since,
                                  until=query.until, limit=query.limit, after=query.after, in_=query.in_)
        except BadSearch as exc:
            raise bad_request(str(exc), None, "invalid_search") from None
        if search.session is not None:
            search = replace(search, session=unicodedata.normalize("NFC", search.session))
        hits, more = await anyio.to_thread.run_sync(self.s.config.repo.catalog.search, ns, search)
        await self.s.record(entry(request.state.caller, "memory.search", text_digest(query.q or ""), hits=len(hits)))
        return HitPage(data=[MemoryHit(**{**asdict(h), "session": h.session[len(ns):]}) for h in hits], has_more=more,
                       next=search.cursor(search.offset + search.limit) if more else None)

    async def view(self, key: SessionKey, with_layout: bool, if_none_match: str | None = None) -> Response:
        """The session as JSON: its stored memory, the request a turn runs in it now (as it will be stored) or that
        waits on tool results, and, asked, its graph's layout — read, laid out, checked against ``SessionViewOut`` and
        written in a worker thread (a session of thousands of states takes a large part of a second: never on the
        event loop, and checked once). Its ``ETag`` is the session's version (``Repository.version``, one query of
        counts) and what runs in it now: a poll that sends it back in ``If-None-Match`` gets a 304, nothing read."""
        calls = await self.s.sessions.waiting(key.full)  # memory, else the database's waiting request
        waiting = calls is not None
        # a turn runs in this server's memory (on a shared database, view reads anew)
        held = self.s.sessions.peek(key.full)
        run = held.run if held is not None else None
        running = None if run is None else {"index": run.index_k, "query": run.query, "waiting": waiting,
                                            "steps": [st.to_dict() for st in list(run.steps)]}
        pending = {"tool_call_ids": calls} if calls else None
        stored = await anyio.to_thread.run_sync(self.s.config.repo.lineage.version, key.full)
        tag = etag(key.full, with_layout, stored, running, pending)
        if if_none_match is not None and tag in [t.strip() for t in if_none_match.split(",")]:
            return Response(status_code=304, headers={"ETag": tag})

        def written() -> bytes:
            repo = self.s.config.repo
            dump = stored_dump(repo, key, waiting or run is not None)
            # what runs in memory is shown as it will be stored
            dump["running"] = running if repo.redaction is None or running is None else \
                repo.redaction.value(key.full, running)
            dump["pending"], dump["layout"] = pending, layout(dump) if with_layout else None
            return SessionViewOut.model_validate({"id": key.name, **dump}).model_dump_json().encode()

        return Response(await anyio.to_thread.run_sync(written), media_type="application/json",
                        headers={"ETag": tag, "Cache-Control": "private, no-cache"})

    async def finished(self, key: SessionKey, index: int) -> RequestView:
        """One finished request with its run record: every step's output and what became of it."""

        def read() -> dict[str, Any] | None:
            repo = self.s.config.repo
            record = repo.records.request(key.full, index)
            if record is None:
                return None
            row = next(r for r in repo.requests(key.full) if r.index == index)
            record.pop("session", None)  # the repository's name: the key's namespace is not shown
            return {"index": index, "query": row.query, "response": row.response, "unfinished": row.unfinished,
                    "created_at": row.created_at, "strategy": row.strategy, "record": record}

        found = await anyio.to_thread.run_sync(read)
        if found is None:
            raise no_request(key.name, index)
        return RequestView(session=key.name, **found)

    async def page(self, key: SessionKey) -> HTMLResponse:
        live = self.s.sessions.peek(key.full)
        dump = await anyio.to_thread.run_sync(stored_dump, self.s.config.repo, key,
                                              live is not None and live.run is not None)
        return HTMLResponse(render_html(dump, key.name), headers=GRAPH_HEADERS)

    async def export(self, request: Request, key: SessionKey) -> Response:
        """The session as a portable file (flowstate/store/transfer.py): what ``POST /v1/sessions/import`` reads."""
        did = entry(request.state.caller, "session.export", key.name)
        try:
            lines = await anyio.to_thread.run_sync(self.s.config.repo.transfer.export, [key.full], key.namespace)
        except SessionNotFound:
            await self.s.record(did.refused("no such session"))
            raise unknown_session(key.name) from None
        await self.s.record(did)  # before a line of it leaves
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key.name)[:80] or "session"
        return Response("".join(lines), media_type=EXPORT_TYPE,
                        headers={"Content-Disposition": f'attachment; filename="{safe}.flowstate.jsonl"'})

    async def take_in(self, request: Request) -> Imported:
        """A session file into the key's namespace, all or nothing; ``rename=OLD=NEW`` renames on the way."""
        ns = self.s.namespace(request)
        try:
            renames = transfer.renames(unicodedata.normalize("NFC", v) for v in request.query_params.getlist("rename"))
        except ValueError as exc:
            raise bad_request(str(exc), "rename", "invalid_rename") from None
        raw = await read_body(request, replace(self.s.config.ingress, max_body_bytes=MAX_IMPORT_BYTES))
        try:
            text = raw.decode("utf-8")
            file = await anyio.to_thread.run_sync(transfer.read_file, transfer.lines_of(text), renames, MAX_DEPTH)
        except UnicodeDecodeError:
            raise bad_request("the body is not UTF-8 text", None, "invalid_session_file") from None
        except transfer.BadSessionFile as exc:
            raise bad_request(str(exc), None, "invalid_session_file") from None
        for name in file.names:  # a name the API can address, as every session a client makes
            if check_name(name, "rename") != name:
                raise bad_request(f"session name {name[:60]!r} is not in NFC form: rename it", "rename",
                                  "invalid_session")
        did = entry(request.state.caller, "session.import", ",".join(file.names)[:500], sessions=len(file.names))
        try:
            names = await self.s.take_in(file, ns, did)
        except (transfer.SessionExists, transfer.BadSessionFile, APIError) as exc:
            await self.s.record(did.refused(str(exc)))
            if isinstance(exc, transfer.SessionExists):
                raise conflict(str(exc), "session_exists") from None
            if isinstance(exc, transfer.BadSessionFile):
                raise bad_request(str(exc), None, "invalid_session_file") from None
            raise
        return Imported(sessions=names)

    async def delete(self, request: Request, key: SessionKey) -> Deleted:
        did = entry(request.state.caller, "session.delete", key.name)
        if not await self.s.forget(key.full, did):
            await self.s.record(did.refused("no such session"))
            raise unknown_session(key.name)
        return Deleted(id=key.name)
