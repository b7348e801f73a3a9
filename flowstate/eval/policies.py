"""Reference policies that speak the protocol: an oracle that uses memory, and one that never does.

``PolicyEngine`` is an engine whose outputs a policy computes from the prompt, so a suite runs
through the real loop, strategies, validation and repository exactly as a model's outputs would.
The policy reads facts (what it distills from tool results) wherever the prompt shows them. With
memory it also records the durable facts of each tool result as a state (ISU, where the strategy has
it) and asks for earlier states and the tool results they reference (PSA, where it has it); without
memory it ignores everything from earlier requests and guesses where a fact from them is needed.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.base import Capabilities, Engine, Generation, Message, OnText, Sampling, Usage
from engine.purpose import STEP, Purpose
from engine.text import common_prefix, flatten, tokenize
from flowstate import tags
from flowstate.eval.task import Answer, Call, Decision, Need, Task
from flowstate.history import words
from flowstate.limits import STANDARD, Limits, clip, fit
from flowstate.memory.base import Strategy
from flowstate.memory.reference import Reference, read_interaction, sections
from flowstate.nodes import OBSERVATION_PREFIX, PAGE_PREFIX
from flowstate.protocol import ModelOutput, render_output

BOUNDED: dict[str, str] = {
    "bm25": "a request sees only the 3 earlier requests BM25 scores highest for its query; a subtask that needs "
            "more of them (chain's running total past depth 4) or whose source shares too few words with the query "
            "misses them",
    "mem0-style": "a request sees only the 5 live memories most similar to its query; a subtask that needs more "
                  "earlier facts than that (chain's running total past depth 6) or whose memory shares too few "
                  "words with the query misses them",
    "reasoningbank": "its memory holds distilled strategies, no facts of earlier requests (as ReasoningBank "
                     "defines it), so no policy can solve a subtask that needs an earlier subtask's facts",
}
"""Strategies whose reference policy is not expected to solve every dependent subtask, and why: what their
memory shows is not always enough, by the method's own design. The report says so beside their figures."""

Answerer = Callable[[Sequence[Message], Purpose], str]
"""What a policy is: the output of a model call from its messages and its declared purpose."""

PAGES_AT_ONCE = 2
"""Pages of a bounded index a policy asks for at once when nothing in view names what it misses."""

LOOKS = 3
"""The realistic policy's disclosure steps per request at most: then it acts on what it has."""

def read_prompt(messages: Sequence[Message]) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """A step's query and sections, from one user message or from a chat (full context in chat order, where
    each step's results are a ``<tool_results>`` message: earlier requests' become the history, this request's
    latest the latest observation and the rest its trajectory, as the one-message layouts name them)."""
    users = [m.content for m in messages[1:] if m.role == "user"]
    parts = sections("\n".join(users))
    written = [s for m in messages[1:] if m.role == "assistant" for s in written_states(m.content)]
    if written:  # the append-only layout: the states a step added are its own output, earlier in the chat
        parts[tags.ACTIVE_STATE] = [*parts.get(tags.ACTIVE_STATE, []), *written]
    queries = re.findall(rf"<{tags.USER_QUERY}>\n(.*?)\n</{tags.USER_QUERY}>", "\n".join(users), re.S)
    results = parts.pop(tags.TOOL_RESULTS, [])
    latest = {str(i.get("observation_id")) for i in sections(users[-1] if users else "").get(tags.TOOL_RESULTS, [])}
    for item in results:
        oid = str(item.get("observation_id"))
        request = int(oid.split("_")[1][1:])
        key = tags.INTERACTION_HISTORY if request < len(queries) else \
            tags.LATEST_OBSERVATION if oid in latest else tags.TRAJECTORY
        parts.setdefault(key, []).append(item)
    return (queries[-1] if queries else ""), parts


def written_states(output: str) -> list[dict[str, Any]]:
    """The states an earlier output of the chat added or updated (its ``state_delta``), as Active State entries."""
    delta = tags.read(output, "state_delta")
    try:
        ops = json.loads(delta) if delta else []
    except json.JSONDecodeError:
        return []
    states: dict[str, dict[str, Any]] = {}
    for op in ops if isinstance(ops, list) else []:
        if not isinstance(op, dict) or not isinstance(op.get("state_id"), str):
            continue
        if op.get("operation") == "remove":
            states.pop(op["state_id"], None)
            continue
        entry = states.setdefault(op["state_id"], {"state_id": op["state_id"]})
        for key, field in (("state_set", "type"), ("summary", "summary"), ("value", "value"),
                           ("refs", "related_states")):
            if key in op:
                entry[field] = op[key]
    return list(states.values())


def memory_text(query: str, facts: dict[str, Any]) -> str:
    """A memory as the reference policies write it: the request it came from, then its facts as JSON."""
    return f"{query} | {json.dumps(facts)}"


def strings(value: Any) -> list[str]:
    """Every string in a JSON value, in order."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in strings(v)]
    if isinstance(value, list):
        return [x for v in value for x in strings(v)]
    return [value] if isinstance(value, str) else []


def gist(observation: dict[str, Any], size: int = 160) -> str:
    """A summary as a model writes one of a tool result: the call, then the result's names — its short strings
    (ids, titles, names, codes; prose is left out) — in order, up to ``size`` characters."""
    args = " ".join(strings(observation.get("arguments") or {}))
    head = f"{observation.get('tool', '')} {args}".strip()
    names = [" ".join(x.split()) for x in strings(observation.get("result", observation.get("error")))
             if 0 < len(x.split()) <= NAME_WORDS]
    return f"{head}: {', '.join(dict.fromkeys(names))}"[:size]


NAME_WORDS = 8
"""A string of at most this many words is a name (a title, an id, a code) rather than prose."""


def _remembered(item: dict[str, Any]) -> dict[str, Any]:
    """An extracted memory written as "<request> | <JSON object of facts>", as facts (nothing otherwise)."""
    _, bar, facts = str(item.get("fact", "")).rpartition(" | ")
    try:
        value = json.loads(facts) if bar else None
    except json.JSONDecodeError:
        value = None
    return {"value": value} if isinstance(value, dict) else {}


def memory_reply(purpose: Purpose, user: str, remember: Callable[[str], str | None],
                 keep: Callable[[Any], Any] | None = None) -> str | None:
    """A memory method's own call answered as a model would, for a policy that replays given actions (the τ³
    gold replay, a recorded conversation); None: the call is an agent step. ``remember`` turns a finished
    interaction (JSON lines) into the one memory the policy writes of it, or None; ``keep`` what a state tracker
    keeps of a tool result in its world (by the result's id; None: it keeps nothing)."""
    if purpose.kind == STEP.kind:
        return None
    return answer(purpose, user, _Replaying(remember, keep))


class _Replaying:
    """What a replaying policy knows of its request: the memory it writes, what a tracker keeps of each result
    (by its id), and that every request it replays answers."""

    def __init__(self, remember: Callable[[str], str | None], keep: Callable[[Any], Any] | None) -> None:
        self._remember, self._keep = remember, keep

    def remember(self, interaction: str) -> str | None:
        return self._remember(interaction)

    def world(self, query: str, before: dict[str, Any], new: list[dict[str, Any]]) -> dict[str, Any]:
        if self._keep is None:
            return {}
        return {**before, **{str(i.get("observation_id")): self._keep(i.get("result", i.get("error"))) for i in new}}

    def answered(self, interaction: str) -> bool:
        return True


def answer(purpose: Purpose, user: str, ref: Reference) -> str:
    """The reply to a memory call by its declared kind: the reference its method declares (``Purpose.reference``),
    else — a new memory method's kind with none — its reply model's defaults, so a method of one file runs under
    every reference policy with nothing added here."""
    if purpose.reference is not None:
        return purpose.reference(user, ref)
    model = purpose.reply
    try:
        return json.dumps(model.model_validate({}).model_dump(mode="json"))  # type: ignore[union-attr]
    except Exception as exc:  # no model, or one without defaults for every field
        raise ValueError(f"no reference answer for a memory call of kind {purpose.kind!r}: give its reply model "
                         "defaults, or its Purpose a reference (flowstate/memory/reference.py)") from exc


def _states(states: Any) -> list[dict[str, Any]]:
    """An index line's states as ``{"state_id", "summary"}`` objects: the paper's list of them, or flowstate-lean's
    mapping of id to summary."""
    if isinstance(states, dict):
        return [{"state_id": sid, "summary": summary} for sid, summary in states.items()]
    return list(states)


@dataclass(frozen=True)
class PolicyStep:
    """What the policy saw and did at one step, for checking that no step could have been merged."""

    k: int
    t: int
    facts: dict[str, Any]
    new: frozenset[str]  # fact keys that arrived at this step (a tool result, or content disclosed from history)
    visible: frozenset[str]  # ids the policy could ask for at this step
    focus: tuple[str, ...]
    decision: Decision


class Policy:
    """The decision of one step, given the task, the strategy and whether memory is used.

    The oracle is minimal for its strategy: at a request's first step it asks memory for everything
    the subtask depends on *together with* any action that does not depend on it, acts as soon as
    what it needs is in view, and records only what later subtasks need (``Task.durable``) as
    states. Its token counts are a lower bound a real model can only exceed.
    """

    def __init__(self, task: Task, strategy: Strategy, memory: bool, limits: Limits = STANDARD,
                 realistic: bool = False) -> None:
        self.task, self.strategy, self.memory, self.limits = task, strategy, memory, limits
        self.realistic = realistic and memory
        self.trace: list[PolicyStep] = []
        self._seen: set[str] = set()
        self._looked = 0  # disclosure steps of its own in this request (realistic)

    def keeps(self, key: str) -> bool:
        """Whether a fact goes into memory: the oracle keeps what later subtasks need (``Task.durable``), the
        realistic policy every fact of the results it used."""
        return self.realistic or self.task.durable(key)

    def _facts_of(self, item: dict[str, Any]) -> dict[str, Any]:
        """The facts an item holds: a tool result's distilled facts, or a state's value."""
        value = item.get("value", item)
        if isinstance(value, dict) and "tool" in value:
            return self.task.distill(str(value["tool"]), value.get("result"))
        return dict(value) if isinstance(value, dict) else {}

    def facts(self, parts: dict[str, list[dict[str, Any]]], k: int = 0) -> tuple[dict[str, Any], set[str]]:
        """Every fact in view, and the keys of those that arrived at this step."""
        sources: list[dict[str, Any]] = []
        for tracked in parts.get(tags.TRACKED_STATE, []):  # a state tracker's world, by request
            world = tracked.get("world") or {}
            sources += [{"value": facts} for key, facts in world.items()
                        if isinstance(facts, dict) and (self.memory or key == f"request_{k}")]
        if self.memory:  # earlier requests: full context's transcript, BM25's retrieved requests, extracted memories,
            # MAGE's summaries on the active path (or, without Compress, its raw steps)
            sources += [i for i in parts.get(tags.INTERACTION_HISTORY, []) + parts.get(tags.RETRIEVED_MEMORY, [])
                        + parts.get(tags.EXECUTION_STATE, []) if "observation_id" in i]
            sources += [_remembered(i) for i in parts.get(tags.MEMORIES, [])]
            sources += [_remembered({"fact": i["summary"]}) for i in parts.get(tags.EXECUTION_STATE, [])
                        if "summary" in i and "hint" not in i]
        active = [e for e in parts.get(tags.ACTIVE_STATE, []) if self.memory or "source_query" not in e]
        # what earlier requests hold first, so that this request's own facts win where keys meet
        sources += sorted(active, key=lambda e: "source_query" not in e)
        sources += parts.get(tags.TRAJECTORY, [])
        facts: dict[str, Any] = {}
        new: set[str] = set()
        for item in sources:
            found = self._facts_of(item)
            facts.update(found)
            if "source_query" in item and item.get("state_id") not in self._seen:  # disclosed at this step
                new.update(found)
        for item in parts.get(tags.LATEST_OBSERVATION, []):
            found = self._facts_of(item)
            facts.update(found)
            new.update(found)
        return facts, new

    def record(self, observations: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """ISU: the facts of each tool result it keeps become a knowledge state that cites it; the oracle names
        the facts in the summary, the realistic policy writes what a model would: the call and the result's words."""
        ops = []
        for o in observations:
            facts = {key: v for key, v in self._facts_of(o).items() if self.keeps(key)}
            if not facts:
                continue
            summary = gist(o) if self.realistic else f"{o['tool']} result: {', '.join(facts)}"
            facts = fit(facts, self.limits)
            ops.append({
                "operation": "add", "state_set": "knowledge",
                "state_id": "fact_" + o["observation_id"][len(OBSERVATION_PREFIX):],
                "summary": clip(summary, self.limits.text),
                "value": facts, "refs": [{"rel": "supports", "state_id": o["observation_id"]}],
            })
        return ops[: self.limits.ops]

    @staticmethod
    def visible(parts: dict[str, list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], set[str], list[str]]:
        """The index's states (and pages of a bounded index, and the lines of pages disclosed: a page is listed as
        an id with its summary), the ids in the Active State, and the obs ids its entries reference."""
        lines = parts.get(tags.HISTORICAL_INDEX, []) + [line for e in parts.get(tags.ACTIVE_STATE, [])
                                                        for line in e.get("index", [])]
        listed = [item for line in lines for item in (
            [{"state_id": line["page_id"], "summary": line.get("summary", "")}] if "page_id" in line
            else _states(line.get("states", [])))]
        shown = {str(e.get("state_id", e.get("page_id"))) for e in parts.get(tags.ACTIVE_STATE, [])}
        related = [r["state_id"] for e in parts.get(tags.ACTIVE_STATE, []) for r in e.get("related_states", [])
                   if r["state_id"].startswith(OBSERVATION_PREFIX) and r["state_id"] not in shown]
        return listed, shown, related

    def focus(self, keys: Sequence[str], parts: dict[str, list[dict[str, Any]]]) -> list[str]:
        """PSA: earlier states whose summaries name a missing fact; else any unseen earlier state, and
        the tool results that visible states reference."""
        listed, shown, related = self.visible(parts)
        named = [s["state_id"] for s in listed if s["state_id"] not in shown
                 and set(keys) & set(re.split(r"[:,\s]+", s.get("summary", "")))]
        if named:
            return named[-self.limits.focus:]
        unseen = [s["state_id"] for s in listed if s["state_id"] not in shown
                  and not s["state_id"].startswith(PAGE_PREFIX)]
        if related or unseen:
            return list(dict.fromkeys(related + unseen))[: self.limits.focus]
        # a bounded index: its pages, newest first
        pages = [s["state_id"] for s in listed if s["state_id"] not in shown]
        return pages[::-1][:PAGES_AT_ONCE]

    def look(self, query: str, decision: Decision, parts: dict[str, list[dict[str, Any]]], first: bool) -> list[str]:
        """Realistic PSA, in steps of their own: at a request's first step, the earlier states whose summaries
        share the most words with the query (those sharing none are left); when a fact is still missing, the
        latest earlier states not yet seen, then the tool results that states in view reference — at most
        ``LOOKS`` such steps per request, then it guesses. Of a bounded index's pages it asks for at most
        ``PAGES_AT_ONCE`` a step, ranked the same way."""
        if first:
            self._looked = 0
        listed, shown, related = self.visible(parts)
        unseen = [st for st in listed if st["state_id"] not in shown]
        if first:
            wanted = words(query)
            shared = [(len(wanted & words(str(st.get("summary", "")))), i, st["state_id"])
                      for i, st in enumerate(unseen)]
            ranked = [sid for n, _, sid in sorted(shared, reverse=True) if n]
        elif isinstance(decision, Need) and self._looked < LOOKS:
            ranked = [*(st["state_id"] for st in unseen[::-1]), *related]
        else:
            ranked = []
        pages = [sid for sid in ranked if sid.startswith(PAGE_PREFIX)][:PAGES_AT_ONCE]
        focus = [sid for sid in ranked if not sid.startswith(PAGE_PREFIX)][: self.limits.focus - len(pages)] + pages
        self._looked += bool(focus)
        return focus

    def extract(self, interaction: str) -> str:
        """Mem0-style extraction: the request's durable facts as one memory that names the request it came from
        (so that a later request's words find it)."""
        query, lines = read_interaction(interaction)
        durable = {k: v for item in lines if "observation_id" in item
                   for k, v in self._facts_of(item).items() if self.keeps(k)}
        return json.dumps({"facts": [memory_text(query, durable)] if durable else []})

    def remember(self, interaction: str) -> str | None:
        """The one memory it writes of an interaction: its durable facts, named by the request (``extract``)."""
        facts = json.loads(self.extract(interaction))["facts"]
        return str(facts[0]) if facts else None

    def world(self, query: str, before: dict[str, Any], new: list[dict[str, Any]]) -> dict[str, Any]:
        """A state tracker's world: the durable facts of the newest tool results join it, by request."""
        k = self.task.subtask(query)
        world = dict(before)
        facts = {key: v for item in new for key, v in self._facts_of(item).items() if self.keeps(key)}
        world[f"request_{k}"] = {**(world.get(f"request_{k}") or {}), **facts}
        return world

    def answered(self, interaction: str) -> bool:
        """Whether the request it just played ended with its answer (its own last decision, not the prompt's words)."""
        return bool(self.trace) and isinstance(self.trace[-1].decision, Answer)

    def memory_call(self, purpose: Purpose, user: str) -> str:
        """A memory method's own call, answered by its declared kind."""
        return answer(purpose, user, self)

    def __call__(self, messages: Sequence[Message], purpose: Purpose = STEP) -> str:
        if purpose.kind != STEP.kind:
            return self.memory_call(purpose, messages[-1].content)
        query, parts = read_prompt(messages)
        k = self.task.subtask(query)
        t = 1 if not self.trace or self.trace[-1].k != k else self.trace[-1].t + 1
        if t == 1:
            self._seen = set()
        facts, new = self.facts(parts, k)
        # where the system records tool results as states, the policy leaves them to it
        delta = (self.record(parts.get(tags.LATEST_OBSERVATION, []))
                 if "state_delta" in self.strategy.blocks and not self.strategy.facts else [])
        decision = self.task.solve(k, facts)
        focus: list[str] = []
        if self.realistic and "state_focus" in self.strategy.blocks:
            focus = self.look(query, decision, parts, first=t == 1 and k > 1)
            decision = Need(()) if focus else decision  # a step of its own: it acts once what it asked for is in view
        elif self.memory and "state_focus" in self.strategy.blocks:
            missing = [key for key in self.task.needs(k) if key not in facts]
            if isinstance(decision, Need):
                missing += [key for key in decision.keys if key not in missing]
            if missing:
                focus = self.focus(missing, parts)
        shown = decision if not isinstance(decision, Need) or focus else self.task.guess(k, facts)
        listed, ids, related = self.visible(parts)
        self.trace.append(PolicyStep(k, t, facts, frozenset(new), frozenset([s["state_id"] for s in listed] + related),
                               tuple(focus), shown))
        self._seen = ids
        output: dict[str, Any] = {
            "state_focus": [{"target_id": f, "reason": "needed for this subtask"} for f in focus],
            "state_delta": delta, "tool_calls": [], "assistant_message": {"content": None},
        }
        if isinstance(shown, Call):
            output["tool_calls"] = [{"name": shown.tool, "arguments": shown.arguments}]
        elif isinstance(shown, Answer):
            output["assistant_message"] = {"content": shown.text}
        return render_output(ModelOutput.model_validate(output), self.strategy.blocks, self.strategy.optional)

    def mergeable(self) -> list[str]:
        """Steps that a policy taking the fewest steps would not have taken, each with why.

        A step is needed when its action uses something that arrived at it (a tool result or disclosed
        history): decided without that, the action would differ. A step that only waits for history
        is needed only at a request's first step, when what it asks for first came into view at the
        step before (an id that a just-disclosed state references), or when the step before asked for
        as many ids as the limits allow.
        """
        out = []
        for before, step in zip(self.trace, self.trace[1:]):
            if step.k != before.k:
                continue
            where = f"subtask {step.k} step {step.t}"
            if isinstance(step.decision, Need):
                if set(step.focus) <= before.visible and len(before.focus) < self.limits.focus:
                    out.append(f"{where}: waits for {list(step.focus)}, which it could have asked for a step earlier")
                continue
            without = {key: v for key, v in step.facts.items() if key not in step.new}
            if self.task.solve(step.k, without) == step.decision:
                out.append(f"{where}: {step.decision} uses nothing that arrived at this step")
        return out


class PolicyEngine(Engine):
    """An engine that answers with a policy; usage counted like the scripted engine's."""

    name = "policy"

    def __init__(self, policy: Answerer,
                 tokens: Callable[[str], Sequence[Any]] = tokenize,
                 forced: Callable[[str, str], int] | None = None) -> None:
        """``tokens`` splits text into tokens: words and punctuation by default, or a model's vocabulary;
        ``forced`` (a grammar and an output: how many of its tokens the grammar forces) takes each call's grammar
        and reports them as forced tokens, as an engine that fast-forwards would append them."""
        self.policy, self.tokens, self.forced = policy, tokens, forced
        self.capabilities = Capabilities(grammar=forced is not None)
        self._last: Sequence[Any] = []
        self._systems: dict[str, Sequence[Any]] = {}  # a system message's tokens, counted once
        self._lock = threading.Lock()

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 on_text: OnText | None = None, sampling: Sampling | None = None,
                 affinity: str | None = None, purpose: Purpose = STEP,
                 cache_salt: str | None = None, priority: int = 0) -> Generation:
        """Usage as a perfect prefix cache would serve it: ``cached`` over this session's previous call alone — its
        prompt and the output it decoded, whose KV a prefix cache keeps too (vLLM caches the blocks decoding
        fills), so a chat that resends an output verbatim prefills it no more — and ``shared`` the prompt's
        system message (the deployment's fixed prefix, which every session shares)."""
        text = self.policy(messages, purpose)
        rendered = flatten(messages)
        prompt = self.tokens(rendered)
        with self._lock:
            cached = common_prefix(prompt, self._last)
            self._last = self.tokens(rendered + text)
            system = self._systems.get(messages[0].content) if messages else ()
            if system is None:
                head = flatten(messages[:1])[: -len("<|assistant|>\n")]
                system = self._systems[messages[0].content] = self.tokens(head)
        return Generation(text, Usage(prompt_tokens=len(prompt), cached_tokens=cached,
                                      completion_tokens=len(self.tokens(text)),
                                      shared_tokens=common_prefix(prompt, system or ()),
                                      forced_tokens=self.forced(grammar, text) if self.forced and grammar else 0))

    def count_tokens(self, text: str) -> int:
        return len(self.tokens(text))
