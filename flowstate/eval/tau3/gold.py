"""The gold reference policy of a τ³ task, in each strategy's protocol.

It replays the task's gold actions over a two-turn conversation with the scripted user: turn 1
(the user's request) makes the read-only gold calls, then asks to proceed; turn 2 (the user's yes)
makes the other gold calls in their order and answers with what the task says must be
communicated. A task without writes answers in turn 1.

Under flowstate it records, per tool result, the facts later calls use (the values of the gold
arguments still to come, found in the result) as a knowledge state citing the result, plus the
user's request as a preference; in turn 2 it asks for those states before acting. full-context
acts at once (its transcript holds every result); no-psa sees every state inline; no-isu asks for
the rule states, then the tool results they derive from. Its tokens per strategy are the lower
bound a model following each protocol can reach on real τ³ observations.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import ValidationError

from engine.base import Message
from engine.purpose import STEP, Purpose
from flowstate import tags
from flowstate.eval.policies import Policy, memory_reply, memory_text, read_prompt
from flowstate.eval.tau3.tasks import Tau3Task
from flowstate.eval.tau3.users import CONFIRM_QUESTION
from flowstate.limits import STANDARD, Limits, clip
from flowstate.memory.base import Strategy
from flowstate.memory.reference import read_interaction
from flowstate.nodes import OBSERVATION_PREFIX
from flowstate.protocol import ModelOutput, bounded, render_output


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, scalar) for every scalar in a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    elif value is not None:
        yield path or "value", value


class GoldPolicy:
    def __init__(self, task: Tau3Task, strategy: Strategy, limits: Limits = STANDARD) -> None:
        self.task, self.strategy, self.limits = task, strategy, limits
        reads = [a for a in task.actions if task.read_only(a["name"])]
        rest = [a for a in task.actions if not task.read_only(a["name"])]
        self.turns = [reads, rest] if rest else [reads]
        self.queries: list[str] = []
        self.left: list[dict[str, Any]] = []
        self.wanted = {json.dumps(v) for a in rest for _, v in leaves(a["arguments"])}
        self._op = bounded(limits).items["state_delta"]

    def _fits(self, op: dict[str, Any]) -> bool:
        try:
            self._op.validate_python(op)
            return True
        except ValidationError:
            return False

    def record(self, observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """ISU: each tool result becomes a knowledge state holding the facts later calls use."""
        ops = []
        for o in observations:
            outcome = o.get("result", o.get("error"))
            facts = {p: v for p, v in leaves(outcome) if json.dumps(v) in self.wanted}
            facts = dict(list(facts.items())[: self.limits.value_items])
            args = json.dumps(o.get("arguments", {}), ensure_ascii=False, sort_keys=True)
            op = {"operation": "add", "state_set": "knowledge",
                  "state_id": "fact_" + o["observation_id"][len(OBSERVATION_PREFIX):],
                  "summary": clip(f"{o['tool']}({args})" + (" failed" if "error" in o else ""), self.limits.text),
                  "value": facts, "refs": [{"rel": "supports", "state_id": o["observation_id"]}]}
            ops.append(op if self._fits(op) else {**op, "value": {}})
        return ops[: self.limits.ops]

    def _focus(self, parts: dict[str, list[dict[str, Any]]]) -> list[str]:
        """What to ask memory for before acting in a later turn: unseen earlier states, then the tool
        results of visible earlier states that hold no facts of their own (no-isu's rule states)."""
        listed, shown, _ = Policy.visible(parts)
        unseen = [s["state_id"] for s in listed if s["state_id"] not in shown]
        empty = [r["state_id"] for e in parts.get(tags.ACTIVE_STATE, []) if "response" in (e.get("value") or {})
                 for r in e.get("related_states", []) if r["state_id"].startswith(OBSERVATION_PREFIX)
                 and r["state_id"] not in shown]
        return list(dict.fromkeys(unseen + empty))[: self.limits.focus]

    def _answer(self, turn: int) -> str:
        if turn < len(self.turns):
            planned = ", ".join(dict.fromkeys(a["name"] for a in self.turns[turn]))
            return f"I have what I need for: {planned}. {CONFIRM_QUESTION}"
        info = self.task.spec["evaluation_criteria"].get("communicate_info") or []
        return " ".join(["Done.", *info])

    def extract(self, interaction: str) -> str:
        """mem0-style's extraction call: the facts later calls use, found in this interaction's tool results."""
        query, lines = read_interaction(interaction)
        facts = {p: v for item in lines if "observation_id" in item
                 for p, v in leaves(item.get("result", item.get("error"))) if json.dumps(v) in self.wanted}
        return json.dumps({"facts": [memory_text(query, facts)] if facts else []})

    def remember(self, interaction: str) -> str | None:
        """The memory a mem0-style extraction or MAGE's Compress writes of an interaction: the facts later calls
        use (the gold replay needs none of it: it acts on the gold arguments)."""
        facts = json.loads(self.extract(interaction))["facts"]
        return str(facts[0]) if facts else None

    def __call__(self, messages: Sequence[Message], purpose: Purpose = STEP) -> str:
        own = memory_reply(purpose, messages[-1].content, self.remember)
        if own is not None:
            return own
        query, parts = read_prompt(messages)
        first_step = query not in self.queries
        if first_step:
            self.queries.append(query)
            turn = len(self.queries)
            self.left = list(self.turns[turn - 1]) if turn <= len(self.turns) else []
        turn = self.queries.index(query) + 1
        output: dict[str, Any] = {"state_focus": [], "state_delta": [], "tool_calls": [],
                                  "assistant_message": {"content": None}}
        if "state_delta" in self.strategy.blocks:
            # where the system records each result as a state, the policy leaves them to it
            output["state_delta"] = [] if self.strategy.facts else self.record(parts.get(tags.LATEST_OBSERVATION, []))
            if first_step and turn == 1:
                output["state_delta"].insert(0, {
                    "operation": "add", "state_set": "preference", "state_id": "user_request",
                    "summary": clip(f"user request: {query}", self.limits.text),
                    "value": {"request": clip(query, self.limits.value_text)}, "refs": []})
        if turn > 1 and self.left and "state_focus" in self.strategy.blocks:
            output["state_focus"] = [{"target_id": t, "reason": "facts the requested changes use"}
                                     for t in self._focus(parts)]
        if output["state_focus"]:
            pass  # the changes use what is asked for: wait for it
        elif self.left:
            chunk, self.left = self.left[: self.limits.tool_calls], self.left[self.limits.tool_calls:]
            output["tool_calls"] = [{"name": a["name"], "arguments": a["arguments"]} for a in chunk]
        else:
            output["assistant_message"] = {"content": self._answer(turn)}
        return render_output(ModelOutput.model_validate(output), self.strategy.blocks, self.strategy.optional)
