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

from flowstate import tags
from flowstate.active import ActiveState, Disclosed
from flowstate.limits import STANDARD, Limits
from flowstate.nodes import Node, canonical_json
from flowstate.pages import PAGE_MARK
from flowstate.protocol import BLOCKS

# What a final answer means: without it, instruct models answer with a plan ("I will search …") at the first step.
ANSWER_RULE = ("A final answer ends the request: give it when the request is done (its actions taken, its question "
               "answered from facts you saw) or cannot be done with your tools; until then, call the tools it needs.")

REACT_RULES = f"""\
You complete the user's requests step by step. Each step shows the request, your memory and your \
latest tool results; reply with one decision: call tools, answer the user, or wait for information \
you asked for. Act only on facts you can see; never guess identifiers, prices or results. {ANSWER_RULE}"""

MEMORY_INTRO = """\
## flowstate_rules
<active_state> is your working memory: check that it holds the facts and ids an action needs."""

ISU_RULES = """\
### Incremental State Update (state_delta)
- Record each task-relevant change when it happens; send only changes.
- state_set: preference (user requirements), knowledge (tool observations), attribute (entity properties), \
judgement (plans, decisions, risks) or artifact (reusable outputs).
- add: a new state, unused id (lowercase letters, digits, _). update (omitted fields keep their value) and remove: \
only states of this request. To revise a state of an earlier request (an index id), even disclosed: add one that \
supersedes it.
- A state: a short summary naming the ids it holds, a JSON value of what later steps need (ids, amounts, dates, \
decisions) not a copy of results, refs to the states and tool results (obs_ ids) it rests on, from it to an existing \
id; rel: supports, derives, follows or supersedes.
- Tool results that no state references are forgotten after this request."""

PSA_RULES = """\
### Progressive State Access (state_focus)
- When information is missing, find it by the Historical State Index (earlier queries, state summaries) and the \
related_states of Active State entries; request its id (an index id, or an obs_ id an Active State entry \
references) with a reason: what is missing and what it enables.
- A summary or related_states entry is not the content: never infer exact facts from it.
- Requested content appears at the next step: defer actions that depend on it. Do not request what is visible."""

PAGES_RULE = ("- Older requests are folded into pages (page_ ids, with the requests they cover and their most used "
              "words): request a page to see its lines, then the ids they list.")

FEEDBACK_RULE = "- <feedback> lists what the previous step had rejected or refused, and why."

TRAJECTORY_RULE = "- This request's earlier tool results stay in <trajectory>; the newest are in <latest_observation>."

FLOWSTATE_RULES = f"{MEMORY_INTRO}\n\n{ISU_RULES}\n\n{PSA_RULES}\n{FEEDBACK_RULE}"


_BLOCK_EXAMPLES = {
    "state_focus": '[{"target_id": "<visible id>", "reason": "<what is missing and what it enables>"}]',
    "state_delta": '[{"operation": "add", "state_set": "<state type>", "state_id": "<new id>", "summary": '
                   '"<short summary>", "value": {}, "refs": [{"rel": "<relation>", "state_id": "<target id>"}]}]',
    "tool_calls": '[{"name": "<tool name>", "arguments": {}}]',
    "assistant_message": '{"content": null}',
}
_COUNT = {2: "two", 3: "three", 4: "four"}

# Two worked steps of another task, shown in every strategy's protocol (its blocks only): a step that starts the work
# and one that acts on a tool result. Without them, instruct models that see blocks filled with [] first continue the
# pattern into an empty tool_calls and answer at once (docs/results/real-model.md).
_EXAMPLE_STEPS = (
    {
        "state_focus": "[]",
        "state_delta": '[{"operation": "add", "state_set": "preference", "state_id": "order_req", "summary": "order 2 '
                       'boxes of green tea, deliver to the office", "value": {"item": "green tea", "quantity": 2, '
                       '"deliver_to": "office"}, "refs": []}]',
        "tool_calls": '[{"name": "search_products", "arguments": {"query": "green tea"}}]',
        "assistant_message": '{"content": null}',
    },
    {
        "state_focus": "[]",
        "state_delta": '[{"operation": "add", "state_set": "knowledge", "state_id": "tea_offer", '
                       '"summary": "product P7 green tea, $12 a box, in stock", "value": {"product_id": "P7", '
                       '"price_usd": 12}, "refs": [{"rel": "derives", "state_id": "obs_r1_s1_1"}]}]',
        "tool_calls": '[{"name": "place_order", "arguments": {"product_id": "P7", "quantity": 2, '
                      '"address": "office"}}]',
        "assistant_message": '{"content": null}',
    },
    {
        "state_focus": "[]",
        "state_delta": '[{"operation": "add", "state_set": "artifact", "state_id": "tea_order", "summary": "order O-58 '
                       'placed: 2 boxes of P7, $24", "value": {"order_id": "O-58", "total_usd": 24}, "refs": [{"rel": '
                       '"derives", "state_id": "obs_r1_s2_1"}]}]',
        "tool_calls": "[]",
        "assistant_message": '{"content": "Ordered 2 boxes of green tea (order O-58, $24), delivered to the office."}',
    },
)


def example_steps(blocks: Sequence[str] = BLOCKS) -> str:
    """The protocol's worked example in ``blocks``: the three steps of another task, from its start to its answer."""
    states = "state_delta" in blocks
    first, then, last = ((" records the requirement and", " records what the order needs, citing the result, and",
                          " records the order and") if states else ("", "", ""))
    steps = list(_EXAMPLE_STEPS)
    step1, step2, step3 = ("\n".join(f"<{b}>\n{step[b]}\n</{b}>" for b in blocks) for step in steps)
    return (f"Example (another task; its tools are not yours). Asked to order two boxes of green tea for the office, "
            f"with nothing known yet, the first step{first} calls a tool:\n{step1}\n"
            f"Its result comes as obs_r1_s1_1; the next step{then} acts on it:\n{step2}\n"
            f"The order's result (obs_r1_s2_1) confirms it: the request is done, so the last step{last} answers, "
            f"calling nothing again:\n{step3}")


def shape(block: str) -> str:
    """A block as the protocol shows it: its tags around an example of its JSON."""
    return f"<{block}>\n{_BLOCK_EXAMPLES[block]}\n</{block}>"


def output_protocol(blocks: Sequence[str] = BLOCKS, limits: Limits = STANDARD) -> str:
    """How to write one output in the protocol of ``blocks`` under ``limits``."""
    examples = "\n".join(shape(b) for b in blocks)
    example = f"\n{example_steps(blocks)}" if limits.examples else ""
    together = {
        ("state_delta", "state_focus"): "state updates, history requests and independent actions",
        ("state_delta",): "state updates and independent actions",
        ("state_focus",): "history requests and independent actions",
        (): "independent actions",
    }[tuple(sorted(b for b in blocks if b in ("state_focus", "state_delta")))]
    return (
        f"Return exactly these {_COUNT[len(blocks)]} blocks, in order, JSON inside each, nothing outside:\n{examples}\n"
        'Use [] for an unused block and "content": null unless you answer the user; at least one block is '
        f"non-empty. Never tool calls and a final answer in one step. Make {together} together in one step.\n"
        f"{limits.describe(blocks)}{example}"
    )



def memory_rules(blocks: Sequence[str] = BLOCKS, *, trajectory: bool = False) -> str:
    """The memory part of the instructions for a strategy's protocol."""
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
    tools: Sequence[dict[str, Any]], task_policy: str = "", blocks: Sequence[str] = BLOCKS,
    memory: str = FLOWSTATE_RULES,
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
    if node.mark == PAGE_MARK:  # a page of the index: its lines, as the index shows them
        return {"page_id": node.id, "index": node.value["index"]}
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
    observation: Sequence[Node] | None = (),
    retrieved: tuple[str, str] | None = None,
) -> str:
    """The user message: memory block (tag, text), retrieved memory (a method that has both, e.g. a tracked
    state and retrieved chunks), query, Active State, trajectory, feedback, observation.

    Blocks that a strategy does not use (``None``) are left out; the order never changes.
    """
    parts = [tags.block(*memory)] if memory is not None else []
    if retrieved is not None:
        parts.append(tags.block(*retrieved))
    parts.append(tags.block(tags.USER_QUERY, query + "\n"))
    if state is not None:
        parts.append(tags.block(tags.ACTIVE_STATE, render_active(state)))
    if trajectory is not None:
        parts.append(tags.block(tags.TRAJECTORY, render_observation(trajectory) or "none\n"))
    if feedback:
        parts.append(tags.block(tags.FEEDBACK, "".join(canonical_json(f) + "\n" for f in feedback)))
    if observation is not None:  # None: a layout that sends tool results elsewhere (flowstate.memory.append)
        parts.append(tags.block(tags.LATEST_OBSERVATION, render_observation(observation) or "none\n"))
    return "".join(parts)[:-1]
