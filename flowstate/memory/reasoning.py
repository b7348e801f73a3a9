"""ReasoningBank (Ouyang et al., 2026) on the strategy seam: ``reasoningbank``.

ReasoningBank distils *strategies*, not facts: when a task ends, an LLM-as-judge labels its trajectory a
success or a failure (no ground truth), and an extraction call distils at most ``ITEMS`` memory items from
it — each a title, a one-line description and content (the reasoning or the decision that worked, or the
lesson of a failure and how to avoid it). Before a new task the ``TOP_K`` items most similar to its query
are retrieved (ReasoningBank embeds; BM25 here) and shown to the agent (``<strategy_memory>``); memories are
only added. Tool results and facts are not kept: across requests the agent has the distilled strategies
and nothing else. So a request that needs an earlier request's *facts* cannot find them here, by design of
the method — the README says which suites that makes unsolvable for its reference policy.
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
from flowstate.memory.base import Finish, MemoryContext, Start, StepInput, Strategy, interaction
from flowstate.memory.retrieval import TWO_BLOCKS, retrieve
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.serializer import layout, system_prompt
from flowstate.store.repository import Repository
from flowstate.tags import DISTILL, JUDGE

ITEM = "reasoningbank.item"  # the mark of a memory item's node
ITEMS = 3  # items distilled per trajectory at most (ReasoningBank's extraction prompt)
TOP_K = 1  # items retrieved per task (ReasoningBank's default)

RULES = f"""\
## memory
<strategy_memory> holds the {TOP_K} strategy item(s) distilled from earlier requests of this session most \
similar to this request: how a similar request was solved, or what went wrong. They hold no facts of those \
requests. This request's earlier tool results are in <trajectory>, the newest in <latest_observation>."""

JUDGE_PROMPT = f"""{JUDGE}
You judge an agent's trajectory: given the user's request, the agent's tool calls with their results and its \
final response, did the agent accomplish the request? Reply with JSON only: \
{{"success": true or false, "reason": "..."}}."""

DISTILL_PROMPT = f"""{DISTILL}
You distil reusable strategies from an agent's trajectory, judged a {{outcome}}. Write at most {ITEMS} memory \
items that would help with similar requests later: for a success, the reasoning and decisions that worked; \
for a failure, what went wrong and how to avoid it. Each item: a title, a one-sentence description, and \
content of a few sentences. Generalize: no request-specific identifiers. Reply with JSON only: \
{{{{"items": [{{{{"title": "...", "description": "...", "content": "..."}}}}]}}}}."""

JUDGE_GRAMMAR = ('start: %json {"type": "object", "properties": {"success": {"type": "boolean"}, "reason": {"type": '
                 '"string", "maxLength": 400}}, "required": ["success", "reason"], "additionalProperties": false}')
ITEMS_GRAMMAR = ('start: %json {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": '
                 '{"type": "object", "properties": {"title": {"type": "string", "maxLength": 120}, "description": '
                 '{"type": "string", "maxLength": 300}, "content": {"type": "string", "maxLength": 1200}}, "required": '
                 '["title", "description", "content"], "additionalProperties": false}}}, "required": ["items"], '
                 '"additionalProperties": false}')


@dataclass(frozen=True)
class ReasoningBank(Strategy):
    name: str = "reasoningbank"
    blocks: tuple[str, ...] = TWO_BLOCKS

    def system_prompt(self, tools: Sequence[dict[str, Any]], policy: str = "", limits: Limits = STANDARD) -> str:
        return system_prompt(tools, policy, self.blocks, RULES, limits)

    def start(self, repo: Repository, session: str) -> Start:
        k = repo.request_count(session) + 1
        items = tuple(canonical_json({"item_id": n.id, **n.value}) + "\n" for n in repo.nodes(session) if n.mark == ITEM)
        return Start(k, HistoricalIndex(), ActiveState(request=k), None, items)

    def prompt(self, step: StepInput) -> list[Message]:
        chosen = retrieve(step.start.documents, step.query, TOP_K)  # per request, by the query, as ReasoningBank retrieves
        user = layout(step.query, memory=(tags.STRATEGY_MEMORY, chosen or "none\n"), state=None,
                      trajectory=step.trajectory, feedback=step.feedback, observation=step.observation)
        return [Message("system", step.system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return []  # only the distilled items cross requests (``finish``)

    def finish(self, ctx: MemoryContext) -> Finish:
        """The judge's call, then the distillation's; each item becomes a node ``rb_r{k}_{i}``."""
        done = tags.block(tags.TRAJECTORY_TO_JUDGE, interaction(ctx.query, ctx.state.observations, ctx.response))[:-1]
        judged = ctx.call_model(JUDGE_PROMPT, done, JUDGE_GRAMMAR)
        verdict = memory_calls.json_object(judged.text)
        success = bool(verdict.get("success")) if verdict is not None else ctx.response is not None
        calls = [memory_calls.record(judged, "judgement", None if verdict is not None else "no verdict")]
        distilled = ctx.call_model(DISTILL_PROMPT.format(outcome="success" if success else "failure"), done,
                                   ITEMS_GRAMMAR)
        items = (memory_calls.json_object(distilled.text) or {}).get("items")
        valid = [i for i in items if isinstance(i, dict) and all(isinstance(i.get(f), str) for f in
                                                                    ("title", "description", "content"))] \
            if isinstance(items, list) else []
        calls.append(memory_calls.record(distilled, "items", None if isinstance(items, list) else "no items"))
        nodes = tuple(Node(id=f"rb_r{ctx.k}_{n}", mark=ITEM, type=StateType.JUDGEMENT, request=ctx.k,
                           summary=i["title"][: ctx.limits.text],
                           value={"title": i["title"], "description": i["description"], "content": i["content"],
                                  "outcome": "success" if success else "failure"})
                      for n, i in enumerate(valid[:ITEMS], 1))
        return Finish(nodes, tuple(calls))


REASONINGBANK: Strategy = ReasoningBank()
