"""Full context in chat order (``full-context``): the whole interaction as it happened, append-only.

The prompt is the conversation itself: per request (earlier ones, then this one) its query as a user
message, each step's tool calls as the assistant's message, their results as a user message
(``<tool_results>``), and the request's response as the assistant's message. A call's prompt extends the
previous call's — within a request and across requests — so a prefix cache serves everything but what is
new since the last call, as with a chat agent that keeps its history. (The previous layout moved each tool
result from the latest observation to the trajectory to the history, re-sending it three times.) Feedback on
a broken output is the one transient part: it is appended to the last user message of the next call only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.base import Message
from flowstate import tags
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.memory.base import Start, StepInput, Strategy
from flowstate.nodes import Node, canonical_json
from flowstate.protocol import ModelOutput, render_output
from flowstate.serializer import render_observation
from flowstate.store.repository import RequestRow, SessionView

TWO_BLOCKS = ("tool_calls", "assistant_message")

RULES = """\
## memory
The conversation so far is this chat, as it happened: each request of the session (earlier ones, then this \
one), your tool calls, their results in <tool_results>, and your responses. Nothing of it is summarized or \
left out."""


def step_of(observation: Node) -> int:
    """The step whose call made an observation (its id is obs_r{k}_s{t}_{i})."""
    return int(observation.id.rsplit("_s", 1)[1].split("_")[0])


def steps(observations: Sequence[Node]) -> list[list[Node]]:
    """Observations grouped by the step that made them, in order."""
    groups: dict[int, list[Node]] = {}
    for o in observations:
        groups.setdefault(step_of(o), []).append(o)
    return [groups[t] for t in sorted(groups)]


def calls_message(group: Sequence[Node]) -> Message:
    """The assistant's turn that made these calls, as the protocol renders it."""
    output = ModelOutput.model_validate({"tool_calls": [{"name": o.value["tool"], "arguments": o.value["arguments"]}
                                                        for o in group], "assistant_message": {"content": None}})
    return Message("assistant", render_output(output, TWO_BLOCKS))


def results_text(group: Sequence[Node]) -> str:
    return tags.block(tags.TOOL_RESULTS, render_observation(group))[:-1]


def answer_message(request: RequestRow) -> Message:
    content = request.response if request.response is not None else f"(unfinished: {request.unfinished})"
    output = ModelOutput.model_validate({"tool_calls": [], "assistant_message": {"content": content}})
    return Message("assistant", render_output(output, TWO_BLOCKS))


def request_messages(query: str, observations: Sequence[Node]) -> list[Message]:
    """One request's user query, then per step its calls and their results."""
    out = [Message("user", tags.block(tags.USER_QUERY, query + "\n")[:-1])]
    for group in steps(observations):
        out += [calls_message(group), Message("user", results_text(group))]
    return out


def with_feedback(messages: list[Message], feedback: Sequence[Mapping[str, Any]]) -> list[Message]:
    """``messages`` with the feedback on the previous step at the end of the last one: transient, shown to the next
    call only (a step whose calls were all refused leaves nothing else in the chat)."""
    if feedback:
        last = messages[-1]
        messages[-1] = Message(last.role, last.content + "\n" + tags.block(
            tags.FEEDBACK, "".join(canonical_json(f) + "\n" for f in feedback))[:-1])
    return messages


@dataclass(frozen=True)
class ChatHistory(Strategy):
    name: str = "full-context"
    blocks: tuple[str, ...] = TWO_BLOCKS
    rules: ClassVar[str] = RULES

    def start(self, session: SessionView) -> Start:
        requests, nodes = session.requests(), session.nodes()
        k = len(requests) + 1
        history: list[Message] = []
        for r in requests:
            history += request_messages(r.query, [n for n in nodes if n.is_observation and n.request == r.index])
            history.append(answer_message(r))
        return Start(k, HistoricalIndex(), ActiveState(request=k), None, data={"history": tuple(history)})

    def prompt(self, step: StepInput) -> list[Message]:
        return with_feedback([Message("system", step.system), *step.start.data["history"],
                              *request_messages(step.query, step.state.observations)], step.feedback)

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return list(state.observations)  # the tool results, for the next requests' history


FULL_CONTEXT: Strategy = ChatHistory()
