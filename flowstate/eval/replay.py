"""``tau-replay``: recorded τ-bench conversations replayed through every strategy (``--suite tau-replay --replay
FILE``).

The file is τ-bench's ``historical_trajectories/*.json`` format: a list of ``{task_id, traj: [messages]}`` with
OpenAI-style messages (system: the policy; user; assistant with ``content`` or ``tool_calls``; tool results).
A task is one conversation and one session; each user message is one request (a stop token ends the
conversation). Its tools are the τ³ airline tools' schemas (same names; τ-bench v1's ``think`` gets a
no-op spec) answering with the recorded results, in the recorded order — no environment is needed.

The replay policy (``ReplayPolicy``) makes the recorded calls step by step and ends each request with the
recorded answer; what differs between strategies is only the memory work and the tokens. It is the
*realistic* kind: under a strategy with ISU it records every tool result it used as a state, summarized by the
call and the ids the result holds; with PSA too the state cites the result (it keeps the ids, codes, amounts,
dates and statuses, and the result stays disclosable through its ref), without PSA it holds the result's
content. When its next action uses a value the conversation showed and the prompt does not show as content (a
call's argument, or an id or code the answer repeats), it asks in a step of its own (PSA): for the earlier
states whose summaries name the value, else the results that states in view cite, else states sharing a word
with the query; after three looks for one action — at once, for a strategy that cannot ask (no PSA) — the
request ends as a memory miss. Every strategy is held to what its prompt shows: full context shows everything,
a retrieval method what it retrieved, a state tracker the world its tracker keeps (answered here with each
result's key values, as the citing states keep them). A task succeeds when
every recorded call was reproduced exactly, in order, and every answer is the recorded one. Suite options join
``sessions`` conversations into one session and give every listed result item ``results`` copies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.base import Message
from engine.purpose import STEP, Purpose
from flowstate import tags
from flowstate.eval.policies import Policy, memory_reply, memory_text, read_prompt
from flowstate.eval.task import Score, Task
from flowstate.history import IDENT, identifiers, scalars, words
from flowstate.limits import STANDARD, Limits, fit
from flowstate.memory.base import Strategy
from flowstate.memory.reference import read_interaction
from flowstate.nodes import OBSERVATION_PREFIX
from flowstate.protocol import ModelOutput, bounded, render_output
from flowstate.tools import SchemaTool, ToolSet

STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
THINK = {"name": "think", "description": "Use the tool to think about something. It does not obtain new information "
         "or change the database; it only records the thought.",
         "parameters": {"type": "object", "properties": {"thought": {"type": "string", "description": "A thought."}},
                        "required": ["thought"]}}


@dataclass(frozen=True)
class RecordedCall:
    name: str
    arguments: dict[str, Any]
    result: Any


@dataclass(frozen=True)
class RecordedTurn:
    """One request of a recorded conversation: the user's message, the agent's steps of calls, its answer."""

    query: str
    steps: tuple[tuple[RecordedCall, ...], ...]
    answer: str


def _result(content: Any) -> Any:
    try:
        return json.loads(content) if isinstance(content, str) else content
    except json.JSONDecodeError:
        return content


def parse(conversation: Sequence[dict[str, Any]]) -> tuple[str, list[RecordedTurn]]:
    """A recorded conversation as (policy, turns)."""
    policy, turns = "", []
    query: str | None = None
    steps: list[tuple[RecordedCall, ...]] = []
    answer: list[str] = []
    results: dict[str, Any] = {}
    pending: list[tuple[str, str, dict[str, Any]]] = []

    def close() -> None:
        if query is not None:
            turns.append(RecordedTurn(query, tuple(steps), "\n".join(answer)))

    def flush() -> None:
        if pending:
            steps.append(tuple(RecordedCall(n, a, results.get(i)) for i, n, a in pending))
            pending.clear()

    for m in conversation:
        role = m.get("role")
        if role == "system":
            policy = str(m.get("content") or "")
        elif role == "user":
            flush()
            close()
            text = str(m.get("content") or "")
            if any(t in text for t in STOP_TOKENS):
                return policy, turns
            query, steps, answer = text, [], []
        elif role == "assistant":
            flush()
            for c in m.get("tool_calls") or []:
                args = c["function"].get("arguments") or "{}"
                pending.append((c.get("id", ""), c["function"]["name"],
                                json.loads(args) if isinstance(args, str) else args))
            if m.get("content") and not m.get("tool_calls"):
                answer.append(str(m["content"]))
        elif role == "tool":
            results[str(m.get("tool_call_id"))] = _result(m.get("content"))
            if pending and all(i in results for i, _, _ in pending):
                flush()
    flush()
    close()
    return policy, turns


def load(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--replay {p}: no such file (τ-bench's historical_trajectories/*.json: see "
                         "docs/evaluation.md)")
    data = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(e, dict) and isinstance(e.get("traj"), list) for e in data):
        raise ValueError(f"--replay {p}: expected a list of {{task_id, traj: [messages]}}")
    return data


class ReplayTask(Task):
    suite = "tau-replay"

    def __init__(self, task_id: str, policy: str, turns: list[RecordedTurn]) -> None:
        super().__init__(task_id, [t.query for t in turns])
        self.policy_text, self.turns = policy, turns
        self.expected = [c for t in turns for s in t.steps for c in s]
        self._seen: dict[int, str] = {}

    @property
    def policy(self) -> str:
        return self.policy_text

    def new_env(self) -> dict[str, Any]:
        return {"cursor": 0, "mismatches": [], "day": 0}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        specs = [THINK, *_airline_specs()]
        names = [*(s["name"] for s in specs), *sorted({c.name for c in self.expected} - {s["name"] for s in specs})]

        def handler(name: str) -> Any:
            def run(given: dict[str, Any], session: str) -> Any:
                i = env["cursor"]
                if i < len(self.expected) and (self.expected[i].name, self.expected[i].arguments) == (name, given):
                    env["cursor"] = i + 1
                    return self.expected[i].result
                env["mismatches"].append({"at": i, "call": name, "arguments": given})
                raise ValueError("not the recorded call at this point of the conversation")
            return run

        by = {s["name"]: s for s in specs}
        # a recorded call's arguments are taken as they were (the schema shown to the model is the τ³ tool's)
        return ToolSet([SchemaTool(n, str(by.get(n, {}).get("description", "")), fn=handler(n), check=False,
                                   schema=by.get(n, {}).get("parameters", {"type": "object"})) for n in names])

    def check(self, k: int, response: str | None, env: Any) -> Score:
        """Request k reproduced: every recorded call up to its end made, in order, none else; its answer."""
        upto = sum(len(s) for t in self.turns[:k] for s in t.steps)
        ok = not env["mismatches"] and env["cursor"] == upto and (response or "") == self.turns[k - 1].answer
        return Score(ok, float(ok))

    def distill(self, tool: str, result: Any) -> dict[str, Any]:
        return dict(scalars(result))

    def seen(self, request: int) -> str:
        """Everything the conversation showed before request ``request`` (0-based): queries and results (made
        once per request: every step of it asks)."""
        if request not in self._seen:
            self._seen[request] = json.dumps([[t.query, [c.result for s in t.steps for c in s]]
                                              for t in self.turns[:request]])
        return self._seen[request]

    def solve(self, k: int, facts: Any) -> Any:
        raise TypeError("a replayed conversation is driven by ReplayPolicy")

    def needs(self, k: int) -> tuple[str, ...]:
        return ()

    def guess(self, k: int, facts: Any) -> Any:
        raise TypeError("a replayed conversation is driven by ReplayPolicy")


def _airline_specs() -> list[dict[str, Any]]:
    """The τ³ airline tools' specs (names and parameter schemas), from our tools on an empty database."""
    from flowstate.eval.tau3.airline import AirlineTools

    return AirlineTools({"flights": {}, "users": {}, "reservations": {}}).toolset().specs()


CODE = re.compile(r"[A-Z][A-Z0-9]{1,5}")
"""A code in capitals (airports, currencies, fare classes): an identifier without a digit."""


def identifier(value: Any) -> bool:
    return isinstance(value, str) and bool(IDENT.fullmatch(value) or CODE.fullmatch(value))


LOOKS = 3
"""Disclosure steps one action may wait for at most (earlier states, then the raw results they cite): then the
request ends as a memory miss."""

MISS = "memory miss: cannot see"
"""How a replayed request that could not bring a needed value into view ends (it fails: not the recorded answer)."""

SALIENT_KEY = re.compile(r"(^|_)(id|number|date|status|amount|price|total|balance|fee|cabin|type|membership)s?$")
"""A key whose value later work uses: what a state keeps of a result where it can cite the rest."""


def salient(value: Any, key: str = "") -> Any:
    """What a model keeps of a tool result when the state cites the result for the rest: the identifiers (``IDENT``:
    ids, flight numbers, dates; ``CODE``: airports, fare classes) and the values of keys that name ids, amounts,
    dates and statuses, nested as they came; names, addresses, prose and the rest stay in the cited result (None:
    nothing kept). Judged from the result alone, as a model writing the state would: not from what later requests
    ask."""
    if isinstance(value, dict):
        kept = {k: v for k, v in ((str(k), salient(v, str(k))) for k, v in value.items()) if v is not None}
        return kept or None
    if isinstance(value, list):
        items = [v for v in (salient(v, key) for v in value) if v is not None]
        return items or None
    if identifier(value):
        return value
    return value if SALIENT_KEY.search(key.lower()) and isinstance(value, str | int | float) else None


OPTIONS = {"sessions": 1, "results": 1}
"""tau-replay's suite options: recorded conversations joined into one session, and copies of each listed result
item (search pages' size)."""


def generate(path: str | Path | None, tasks: int, sessions: int = OPTIONS["sessions"],
             results: int = OPTIONS["results"]) -> list[Task]:
    """``tasks`` sessions, each of ``sessions`` recorded conversations one after the other (ordered by task, then
    trial: a task's trials first, then the next task's; only whole sessions), with every list of objects in a
    result holding ``results`` copies of each item (the first as recorded, the others with other ids and numbers)."""
    if path is None:
        raise ValueError("--suite tau-replay needs --replay FILE (τ-bench's historical_trajectories/*.json)")
    recorded = [(e, p) for e, p in ((e, parse(e["traj"])) for e in load(path)) if p[1]]
    if sessions > 1:  # one conversation a session keeps the file's order
        recorded.sort(key=lambda x: (str(x[0].get("task_id", "")).zfill(8), int(x[0].get("trial", 0) or 0)))
    out: list[Task] = []
    for start in range(0, len(recorded) - sessions + 1, sessions):
        joined = recorded[start:start + sessions]
        turns = [enlarge(t, results) for _, (_, ts) in joined for t in ts]
        first = joined[0][0].get("task_id", len(out))
        name = f"replay-{first}-{len(out)}" if sessions == 1 else f"replay-{first}x{sessions}-{len(out)}"
        out.append(ReplayTask(name, joined[0][1][0], turns))
        if len(out) == tasks:
            break
    return out


def enlarge(turn: RecordedTurn, copies: int) -> RecordedTurn:
    """A turn whose results' lists of objects hold ``copies`` of each item (as a search page with more rows)."""
    if copies == 1:
        return turn
    steps = tuple(tuple(RecordedCall(c.name, c.arguments, _copies(c.result, copies)) for c in step)
                  for step in turn.steps)
    return RecordedTurn(turn.query, steps, turn.answer)


def _copies(value: Any, copies: int) -> Any:
    if isinstance(value, dict):
        return {k: _copies(v, copies) for k, v in value.items()}
    if isinstance(value, list):
        items = [_copies(v, copies) for v in value]
        if not any(isinstance(v, dict) for v in items):
            return items
        return [x for v in items for x in [v, *(_perturbed(v, j) for j in range(1, copies))]]
    return value


def _perturbed(value: Any, j: int) -> Any:
    """Copy ``j`` of an item: its identifiers suffixed, its numbers moved, so no copy repeats the recorded one."""
    if isinstance(value, dict):
        return {k: _perturbed(v, j) for k, v in value.items()}
    if isinstance(value, list):
        return [_perturbed(v, j) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return value + j
    return f"{value}-{j}" if identifier(value) else value


class ReplayPolicy:
    """Makes a recorded conversation's calls and answers in a strategy's protocol, with realistic memory work."""

    def __init__(self, task: ReplayTask, strategy: Strategy, limits: Limits = STANDARD) -> None:
        self.task, self.strategy, self.limits = task, strategy, limits
        self.request = -1  # the request being replayed (0-based)
        self.left: list[tuple[RecordedCall, ...]] = []
        self.asked = 0  # disclosure steps taken for the next action
        self.answered = True
        self.made: list[RecordedCall] = []  # the calls made so far in this request
        self.cites = "state_focus" in strategy.blocks and "state_delta" in strategy.blocks
        self._op = bounded(limits).items["state_delta"]

    def record(self, observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """ISU: every tool result used becomes a knowledge state, summarized by the call and the identifiers the
        result holds, so the index can find it. Where the strategy can disclose raw results (PSA), the state
        *cites*: its value keeps the result's key values (``salient``: ids, amounts, dates, statuses) and its
        ``supports`` ref names the result for the rest; without PSA it holds the result's content (as far as the
        limits let a value hold it)."""
        ops = []
        for o in observations:
            result = o.get("result", o.get("error"))
            value = salient(result) if self.cites else result
            value = fit(value if isinstance(value, dict) else {} if value is None else {"result": value}, self.limits)
            args = " ".join(str(v) for _, v in scalars(o.get("arguments", {})))
            ids = identifiers(result)
            summary = f"{o['tool']} {args}".strip() + (": " + ", ".join(ids) if ids else "")
            op = {"operation": "add", "state_set": "knowledge",
                  "state_id": "fact_" + o["observation_id"][len(OBSERVATION_PREFIX):],
                  "summary": summary[: self.limits.text], "value": value,
                  "refs": [{"rel": "supports", "state_id": o["observation_id"]}]}
            try:
                self._op.validate_python(op)
            except Exception:
                op["value"] = {}
            ops.append(op)
        return ops[: self.limits.ops]

    def focus(self, query: str, needs: Sequence[str], parts: dict[str, list[dict[str, Any]]]) -> list[str]:
        """PSA: the earlier states whose summaries name a value the next action needs; else the raw results that
        states in view cite (those whose state's summary names the value first, then the latest) — a state keeps
        key values, its result the rest; else the earlier states that share a word with the query; else the
        latest earlier states."""
        listed, shown, _ = Policy.visible(parts)
        unseen = [s for s in listed if s["state_id"] not in shown]
        named = [s["state_id"] for s in unseen if any(v in str(s.get("summary", "")) for v in needs)]
        if named:
            return named[-self.limits.focus:]
        cited = [(any(v in str(e.get("summary", "")) for v in needs), i, r["state_id"])
                 for i, e in enumerate(parts.get(tags.ACTIVE_STATE, [])) for r in e.get("related_states", [])
                 if r["state_id"].startswith(OBSERVATION_PREFIX) and r["state_id"] not in shown]
        if cited:
            return [oid for _, _, oid in sorted(cited, reverse=True)][: self.limits.focus]
        wanted = words(query)
        hits = [s["state_id"] for s in unseen if wanted & words(s.get("summary", ""))]
        return (hits or [s["state_id"] for s in unseen])[-self.limits.focus:]

    def missing(self, user: str) -> list[str]:
        """What the next action uses from earlier in the conversation but the prompt does not show as content: the
        string arguments of the next calls, or the ids and codes of earlier results that the answer repeats word
        for word, which the conversation showed before this step (earlier requests' queries and results, this
        request's results) and which are not in the query, the Active State or the results in view. An index
        summary is not content (B.4): what only a summary shows is missing."""
        earlier = self.task.seen(self.request) + json.dumps([c.result for c in self.made])
        if self.left:
            used = [str(v) for c in self.left[0] for _, v in scalars(c.arguments) if isinstance(v, str)]
        else:
            answer = set(re.findall(r"[\w-]+", self.task.turns[self.request].answer))
            results = [c.result for t in self.task.turns[: self.request] for s in t.steps for c in s]
            used = [v for r in [*results, *(c.result for c in self.made)] for _, v in scalars(r)
                    if identifier(v) and v in answer]  # the ids and codes it repeats, word for word
        index = tags.read(user, tags.HISTORICAL_INDEX)
        view = user.replace(index, "") if index else user
        if index:
            view += "\n".join(str(json.loads(line).get("user_query", "")) for line in index.splitlines() if line)
        return list(dict.fromkeys(v for v in used if v and v not in view and v in earlier))

    @staticmethod
    def remember(interaction: str) -> str:
        """The memory a model would write of an interaction: its request and the first fields of its results."""
        query, lines = read_interaction(interaction)
        return memory_text(query,
                           {k: v for i in lines if "observation_id" in i for k, v in scalars(i.get("result"))[:8]})

    def __call__(self, messages: Sequence[Message], purpose: Purpose = STEP) -> str:
        own = memory_reply(purpose, messages[-1].content, self.remember, salient)
        if own is not None:
            return own
        query, parts = read_prompt(messages)
        if self.answered:  # the first step of the next request
            self.request += 1
            self.left, self.asked, self.answered = list(self.task.turns[self.request].steps), 0, False
            self.made = []
        output: dict[str, Any] = {"state_focus": [], "state_delta": [], "tool_calls": [],
                                  "assistant_message": {"content": None}}
        if "state_delta" in self.strategy.blocks and not self.strategy.facts:  # else the system records them
            output["state_delta"] = self.record(parts.get(tags.LATEST_OBSERVATION, []))
        view = "\n".join(m.content for m in messages[1:])  # the whole prompt but the instructions
        needs = self.missing(view) if self.request > 0 or self.made else []
        if needs and self.asked < LOOKS and "state_focus" in self.strategy.blocks:
            output["state_focus"] = [{"target_id": t, "reason": f"holds {needs[0]}, needed next"}
                                     for t in self.focus(query, needs, parts)]
            self.asked += 1
        if output["state_focus"]:
            pass  # a step of its own: the calls need what it asks for, in view from the next step
        elif needs:  # it looked (or cannot look) and cannot see what the next action needs: it does not guess
            output["assistant_message"] = {"content": f"{MISS} {needs[0]}"}
            self.answered = True
        elif self.left:
            calls = self.left.pop(0)
            if len(calls) > self.limits.tool_calls:  # more than a step may hold: the rest next step
                self.left.insert(0, calls[self.limits.tool_calls:])
                calls = calls[: self.limits.tool_calls]
            self.made += calls
            self.asked = 0  # the next action looks afresh
            output["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in calls]
        else:
            output["assistant_message"] = {"content": self.task.turns[self.request].answer}
            self.answered = True
        return render_output(ModelOutput.model_validate(output), self.strategy.blocks, self.strategy.optional)
