"""τ³'s grading of one conversation: the database, what was communicated, the actions, NL assertions.

- DB: the gold actions replayed on a fresh database must leave it in the same state (hash) as the
  conversation's tool calls replayed on another (``replay_calls``, as tau2's environment check does) — so the
  database is checked the same way whether the run's tools were the domain's own or an MCP server's.
- COMMUNICATE: each ``communicate_info`` string appears in some agent message (case-insensitive,
  commas dropped from the message), as τ³ checks it.
- ACTION (reported as action accuracy; part of the reward only where the task's basis says so): each
  gold action matches one of the agent's tool calls by name and by ``compare_args`` (all arguments
  when unset).
- NL_ASSERTION: natural-language assertions about the conversation, checked by a judge model when
  one is given, with tau2's judge prompt over the whole trajectory (tool calls and results included); a task with
  none scores 1.0 on it, as tau2's does ("No nl_assertions to evaluate").

As tau2 grades: a conversation that did not end normally (the user's stop token; not the turn cap, not a
failed request, too many tool errors) scores 0 whatever its database, and its checks are not counted in the
accuracies; a reward-basis check that could not run (NL assertions
without a judge) leaves the task *unscored* (reward None) — never passed; its DB check is still reported,
as the "DB-only" figure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.base import Engine, Message
from flowstate.eval.tau3.domain import db_hash
from flowstate.eval.tau3.tasks import Tau3Task
from flowstate.mcp.content import through_fastmcp
from flowstate.memory.calls import json_object


@dataclass
class Grade:
    reward: float | None  # None: unscored (a reward-basis check could not run)
    checks_run: list[str]
    checks_skipped: list[str]
    db_match: bool
    communicate: list[bool]
    actions: list[bool]
    nl: list[bool] | None
    gold_errors: list[str] = field(default_factory=list)
    judge_note: str | None = None
    ended_normally: bool = True  # False: cut by the turn cap or a failed request, so the reward is 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay_gold(task: Tau3Task) -> tuple[str, list[str]]:
    """The hash of a fresh database after the gold actions, and the errors they raised (τ³ ignores them)."""
    db = task.new_env()
    tools = task.tools(db)
    errors = []
    for action in task.actions:
        _, error = tools.call(action["name"], action["arguments"])
        if error:
            errors.append(f"{action['name']}: {error}")
    return db_hash(db), errors


_PREFIX = re.compile(r"^(Error executing tool \w+: )?(\w+(Error|Exception): )?")


def same_result(call: dict[str, Any], result: Any, error: str | None) -> bool:
    """Whether a call's result as the run saw it (an MCP server's) is the domain's own tool's for the same call: the
    same value as a FastMCP server sends it, or an error with the same message (its prefixes dropped)."""
    seen = call.get("error")
    if seen is not None or error is not None:
        return seen is not None and error is not None and _PREFIX.sub("", str(seen)) == _PREFIX.sub("", error)
    return bool(call.get("result") == through_fastmcp(result))


def replay_calls(task: Tau3Task, calls: Sequence[dict[str, Any]], compare: bool = False,
                 ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A fresh database after the conversation's tool calls, replayed in order on the domain's own tools (the
    database tau2 checks); with ``compare``, every call whose result there differs from the one the run saw."""
    db = task.new_env()
    tools = task.tools(db)
    differ = []
    for at, call in enumerate(calls):
        if call["name"] not in tools:
            continue  # the memory method's own tools
        result, error = tools.call(call["name"], call["arguments"])
        if compare and not same_result(call, result, error):
            differ.append({"at": at, "name": call["name"], "arguments": call["arguments"],
                           "seen": call.get("result", call.get("error")), "native": result if error is None else error})
    return db, differ


def action_matches(action: dict[str, Any], call: dict[str, Any]) -> bool:
    if action["name"] != call["name"]:
        return False
    keys = action.get("compare_args")
    keys = list(call["arguments"]) if keys is None else keys
    if not keys:
        return True
    return {k: v for k, v in call["arguments"].items() if k in keys} == \
        {k: v for k, v in action["arguments"].items() if k in keys}


def communicated(info: str, messages: Sequence[str]) -> bool:
    return any(info.lower() in m.lower().replace(",", "") for m in messages)


JUDGE = """
        TASK
        - You will be given a list of expected outcomes and a conversation that was collected during a test case run.
        - The conversation is between an agent and a customer.
        - Your job is to evaluate whether the agent satisfies each of the expected outcomes.
        - Grade each expected outcome individually.

        FORMAT
        - Your response should be a JSON object with the following fields:
        - `reasoning`: a short explanation for your classification
        - `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise
        - `expectedOutcome`: repeat the expectation from the input that you are grading
        
        Example response structure:
        {
            "results": [
                {
                    "expectedOutcome": "<one of the expected outcomes from the input>",
                    "reasoning": "<reasoning trace>",
                    "metExpectation": <false or true>,
                }
            ]
        }
        """
"""tau2's NL-assertion judge's system prompt at v1.0.1 (``evaluator_nl_assertions.py``), word for word: the benchmark's
grading is part of its definition."""


def judge_prompt(assertions: Sequence[str], trajectory: Sequence[tuple[str, str]]) -> str:
    """The judge's user message as tau2 writes it: every message of the trajectory as ``role: content`` (tool calls'
    turns and tool results included), then the assertions as a Python list."""
    lines = "\n".join(f"{role}: {content}" for role, content in trajectory)
    return f"""
        conversation:
        {lines}
        
        expectedOutcomes:
        {list(assertions)}
        """


def judge_assertions(judge: Engine, assertions: Sequence[str], trajectory: Sequence[tuple[str, str]],
                     ) -> tuple[list[bool], str | None]:
    """Ask a judge model, as tau2 does: the reward is whether every outcome it returns is met. An answer that is not
    the JSON asked for (tau2's run would stop on it) counts every assertion as unmet, with a note."""
    text = judge.generate([Message("system", JUDGE), Message("user", judge_prompt(assertions, trajectory))],
                          max_tokens=1024).text
    results = (json_object(text) or {}).get("results")
    try:
        verdicts = [r["metExpectation"] in (True, "true") for r in results] if isinstance(results, list) else None
    except (KeyError, TypeError):
        verdicts = None
    if verdicts is None:
        return [False] * len(assertions), f"the judge's answer was not the JSON asked for: {text[:200]!r}"
    note = None if len(verdicts) == len(assertions) else \
        f"the judge graded {len(verdicts)} of {len(assertions)} outcomes (tau2 takes its results as they are)"
    return verdicts, note


def grade(task: Tau3Task, db: dict[str, Any], calls: Sequence[dict[str, Any]],
          conversation: Sequence[tuple[str, str]], judge: Engine | None = None, ended_normally: bool = True,
          trajectory: Sequence[tuple[str, str]] | None = None) -> Grade:
    """Grade a finished conversation: ``db`` as its calls left it (``replay_calls``), the agent's executed ``calls``
    (name, arguments) and the ``conversation`` as (role, text) pairs; ``ended_normally``: the user ended it;
    ``trajectory``: every message as (role, content), tool calls and results included, as the judge reads it
    (default: the conversation)."""
    criteria = task.spec["evaluation_criteria"]
    basis = list(criteria.get("reward_basis") or ["DB", "COMMUNICATE"])
    gold, errors = replay_gold(task)
    db_match = gold == db_hash(db)
    agent_messages = [text for role, text in conversation if role == "assistant"]
    communicate = [communicated(i, agent_messages) for i in criteria.get("communicate_info") or []]
    actions = [any(action_matches(a, c) for c in calls) for a in task.actions]
    nl: list[bool] | None = None
    note = None
    assertions = criteria.get("nl_assertions") or []
    if not assertions and "NL_ASSERTION" in basis:
        nl, note = [], "no nl_assertions to evaluate"  # tau2 scores it 1.0, judge or none
    elif assertions and judge is not None:
        nl, note = judge_assertions(judge, assertions, trajectory if trajectory is not None else conversation)
    parts = {"DB": [db_match], "COMMUNICATE": communicate, "ACTION": actions, "NL_ASSERTION": nl}
    run = [b for b in basis if parts.get(b) is not None]
    skipped = [b for b in basis if parts.get(b) is None]
    reward: float | None = 1.0 if all(all(parts[b] or ()) for b in run) else 0.0
    if not ended_normally:
        reward = 0.0  # tau2 grades only a conversation that ended normally
    elif skipped:
        reward = None  # a check of the reward basis did not run: unscored, never passed
    return Grade(reward, run, skipped, db_match, communicate, actions, nl, errors, note, ended_normally)
