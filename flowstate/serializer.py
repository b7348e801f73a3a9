"""Serialize(q_k, O_k,t, G_k, S_k,t): the prompt, laid out for prefix caching.

Order, byte-identical across calls wherever the content is unchanged:
1. system message — rules, task policy, tools, output protocol (fixed per deployment);
2. the Historical State Index G_k (fixed per request, append-only across requests);
3. the user query q_k (fixed per request);
4. the Active State S_k,t in the order entries entered it (new entries append);
5. feedback on the previous step and the latest observation (the tail).
Deterministic JSON throughout; no clocks, no random ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.base import Message
from flowstate.active import ActiveState, Disclosed
from flowstate.history import HistoricalIndex
from flowstate.limits import STANDARD, Limits
from flowstate.nodes import Node, canonical_json
from flowstate.protocol import BLOCKS

REACT_RULES = """\
You are an agent that completes the user's requests step by step. At every step you receive the \
current request, your working memory and the result of your last tool calls, and you reply with \
one decision: call one or more tools, answer the user, or wait for information you asked for. \
Base every action on facts you can see; never guess identifiers, prices or results."""

MEMORY_INTRO = """\
## flowstate_rules
The Active State in <active_state> is your working memory. Before each action, check that it \
holds the facts and identifiers the action needs."""

ISU_RULES = """\
### Incremental State Update (state_delta)
- Record every task-relevant change as it happens: requirements, facts, plans, decisions, \
results. Send only the changes, never the whole state again.
- Give each state a type (state_set): preference (what the user wants, requires or forbids), \
knowledge (facts observed in tool results), attribute (properties of an entity, distilled from \
tool results), judgement (goals, plans, decisions, risks) or artifact (reusable outputs you made).
- operation "add" creates a state with a new, unused id (lowercase letters, digits and \
underscores, e.g. dec_book_hotel_a); "update" revises a state created in this request (fields \
you leave out keep their value); "remove" deletes a state created in this request.
- States from earlier requests (their ids are in the Historical State Index) can never be \
updated or removed, even after they were disclosed. To revise one, add a new state with a \
"supersedes" ref to it.
- Give each state a short summary and a structured JSON value, and link it through refs to the \
states and tool results (ids starting with obs_) it rests on. A ref is an edge from the state \
you add or update to the ref's state_id; rel is one of supports, derives, follows, supersedes. \
Every ref must name an existing id.
- Tool results you do not reference from a state are forgotten after this request."""

PSA_RULES = """\
### Progressive State Access (state_focus)
- When information is missing, look at the earlier queries and state summaries in the \
Historical State Index, and at related_states of Active State entries, and ask for what you \
need with state_focus: its target_id, and a reason saying what is missing and what it enables.
- You may ask for ids in the Historical State Index, and for tool results (obs_ ids) that an \
Active State entry references. A summary is not the content: never infer exact facts from it.
- related_states shows a related id, not its content; ask for that id when you need it.
- Requested content appears in the Active State at the next step, not this one: defer any \
action that depends on it (leave tool_calls empty and content null). Do not ask for what is \
already visible."""

FEEDBACK_RULE = "- <feedback> lists what was rejected or refused at the previous step, and why."

TRANSCRIPT_RULES = """\
## memory
Earlier requests of this session, with every tool call, tool result and response, are in \
<interaction_history>. This request's earlier tool results are in <trajectory>, the newest in \
<latest_observation>."""

TRAJECTORY_RULE = "- This request's earlier tool results stay visible in <trajectory>; the newest are in <latest_observation>."

FLOWSTATE_RULES = f"{MEMORY_INTRO}\n\n{ISU_RULES}\n\n{PSA_RULES}\n{FEEDBACK_RULE}"


_BLOCK_EXAMPLES = {
    "state_focus": '[{"target_id": "<visible id>", "reason": "<what is missing and what it enables>"}]',
    "state_delta": '[{"operation": "add", "state_set": "<state type>", "state_id": "<new id>", "summary": "<short summary>", '
                   '"value": {}, "refs": [{"rel": "<relation>", "state_id": "<target id>"}]}]',
    "tool_calls": '[{"name": "<tool name>", "arguments": {}}]',
    "assistant_message": '{"content": null}',
}
_COUNT = {2: "two", 3: "three", 4: "four"}


def output_protocol(blocks: Sequence[str] = BLOCKS, limits: Limits = STANDARD) -> str:
    """How to write one output in the protocol of ``blocks`` under ``limits``."""
    examples = "\n".join(f"<{b}>\n{_BLOCK_EXAMPLES[b]}\n</{b}>" for b in blocks)
    together = {
        ("state_delta", "state_focus"): "state updates, history requests and independent actions",
        ("state_delta",): "state updates and independent actions",
        ("state_focus",): "history requests and independent actions",
        (): "independent actions",
    }[tuple(sorted(b for b in blocks if b in ("state_focus", "state_delta")))]
    return (
        f"Return exactly these {_COUNT[len(blocks)]} blocks, in this order, with JSON inside each and nothing "
        f"outside them:\n{examples}\n"
        'Use [] for an unused block and "content": null unless you give the user your final answer. '
        f"Tool calls and a final answer never come in the same step. Make {together} together in one step "
        "rather than spreading them over several. At least one block must be non-empty.\n"
        f"{limits.describe()}"
    )



def memory_rules(blocks: Sequence[str] = BLOCKS, *, transcript: bool = False, trajectory: bool = False) -> str:
    """The memory part of the instructions for a strategy's protocol."""
    if transcript:
        return TRANSCRIPT_RULES
    if set(blocks) >= {"state_focus", "state_delta"} and not trajectory:
        return FLOWSTATE_RULES
    parts = [MEMORY_INTRO]
    if "state_delta" in blocks:
        parts.append(ISU_RULES)
    if "state_focus" in blocks:
        parts.append(PSA_RULES)
    rules = "\n\n".join(parts)
    if trajectory:
        rules += "\n" + TRAJECTORY_RULE
    return rules + "\n" + FEEDBACK_RULE


def system_prompt(
    tools: Sequence[dict[str, Any]], task_policy: str = "", blocks: Sequence[str] = BLOCKS, memory: str = FLOWSTATE_RULES,
    limits: Limits = STANDARD,
) -> str:
    """The static system message: identical for every call of one agent configuration."""
    tool_lines = "\n".join(canonical_json(t) for t in tools) or "(no tools)"
    return (
        f"<instructions>\n{REACT_RULES}\n\n{memory}\n</instructions>\n"
        f"<policy>\n{task_policy.strip() or '(none)'}\n</policy>\n"
        f"<tools>\n{tool_lines}\n</tools>\n"
        f"<output_protocol>\n{output_protocol(blocks, limits)}\n</output_protocol>"
    )


def _relations(refs: Sequence[Any]) -> list[dict[str, str]]:
    return [{"rel": r.rel.value, "state_id": r.state_id} for r in refs]


def render_entry(entry: Node | Disclosed, request: int) -> dict[str, Any]:
    """One Active State entry: content plus relations as (rel, id) pairs only."""
    node = entry.node if isinstance(entry, Disclosed) else entry
    out: dict[str, Any] = {
        "state_id": node.id,
        "type": node.type.value,
        "summary": node.summary,
        "value": node.value,
        "related_states": _relations(node.refs),
    }
    if node.request != request:
        out["source_query"] = node.request
    if isinstance(entry, Disclosed) and entry.incoming:
        out["referenced_by"] = [{"rel": rel, "state_id": src} for src, rel in entry.incoming]
    return out


def render_active(state: ActiveState) -> str:
    return "".join(canonical_json(render_entry(e, state.request)) + "\n" for e in state.entries())


def render_observation(observations: Sequence[Node]) -> str:
    return "".join(canonical_json({"observation_id": o.id, **o.value}) + "\n" for o in observations)


def layout(
    query: str,
    *,
    memory: tuple[str, str] | None,
    state: ActiveState | None,
    trajectory: Sequence[Node] | None = None,
    feedback: Sequence[dict[str, Any]] = (),
    observation: Sequence[Node] = (),
) -> str:
    """The user message: memory block (tag, text), query, Active State, trajectory, feedback, observation.

    Blocks that a strategy does not use (``None``) are left out; the order never changes.
    """
    parts = [f"<{memory[0]}>\n{memory[1]}</{memory[0]}>\n"] if memory is not None else []
    parts.append(f"<user_query>\n{query}\n</user_query>\n")
    if state is not None:
        parts.append(f"<active_state>\n{render_active(state)}</active_state>\n")
    if trajectory is not None:
        parts.append(f"<trajectory>\n{render_observation(trajectory) or 'none' + chr(10)}</trajectory>\n")
    if feedback:
        parts.append("<feedback>\n" + "".join(canonical_json(f) + "\n" for f in feedback) + "</feedback>\n")
    parts.append(f"<latest_observation>\n{render_observation(observation) or 'none' + chr(10)}</latest_observation>")
    return "".join(parts)


def user_prompt(
    index: HistoricalIndex,
    query: str,
    state: ActiveState,
    feedback: Sequence[dict[str, Any]] = (),
    observation: Sequence[Node] = (),
) -> str:
    """FlowState's user message: G_k, q_k, S_k,t, feedback, O_k,t."""
    return layout(query, memory=("historical_state_index", index.render()), state=state, feedback=feedback,
                  observation=observation)


def serialize(
    system: str,
    index: HistoricalIndex,
    query: str,
    state: ActiveState,
    feedback: Sequence[dict[str, Any]] = (),
    observation: Sequence[Node] = (),
) -> list[Message]:
    """The chat prompt C_k,t for one model call."""
    return [
        Message("system", system),
        Message("user", user_prompt(index, query, state, feedback, observation)),
    ]

