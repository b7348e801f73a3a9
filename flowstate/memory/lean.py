"""FlowState lean (``flowstate-lean``): the paper's states, written and carried where they pay.

The paper's method (``flowstate``, ``memory.state``) stays as it is; this one keeps its ideas — typed states with
relations and references to raw tool results, ISU's rules, PSA's index and disclosure — and changes what each call
decodes and carries (each difference argued in docs/memory-methods.md, measured in docs/results/lean.md):

- **the system writes the knowledge**: each tool result becomes a knowledge state by rule as it comes in (``fact_``
  ids citing the result, as ``flowstate-facts``); the model writes only what only it knows — preferences,
  judgements, attributes, artifacts — and their relations, under ISU's rules;
- **memory blocks only when they say something**: ``state_focus`` and ``state_delta`` are left out of an output
  that has nothing in them (the grammar admits them absent or non-empty, never ``[]``), and the model's states are
  written after it decides to answer (``tool_calls`` comes before ``state_delta``; a step that calls writes none),
  only by a request after which the index moves (the ``crossover``-th, then the last of each ``block``), whose
  chat holds what the next request folds into the index (``records``): a step that acts decodes what full
  context's step decodes, and a session that ends below the crossover decodes no state;
- **below the crossover the history is the chat**: a session of fewer than ``crossover`` earlier requests sends
  them as full context does (each query, call, result and response, as they happened), so a short session never
  carries more than full context; its states are kept all the same (the index, search, export);
- **past it, states**: the earlier requests are the Historical State Index (``index_text``: a request's states a
  mapping of id to summary; a tool result's summary names the identifiers it holds), and the states whose
  summaries share the most words with the new query are disclosed in its first call — a disclosure step only when
  the model asks for more;
- **the request appends**: its calls and results are the chat's next messages (the layout of full context), so a
  prefix cache holds every call but what is new; what changes within a request (the model's own states, states
  disclosed by a step, feedback) is the last message's tail, shown to the next call only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from engine.base import Message
from flowstate import tags
from flowstate.access import disclose
from flowstate.active import ActiveState, Disclosed
from flowstate.history import HistoricalIndex, build_index, identifiers, words
from flowstate.limits import STANDARD, Limits, clip
from flowstate.memory.append import brought
from flowstate.memory.base import MemoryContext, Observed, Start, StepInput, Strategy
from flowstate.memory.chat import RULES as CHAT_RULES
from flowstate.memory.chat import TWO_BLOCKS, calls_message, results_text, steps, with_feedback
from flowstate.memory.state import fact_id, fact_node
from flowstate.nodes import Node, canonical_json
from flowstate.protocol import AddOp, MessageBlock, ModelOutput, render_output
from flowstate.serializer import FEEDBACK_RULE, render_entry, shape, system_prompt
from flowstate.store.repository import RequestRow, SessionView

CROSSOVER = 30
"""Earlier requests a session holds before the lean method sends states instead of the chat: where its GPU time
(PET) meets full context's on the recorded conversations, between 27 and 54 requests (docs/results/lean.md); below
it a session costs what full context costs. ``flowstate-lean:N`` sets another."""
BLOCK = 10
"""Requests the index takes at a time past the crossover (at most the crossover): between its moves a request's
prompt extends the previous one's, as full context's does."""

OPTIONAL = ("state_focus", "state_delta")
LEAN_BLOCKS = ("state_focus", "tool_calls", "state_delta", "assistant_message")
"""The lean protocol's order: a step decides (calls, or answers) before it records, and records only with its
answer (``grammars.four_blocks.decides_first``) — a model that began a record in the paper's order, where the record
comes first, would be held to answering by the grammar (the 1.5B model then answered every request without a call,
docs/results/lean.md)."""
NOTE = {"ops": 4, "refs": 4, "text": 120, "value_depth": 0, "value_items": 4, "value_text": 64}
"""The most a state the model writes may hold (each bound the lower of this and the profile's): a note — a summary
of a line, a few scalar members, refs to the evidence — never a copy of a tool result, which the system has already
recorded as a fact (the 1.5B model copied whole reservations into states of its own at every step without it,
docs/results/lean.md); four operations a record (one a block of requests, ``LeanStrategy.records``). The grammar
admits nothing longer, so nothing longer is decoded."""
FACT_MARK = "flowstate-facts.fact"
FACT_TEXT = 160
"""A fact's summary (the call and its result's identifiers), at most: its line in the index (96 and 240 measured
against it in docs/results/lean.md)."""
NUMERIC = re.compile(r"[\d:./-]+")
"""An identifier of digits alone (a date, a time, an amount): left out of a fact's summary, where it would crowd out
the ids a later request looks up (dates of birth and departure are in every reservation)."""

def record_ask(limits: Limits) -> str:
    """The head of a request that records (``LeanStrategy.records``: one after which the next request folds the
    chat into the index): ISU's rule and the record's shape under ``limits`` (the bounds the
    grammar holds the record to), where the paper's method has them in the system message. Every other request's
    grammar admits no record, so the system message is full context's."""
    return f"""\
The requests above, this one included, leave the chat after this request: with your answer, record what later \
requests will need of them and no tool result says (the system keeps each result). Between <tool_calls>[]\
</tool_calls> and <assistant_message>, write
{shape("state_delta")}
with the user's preferences, your judgements, attributes and artifacts (state_set preference, judgement, attribute, \
artifact): each a new id, a one-line summary (at most {limits.text} characters), at most {limits.value_items} \
scalar values (strings at most {limits.value_text} characters; a note, never a copy of a result), refs (supports, \
derives, follows, supersedes) to the obs_ ids it rests on; at most {limits.ops} operations. Nothing to record: \
leave <state_delta> out.
{FEEDBACK_RULE}
"""


ACCESS = "state_access"
ACCESS_RULES = f"""\
This long session's older requests have left the chat: <{tags.HISTORICAL_INDEX}> lists them (queries, state ids, \
summaries); <active_state> shows earlier states your request's words found. To see another, write first \
<state_focus>[{{"target_id": "<id>", "reason": "<what is missing>"}}]</state_focus> with an index id or an obs_ id a \
shown state references: it appears next step. A summary is not content: never infer facts from it.
{FEEDBACK_RULE}
"""

def found(index: HistoricalIndex, query: str, limit: int) -> tuple[str, ...]:
    """The index's states whose summaries name an identifier of ``query`` (a word with a digit: an id, a code, a
    date, a number), the most words shared first, the newest among equals; at most ``limit``. A query that names
    none finds nothing: common words ("flight", "reservation") match every state and would disclose at random."""
    wanted = words(query)
    if not any(ch.isdigit() for w in wanted for ch in w):
        return ()
    ranked = []
    for e in index.entries:
        for i, (sid, summary) in enumerate(e.states):
            shared = wanted & words(summary)
            if any(ch.isdigit() for w in shared for ch in w):
                ranked.append((len(shared), e.query_id, i, sid))
    return tuple(sid for *_, sid in sorted(ranked, reverse=True))[:limit]


def lean_fact(obs: Node, limits: Limits, text: int) -> Node:
    """A tool result's knowledge state as the lean method writes it by rule: ``flowstate-facts``' fact, its summary
    the call and the identifiers its result holds (ids, flight numbers, codes; no bare dates or amounts, ``NUMERIC``;
    at most ``text`` characters) — what a later
    request's words and a model reading the index look a value up by. A result cut to a line shows only its first
    fields: a payment id deep in a reservation was in no summary, and a request that needed it did not find it."""
    fact = fact_node(obs, limits)
    named = [i for i in identifiers(obs.value["result"]) if i not in obs.summary and not NUMERIC.fullmatch(i)]
    summary = f"{obs.summary}: {' '.join(named)}" if named else obs.summary
    return fact.model_copy(update={"summary": clip(summary, text)})


def index_text(index: HistoricalIndex) -> str:
    """The index as lean renders it: one line per earlier request, as the paper's, but its states a mapping of id to
    summary (``{"fact_r3_s1_1": "get_user_details(…): …"}``) where the paper's lists ``{"state_id", "summary"}``
    objects — the same content without two keys a state, about a tenth of the index at 100 requests. Each line is
    fixed once written, so the rendering of a longer index extends a shorter one's."""
    lines = []
    for e in index.entries:  # the keys in canonical order, the states in the order they were written
        entry: dict[str, object] = {"query_id": e.query_id, "states": dict(e.states)}
        entry.update({"unfinished": e.unfinished} if e.unfinished is not None else {})
        entry["user_query"] = e.user_query
        lines.append(json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n")
    return "".join(lines)


def own(node: Node) -> bool:
    """A state the model wrote (not a rule-built fact, not a raw result)."""
    return not node.is_observation and node.mark != FACT_MARK


def answer_message(request: RequestRow, states: Sequence[Node], optional: Sequence[str]) -> Message:
    """An earlier request's last output as the lean protocol renders it: the states the model wrote in the request
    (as adds), and its response."""
    content = request.response if request.response is not None else f"(unfinished: {request.unfinished})"
    ops = [AddOp(operation="add", state_set=n.type, state_id=n.id, summary=n.summary, value=n.value, refs=n.refs)
           for n in states]
    output = ModelOutput.model_construct(state_delta=tuple(ops), assistant_message=MessageBlock(content=content))
    return Message("assistant", render_output(output, LEAN_BLOCKS, optional))


def request_messages(head: str, observations: Sequence[Node]) -> list[Message]:
    """One request as the chat holds it: its first user message, then per step its calls and their results."""
    out = [Message("user", head)]
    for group in steps(observations):
        out += [calls_message(group), Message("user", results_text(group))]
    return out


def _entries(entries: Sequence[Node | Disclosed], request: int) -> str:
    return "".join(canonical_json(render_entry(e, request)) + "\n" for e in entries)


@dataclass(frozen=True)
class LeanStrategy(Strategy):
    name: str = "flowstate-lean"
    blocks: tuple[str, ...] = LEAN_BLOCKS
    optional: tuple[str, ...] = OPTIONAL
    facts: bool = True
    crossover: int = CROSSOVER
    block: int = BLOCK  # past the crossover the index moves by this many requests (at most ``crossover``)
    found: int = 3  # states the query's words disclose in a request's first call, at most
    fact_text: int = FACT_TEXT  # a fact's summary (its line in the index), at most
    rules: ClassVar[str] = CHAT_RULES

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        """Full context's system message, byte for byte: what a request below the crossover that records nothing
        needs (the record's rules come with the request that records, the access rules with the index)."""
        return system_prompt(tools, policy, TWO_BLOCKS, CHAT_RULES, limits)

    def output_limits(self, limits: Limits) -> Limits:
        """``limits`` with the states the model writes held to ``NOTE`` (the system's facts keep ``limits``)."""
        return replace(limits, name=f"{limits.name}+note", **{f: min(getattr(limits, f), n) for f, n in NOTE.items()})

    def indexed(self, earlier: int) -> int:
        """How many of ``earlier`` requests the index holds: none below the crossover, then the first ``crossover``
        and whole blocks of ``block`` requests after them (every one with ``crossover`` 0); the rest are the chat.
        The split moves once a block, so between moves a request's prompt extends the previous one's, as full
        context's does."""
        if self.crossover == 0:
            return earlier
        if earlier < self.crossover:
            return 0
        block = max(1, min(self.block, self.crossover))
        return self.crossover + (earlier - self.crossover) // block * block

    def records(self, k: int) -> bool:
        """Whether request ``k``'s model writes states: only the one after which the index moves — the
        ``crossover``-th, then the last of each block (every one with ``crossover`` 0 or 1). Below the crossover the
        chat is what later requests read, and the states are read only once the next request folds them into the
        index: they are written then, once, by the request whose chat holds them whole — a session that ends below
        the crossover decodes no state at all (the system's facts are kept, as every result and message is)."""
        return self.crossover <= 1 or self.indexed(k) != self.indexed(k - 1)

    def step_blocks(self, k: int) -> tuple[str, ...]:
        """Request ``k``'s blocks: ``state_delta`` only where it records, ``state_focus`` only where an index holds
        something to ask for (past the crossover). Below it a request that records nothing is decoded under full
        context's grammar, byte for byte, as its prompt is full context's: the grammar forces what full context's
        forces, so a model decodes the same tokens."""
        past = self.crossover == 0 or k - 1 >= self.crossover
        return tuple(b for b in self.blocks
                     if (b != "state_delta" or self.records(k)) and (b != "state_focus" or past))

    @staticmethod
    def head(session: SessionView, query: str, request: int, found_ids: Sequence[str]) -> str:
        """A request's first user message: the earlier states its words found (past the crossover), its query."""
        entries = [Disclosed(*session.disclosure(i)) for i in found_ids]  # type: ignore[arg-type]
        parts = [tags.block(tags.ACTIVE_STATE, _entries(entries, request))] if entries else []
        return "".join([*parts, tags.block(tags.USER_QUERY, query + "\n")])[:-1]

    def start(self, session: SessionView) -> Start:
        requests, nodes = session.requests(), session.nodes()
        k, cut = len(requests) + 1, self.indexed(len(requests))
        folded = {r.index for r in requests[:cut]}
        index = build_index(requests[:cut], [n for n in nodes if n.request in folded])
        limit = self.found
        chat: list[Message] = []
        for r in requests[cut:]:  # the chat: every request since the index's last block, as it happened
            mine = [n for n in nodes if n.request == r.index]
            head = self.head(session, r.query, r.index, found(index, r.query, limit))
            chat += request_messages(head, [n for n in mine if n.is_observation])
            chat.append(answer_message(r, [n for n in mine if own(n)], self.optional))
        state = ActiveState(request=k, history_ids=frozenset(n.id for n in nodes), index_ids=index.ids())
        memory = (tags.HISTORICAL_INDEX, index_text(index)) if index.entries else None
        return Start(k, index, state, memory, data={"history": tuple(chat)})

    def begin(self, ctx: MemoryContext) -> Observed:
        """Past the crossover: the index's states the query's words find, disclosed in the request's first call."""
        requests = ctx.session.requests()
        folded = {r.index for r in requests[: self.indexed(len(requests))]}
        if not folded:
            return Observed()
        index = build_index([r for r in requests if r.index in folded],
                            [n for n in ctx.session.nodes() if n.request in folded])
        targets = found(index, ctx.query, min(self.found, ctx.limits.focus))
        return Observed(state=disclose(ctx.session, ctx.state, targets)) if targets else Observed()

    def observed(self, ctx: MemoryContext) -> Observed:
        """Each new tool result (not an error) recorded as a knowledge state citing it."""
        state = ctx.state
        for obs in ctx.observation:
            if "result" in obs.value and not state.is_used(fact_id(obs.id)):
                state = state.with_added(lean_fact(obs, ctx.limits, self.fact_text))
        return Observed(state=state) if state is not ctx.state else Observed()

    def prompt(self, step: StepInput) -> list[Message]:
        """System; past the crossover the access rules and the index (fixed for a block of requests); the chat since
        the index's last block; the request's head (the states its words found, its query); then per step its output
        as written and what it brought — states it disclosed, feedback, tool results (``memory.append``). Nothing
        already sent changes. Below the crossover the steps are full context's (each step's calls and results, the
        feedback on the last one shown once), so a request that records nothing is full context's prompt."""
        state = step.state
        by_steps = {i for record in step.steps for i in record.disclosed}
        found_first = [d for d in state.disclosed if d.node.id not in by_steps]  # disclosed before the first call
        head = [tags.block(tags.ACTIVE_STATE, _entries(found_first, state.request))] if found_first else []
        if self.records(state.request):
            head.append(tags.block(tags.STATE_RECORD, record_ask(step.limits)))
        head.append(tags.block(tags.USER_QUERY, step.query + "\n"))
        messages = [Message("system", step.system), *step.start.data["history"], Message("user", "".join(head)[:-1])]
        if step.start.memory is None:  # below the crossover: the request's steps as full context renders them
            for group in steps(state.observations):
                messages += [calls_message(group), Message("user", results_text(group))]
            return with_feedback(messages, step.feedback)
        for record in step.steps:
            messages += [Message("assistant", record.raw), Message("user", brought(record, state))]
        prefix = tags.block(ACCESS, ACCESS_RULES) + tags.block(*step.start.memory)  # at the head of the chat
        messages[1] = Message("user", prefix + messages[1].content)
        return messages

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        """Every tool result (the chat shows them below the crossover; states cite them past it) and the request's
        states."""
        return [*state.observations, *state.current]


FLOWSTATE_LEAN: Strategy = LeanStrategy()
