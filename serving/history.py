"""How an incoming conversation relates to a session's transcript, and the fingerprint of one that names no session.

A client may resend its whole conversation (the usual case), the conversation with its oldest messages
dropped (a trimmed history: a suffix of the transcript holding a reply of the server's, then what is new), or
only its new messages. The server keeps, per session, the transcript of what it processed; the incoming
conversation is matched against it to find what is new. A conversation that begins like the transcript but
departs from it, or that carries assistant messages the transcript does not hold in that order (an edited
history), is a contradiction (409), never grafted in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from serving.errors import conflict


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
