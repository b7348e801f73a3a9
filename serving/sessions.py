"""Sessions over HTTP: naming (key namespace, header, ``user``, fingerprint) and recognising history.

A client may resend its whole conversation (the usual case) or only its new messages. The server
keeps, per session, the transcript of what it processed; the incoming conversation is matched
against it to find what is new. A conversation that begins like the transcript but departs from it
is a contradiction (409), never silently mixed in.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowstate.loop import RequestRun
from flowstate.records import ToolCallRecord, unfinished_message
from flowstate.repository import Repository
from serving.errors import APIError, bad_request, conflict

SESSION_HEADER = "x-flowstate-session"
MAX_NAME = 200


class Keys:
    """The server's API keys; each key owns a namespace of sessions."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = [k for k in keys if k]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def namespace(self, authorization: str | None) -> str:
        """The session-name prefix of the caller's key ('' without keys); 401 for a missing or wrong key."""
        if not self._keys:
            return ""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "missing API key: send Authorization: Bearer KEY", type="authentication_error",
                           code="invalid_api_key")
        if not any(hmac.compare_digest(token.encode(), k.encode()) for k in self._keys):
            raise APIError(401, "invalid API key", type="authentication_error", code="invalid_api_key")
        return "k" + hashlib.sha256(token.encode()).hexdigest()[:16] + "/"


def check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME or any(ord(c) < 32 for c in name):
        raise bad_request(f"session names are 1 to {MAX_NAME} printable characters", "user", "invalid_session")
    return name


def session_name(header: str | None, user: str | None, policy: str, conversation: Sequence[dict[str, Any]]) -> str:
    """The header, else ``user``, else a fingerprint of the first system and user messages."""
    if header is not None:
        return check_name(header)
    if user is not None:
        return check_name(user)
    first_user = next((m["content"] for m in conversation if m["role"] == "user"), "")
    digest = hashlib.sha256(f"{policy}\x00{first_user}".encode()).hexdigest()[:20]
    return f"fp-{digest}"


def new_messages(incoming: list[dict[str, Any]], seen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The part of ``incoming`` the server has not processed yet (see the module docstring)."""
    if len(incoming) >= len(seen) and incoming[: len(seen)] == seen:
        return incoming[len(seen):]  # the whole history, then what is new
    if len(incoming) > 1 and seen and incoming[0] == seen[0]:
        pairs = enumerate(zip(incoming, seen, strict=False))
        at = next((i for i, (a, b) in pairs if a != b), min(len(incoming), len(seen)))
        raise conflict(
            f"the conversation contradicts this session's history at message {at + 1} (system messages not "
            f"counted): the server recorded {_describe(seen[at]) if at < len(seen) else 'nothing more'}, "
            f"the request has {_describe(incoming[at]) if at < len(incoming) else 'nothing more'}; resend the "
            "history as the server answered it, send only the new messages, or use a new session",
            "history_mismatch",
        )
    return incoming  # a client that sends only its new messages


def _describe(message: dict[str, Any]) -> str:
    if message.get("tool_calls"):
        return "an assistant message with tool calls " + ", ".join(c["id"] for c in message["tool_calls"])
    text = str(message.get("content") or "")
    return f"a {message['role']} message {text[:60]!r}" + ("…" if len(text) > 60 else "")


@dataclass
class PendingCalls:
    """The tool calls of the step a request waits on: client calls by id, server-run results by position."""

    client: dict[str, int]  # tool_call_id -> position (0-based) in the step's calls
    done: dict[int, ToolCallRecord]  # server-side and refused calls, already observed


@dataclass
class Live:
    """A session as the server holds it between HTTP calls."""

    name: str  # namespaced name in the repository
    transcript: list[dict[str, Any]]  # canonical messages of finished requests, then of the pending one
    finished: int  # length of the transcript part that belongs to finished requests
    run: RequestRun | None = None  # the unfinished request, waiting on the client's tool results
    calls: PendingCalls | None = None
    client_tools: frozenset[str] = frozenset()  # names the client runs, fixed for the request

    def abandon(self) -> None:
        """Drop the unfinished request (nothing of it was persisted)."""
        del self.transcript[self.finished:]
        self.run, self.calls = None, None


def load_transcript(repo: Repository, name: str) -> list[dict[str, Any]]:
    """The canonical messages of a session's finished requests, rebuilt from their stored records."""
    out: list[dict[str, Any]] = []
    for request in repo.requests(name):
        record = repo.request_record(name, request.index) or {}
        out.extend(record.get("transcript") or [{"role": "user", "content": request.query}])
        response = request.response
        if response is None:  # ended at the step budget: the client was told so
            response = unfinished_message(request.unfinished, (record.get("persisted") or {}).get("states", []))
        out.append({"role": "assistant", "content": response})
    return out
