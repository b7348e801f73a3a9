"""ReasoningBank (Ouyang et al., 2026) on the strategy seam, as MemoryArena's ``ReasoningBankMemorySystem`` runs it
(``memory/memory_systems/reasoningbank.py``): ``reasoningbank``.

ReasoningBank distils *strategies*, not facts. When a request ends, a judge call labels its trajectory (the query,
the tool calls with their results, the response) ``success`` or ``fail`` (no ground truth); an extraction call,
under the released ``SUCCESSFUL_SI`` or ``FAILED_SI`` instruction, writes at most ``ITEMS`` memory items in their
Markdown format (title, description, content), kept as the record of that request. Before a new request the
``TOP_K`` records whose trajectory is most similar to its query are shown (``<strategy_memory>``), best first.
MemoryArena ranks by an embedding of the trajectory (its first ``EMBED_CHARS`` characters) against an instructed
query; BM25Okapi on the same texts stands in here. Records are only added. Tool results and facts are not kept:
across requests the agent has the distilled strategies and nothing else, so a request that needs an earlier
request's *facts* cannot find them here, by design of the method.

The judge and extraction prompts are the released ones (MemoryArena's copy of ReasoningBank's), each behind the
marker line that names the call; the outputs are held to their format by a grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from engine.base import Message
from engine.purpose import Purpose
from flowstate import tags
from flowstate.active import ActiveState
from flowstate.history import HistoricalIndex
from flowstate.memory import calls as memory_calls
from flowstate.memory.base import Finish, MemoryContext, Start, StepInput, Strategy, interaction
from flowstate.memory.ranking import Embeddings, okapi
from flowstate.memory.reference import read_interaction
from flowstate.memory.retrieval import TWO_BLOCKS
from flowstate.nodes import Node, StateType, canonical_json
from flowstate.serializer import layout
from flowstate.store.repository import SessionView
from flowstate.tags import DISTILL, JUDGE

ITEM = "reasoningbank.item"  # the mark of a request's record (its memory items) in the store
ITEMS = 3  # memory items per trajectory at most (the released extraction prompts)
TOP_K = 5  # records retrieved per request (MemoryArena's ReasoningBankMemorySystem(topk=5))
EMBED_CHARS = 4_096  # what of a trajectory MemoryArena embeds (text[:4096]); here, what BM25 ranks

RULES = f"""\
## memory
<strategy_memory> holds the records of up to {TOP_K} earlier requests of this session most similar to this \
request, the most similar first: each whether it succeeded and the memory items distilled from it (how it was \
solved, or what went wrong). They hold no facts of those requests. This request's earlier tool results are in \
<trajectory>, the newest in <latest_observation>."""

JUDGE_PROMPT = f"""{JUDGE}
You are a helpful assistant that judges whether the agent successfully completed the task."""
JUDGE_QUESTION = "\n\nDid the agent successfully complete the task? Answer with 'success' or 'fail' only."

_FORMAT = """
## Output Format
Your output must strictly follow the Markdown format shown below:

```
# Memory Item i
## Title <the title of the memory item>
## Description <one sentence summary of the memory item>
## Content <1-3 sentences describing the insights learned to successfully resolve the issue in the future>
```"""

SUCCESSFUL_SI = f"""{DISTILL}
You are a memory expert. You will be given a task query to be completed, the corresponding trajectory that \
represents **how an agent successfully solved the task**.

## Guidelines
You need to extract and summarize useful insights in the format of memory items based on the agent's successful \
trajectory.
The goal of summarized memory items is to be helpful and generalizable for future similar tasks.

## Important notes
  - You must first think why the trajectory is successful, and then summarize the insights.
  - You can extract *at most 3* memory items from the trajectory.
  - You must not repeat similar or overlapping items.
  - Do not mention specific websites, queries, or string contents, but rather focus on the generalizable insights.
{_FORMAT}"""

FAILED_SI = f"""{DISTILL}
You are a memory expert. You will be given a task query to be completed, the corresponding trajectory that \
represents **how an agent attempted to resolve the task but failed**.

## Guidelines
You need to extract and summarize useful insights in the format of memory items based on the agent's failed \
trajectory.
The goal of summarized memory items is to be helpful and generalizable for future similar tasks.

## Important notes
  - You must first reflect and think why the trajectory failed, and then summarize what lessons you have learned \
or strategies to prevent the failure in the future.
  - You can extract *at most 3* memory items from the trajectory.
  - You must not repeat similar or overlapping items.
  - Do not mention specific websites, queries, or string contents, but rather focus on the generalizable insights.
{_FORMAT}"""

JUDGE_GRAMMAR = 'start: "success" | "fail"'


def _distilled(user: str, ref: Any) -> str:
    """Extraction as a reference policy answers it: the strategy of the request — which tools, in which order — with
    no facts of it, in the released Markdown format (so a later request that needs those facts has none)."""
    query, lines = read_interaction(user)
    used = list(dict.fromkeys(str(i["tool"]) for i in lines if "observation_id" in i and "tool" in i))
    steps = ", then ".join(used) if used else "no tool"
    title = " ".join(query.split())[:60] or "the request"
    return (f"# Memory Item 1\n## Title Strategy for: {title}\n## Description The tools that answered it.\n"
            f"## Content Call {steps}, then answer from the results.")


JUDGE_CALL = Purpose("reasoningbank.judge",  # a word, not JSON; a reference policy says whether the request answered
                     reference=lambda user, ref: "success" if ref.answered(user) else "fail")
DISTILL_CALL = Purpose("reasoningbank.distill", reference=_distilled)  # the released Markdown items
_ITEM = r'"# Memory Item " /[1-3]/ "\n## Title " LINE "\n## Description " LINE "\n## Content " LINE'
ITEMS_GRAMMAR = (f"start: item | item SEP item | item SEP item SEP item\nitem: {_ITEM}\nSEP: \"\\n\\n\"\n"
                 "LINE: /[^\\n#]{1,400}/")
"""The released Markdown format, one to three items (a line of text after each heading)."""

ITEM_SHAPE = re.compile(r"# Memory Item \d+\n## Title [^\n]+\n## Description [^\n]+\n## Content [^\n]+")


def items_of(text: str) -> list[str]:
    """The memory items of an extraction's reply, split as MemoryArena splits them (at blank lines), those of the
    released format kept (at most ``ITEMS``)."""
    return [part.strip() for part in text.strip().split("\n\n") if ITEM_SHAPE.fullmatch(part.strip())][:ITEMS]


@dataclass(frozen=True)
class ReasoningBank(Strategy):
    name: str = "reasoningbank"
    blocks: tuple[str, ...] = TWO_BLOCKS
    rules: ClassVar[str] = RULES
    ranker: Embeddings | None = None  # MemoryArena embeds the trajectories (--embed); without, BM25 stands in

    def start(self, session: SessionView) -> Start:
        k = session.request_count() + 1
        records = [n for n in session.nodes() if n.mark == ITEM]
        shown = tuple(canonical_json({"record_id": n.id, "status": n.value.get("status"),
                                      "memory_items": n.value.get("memory_items", [])}) + "\n" for n in records)
        # what ranks a record: its trajectory (MemoryArena embeds it), kept beside the record, never shown
        keys = tuple(str(n.value.get("trajectory", "")) for n in records)
        return Start(k, HistoricalIndex(), ActiveState(request=k), None, shown, data={"keys": keys})

    def prompt(self, step: StepInput) -> list[Message]:
        keys = step.start.data.get("keys", ())  # by the query, once per request, as wrap_user_prompt retrieves
        ranked = self.ranker.top(keys, step.query, TOP_K) if self.ranker is not None else okapi(keys, step.query, TOP_K)
        chosen = "".join(step.start.documents[i] for i in ranked)
        user = layout(step.query, memory=(tags.STRATEGY_MEMORY, chosen or "none\n"), state=None,
                      trajectory=step.trajectory, feedback=step.feedback, observation=step.observation)
        return [Message("system", step.system), Message("user", user)]

    def persisted(self, state: ActiveState, response: str | None) -> list[Node]:
        return []  # only the distilled records cross requests (``finish``)

    def finish(self, ctx: MemoryContext) -> Finish:
        """The judge's call, then the extraction's under the instruction for its verdict; the record is a node
        ``rb_r{k}``."""
        trajectory = interaction(ctx.query, ctx.state.observations, ctx.response)
        judged = ctx.call_model(JUDGE_CALL, JUDGE_PROMPT, f"Task and Trajectory:\n{trajectory}{JUDGE_QUESTION}",
                                JUDGE_GRAMMAR)
        success = "success" in judged.text.strip().lower()  # as MemoryArena reads the verdict
        verdict = None if judged.text.strip().lower() in ("success", "fail") else "neither 'success' nor 'fail'"
        calls = [memory_calls.record(judged, "judgement", verdict)]
        distilled = ctx.call_model(DISTILL_CALL, SUCCESSFUL_SI if success else FAILED_SI,
                                   f"**Query and Trajectory:**\n{trajectory}", ITEMS_GRAMMAR)
        items = items_of(distilled.text)
        calls.append(memory_calls.record(distilled, "items", None if items else "no memory item in the format"))
        if not items:
            return Finish((), tuple(calls))
        record = Node(id=f"rb_r{ctx.k}", mark=ITEM, type=StateType.JUDGEMENT, request=ctx.k,
                      summary=items[0].split("\n")[1].removeprefix("## Title ")[: ctx.limits.text],
                      value={"status": "success" if success else "fail", "memory_items": items,
                             "trajectory": trajectory[:EMBED_CHARS]})
        return Finish((record,), tuple(calls))


REASONINGBANK: Strategy = ReasoningBank()
