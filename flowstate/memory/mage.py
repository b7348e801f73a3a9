"""MAGE (Memory as Agent-Guided Exploration, seed 003) on the strategy seam: ``mage`` and its ablations.

The execution history is a two-layer tree. The bottom layer holds every raw action–observation pair
(the requests' tool results, kept as observation nodes: Grow). At each subgoal boundary — here, the end of
a request — Compress writes a summary node for the segment with a model call, and Maintain validates it
with another (a summary it finds wanting is kept untrusted, with its note shown as a hint). The top layer
is the summaries; each has a parent, so the tree can branch: Revise (a tool the agent is given,
``revise_memory(step)``) moves the active-path pointer back to an earlier boundary, and later summaries
grow from there, the abandoned ones staying as explored alternatives. Everything is append-only in the
repository: summaries never change, a pointer node per revision says where the active path now ends.

The agent sees (``<execution_state>``) the compressed state C — the summaries on the root-to-pointer path,
each with its step id —, the raw state R — this request's tool results so far — and hints H — the
alternatives branching off the path and Maintain's notes. Choices where the seed leaves details open (said
so in the README): a boundary is a request; one summary per request; the pointer moves only by Revise.
Ablations: ``mage-no-compress`` (no summaries: every earlier raw step stays in view), ``mage-no-maintain``
(summaries trusted unchecked), ``mage-no-revise`` (no revise tool).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.base import Message
from flowstate import tags
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.limits import STANDARD, Limits
from flowstate.memory import calls as memory_calls
from flowstate.memory.base import Finish, MemoryContext, Start, Strategy, ToolOutcome, interaction
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.records import StepRecord
from flowstate.serializer import layout, system_prompt
from flowstate.store.repository import Repository
from flowstate.tags import COMPRESS, MAINTAIN

REVISE = "revise_memory"
SUMMARY, POINTER = "mage.summary", "mage.pointer"  # the marks of the top layer's nodes

RULES = """\
## memory
<execution_state> is your execution history as a tree: summaries of completed earlier requests on the \
active path (each with its step id), the alternatives explored off that path and notes on summaries found \
wanting (hints), and this request's tool results so far. If a summarized step went wrong, call \
revise_memory with its step id to continue from the boundary before it; the summaries after it leave the \
active path."""

COMPRESS_PROMPT = f"""{COMPRESS}
Summarize this completed segment of an agent's execution (a request, its tool calls with results, and the \
response) as one subgoal summary: what was asked, what was done, and every fact later steps may need \
(identifiers, numbers, results, choices). Reply with JSON only: {{"summary": "..."}}."""

MAINTAIN_PROMPT = f"""{MAINTAIN}
Check a subgoal summary against the segment it summarizes: is every fact in it supported, and is nothing a \
later step needs left out? Reply with JSON only: {{"valid": true or false, "note": "what is wrong, if anything"}}."""

SUMMARY_GRAMMAR = ('start: %json {"type": "object", "properties": {"summary": {"type": "string", "maxLength": 2000}}, '
                   '"required": ["summary"], "additionalProperties": false}')
CHECK_GRAMMAR = ('start: %json {"type": "object", "properties": {"valid": {"type": "boolean"}, "note": {"type": "string", '
                 '"maxLength": 400}}, "required": ["valid", "note"], "additionalProperties": false}')
REVISE_TOOL = {
    "name": REVISE, "description": "Continue from the boundary before an earlier summarized step that went wrong.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["step", "reason"],
                   "properties": {"step": {"type": "integer", "description": "The step id of the summary to leave."},
                                  "reason": {"type": "string", "description": "What went wrong there."}}},
}


@dataclass(frozen=True)
class Tree:
    """The top layer as stored: summaries by step id, and where the active path ends."""

    summaries: dict[int, dict[str, Any]]  # step -> {"summary", "parent", "trusted", "note", "request"}
    pointer: int | None  # the step id of the summary the active path ends at (None: the root)

    def path(self) -> list[int]:
        out, step = [], self.pointer
        while step is not None and step in self.summaries:
            out.append(step)
            step = self.summaries[step]["parent"]
        return out[::-1]

    def alternatives(self) -> list[int]:
        """Summaries off the active path whose parent is on it (or is the root): explored, then left."""
        on = set(self.path())
        anchors = on | {None}
        return [s for s, v in self.summaries.items() if s not in on and v["parent"] in anchors]


def load_tree(nodes: Sequence[Node]) -> Tree:
    summaries: dict[int, dict[str, Any]] = {}
    pointer: int | None = None
    for n in nodes:  # creation order: the last pointer node wins
        if n.mark == SUMMARY:
            summaries[int(n.value["step"])] = dict(n.value)
            pointer = int(n.value["step"])  # a new summary extends the active path
        elif n.mark == POINTER:
            pointer = n.value.get("pointer")
    return Tree(summaries, pointer)


@dataclass(frozen=True)
class Mage(Strategy):
    name: str = "mage"
    blocks: tuple[str, ...] = ("tool_calls", "assistant_message")
    compress: bool = True
    maintain: bool = True
    revise: bool = True

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        return system_prompt(tools, policy, self.blocks, RULES, limits)

    def tools(self) -> list[dict[str, Any]]:
        return [REVISE_TOOL] if self.revise else []

    def start(self, repo: Repository, session: str) -> Start:
        requests, nodes = repo.requests(session), repo.nodes(session)
        k = len(requests) + 1
        tree = load_tree(nodes)
        lines: list[dict[str, Any]] = []
        if self.compress:
            lines += [{"step": s, "summary": tree.summaries[s]["summary"]} for s in tree.path()]
            lines += [{"hint": "explored alternative, off the active path", "step": s,
                       "summary": tree.summaries[s]["summary"]} for s in tree.alternatives()]
            lines += [{"hint": "summary found wanting", "step": s, "note": v["note"]}
                      for s, v in tree.summaries.items() if not v["trusted"]]
        else:  # no Compress: the bottom layer stays in view, every earlier raw step
            lines += [{"observation_id": n.id, **n.value} for n in nodes if n.is_observation]
        memory = (tags.EXECUTION_STATE, "".join(canonical_json(line) + "\n" for line in lines) or "none\n")
        return Start(k, HistoricalIndex(), ActiveState(request=k), memory)

    def prompt(
        self, system: str, query: str, start: Start, state: ActiveState,
        feedback: Sequence[dict[str, Any]], observation: Sequence[Node],
    ) -> list[Message]:
        raw = state.observations[: len(state.observations) - len(observation)]  # R: this request's steps so far
        user = layout(query, memory=start.memory, state=None, trajectory=raw, feedback=feedback, observation=observation)
        return [Message("system", system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return list(state.observations)  # Grow: the bottom layer keeps every raw step

    def call_tool(self, ctx: MemoryContext, name: str, arguments: dict[str, Any]) -> ToolOutcome | None:
        if name != REVISE or not self.revise:
            return None
        tree = load_tree(ctx.session.nodes())
        step = arguments.get("step")
        if not isinstance(step, int) or step not in tree.summaries:
            return ToolOutcome(None, f"no summary with step id {step!r}; steps: {sorted(tree.summaries)}")
        parent = tree.summaries[step]["parent"]
        # persisted with the request (finish)
        return ToolOutcome({"active_path_ends_at": parent, "left": step}, None, {**ctx.scratch, "revised": parent})

    def finish(self, ctx: MemoryContext) -> Finish:
        nodes: list[Node] = []
        calls: list[StepRecord] = []
        k = ctx.k
        revised = ctx.scratch.get("revised", "unset")
        if revised != "unset":
            nodes.append(Node(id=f"mage_p{k}", mark=POINTER, type=StateType.JUDGEMENT, summary="active path revised",
                              request=k,
                              value={"pointer": revised}))
        if not self.compress:
            return Finish(tuple(nodes), ())
        tree = load_tree(ctx.session.nodes())
        parent = revised if revised != "unset" else tree.pointer
        segment = interaction(ctx.query, ctx.state.observations, ctx.response)
        out = ctx.call_model(COMPRESS_PROMPT, tags.block(tags.SEGMENT, segment)[:-1], SUMMARY_GRAMMAR)
        summary = (memory_calls.json_object(out.text) or {}).get("summary")
        calls.append(memory_calls.record(out, "summary", None if isinstance(summary, str) else "no summary"))
        if not isinstance(summary, str):
            return Finish(tuple(nodes), tuple(calls))
        trusted, note = True, ""
        if self.maintain:
            check = ctx.call_model(MAINTAIN_PROMPT, tags.block(tags.SEGMENT, segment)
                                   + tags.block(tags.SUMMARY, summary + "\n")[:-1], CHECK_GRAMMAR)
            verdict = memory_calls.json_object(check.text)
            calls.append(memory_calls.record(check, "check"))
            if verdict is not None:
                trusted, note = bool(verdict.get("valid", True)), str(verdict.get("note", ""))[:400]
        step = max([*tree.summaries, 0]) + 1
        nodes.append(Node(id=f"mage_s{step}", mark=SUMMARY, type=StateType.ARTIFACT, request=k,
                          summary=summary[: ctx.limits.text],
                          value={"step": step, "summary": summary, "parent": parent, "trusted": trusted, "note": note,
                                 "covers": [o.id for o in ctx.state.observations]}))
        return Finish(tuple(nodes), tuple(calls))


MAGE: Strategy = Mage()
MAGE_NO_COMPRESS: Strategy = Mage(name="mage-no-compress", compress=False)
MAGE_NO_MAINTAIN: Strategy = Mage(name="mage-no-maintain", maintain=False)
MAGE_NO_REVISE: Strategy = Mage(name="mage-no-revise", revise=False)
