"""The user side of a τ³ conversation: a scripted user for tests and reference runs, and a user simulator
on an engine of its own. The simulator's system prompt is tau2's own: its guidelines file
(``tau2/user_simulator/simulation_guidelines.md`` under ``--tau2-data``) and the task's scenario as tau2
renders it; without that file, a paraphrase of those rules (``RULES``), and the report says which ran.

Each user message is one FlowState request; the conversation ends when the user says one of τ³'s
stop tokens (or the turn budget runs out).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Protocol

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


GUIDELINES = Path("tau2") / "user_simulator" / "simulation_guidelines.md"


def tau2_guidelines(data_dir: str | Path | None) -> str | None:
    """tau2's user-simulator guidelines from a tau2-bench checkout's data folder, or None where it has none."""
    path = Path(data_dir) / GUIDELINES if data_dir else None
    return path.read_text(encoding="utf-8") if path is not None and path.is_file() else None


def tau2_scenario(spec: dict[str, Any]) -> str:
    """The task's user scenario as tau2 renders it for its simulator: persona, then the structured instructions
    (domain, reason for call, known and unknown info, task instructions), each indented by a tab."""
    scenario = spec["user_scenario"]
    given = scenario.get("instructions")
    if isinstance(given, dict):
        fields = [("Domain", given.get("domain"), False), ("Reason for call", given.get("reason_for_call"), True),
                  ("Known info", given.get("known_info"), True), ("Unknown info", given.get("unknown_info"), True),
                  ("Task instructions", given.get("task_instructions"), True)]
        text = "\n".join(f"{name}:\n{textwrap.indent(str(value), chr(9))}" if block else f"{name}: {value}"
                         for name, value, block in fields if value is not None)
    else:
        text = str(given)
    persona = scenario.get("persona")
    head = f"Persona:\n{textwrap.indent(persona, chr(9))}\n" if persona is not None else ""
    return f"{head}Instructions:\n{textwrap.indent(text, chr(9))}"


class SimulatedUser:
    """A user played by a model: its system prompt is tau2's guidelines and the task's scenario (our paraphrase
    of the rules where the guidelines file is not given); the agent's messages are its ``user`` turns and its
    own messages its ``assistant`` turns."""

    def __init__(self, task: Tau3Task, engine: Engine, max_tokens: int = 512, guidelines: str | None = None) -> None:
        self.engine, self.max_tokens = engine, max_tokens
        if guidelines is not None:
            persona = guidelines.replace("<PERSONA_GUIDELINES>", "")
            system = f"{persona}\n\n<scenario>\n{tau2_scenario(task.spec)}\n</scenario>"
        else:
            system = f"{RULES}\n\n<instructions>\n{instructions(task)}\n</instructions>"
        self.messages: list[Message] = [Message("system", system.strip())]

    def _say(self, agent_message: str) -> str:
        self.messages.append(Message("user", agent_message))
        text = self.engine.generate(list(self.messages), max_tokens=self.max_tokens).text.strip()
        self.messages.append(Message("assistant", text))
        return text or STOP

    def first(self) -> str:
        return self._say(GREETING)

    def reply(self, agent_message: str) -> str:
        return self._say(agent_message)

