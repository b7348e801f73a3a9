"""A session as the server holds it between HTTP calls (its transcript, its waiting request, its replies by
Idempotency-Key, what it holds in memory), rebuilt from the repository when it is not in memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowstate.loop import RequestRun
from flowstate.records import FAILED, unfinished_message
from flowstate.store.repository import Repository, Transcript
from serving.messages import AssistantMessage, FunctionCallOut, ToolCallOut


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
    count, finished = _finished(repo, name)
    out: list[dict[str, Any]] = []
    replies: dict[str, int] = {}
    for _, messages, keys in finished:
        replies.update({k: len(out) + int(i) for k, i in keys.items()})
        out.extend(messages)
    live = Live(name, out, len(out), replies=replies, requests=count)
    suspended = repo.pending(name)
    if suspended is not None:  # a request waits on the client's tool results (started here or elsewhere)
        waiting = suspended["live"]
        live.transcript.extend(waiting["transcript"])
        live.replies.update({k: live.finished + int(i) for k, i in waiting["keys"].items()})
        live.suspended = suspended
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
