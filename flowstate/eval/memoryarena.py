"""``memoryarena``: MemoryArena's own data, for the subsets that need no environment (``--suite memoryarena --data
FILE``): formal reasoning, math and physics.

The file is MemoryArena's JSON Lines as its Hugging Face dataset ``ZexueHe/memoryarena`` publishes them (configs
``formal_reasoning_math`` and ``formal_reasoning_phys``, split ``test``): one task per line, ``{"id", "paper_name"?,
"questions": [...], "answers": [...], "backgrounds": [...]}``, the lists of one length. A task is one session; its
k-th question is request k, shown as MemoryArena's ``MathAgent.build_prompt`` shows it (the question's
background, then the problem). A subtask is graded as MemoryArena's ``MathEnvironment.judge`` grades it: a judge
model (``--judge``) asked, with the released prompt, whether the answer and the reference answer are
mathematically equivalent, correct when its reply contains "yes" (MemoryArena's code calls it without the
question, so the prompt reads ``Question: None``; so does ours). Without a judge a subtask is correct when its
answer equals the reference after normalisation (case, spaces, ``$``, ``\\boxed{}``), and the report says so. SR is
the last subtask correct and PS the share of correct subtasks averaged over tasks, as MemoryArena's
``formal_reasoning_env/eval.py`` computes its pass rate and progress score.

No tools: the agent answers from the request and its memory of earlier ones. The reference policy answers each
question with its reference answer, so under ``--policy oracle`` every method scores 100 by construction: what it
measures is the prompts each memory builds over these sessions (tokens, PET), not quality.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from engine.base import Engine, Message
from engine.jsonl import objects
from flowstate.eval.task import Answer, Call, Decision, Facts, Score, Task
from flowstate.tools import ToolSet

SUITE = "memoryarena"

JUDGE_SYSTEM = "You are a helpful assistant that judges the equivalence of two mathematical expressions."
JUDGE_PROMPT = """
            You are a math expert. 
            Determine if these two expressions are mathematically equivalent answer for the given question:
            Question: {query}
            Expression 1: {action}
            Expression 2: {ground_truth}

            Respond only with "yes" or "no". """
"""MemoryArena's judge prompt (``env/env_systems/math_env.py``), spacing included."""

POLICY = ("Solve the problem described in PROBLEM using the definitions and setup in BACKGROUND if there is any. "
          "Use your memory of earlier requests where it helps: later problems build on earlier answers. "
          "Reply with the final answer.")


def prompt(question: str, background: str | None) -> str:
    """A question as MemoryArena's ``MathAgent.build_prompt`` shows it (a question that carries its own BACKGROUND
    or PROBLEM section is shown as it is)."""
    if "### BACKGROUND" in question or "### PROBLEM" in question:
        return question
    return f"### BACKGROUND:\n{background or 'No information provided.'}\n### PROBLEM:\n{question}"


def normalized(text: str) -> str:
    text = re.sub(r"\\boxed\{(.*)\}", r"\1", text.strip())
    return re.sub(r"[\s$]+", "", text).lower().rstrip(".")


class ArenaTask(Task):
    suite = SUITE

    def __init__(self, task_id: str, questions: list[str], answers: list[str], backgrounds: list[str | None],
                 judge: Engine | None = None) -> None:
        super().__init__(task_id, [prompt(q, b) for q, b in zip(questions, backgrounds, strict=True)])
        self.answers, self.judge = answers, judge

    @property
    def policy(self) -> str:
        return POLICY

    def new_env(self) -> dict[str, Any]:
        return {}

    def tools(self, env: Any) -> ToolSet:
        return ToolSet([])

    def solve(self, k: int, facts: Facts) -> Decision:
        return Answer(self.answers[k - 1])

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        return Answer(self.answers[k - 1])

    def check(self, k: int, response: str | None, env: Any) -> Score:
        if response is None:
            return Score(False, 0.0)
        expected = self.answers[k - 1]
        if self.judge is None:
            ok = normalized(response) == normalized(expected)
        else:
            reply = self.judge.generate([Message("system", JUDGE_SYSTEM), Message("user", JUDGE_PROMPT.format(
                query=None, action=response, ground_truth=expected))]).text
            ok = "yes" in reply.lower()
        return Score(ok, float(ok))


def read(path: str | Path | None, tasks: int, judge: Engine | None = None) -> list[ArenaTask]:
    """The first ``tasks`` tasks of a MemoryArena JSON Lines file."""
    if path is None:
        raise ValueError("memoryarena reads MemoryArena's JSON Lines: give --data FILE (the Hugging Face dataset "
                         "ZexueHe/memoryarena, config formal_reasoning_math or formal_reasoning_phys, split test)")
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"no MemoryArena data at {p}")
    out = []
    for n, row in objects(p, "MemoryArena data"):
        questions, answers = row.get("questions"), row.get("answers")
        backgrounds = row.get("backgrounds") or [None] * len(questions or [])
        if not (isinstance(questions, list) and isinstance(answers, list) and questions
                and len(questions) == len(answers) == len(backgrounds)):
            raise ValueError(f"{p}, line {n}: expected questions, answers and backgrounds as lists of one length")
        out.append(ArenaTask(str(row.get("id", n)), [str(q) for q in questions], [str(a) for a in answers],
                             [None if b is None else str(b) for b in backgrounds], judge))
        if len(out) == tasks:
            break
    if not out:
        raise ValueError(f"{p} holds no task")
    return out
