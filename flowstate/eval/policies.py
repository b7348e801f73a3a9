"""Reference policies that speak the protocol: an oracle that uses memory, and one that never does.

``PolicyEngine`` is an engine whose outputs a policy computes from the prompt, so a suite runs
through the real loop, strategies, validation and repository exactly as a model's outputs would.
The policy reads facts (flat tool results) wherever the prompt shows them. With memory it also
records every tool result as a state (ISU, where the strategy has it) and asks for earlier states
and the tool results they reference (PSA, where it has it); without memory it ignores everything
from earlier requests and guesses where a fact from them is needed.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from typing import Any

from engine.base import Generation, Message, Usage
from engine.scripted import common_prefix, flatten, tokenize
from flowstate.eval.task import Answer, Call, Need, Task
from flowstate.nodes import OBSERVATION_PREFIX
from flowstate.limits import COMPACT
from flowstate.protocol import ModelOutput, render_output
from flowstate.strategies import Strategy

# the policies' outputs stay inside the compact profile, so they are valid under every profile
MAX_TEXT, MAX_FOCUS = COMPACT.text, COMPACT.focus

_SECTION = re.compile(r"<([a-z_]+)>\n(.*?)</\1>", re.S)


def sections(user: str) -> dict[str, list[dict[str, Any]]]:
    """The user message's blocks as lists of JSON objects (one per line)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, body in _SECTION.findall(user):
        items = []
        for line in body.splitlines():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                items.append(obj)
        out[name] = items
    return out


def _result(item: dict[str, Any]) -> dict[str, Any]:
    """The facts an item holds: an observation's result, or a state's value (its result if it is one)."""
    value = item.get("value", item)
    if isinstance(value, dict) and "tool" in value:
        value = value.get("result")
    return value if isinstance(value, dict) else {}


class Policy:
    """The decision of one step, given the task, the strategy and whether memory is used."""

    def __init__(self, task: Task, strategy: Strategy, memory: bool) -> None:
        self.task, self.strategy, self.memory = task, strategy, memory

    def facts(self, parts: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        sources: list[dict[str, Any]] = []
        if self.memory:
            sources += [i for i in parts.get("interaction_history", []) if "observation_id" in i]
        sources += [e for e in parts.get("active_state", []) if self.memory or "source_query" not in e]
        sources += parts.get("trajectory", []) + parts.get("latest_observation", [])
        facts: dict[str, Any] = {}
        for item in sources:
            facts.update(_result(item))
        return facts

    def record(self, observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """ISU: each tool result becomes a knowledge state that cites it."""
        ops = []
        for o in observations:
            result = o.get("result")
            if not isinstance(result, dict) or not result:
                continue
            summary = f"{o['tool']} result: {', '.join(result)}"
            ops.append({
                "operation": "add", "state_set": "knowledge", "state_id": "fact_" + o["observation_id"][len(OBSERVATION_PREFIX):],
                "summary": summary if len(summary) <= MAX_TEXT else summary[: MAX_TEXT - 1] + "…",
                "value": result, "refs": [{"rel": "supports", "state_id": o["observation_id"]}],
            })
        return ops[:4]

    def focus(self, keys: Sequence[str], parts: dict[str, list[dict[str, Any]]]) -> list[str]:
        """PSA: earlier states whose summaries name a missing fact; else any unseen earlier state, and
        the tool results that visible states reference."""
        visible = {e.get("state_id") for e in parts.get("active_state", [])}
        listed = [s for entry in parts.get("historical_state_index", []) for s in entry.get("states", [])]
        named = [s["state_id"] for s in listed if s["state_id"] not in visible
                 and set(keys) & set(re.split(r"[:,\s]+", s.get("summary", "")))]
        if named:
            return named[-MAX_FOCUS:]
        related = [r["state_id"] for e in parts.get("active_state", []) for r in e.get("related_states", [])
                   if r["state_id"].startswith(OBSERVATION_PREFIX) and r["state_id"] not in visible]
        unseen = [s["state_id"] for s in listed if s["state_id"] not in visible]
        return list(dict.fromkeys(related + unseen))[:MAX_FOCUS]

    def __call__(self, messages: Sequence[Message]) -> str:
        parts = sections(messages[-1].content)
        query = re.search(r"<user_query>\n(.*?)\n</user_query>", messages[-1].content, re.S)
        k = self.task.subtask(query.group(1) if query else "")
        facts = self.facts(parts)
        delta = self.record(parts.get("latest_observation", [])) if "state_delta" in self.strategy.blocks else []
        decision = self.task.solve(k, facts)
        focus: list[str] = []
        if isinstance(decision, Need):
            if self.memory and "state_focus" in self.strategy.blocks:
                focus = self.focus(decision.keys, parts)
            decision = self.task.guess(k, facts) if not focus else decision
        output: dict[str, Any] = {
            "state_focus": [{"target_id": f, "reason": "needed for this subtask"} for f in focus],
            "state_delta": delta, "tool_calls": [], "assistant_message": {"content": None},
        }
        if isinstance(decision, Call):
            output["tool_calls"] = [{"name": decision.tool, "arguments": decision.arguments}]
        elif isinstance(decision, Answer):
            output["assistant_message"] = {"content": decision.text}
        return render_output(ModelOutput.model_validate(output), self.strategy.blocks)


class PolicyEngine:
    """An engine that answers with a policy; usage counted like the scripted engine's."""

    name = "policy"
    supports_grammar = False

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._last: list[str] = []
        self._lock = threading.Lock()

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None,
                 max_tokens: int | None = None) -> Generation:
        text = self.policy(messages)
        prompt = tokenize(flatten(messages))
        with self._lock:
            cached = common_prefix(prompt, self._last)
            self._last = prompt
        return Generation(text, Usage(prompt_tokens=len(prompt), cached_tokens=cached,
                                      completion_tokens=len(tokenize(text))))

    def count_tokens(self, text: str) -> int:
        return len(tokenize(text))
