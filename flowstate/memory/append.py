"""The request-local append-only layout (``--layout append``, a state method's ``+append`` variant).

Within a request each call's prompt extends the previous one: the first user message is the index, the query
and the Active State the request starts from; then, per step so far, the model's output as it wrote it (its
state operations among them) and a user message with what that step brought — the states it disclosed, the
runtime's feedback, its tool results. Nothing already sent is re-rendered, so a prefix cache prefills every
token once. When the request ends it collapses into its index line, as in the paper's layout.

It shows more than the paper's latest-observation view (Serialize in B.3 keeps only the latest tool results
and the Active State): every tool result of the request stays in view, and the model's own outputs too.
"""

from __future__ import annotations

from engine.base import Message
from flowstate import tags
from flowstate.active import ActiveState, Disclosed
from flowstate.memory.base import StepInput
from flowstate.nodes import canonical_json
from flowstate.records import StepRecord
from flowstate.serializer import layout, render_entry, render_observation

APPEND_RULE = """\
- This request's steps stay in the chat as they happened: your outputs, each followed by what it brought — the \
states you requested in <active_state>, <feedback>, and the results of your tool calls in <tool_results>. The \
states you added or updated are your state_delta as you wrote it, less what <feedback> rejected."""


def head(step: StepInput) -> str:
    """The first user message: memory block (the index), query, the Active State the request starts from."""
    return layout(step.query, memory=step.start.memory, state=step.start.state, observation=None)


def brought(record: StepRecord, state: ActiveState) -> str:
    """What one step brought, as the user message after its output: disclosed entries, feedback, tool results."""
    disclosed = {d.node.id: d for d in state.disclosed}
    entries = [disclosed[i] for i in record.disclosed if i in disclosed]
    ids = {c.observation_id for c in record.tool_calls}
    parts = [tags.block(tags.ACTIVE_STATE, _render(entries, state.request))] if entries else []
    if feedback := record.feedback():
        parts.append(tags.block(tags.FEEDBACK, "".join(canonical_json(f) + "\n" for f in feedback)))
    results = render_observation([o for o in state.observations if o.id in ids])
    if results or not parts:
        parts.append(tags.block(tags.TOOL_RESULTS, results or "none\n"))
    return "".join(parts)[:-1]


def _render(entries: list[Disclosed], request: int) -> str:
    return "".join(canonical_json(render_entry(e, request)) + "\n" for e in entries)


def appended(step: StepInput) -> list[Message]:
    """The messages of one call: system, head, then each earlier step's output and what it brought."""
    messages = [Message("system", step.system), Message("user", head(step))]
    for record in step.steps:
        messages += [Message("assistant", record.raw), Message("user", brought(record, step.state))]
    return messages
