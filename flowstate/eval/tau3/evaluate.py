"""τ³'s grading of one conversation: the database, what was communicated, the actions, NL assertions.

- DB: the gold actions replayed on a fresh database must leave it in the same state (hash) as the
  agent's run did.
- COMMUNICATE: each ``communicate_info`` string appears in some agent message (case-insensitive,
  commas dropped from the message), as τ³ checks it.
- ACTION (reported as action accuracy; part of the reward only where the task's basis says so): each
  gold action matches one of the agent's tool calls by name and by ``compare_args`` (all arguments
  when unset).
- NL_ASSERTION: natural-language assertions about the conversation, checked by a judge model when
  one is given.

As tau2 grades: a conversation that did not end normally (the user's stop token; not the turn cap, not a
failed request) scores 0 whatever its database; a reward-basis check that could not run (NL assertions
without a judge) leaves the task *unscored* (reward None) — never passed; its DB check is still reported,
as the "DB-only" figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.base import Engine, Message
from flowstate.eval.tau3.domain import db_hash
from flowstate.eval.tau3.tasks import Tau3Task
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


JUDGE = """You grade a customer-service conversation against assertions about the agent's behaviour.
For each assertion, decide from the conversation alone whether it holds.
Reply with JSON only: {"results": [{"assertion": "...", "met": true or false, "why": "..."}]}, one entry per \
assertion, in the order given."""


def judge_assertions(judge: Engine, assertions: Sequence[str], conversation: Sequence[tuple[str, str]],
                     ) -> tuple[list[bool], str | None]:
    """Ask a judge model; an answer that is not the JSON asked for counts every assertion as unmet."""
    transcript = "\n".join(f"{role}: {text}" for role, text in conversation)
    prompt = f"<conversation>\n{transcript}\n</conversation>\n<assertions>\n" + \
        "\n".join(f"- {a}" for a in assertions) + "\n</assertions>"
    text = judge.generate([Message("system", JUDGE), Message("user", prompt)], max_tokens=1024).text
    results = (json_object(text) or {}).get("results")
    try:
        verdicts = [bool(r["met"]) for r in results] if isinstance(results, list) else []
    except (KeyError, TypeError):
        verdicts = []
    if len(verdicts) != len(assertions):
        return [False] * len(assertions), f"the judge's answer was not one verdict per assertion: {text[:200]!r}"
    return verdicts, None


def grade(task: Tau3Task, db: dict[str, Any], calls: Sequence[dict[str, Any]],
          conversation: Sequence[tuple[str, str]], judge: Engine | None = None, ended_normally: bool = True) -> Grade:
    """Grade a finished conversation: ``db`` as the run left it, the agent's executed ``calls``
    (name, arguments) and the ``conversation`` as (role, text) pairs; ``ended_normally``: the user ended it."""
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
    if judge is not None and assertions:
        nl, note = judge_assertions(judge, assertions, conversation)
    parts = {"DB": [db_match], "COMMUNICATE": communicate, "ACTION": actions, "NL_ASSERTION": nl}
    run = [b for b in basis if parts.get(b) is not None]
    skipped = [b for b in basis if parts.get(b) is None]
    reward: float | None = 1.0 if all(all(parts[b] or ()) for b in run) else 0.0
    if not ended_normally:
        reward = 0.0  # tau2 grades only a conversation that ended normally
    elif skipped:
        reward = None  # a check of the reward basis did not run: unscored, never passed
    return Grade(reward, run, skipped, db_match, communicate, actions, nl, errors, note, ended_normally)
