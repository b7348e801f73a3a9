"""A session as the server holds it between HTTP calls (its transcript, its waiting request, its replies by
Idempotency-Key, what it holds in memory), rebuilt from the repository when it is not in memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flowstate.loop import RequestRun
from flowstate.records import FAILED, unfinished_message
from flowstate.store.repository import Repository, Transcript
from serving.chat.messages import AssistantMessage, FunctionCallOut, ToolCallOut
from serving.errors import APIError
from serving.history import relate


class Live:
    """A session as the server holds it between HTTP calls, and the rules of its turns: the one place that changes
    its transcript, its waiting request and its replies by Idempotency-Key. A turn starts a request (``start``),
    answers the calls it waits on (``answer``), then either waits on the client again (``wait``), finishes it
    (``finish``) or drops it (``abandon``); ``earlier_reply`` finds the reply a retry already got."""

    def __init__(self, name: str, transcript: list[dict[str, Any]], settled: int, *, requests: int = 0,
                 replies: dict[str, int] | None = None) -> None:
        self.name = name  # namespaced name in the repository
        self.transcript = transcript  # canonical messages of finished requests, then of the waiting one: read only
        self.settled = settled  # where the finished requests end in the transcript (what follows is the waiting one)
        self.requests = requests  # finished requests the transcript holds (another server may have finished more)
        self.run: RequestRun | None = None  # the unfinished request, waiting on the client's tool results
        self.suspended: dict[str, Any] | None = None  # the stored snapshot of the waiting request (flowstate.suspend)
        self._replies = dict(replies or {})  # Idempotency-Key -> index of its reply in the transcript
        self._running: set[str] = set()  # Idempotency-Keys of turns that run now
        self._size: tuple[int, int] = (-1, 0)  # (transcript length, bytes) when last measured
        # messages as the transcript keeps them: redacted as the repository stores them, on a redacting server (so a
        # session in memory matches a client's resent history exactly as one read back from the database does)
        self.seal: Callable[[Any], Any] = lambda messages: messages

    # -- idempotency: what a key already got, or is getting ----------------------------------------------------

    def replied(self, key: str | None) -> bool:
        """Whether a call under ``key`` got its reply in this session."""
        return key is not None and key in self._replies

    def claims(self, key: str) -> bool:
        """Whether ``key`` belongs to this session: its reply is here, or its turn runs here now."""
        return key in self._replies or key in self._running

    def hold(self, key: str | None) -> None:
        """A turn under ``key`` runs now (a retry that resolves meanwhile waits for it)."""
        if key is not None:
            self._running.add(key)

    def release(self, key: str | None) -> None:
        if key is not None:
            self._running.discard(key)

    def earlier_reply(self, key: str | None, conversation: list[dict[str, Any]], resent_history: bool) -> int | None:
        """Where in the transcript the reply already given to this exact request is: by its Idempotency-Key, or (for
        a client that resends its history) because the conversation ends where an answered turn ends; a key used
        for other messages is a 422."""
        if key is not None and key in self._replies and self._replies[key] < len(self.transcript):
            at = self._replies[key]
            last = max((i for i, m in enumerate(conversation) if m["role"] == "assistant"), default=-1)
            sent = conversation[last + 1:]  # what this call adds: it must be what the key's first call added
            if not sent or self.transcript[max(at - len(sent), 0):at] != sent:
                raise APIError(422, f"Idempotency-Key {key!r} was used for a different request in this session: a "
                                    "retry must resend the same messages; use a new key for a new request",
                               type="invalid_request_error", param="Idempotency-Key", code="idempotency_key_reused")
            return at
        if resent_history:
            found = relate(conversation, self.transcript)
            if found.kind == "replay":
                return found.at
        return None

    # -- a request's life -------------------------------------------------------------------------------------------

    def start(self, run: RequestRun, users: list[dict[str, Any]]) -> None:
        """A new request from the client's new messages."""
        if self.run is not None or self.suspended is not None:
            raise RuntimeError(f"session {self.name!r} has a waiting request")
        self.run = run
        self.transcript.extend(self.seal(users))

    def take_up(self, run: RequestRun) -> None:
        """The waiting request, restored from its stored snapshot, runs here now."""
        self.run = run

    def answer(self, results: list[dict[str, Any]]) -> None:
        """The client's messages that answered the waiting calls."""
        self.transcript.extend(self.seal(results))

    def so_far(self, key: str | None) -> Transcript:
        """The unfinished request's messages and keys, the reply about to come under ``key`` included."""
        keys = {**self.request_keys(), **({key: len(self.transcript) - self.settled} if key else {})}
        return Transcript(self.transcript[self.settled:], keys)

    def wait(self, calls: list[dict[str, Any]], key: str | None, snapshot: dict[str, Any]) -> dict[str, Any]:
        """The request waits on the client's ``calls``: its reply is they, the request as stored (``snapshot``) is
        kept; returns what to store so that any server can go on with it."""
        self._remember(key)
        self.transcript.extend(self.seal([{"role": "assistant", "content": None, "tool_calls": calls}]))
        self.suspended = {"run": snapshot, "live": self.unsettled()}
        return self.suspended

    def finish(self, response: str, key: str | None) -> bool:
        """The request answered (and was persisted); returns whether a stored waiting request must go."""
        self._remember(key)
        self.transcript.extend(self.seal([{"role": "assistant", "content": response}]))
        self.settled, self.run, self.requests = len(self.transcript), None, self.requests + 1
        return self.unsuspend()

    def abandon(self) -> bool:
        """Drop the unfinished request (nothing of it was persisted); returns whether a stored one must go."""
        del self.transcript[self.settled:]
        self._replies = {k: i for k, i in self._replies.items() if i < self.settled}
        self.run = None
        return self.unsuspend()

    def unsuspend(self) -> bool:
        """Forget the waiting request's snapshot; returns whether there was one (the caller removes it from storage)."""
        had, self.suspended = self.suspended is not None, None
        return had

    def resume_from(self, waiting: dict[str, Any]) -> None:
        """The waiting request as stored (``waiting()`` of the server that suspended it)."""
        self.transcript.extend(waiting["live"]["transcript"])
        self._replies.update({k: self.settled + int(i) for k, i in waiting["live"]["keys"].items()})
        self.suspended = waiting

    def _remember(self, key: str | None) -> None:
        """The reply about to be appended to the transcript answers the call with ``key``."""
        if key:
            self._replies[key] = len(self.transcript)

    # -- what it holds ----------------------------------------------------------------------------------------------

    def bytes(self) -> int:
        """About what the session holds in memory: its transcript's text (a stored tool result included), measured
        again only when the transcript changed length (it only grows, or is cut back by ``abandon``)."""
        if self._size[0] != len(self.transcript):
            self._size = (len(self.transcript), sum(_text_bytes(m) for m in self.transcript) + 256)
        return self._size[1]

    @property
    def calls(self) -> list[str] | None:
        """The ids of the client's tool calls the unfinished request waits on; None when none wait."""
        if self.run is not None:
            return None if self.run.waiting is None else list(self.run.waiting.client)
        return waiting_calls(self.suspended)

    def unsettled(self) -> dict[str, Any]:
        """What the server holds of the waiting request besides the run itself, as JSON."""
        return {"transcript": self.transcript[self.settled:], "keys": self.request_keys()}

    def request_keys(self) -> dict[str, int]:
        """The idempotency keys of the unfinished request, by offset of their reply within it."""
        return {k: i - self.settled for k, i in self._replies.items() if i >= self.settled}


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


def waiting_calls(suspended: dict[str, Any] | None) -> list[str] | None:
    """The client's tool calls a stored waiting request (``Repository.pending``) waits on; None when none wait."""
    waiting = None if suspended is None else suspended["run"].get("waiting")
    return None if waiting is None else list(waiting["client"])


def load_live(repo: Repository, name: str) -> Live:
    """A session's finished requests as the server holds them, rebuilt from their stored records."""
    count, finished = _finished(repo, name)
    out: list[dict[str, Any]] = []
    replies: dict[str, int] = {}
    for _, messages, keys in finished:
        replies.update({k: len(out) + int(i) for k, i in keys.items()})
        out.extend(messages)
    live = Live(name, out, len(out), replies=replies, requests=count)
    redaction = repo.redaction
    if redaction is not None:
        live.seal = lambda messages: redaction.value(name, messages)
    suspended = repo.waiting.get(name)
    if suspended is not None:  # a request waits on the client's tool results (started here or elsewhere)
        live.resume_from(suspended)
    return live


def fork_point(repo: Repository, name: str, position: int) -> int | None:
    """How many of the session's finished requests its transcript's first ``position`` messages hold, when they
    end exactly there (None when ``position`` falls inside a request: no fork starts mid-request)."""
    length = 0
    for index, messages, _ in _finished(repo, name)[1]:
        length += len(messages)
        if length >= position:
            return index if length == position and position > 0 else None
    return None


def _finished(repo: Repository, name: str) -> tuple[int, list[tuple[int, list[dict[str, Any]], dict[str, int]]]]:
    """The session's finished requests, and each that its client was answered: its index, its messages in the
    transcript (the reply last) and its Idempotency-Keys by offset within them."""
    out = []
    requests = repo.requests(name)
    transcripts = repo.records.transcripts(name)
    for request in requests:
        if (request.unfinished or "").startswith(FAILED):  # its client got an error, not a reply: not in the chat
            continue
        kept = transcripts.get(request.index)
        # the run record only where the transcript is not beside it, or for what an unfinished request kept
        record = (repo.records.request(name, request.index) or {}) if kept is None or request.response is None else {}
        if kept is None:  # persisted before migration 0006, or not through the endpoint
            kept = Transcript(record.get("transcript") or [{"role": "user", "content": request.query}],
                              record.get("idempotency") or {})
        response = request.response
        if response is None:  # ended at the step budget: the client was told so
            response = unfinished_message(request.unfinished, (record.get("persisted") or {}).get("states", []))
        out.append((request.index, [*kept.messages, {"role": "assistant", "content": response}], kept.idempotency))
    return len(requests), out


def reply_message(message: dict[str, Any]) -> AssistantMessage:
    """A transcript's assistant message as OpenAI's reply message."""
    if message.get("tool_calls"):
        return AssistantMessage(tool_calls=[
            ToolCallOut(id=c["id"], function=FunctionCallOut(name=c["name"], arguments=c["arguments"]))
            for c in message["tool_calls"]])
    return AssistantMessage(content=message.get("content"))
