"""Retrieval baselines on the strategy seam: BM25 over earlier requests, and Mem0-style extracted memories.

- ``bm25`` (the paper's BM25 baseline, MemoryArena's protocol): every earlier request is one document (its
  query, tool calls with results, response); before each step the ``TOP_K`` documents most similar to the
  current request and its tool results so far are shown in ``<retrieved_memory>``. Ranking is BM25 from
  ``bm25s``. No state, the two-block protocol of full context.
- ``mem0-style`` (Mem0's extraction memory, reduced to its core): when a request ends, one model call
  extracts the facts worth remembering (their tokens count for the method); each fact is a node. At the
  start of a request the ``TOP_K`` facts most similar to its query (BM25 here, where Mem0 embeds) are shown in
  ``<memories>``. Tool results are not kept; the memories are all that crosses requests.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.base import Message
from flowstate import tags
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.limits import STANDARD, Limits
from flowstate.memory import calls as memory_calls
from flowstate.memory.base import Finish, MemoryContext, Start, Strategy, interaction, transcript
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.serializer import layout, render_observation, system_prompt
from flowstate.store.repository import Repository
from flowstate.tags import EXTRACT

FACT = "mem0.fact"  # the mark of an extracted fact's node
TOP_K = 5  # as MemoryArena's baselines (and MAGE's comparison) fix it
TWO_BLOCKS = ("tool_calls", "assistant_message")

BM25_RULES = f"""\
## memory
Earlier requests of this session are not all shown: the {TOP_K} most similar to this request and its tool \
results so far are in <retrieved_memory>, each with its query, tool calls and results, and response. This \
request's earlier tool results are in <trajectory>, the newest in <latest_observation>."""

MEM0_RULES = f"""\
## memory
Facts remembered from earlier requests of this session, the {TOP_K} most relevant to this request, are in \
<memories>. This request's earlier tool results are in <trajectory>, the newest in <latest_observation>."""

EXTRACT_PROMPT = f"""{EXTRACT}
You maintain the memory of an agent. From the interaction below (a user request, the agent's tool calls \
with their results, and its response), extract the facts that later requests may need: identifiers, \
numbers, choices made, requirements, results. Write each fact as one self-contained sentence that names \
what it is about. Reply with JSON only: {{"facts": ["..."]}}."""

FACTS_GRAMMAR = ('start: %json {"type": "object", "properties": {"facts": {"type": "array", "maxItems": 16, '
                 '"items": {"type": "string", "maxLength": 400}}}, "required": ["facts"], "additionalProperties": false}')


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


@functools.lru_cache(maxsize=32)
def _index(documents: tuple[str, ...]) -> Any:
    """The BM25 index of a request's documents, built once for all its steps (they stay the same)."""
    import bm25s

    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(list(documents), stopwords="en", show_progress=False), show_progress=False)
    return retriever


@dataclass(frozen=True)
class BM25Memory(Strategy):
    name: str = "bm25"
    blocks: tuple[str, ...] = TWO_BLOCKS

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        return system_prompt(tools, policy, self.blocks, BM25_RULES, limits)

    def start(self, repo: Repository, session: str) -> Start:
        requests, nodes = repo.requests(session), repo.nodes(session)
        k = len(requests) + 1
        documents = tuple(transcript([r], [n for n in nodes if n.request == r.index]) for r in requests)
        return Start(k, HistoricalIndex(), ActiveState(request=k), None, documents)

    def prompt(
        self, system: str, query: str, start: Start, state: ActiveState,
        feedback: Sequence[dict[str, Any]], observation: Sequence[Node],
    ) -> list[Message]:
        trajectory = state.observations[: len(state.observations) - len(observation)]
        probe = query + "\n" + render_observation(state.observations)  # the current request's trace so far
        chosen = "".join(start.documents[i] for i in rank(start.documents, probe))
        user = layout(query, memory=(tags.RETRIEVED_MEMORY, chosen), state=None, trajectory=trajectory,
                      feedback=feedback, observation=observation)
        return [Message("system", system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return list(state.observations)


@dataclass(frozen=True)
class ExtractedMemory(Strategy):
    name: str = "mem0-style"
    blocks: tuple[str, ...] = TWO_BLOCKS

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        return system_prompt(tools, policy, self.blocks, MEM0_RULES, limits)

    def start(self, repo: Repository, session: str) -> Start:
        k = repo.request_count(session) + 1
        facts = tuple(n for n in repo.nodes(session) if n.mark == FACT)
        return Start(k, HistoricalIndex(), ActiveState(request=k), None,
                     tuple(canonical_json({"memory_id": n.id, "fact": n.value.get("fact", "")}) + "\n" for n in facts))

    def prompt(
        self, system: str, query: str, start: Start, state: ActiveState,
        feedback: Sequence[dict[str, Any]], observation: Sequence[Node],
    ) -> list[Message]:
        trajectory = state.observations[: len(state.observations) - len(observation)]
        chosen = "".join(start.documents[i] for i in rank(start.documents, query))  # per request, as Mem0's search
        user = layout(query, memory=(tags.MEMORIES, chosen or "none\n"), state=None, trajectory=trajectory,
                      feedback=feedback, observation=observation)
        return [Message("system", system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return []  # only the extracted facts cross requests (``finish``)

    def finish(self, ctx: MemoryContext) -> Finish:
        """One model call extracts the request's facts; each becomes a node ``mem_r{k}_{i}``."""
        done = interaction(ctx.query, ctx.state.observations, ctx.response)
        generation = ctx.call_model(EXTRACT_PROMPT, tags.block(tags.INTERACTION, done)[:-1], FACTS_GRAMMAR)
        facts, error = _facts(generation.text, ctx.limits)
        nodes = tuple(Node(id=f"mem_r{ctx.k}_{i}", mark=FACT, type=StateType.KNOWLEDGE, request=ctx.k,
                           summary=fact[: ctx.limits.text], value={"fact": fact}) for i, fact in enumerate(facts, 1))
        return Finish(nodes, (memory_calls.record(generation, "facts", error),))


def _facts(text: str, limits: Limits) -> tuple[list[str], str | None]:
    """The extracted facts, or none and why (an extraction that is not the JSON asked for keeps nothing)."""
    facts = (memory_calls.json_object(text) or {}).get("facts")
    if not isinstance(facts, list) or not all(isinstance(f, str) for f in facts):
        return [], f"not the JSON {{\"facts\": [...]}} asked for: {text[:120]!r}"
    return [f.strip()[: limits.value_text] for f in facts if f.strip()][:16], None


BM25: Strategy = BM25Memory()
MEM0_STYLE: Strategy = ExtractedMemory()
