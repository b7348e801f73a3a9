"""Sessions over HTTP: naming (key namespace, header, ``user``, fingerprint) and recognising history.

A client may resend its whole conversation (the usual case), the conversation with its oldest messages
dropped (a trimmed history: a suffix of the transcript holding a reply of the server's, then what is new), or
only its new messages. The server keeps, per session, the transcript of what it processed; the incoming
conversation is matched against it to find what is new. A conversation that begins like the transcript but
departs from it, or that carries assistant messages the transcript does not hold in that order (an edited
history), is a contradiction (409), never grafted in.
"""

from __future__ import annotations

import hashlib
import hmac
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from flowstate.loop import RequestRun
from flowstate.records import FAILED, unfinished_message
from flowstate.store.repository import Repository, Transcript
from serving.errors import APIError, bad_request, conflict
from serving.messages import AssistantMessage, FunctionCallOut, ToolCallOut

SESSION_HEADER = "x-flowstate-session"
MAX_NAME = 200
_NAME_PUNCT = frozenset("._-:@+=~")


@dataclass(frozen=True)
class SessionKey:
    """A session as the server names it: the caller's key namespace and the session's name within it."""

    namespace: str  # "" without API keys
    name: str

    @property
    def full(self) -> str:
        """The name in the repository and the registry."""
        return self.namespace + self.name


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


NAME_RULE = (f"a session name is 1 to {MAX_NAME} characters: letters and digits (any script), and . _ - : @ + = ~; "
             "not '.' or '..'")


def check_name(name: str, param: str = "user") -> str:
    """A session name as given (header or ``user``), or 400: names must be reachable at /v1/sessions/{name}."""
    name = unicodedata.normalize("NFC", name)
    if not (0 < len(name) <= MAX_NAME) or name in (".", "..") or not all(c.isalnum() or c in _NAME_PUNCT for c in name):
        raise bad_request(f"invalid session name {name[:60]!r}: {NAME_RULE}", param, "invalid_session")
    return name


def header_text(value: str | None, header: str) -> str | None:
    """A header value as UTF-8 text (HTTP hands header bytes over as Latin-1)."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise bad_request(f"the {header} header is not UTF-8", header, "invalid_header") from None


def session_name(header: str | None, user: str | None) -> str | None:
    """The header's name, else ``user``'s, else None (the server picks one by fingerprint)."""
    if header is not None:
        return check_name(header, SESSION_HEADER)
    if user is not None:
        return check_name(user)
    return None


def fingerprint(policy: str, conversation: Sequence[dict[str, Any]]) -> str:
    """The base name of an unnamed conversation: its system message and first user message.

    Conversations with the same opening are told apart by ``match``: each gets its own session
    (``fp-…``, then ``fp-….1``, ``fp-….2``, …).
    """
    first_user = next((m["content"] for m in conversation if m["role"] == "user"), "")
    return "fp-" + hashlib.sha256(f"{policy}\x00{first_user}".encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Match:
    """How a conversation relates to a session's transcript."""

    kind: str  # "continues" (new messages follow), "replay" (an answered turn resent), "diverges"
    new: list[dict[str, Any]]  # continues: the messages not processed yet
    at: int = 0  # replay: where the answer to the resent turn starts in the transcript


def match(incoming: list[dict[str, Any]], seen: list[dict[str, Any]]) -> Match:
    """Whether ``incoming`` (a resent history) continues ``seen``, resends an answered turn of it, or neither."""
    if len(incoming) >= len(seen) and incoming[: len(seen)] == seen:
        return Match("continues", incoming[len(seen):])
    if len(incoming) < len(seen) and incoming == seen[: len(incoming)] and seen[len(incoming)]["role"] == "assistant":
        return Match("replay", [], len(incoming))
    return Match("diverges", [])


def trimmed(incoming: list[dict[str, Any]], seen: list[dict[str, Any]]) -> Match | None:
    """``incoming`` as a trimmed history — the client dropped its oldest messages, as context-window managers do:
    a part of ``seen`` from some message on, holding one of the server's replies at least, that either runs to its
    end and continues with new messages, or stops where an answered turn's reply starts (a resend: a replay)."""
    for start in range(1, len(seen)):
        overlap = seen[start:]
        if incoming[: len(overlap)] == overlap and any(m["role"] == "assistant" for m in overlap):
            return Match("continues", incoming[len(overlap):])
        end = start + len(incoming)
        if end < len(seen) and seen[start:end] == incoming and seen[end]["role"] == "assistant" \
                and any(m["role"] == "assistant" for m in incoming):
            return Match("replay", [], end)
    return None


def relate(incoming: list[dict[str, Any]], seen: list[dict[str, Any]]) -> Match:
    """``match``, or where that finds no relation, ``trimmed``."""
    found = match(incoming, seen)
    return found if found.kind != "diverges" else trimmed(incoming, seen) or found


def new_messages(incoming: list[dict[str, Any]], seen: list[dict[str, Any]]) -> Match:
    """What ``incoming`` asks of a named session: its new messages, a replay, or a 409 (see the module docstring)."""
    found = relate(incoming, seen)
    if found.kind == "continues" or (found.kind == "replay" and len(incoming) > 1):
        return found
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
    if any(m["role"] == "assistant" for m in incoming) and any(m in seen for m in incoming if m["role"] == "user"):
        # it resends user messages of this session's with replies beside them: a history, edited or cut out of order
        raise conflict(
            "the conversation resends this session's messages with assistant messages that are not its history (an "
            "edited history, or a trimmed one that matches no part of it): the server never takes replies it did "
            "not give as the client's; resend the history as the server answered it (its oldest messages may be "
            "dropped), send only the new messages, or use a new session", "history_mismatch")
    return Match("continues", incoming)  # a client that sends only its new messages


def _describe(message: dict[str, Any]) -> str:
    if message.get("tool_calls"):
        return "an assistant message with tool calls " + ", ".join(c["id"] for c in message["tool_calls"])
    text = str(message.get("content") or "")
    return f"a {message['role']} message {text[:60]!r}" + ("…" if len(text) > 60 else "")


@dataclass
class Live:
    """A session as the server holds it between HTTP calls."""

    name: str  # namespaced name in the repository
    transcript: list[dict[str, Any]]  # canonical messages of finished requests, then of the pending one
    finished: int  # length of the transcript part that belongs to finished requests
    run: RequestRun | None = None  # the unfinished request, waiting on the client's tool results
    replies: dict[str, int] = field(default_factory=dict)  # Idempotency-Key -> index of its reply in the transcript
    requests: int = 0  # finished requests the transcript holds (another server may have finished more)
    suspended: dict[str, Any] | None = None  # the stored snapshot of the waiting request (flowstate.suspend)
    running: set[str] = field(default_factory=set)  # Idempotency-Keys of turns that run now
    _size: tuple[int, int] = (-1, 0)  # (transcript length, bytes) when last measured

    def bytes(self) -> int:
        """About what the session holds in memory: its transcript's text (a stored tool result included), measured
        again only when the transcript changed length (it only grows, or is cut back by ``abandon``)."""
        if self._size[0] != len(self.transcript):
            self._size = (len(self.transcript), sum(_text_bytes(m) for m in self.transcript) + 256)
        return self._size[1]

    def abandon(self) -> None:
        """Drop the unfinished request (nothing of it was persisted)."""
        del self.transcript[self.finished:]
        self.replies = {k: i for k, i in self.replies.items() if i < self.finished}
        self.run, self.suspended = None, None

    @property
    def calls(self) -> list[str] | None:
        """The ids of the client's tool calls the unfinished request waits on; None when none wait."""
        if self.run is not None:
            return None if self.run.waiting is None else list(self.run.waiting.client)
        waiting = None if self.suspended is None else self.suspended["run"].get("waiting")
        return None if waiting is None else list(waiting["client"])

    def waiting(self) -> dict[str, Any]:
        """What the server holds of the waiting request besides the run itself, as JSON."""
        return {"transcript": self.transcript[self.finished:], "keys": self.request_keys()}

    def request_keys(self) -> dict[str, int]:
        """The idempotency keys of the unfinished request, by offset of their reply within it."""
        return {k: i - self.finished for k, i in self.replies.items() if i >= self.finished}


def _text_bytes(value: Any) -> int:
    """The characters of a message's strings (its content, a JSON content's leaves, tool calls' arguments), plus a
    little for each container: what dominates a transcript's memory."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return 64 + sum(_text_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return 56 + sum(_text_bytes(v) for v in value)
    return 16


def load_live(repo: Repository, name: str) -> Live:
    """A session's finished requests as the server holds them, rebuilt from their stored records."""
    out: list[dict[str, Any]] = []
    replies: dict[str, int] = {}
    requests = repo.requests(name)
    transcripts = repo.transcripts(name)
    for request in requests:
        if (request.unfinished or "").startswith(FAILED):  # its client got an error, not a reply: not in the chat
            continue
        kept = transcripts.get(request.index)
        # the run record only where the transcript is not beside it, or for what an unfinished request kept
        record = (repo.request_record(name, request.index) or {}) if kept is None or request.response is None else {}
        if kept is None:  # persisted before migration 0006, or not through the endpoint
            kept = Transcript(record.get("transcript") or [{"role": "user", "content": request.query}],
                              record.get("idempotency") or {})
        start = len(out)
        out.extend(kept.messages)
        replies.update({k: start + int(i) for k, i in kept.idempotency.items()})
        response = request.response
        if response is None:  # ended at the step budget: the client was told so
            response = unfinished_message(request.unfinished, (record.get("persisted") or {}).get("states", []))
        out.append({"role": "assistant", "content": response})
    live = Live(name, out, len(out), replies=replies, requests=len(requests))
    suspended = repo.pending(name)
    if suspended is not None:  # a request waits on the client's tool results (started here or elsewhere)
        waiting = suspended["live"]
        live.transcript.extend(waiting["transcript"])
        live.replies.update({k: live.finished + int(i) for k, i in waiting["keys"].items()})
        live.suspended = suspended
    return live


def reply_message(message: dict[str, Any]) -> AssistantMessage:
    """A transcript's assistant message as OpenAI's reply message."""
    if message.get("tool_calls"):
        return AssistantMessage(tool_calls=[
            ToolCallOut(id=c["id"], function=FunctionCallOut(name=c["name"], arguments=c["arguments"]))
            for c in message["tool_calls"]])
    return AssistantMessage(content=message.get("content"))
