"""MAGE (Memory as Agent-Guided Exploration, seed 003) on the strategy seam: ``mage`` and its ablations.

The execution history is a two-layer tree. The bottom layer holds every raw action–observation pair
(the requests' tool results, kept as observation nodes: Grow). At each subgoal boundary — here, the end of
a request — a boundary node joins the top layer: Compress writes its summary with a model call, and
Maintain validates it with another before it becomes trusted. A summary Maintain rejects (or whose check
does not parse: Maintain fails closed) stays off the active path, quarantined; its note becomes a hint.
Each boundary has a parent, so the tree can branch: Revise (a tool the agent is given,
``revise_memory(step, reason)``) moves the active-path pointer back to the boundary before ``step`` at once
— the rest of the request already sees the restored state and the diagnosis as a hint — and later
boundaries grow from there, the abandoned ones staying as explored alternatives. Everything is append-only
in the repository: boundaries never change; a pointer node per revision says where the active path now
ends, with the diagnosis.

The agent sees (``<execution_state>``) the compressed state C — per boundary on the root-to-pointer path its
summary and step id —, the raw state R — this request's tool results so far — and hints H — the
alternatives branching off the path, Maintain's notes on quarantined boundaries, Revise's diagnoses.
Choices where the seed leaves details open (said so in the README): a boundary is a request; one summary
per request; the pointer moves by Revise, and by a trusted boundary extending it.

Ablations, each switching off exactly what its name says:
- ``mage-no-compress``: no Compress call; a boundary on the active path shows its raw steps instead of a
  summary, and Maintain checks the raw trajectory of the path (the seed: "Maintain must verify an
  increasingly long trajectory"); Revise as in the full method.
- ``mage-no-maintain``: no Maintain call; every summary is trusted.
- ``mage-no-revise``: no revise tool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from engine.base import Generation, Message
from engine.purpose import Purpose
from flowstate import tags
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.memory import calls as memory_calls
from flowstate.memory.base import Finish, MemoryContext, Start, StepInput, Strategy, ToolOutcome, interaction
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.records import StepRecord
from flowstate.serializer import layout
from flowstate.store.repository import SessionView
from flowstate.tags import COMPRESS, MAINTAIN

REVISE = "revise_memory"
UNSET = "unset"  # the scratch's "revised" before any revision (None is the root)
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

MAINTAIN_RAW_PROMPT = f"""{MAINTAIN}
Check an agent's execution trajectory (its earlier segments on the active path, then the newest segment): \
did the newest segment go wrong — a wrong action, a fact contradicted by a tool result, an error left \
unhandled? Reply with JSON only: {{"valid": true or false, "note": "what is wrong, if anything"}}."""


class Summary(BaseModel):
    """Compress's reply."""

    model_config = ConfigDict(extra="forbid")
    summary: str = Field(max_length=2000)


class Check(BaseModel):
    """Maintain's reply: is the summary (or the trajectory) sound, and what is wrong if not."""

    model_config = ConfigDict(extra="forbid")
    valid: bool
    note: str = Field(default="", max_length=400)


SUMMARY_GRAMMAR = memory_calls.grammar(Summary)
CHECK_GRAMMAR = memory_calls.grammar(Check)
COMPRESS_CALL = Purpose("mage.compress", Summary, lambda user, ref: json.dumps(
    {"summary": ref.remember(tags.read(user, tags.SEGMENT) or "") or "nothing to keep"}))
"""Compress, as a reference policy answers it: the segment's one memory, as its summary."""
MAINTAIN_CALL = Purpose("mage.maintain", Check, lambda user, ref: json.dumps({"valid": True, "note": ""}))
"""Maintain, as a reference policy answers it: its summaries hold."""
REVISE_TOOL = {
    "name": REVISE, "description": "Continue from the boundary before an earlier summarized step that went wrong.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["step", "reason"],
                   "properties": {"step": {"type": "integer", "description": "The step id of the summary to leave."},
                                  "reason": {"type": "string", "description": "What went wrong there."}}},
}


@dataclass(frozen=True)
class Tree:
    """The top layer as stored: boundaries by step id, where the active path ends, Revise's diagnoses."""

    summaries: dict[int, dict[str, Any]]  # step -> {"summary", "parent", "trusted", "note", "covers"}
    pointer: int | None  # the step id of the boundary the active path ends at (None: the root)
    diagnoses: tuple[dict[str, Any], ...] = ()  # {"left": step, "diagnosis": why}, one per revision

    def path(self) -> list[int]:
        out, step = [], self.pointer
        while step is not None and step in self.summaries:
            out.append(step)
            step = self.summaries[step]["parent"]
        return out[::-1]

    def alternatives(self) -> list[int]:
        """Trusted boundaries off the active path whose parent is on it (or is the root): explored, then left."""
        on = set(self.path())
        anchors = on | {None}
        return [s for s, v in self.summaries.items() if s not in on and v["parent"] in anchors and v["trusted"]]

    def quarantined(self) -> list[int]:
        """Boundaries Maintain found wanting: never on the active path."""
        return [s for s, v in self.summaries.items() if not v["trusted"]]

    def revised(self, pointer: int | None, left: int, diagnosis: str) -> Tree:
        """The tree after Revise: the active path ends at ``pointer``; the diagnosis joins the hints."""
        return Tree(self.summaries, pointer, (*self.diagnoses, {"left": left, "diagnosis": diagnosis}))


def load_tree(nodes: Sequence[Node]) -> Tree:
    summaries: dict[int, dict[str, Any]] = {}
    pointer: int | None = None
    diagnoses: list[dict[str, Any]] = []
    for n in nodes:  # creation order: the last pointer node wins
        if n.mark == SUMMARY:
            summaries[int(n.value["step"])] = dict(n.value)
            if n.value["trusted"]:  # a trusted boundary extends the active path; a quarantined one does not
                pointer = int(n.value["step"])
        elif n.mark == POINTER:
            pointer = n.value.get("pointer")
            if "left" in n.value:
                diagnoses.append({"left": n.value["left"], "diagnosis": n.value.get("diagnosis", "")})
    return Tree(summaries, pointer, tuple(diagnoses))


@dataclass(frozen=True)
class Mage(Strategy):
    name: str = "mage"
    blocks: tuple[str, ...] = ("tool_calls", "assistant_message")
    compress: bool = True
    maintain: bool = True
    revise: bool = True
    rules: ClassVar[str] = RULES

    def tools(self) -> list[dict[str, Any]]:
        return [REVISE_TOOL] if self.revise else []

    def start(self, session: SessionView) -> Start:
        requests, nodes = session.requests(), session.nodes()
        k = len(requests) + 1
        raw = {n.id: n for n in nodes if n.is_observation}
        tree = load_tree(nodes)
        return Start(k, HistoricalIndex(), ActiveState(request=k), self.view(tree, raw),
                     data={"tree": tree, "raw": raw})

    def view(self, tree: Tree, raw: Mapping[str, Node]) -> tuple[str, str]:
        """The execution state's memory block: C along the active path, and the hints H."""
        lines: list[dict[str, Any]] = []
        for s in tree.path():
            if self.compress:
                lines.append({"step": s, "summary": tree.summaries[s]["summary"]})
            else:  # no Compress: the boundary's raw steps stay in view
                lines.append({"step": s})
                lines += [{"observation_id": o, **raw[o].value} for o in tree.summaries[s]["covers"] if o in raw]
        lines += [{"hint": "explored alternative, off the active path", "step": s,
                   **({"summary": tree.summaries[s]["summary"]} if self.compress else {})} for s in tree.alternatives()]
        lines += [{"hint": "segment found wanting, kept off the active path", "step": s,
                   "note": tree.summaries[s]["note"]}
                  for s in tree.quarantined()]
        lines += [{"hint": "revised", "left": d["left"], "diagnosis": d["diagnosis"]} for d in tree.diagnoses]
        return tags.EXECUTION_STATE, "".join(canonical_json(line) + "\n" for line in lines) or "none\n"

    def prompt(self, step: StepInput) -> list[Message]:
        scratch = step.scratch  # R, this request's steps so far, is the trajectory
        memory = step.start.memory
        if scratch.get("revised", UNSET) != UNSET:  # Revise acts at once, within the request
            tree = step.start.data["tree"].revised(scratch["revised"], scratch["left"], scratch["diagnosis"])
            memory = self.view(tree, step.start.data["raw"])
        user = layout(step.query, memory=memory, state=None, trajectory=step.trajectory, feedback=step.feedback,
                      observation=step.observation)
        return [Message("system", step.system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return list(state.observations)  # Grow: the bottom layer keeps every raw step

    def call_tool(self, ctx: MemoryContext, name: str, arguments: dict[str, Any]) -> ToolOutcome | None:
        if name != REVISE or not self.revise:
            return None
        tree = load_tree(ctx.session.nodes())
        step = arguments.get("step")
        if not isinstance(step, int) or step not in tree.summaries:
            return ToolOutcome(None, f"no boundary with step id {step!r}; steps: {sorted(tree.summaries)}")
        parent = tree.summaries[step]["parent"]
        diagnosis = str(arguments.get("reason", ""))[:400]
        # persisted with the request (finish); the prompts of this request show it at once (prompt)
        return ToolOutcome({"active_path_ends_at": parent, "left": step}, None,
                           {**ctx.scratch, "revised": parent, "left": step, "diagnosis": diagnosis})

    def finish(self, ctx: MemoryContext) -> Finish:
        nodes: list[Node] = []
        calls: list[StepRecord] = []
        k = ctx.k
        revised = ctx.scratch.get("revised", UNSET)
        if revised != UNSET:
            nodes.append(Node(id=f"mage_p{k}", mark=POINTER, type=StateType.JUDGEMENT, summary="active path revised",
                              request=k, value={"pointer": revised, "left": ctx.scratch["left"],
                                                "diagnosis": ctx.scratch["diagnosis"]}))
        session = ctx.session.nodes()
        tree = load_tree(session)
        parent = revised if revised != UNSET else tree.pointer
        segment = interaction(ctx.query, ctx.state.observations, ctx.response)
        summary: str | None = None
        if self.compress:
            out = ctx.call_model(COMPRESS_CALL, COMPRESS_PROMPT, tags.block(tags.SEGMENT, segment)[:-1],
                                 SUMMARY_GRAMMAR)
            compressed = memory_calls.reply(out.text, Summary)
            summary = compressed.summary if compressed is not None else None
            calls.append(memory_calls.record(out, "summary", None if summary is not None else "no summary"))
            if summary is None:
                return Finish(tuple(nodes), tuple(calls))
        trusted, note = True, ""
        if self.maintain:
            check = self._check(ctx, segment, summary, tree.revised(parent, 0, "") if revised != UNSET else tree,
                                {n.id: n for n in session if n.is_observation})
            verdict = memory_calls.reply(check.text, Check)
            calls.append(memory_calls.record(check, "check", None if verdict is not None else "no verdict"))
            if verdict is not None:
                trusted, note = verdict.valid, verdict.note
            else:  # Maintain fails closed: a summary it could not judge is not trusted
                trusted, note = False, "Maintain's check did not parse; not trusted"
        step = max([*tree.summaries, 0]) + 1
        nodes.append(Node(id=f"mage_s{step}", mark=SUMMARY, type=StateType.ARTIFACT, request=k,
                          summary=(summary or f"segment of request {k}")[: ctx.limits.text],
                          value={"step": step, "summary": summary, "parent": parent, "trusted": trusted, "note": note,
                                 "covers": [o.id for o in ctx.state.observations]}))
        return Finish(tuple(nodes), tuple(calls))

    def _check(self, ctx: MemoryContext, segment: str, summary: str | None, tree: Tree,
               raw: Mapping[str, Node]) -> Generation:
        """Maintain's call: the summary against its segment, or (no Compress) the raw trajectory of the active
        path with the newest segment."""
        if summary is not None:
            return ctx.call_model(MAINTAIN_CALL, MAINTAIN_PROMPT, tags.block(tags.SEGMENT, segment)
                                  + tags.block(tags.SUMMARY, summary + "\n")[:-1], CHECK_GRAMMAR)
        earlier = "".join(canonical_json({"observation_id": o, **raw[o].value}) + "\n"
                          for s in tree.path() for o in tree.summaries[s]["covers"] if o in raw)
        return ctx.call_model(MAINTAIN_CALL, MAINTAIN_RAW_PROMPT, tags.block(tags.EXECUTION_STATE, earlier or "none\n")
                              + tags.block(tags.SEGMENT, segment)[:-1], CHECK_GRAMMAR)


MAGE: Strategy = Mage()
MAGE_NO_COMPRESS: Strategy = Mage(name="mage-no-compress", compress=False)
MAGE_NO_MAINTAIN: Strategy = Mage(name="mage-no-maintain", maintain=False)
MAGE_NO_REVISE: Strategy = Mage(name="mage-no-revise", revise=False)
