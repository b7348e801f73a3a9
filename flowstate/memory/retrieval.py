"""Retrieval baselines on the strategy seam: BM25 over earlier requests, and Mem0-style extracted memories.

- ``bm25`` (the paper's BM25 baseline, as MemoryArena's ``RAGMemorySystem(max_tokens=2048, top_k=3)`` runs
  it): each earlier request is one memory entry — its history as full context's transcript holds it (the
  query, every tool call with its result, the response) —, split into pieces only past ``ENTRY_TOKENS``
  tokens; at the start of a request the ``BM25_TOP_K`` entries that BM25Okapi (``rank_bm25``, on lower-cased
  ``[a-z0-9]+`` words, as there) scores highest for the request's query are shown in ``<retrieved_memory>``,
  best first, whatever their score. MemoryArena counts the 2,048 tokens with tiktoken's gpt-4o-mini encoding
  (a download this package cannot assume); here a token is ``CHARS_PER_TOKEN`` characters, that encoding's
  average on English and JSON. No state, the two-block protocol of full context.
- ``mem0-style`` (Mem0's two phases, reduced to their core): when a request ends, one model call extracts
  the facts worth remembering; then the update phase compares them with the ``SIMILAR`` stored memories most
  similar to each (BM25 here, where Mem0 embeds) in one more call that decides, per fact, ADD / UPDATE /
  DELETE / NONE (their tokens count for the method; with no stored memory to compare, every fact is added
  without the call). The store is append-only: an update is a new memory that replaces the old one, a
  delete a marker node. At the start of a request the ``TOP_K`` live memories most similar to its query are
  shown in ``<memories>``. Tool results are not kept; the memories are all that crosses requests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.base import Message
from engine.purpose import Purpose
from flowstate import tags
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.limits import Limits
from flowstate.memory import calls as memory_calls
from flowstate.memory import mem0
from flowstate.memory.base import Finish, MemoryContext, Start, StepInput, Strategy, interaction, transcript
from flowstate.memory.cache import IndexCache
from flowstate.memory.ranking import BM25_TOP_K, Embeddings, okapi
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.serializer import layout
from flowstate.store.repository import RequestRow, SessionView

FACT = "mem0.fact"  # the mark of an extracted fact's node
DELETED = "mem0.deleted"  # the mark of a node that deletes a memory
SIMILAR = 5  # stored memories compared with each new fact (Mem0's released code: search(..., limit=5) per fact)
TOP_K = 5  # memories shown by mem0-style (MAGE's comparison fixes 5)
ENTRY_TOKENS = 2_048  # MemoryArena's RAGMemorySystem(max_tokens=2048): an entry longer than this is split
CHARS_PER_TOKEN = 4
TWO_BLOCKS = ("tool_calls", "assistant_message")

BM25_RULES = f"""\
## memory
Earlier requests of this session are not shown whole: each one's history (its query, tool calls with results, \
response) is a memory entry, and the {BM25_TOP_K} entries most similar to this request are in \
<retrieved_memory>, the most similar first. This request's earlier tool results are in <trajectory>, the newest \
in <latest_observation>."""

MEM0_RULES = f"""\
## memory
Facts remembered from earlier requests of this session, the {TOP_K} most relevant to this request, are in \
<memories>. This request's earlier tool results are in <trajectory>, the newest in <latest_observation>."""



class Facts(BaseModel):
    """The extraction's reply: the facts later requests may need."""

    model_config = ConfigDict(extra="forbid")
    facts: list[Annotated[str, Field(max_length=400)]] = Field(max_length=16)


FACTS_GRAMMAR = memory_calls.grammar(Facts)
EXTRACT_CALL = Purpose("mem0.extract", Facts, lambda user, ref: json.dumps(
    {"facts": [text] if (text := ref.remember(tags.read(user, tags.INTERACTION) or "")) else []}))
"""Extraction, as a reference policy answers it: the interaction's one memory (or none)."""




class MemoryEvent(BaseModel):
    """One decision of the update phase: a new fact added, a stored memory updated or deleted, or nothing."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(default="", max_length=64)
    text: str = Field(default="", max_length=400)
    event: Literal["ADD", "UPDATE", "DELETE", "NONE"]
    old_memory: str = Field(default="", max_length=400)  # what an UPDATE replaces, as Mem0's reply carries it


class MemoryUpdate(BaseModel):
    """The update phase's reply."""

    model_config = ConfigDict(extra="forbid")
    memory: list[MemoryEvent] = Field(max_length=32)


UPDATE_GRAMMAR = memory_calls.grammar(MemoryUpdate)


def _updated(user: str, ref: Any) -> str:
    """The update phase as a reference policy answers it: a fact already remembered word for word is NONE; every
    other fact is ADDed."""
    shown, facts = mem0.read_update_input(user)
    return json.dumps({"memory": [{"id": str(shown.index(f)) if f in shown else "new", "text": f,
                                   "event": "NONE" if f in shown else "ADD", "old_memory": ""} for f in facts]})


UPDATE_CALL = Purpose("mem0.update", MemoryUpdate, _updated)


def rank(documents: Sequence[str], query: str, k: int = TOP_K) -> list[int]:
    """The indexes of the ``k`` documents most similar to ``query`` by BM25, in document order (all when
    there are no more than ``k``)."""
    if len(documents) <= k:
        return list(range(len(documents)))
    import bm25s

    retriever = _index(tuple(documents))
    words = bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
    known = [w for w in words[0] if w in retriever.vocab_dict] if words and words[0] else []
    if not known:  # nothing in common: the most recent documents
        return list(range(len(documents) - k, len(documents)))
    found, _ = retriever.retrieve([known], k=k, show_progress=False)
    return sorted(int(i) for i in found[0])


def retrieve(chunks: Sequence[str], probe: str, k: int = TOP_K) -> str:
    """The ``k`` chunks most similar to ``probe`` (a request and its trace so far), in history order."""
    return "".join(chunks[i] for i in rank(chunks, probe, k))


def _build_index(documents: tuple[str, ...]) -> Any:
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(list(documents), stopwords="en", show_progress=False), show_progress=False)
    return retriever


_index: IndexCache[Any] = IndexCache(_build_index)  # a request's documents' index, built once for all its steps


def entries(requests: Sequence[RequestRow], nodes: Sequence[Node], tokens: int = ENTRY_TOKENS) -> tuple[str, ...]:
    """One memory entry per earlier request (its transcript), an entry past ``tokens`` cut into pieces of that
    many (as MemoryArena's ``_split_chunk`` cuts, wherever the boundary falls)."""
    size = tokens * CHARS_PER_TOKEN
    out: list[str] = []
    for r in requests:
        text = transcript([r], nodes)
        out += [text[i:i + size] for i in range(0, len(text), size)] if len(text) > size else [text]
    return tuple(e for e in out if e.strip())


@dataclass(frozen=True)
class BM25Memory(Strategy):
    name: str = "bm25"
    blocks: tuple[str, ...] = TWO_BLOCKS
    rules: ClassVar[str] = BM25_RULES

    def start(self, session: SessionView) -> Start:
        requests = session.requests()
        k = len(requests) + 1
        return Start(k, HistoricalIndex(), ActiveState(request=k), None, entries(requests, session.nodes()))

    def prompt(self, step: StepInput) -> list[Message]:
        # by the request's query, once per request (MemoryArena's wrap_user_prompt): every step's prompt keeps it
        chosen = "".join(step.start.documents[i] for i in okapi(step.start.documents, step.query))
        user = layout(step.query, memory=(tags.RETRIEVED_MEMORY, chosen), state=None, trajectory=step.trajectory,
                      feedback=step.feedback, observation=step.observation)
        return [Message("system", step.system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return list(state.observations)


@dataclass(frozen=True)
class ExtractedMemory(Strategy):
    name: str = "mem0-style"
    blocks: tuple[str, ...] = TWO_BLOCKS
    rules: ClassVar[str] = MEM0_RULES
    ranker: Embeddings | None = None  # Mem0 searches by embeddings (--embed); without, BM25 stands in

    def nearest(self, documents: Sequence[str], query: str, k: int) -> list[int]:
        """The ``k`` stored memories nearest ``query``, in the order they were stored."""
        return sorted(self.ranker.top(documents, query, k)) if self.ranker is not None else rank(documents, query, k)

    def start(self, session: SessionView) -> Start:
        k = session.request_count() + 1
        return Start(k, HistoricalIndex(), ActiveState(request=k), None,
                     tuple(canonical_json({"memory_id": n.id, "fact": n.value.get("fact", "")}) + "\n"
                           for n in live_memories(session.nodes())))

    def prompt(self, step: StepInput) -> list[Message]:
        chosen = "".join(step.start.documents[i] for i in self.nearest(step.start.documents, step.query, TOP_K))
        user = layout(step.query, memory=(tags.MEMORIES, chosen or "none\n"), state=None, trajectory=step.trajectory,
                      feedback=step.feedback, observation=step.observation)
        return [Message("system", step.system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return []  # only the extracted facts cross requests (``finish``)

    def finish(self, ctx: MemoryContext) -> Finish:
        """Extraction (one model call: the request's facts), then the update phase against similar memories."""
        done = interaction(ctx.query, ctx.state.observations, ctx.response)
        generation = ctx.call_model(EXTRACT_CALL, mem0.extraction_prompt(),
                                    mem0.extraction_input(tags.block(tags.INTERACTION, done)[:-1]),
                                    FACTS_GRAMMAR)
        facts, error = _facts(generation.text, ctx.limits)
        calls = [memory_calls.record(generation, "facts", error)]
        stored = {n.id: str(n.value.get("fact", "")) for n in live_memories(ctx.session.nodes())}
        ids = list(stored)
        similar = sorted({ids[i] for fact in facts for i in self.nearest(list(stored.values()), fact, SIMILAR)},
                         key=ids.index)
        events: list[dict[str, str]] = [{"event": "ADD", "id": "new", "text": f} for f in facts]
        if facts:  # Mem0 decides every new fact against the memories found for them (none: an empty memory)
            decided = ctx.call_model(UPDATE_CALL, mem0.UPDATE_PROMPT,
                                     mem0.update_input([stored[i] for i in similar], facts),
                                     UPDATE_GRAMMAR)
            chosen, why = _events(decided.text, similar)
            calls.append(memory_calls.record(decided, "memory", why))
            if chosen is not None:  # an update reply that is not the JSON asked for adds every fact: nothing is lost
                events = chosen
        return Finish(self._nodes(ctx, events), tuple(calls))

    @staticmethod
    def _nodes(ctx: MemoryContext, events: Sequence[dict[str, str]]) -> tuple[Node, ...]:
        """The update phase's decisions as append-only nodes: a new memory (ADD, UPDATE: it replaces the old
        one) or a deletion marker (DELETE)."""
        out: list[Node] = []
        for i, e in enumerate(events, 1):
            text = e["text"].strip()[: ctx.limits.value_text]
            if e["event"] in ("ADD", "UPDATE") and text:
                value = {"fact": text, **({"replaces": e["id"]} if e["event"] == "UPDATE" else {})}
                out.append(Node(id=f"mem_r{ctx.k}_{i}", mark=FACT, type=StateType.KNOWLEDGE, request=ctx.k,
                                summary=text[: ctx.limits.text], value=value))
            elif e["event"] == "DELETE":
                out.append(Node(id=f"mem_r{ctx.k}_{i}", mark=DELETED, type=StateType.JUDGEMENT, request=ctx.k,
                                summary=f"deleted {e['id']}", value={"deletes": e["id"]}))
        return tuple(out)


def live_memories(nodes: Sequence[Node]) -> list[Node]:
    """The memories an update or delete has not retired, in the order they were made."""
    retired = {str(n.value.get("replaces") or n.value.get("deletes")) for n in nodes if n.mark in (FACT, DELETED)}
    return [n for n in nodes if n.mark == FACT and n.id not in retired]


def _events(text: str, shown: Sequence[str]) -> tuple[list[dict[str, str]] | None, str | None]:
    """The update phase's decisions, their temporary ids ("0", "1", …: the memories ``shown``, in order) mapped back
    to the memories' own; or None and why. A decision naming a memory that was not shown is dropped."""
    items = (memory_calls.json_object(text) or {}).get("memory")
    if not isinstance(items, list):
        return None, f"not the JSON {{\"memory\": [...]}} asked for: {text[:120]!r}"
    events = [e.model_dump() for e in map(_event, items) if e is not None]
    kept = []
    for e in events:
        if e["event"] in ("UPDATE", "DELETE"):
            if not (e["id"].isdigit() and int(e["id"]) < len(shown)):
                continue
            e["id"] = shown[int(e["id"])]
        kept.append(e)
    dropped = len(items) - len(kept)
    return kept, f"{dropped} decision(s) dropped: unknown event or id" if dropped else None


def _event(item: Any) -> MemoryEvent | None:
    """One decision as ``MemoryEvent`` reads it (its event in any case), or None: the decision is dropped."""
    if not isinstance(item, dict):
        return None
    try:
        return MemoryEvent.model_validate({**item, "event": str(item.get("event", "")).upper()})
    except ValidationError:
        return None


def _facts(text: str, limits: Limits) -> tuple[list[str], str | None]:
    """The extracted facts, or none and why (an extraction that is not the JSON asked for keeps nothing)."""
    extracted = memory_calls.reply(text, Facts)
    if extracted is None:
        return [], f"not the JSON {{\"facts\": [...]}} asked for: {text[:120]!r}"
    return [f.strip()[: limits.value_text] for f in extracted.facts if f.strip()], None


BM25: Strategy = BM25Memory()
MEM0_STYLE: Strategy = ExtractedMemory()
