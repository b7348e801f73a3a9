"""The user side of a τ³ conversation: a scripted user for tests and reference runs, and a user simulator
on an engine of its own, following τ³'s user-simulator rules.

Each user message is one FlowState request; the conversation ends when the user says one of τ³'s
stop tokens (or the turn budget runs out).
"""

from __future__ import annotations

from typing import Protocol

from engine.base import Engine, Message
from flowstate.eval.tau3.tasks import Tau3Task

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
STOP_TOKENS = (STOP, TRANSFER, OUT_OF_SCOPE)
GREETING = "Hi! How can I help you today?"
CONFIRM_QUESTION = "Shall I proceed?"
CONFIRM = "Yes, please go ahead."


def ends(message: str) -> bool:
    return any(token in message for token in STOP_TOKENS)


class User(Protocol):
    def first(self) -> str:
        """The user's opening message (after the agent's greeting)."""

    def reply(self, agent_message: str) -> str:
        """The user's answer to the agent's latest message (a stop token ends the conversation)."""


class ScriptedUser:
    """States the reason for the call and who they are, confirms once when asked, then stops."""

    def __init__(self, task: Tau3Task) -> None:
        self.task = task
        self.confirmed = False

    def first(self) -> str:
        s = self.task.scenario
        return "\n".join(part.strip() for part in (s.get("reason_for_call"), s.get("known_info")) if part)

    def reply(self, agent_message: str) -> str:
        if agent_message.rstrip().endswith(CONFIRM_QUESTION) and not self.confirmed:
            self.confirmed = True
            return CONFIRM
        return TRANSFER if "transfer" in agent_message.lower() and "human" in agent_message.lower() else STOP


RULES = f"""You are a user talking to a customer-service agent. Follow your instructions below to play the user.
- Write one message at a time, as a user would; say only what the current step of the conversation needs, \
not everything at once.
- Never make up information that the instructions do not give you; if the agent asks for something you do \
not know, say so.
- Do not repeat the instructions verbatim; use your own words. Stay in character.
- When the instructions are satisfied (or cannot be), end the conversation: write {STOP} alone as your \
message.
- If you are transferred to another agent, write {TRANSFER}. If the instructions do not cover what the \
conversation has turned to, write {OUT_OF_SCOPE}."""


def instructions(task: Tau3Task) -> str:
    s = task.scenario
    persona = task.spec["user_scenario"].get("persona")
    parts = [("Persona", persona), ("Reason for the call", s.get("reason_for_call")),
             ("What you know", s.get("known_info")), ("What you do not know", s.get("unknown_info")),
             ("Task instructions", s.get("task_instructions"))]
    return "\n\n".join(f"## {title}\n{text.strip()}" for title, text in parts if text)


class SimulatedUser:
    """A user played by a model: its system prompt is τ³'s rules and the task's user instructions; the agent's
    messages are its ``user`` turns and its own messages its ``assistant`` turns."""

    def __init__(self, task: Tau3Task, engine: Engine, max_tokens: int = 512) -> None:
        self.engine, self.max_tokens = engine, max_tokens
        self.messages: list[Message] = [Message("system", f"{RULES}\n\n<instructions>\n{instructions(task)}\n"
                                                          "</instructions>")]

    def _say(self, agent_message: str) -> str:
        self.messages.append(Message("user", agent_message))
        text = self.engine.generate(list(self.messages), max_tokens=self.max_tokens).text.strip()
        self.messages.append(Message("assistant", text))
        return text or STOP

    def first(self) -> str:
        return self._say(GREETING)

    def reply(self, agent_message: str) -> str:
        return self._say(agent_message)

