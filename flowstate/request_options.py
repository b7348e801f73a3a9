"""What one request asks of the model beyond its query: sampling, a completion budget, stop sequences,
which tools it must or may call, and the shape of its final answer.

The grammar makes the tool choice and the answer's JSON schema hold by construction; ``enforce``
applies the same rules to an output decoded without a grammar (an engine that takes none, or
``--grammar none``): what breaks them is excluded as malformed and fed back, like any bad item.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.base import Engine, Sampling
from engine.errors import EngineConfigError
from engine.priority import LANES
from flowstate.protocol import Malformed, MessageBlock, ModelOutput, ToolCall

TOOL_CHOICES = ("auto", "none", "required")


class UnsupportedOption(EngineConfigError):
    """A request's option its engine cannot honour; ``param`` names it (an endpoint's 400 says which)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class RequestOptions:
    sampling: Sampling = field(default_factory=Sampling)
    max_tokens: int | None = None  # per model call; None: the loop's (or the engine's) budget
    answer_tokens: int | None = None  # the final answer's budget in the engine's tokens (a client's max_tokens)
    stop: tuple[str, ...] = ()  # the final answer ends before the first of these
    tool_choice: str = "auto"  # auto | none | required | the one tool's name
    parallel_tool_calls: bool = True  # False: at most one tool call per step
    answer_schema: dict[str, Any] | None = None  # the final answer is JSON matching this schema
    hidden: tuple[str, ...] = ()  # server tools this request may not call (a Responses mcp tool's allowed_tools)
    approval: tuple[str, ...] = ()  # server tools whose calls wait on the client's approval (require_approval)
    lane: str | None = None  # what the request is run for (engine.priority.LANES); None: its agent's

    def __post_init__(self) -> None:
        if self.lane is not None and self.lane not in LANES:
            raise ValueError(f"a request's lane is one of {', '.join(LANES)}, not {self.lane!r}")

    @property
    def required(self) -> bool:
        """Every step must call a tool (or only update / access state before it does)."""
        return self.tool_choice not in ("auto", "none")

    @property
    def contract(self) -> str | None:
        """What every reply of the request promises beyond text (a JSON answer, a tool call), or None."""
        if self.answer_schema is not None:
            return "response_format json_schema"
        if self.required:
            return f"tool_choice {self.tool_choice!r}"
        return None

    @property
    def only_tool(self) -> str | None:
        return None if self.tool_choice in TOOL_CHOICES else self.tool_choice

    def tools(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tools the model may call under this choice."""
        if self.tool_choice == "none":
            return []
        if self.only_tool is not None:
            return [t for t in specs if t["name"] == self.only_tool]
        return [t for t in specs if t["name"] not in self.hidden]

    def fit(self, answer: str, count: Callable[[str], int]) -> tuple[str, bool]:
        """The answer within ``answer_tokens`` as ``count`` counts them (its longest prefix that fits), and whether
        it was cut — what OpenAI's ``max_tokens`` does to what the client receives (finish_reason "length")."""
        budget = self.answer_tokens  # a token is at least a byte: an answer of no more bytes fits uncounted
        if budget is None or len(answer.encode()) <= budget or count(answer) <= budget:
            return answer, False
        low, high = 0, len(answer)  # the longest prefix that fits: low fits, high does not
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if count(answer[:mid]) <= budget else (low, mid)
        return answer[:low], True

    def stop_at(self, answer: str) -> str:
        """The answer up to the first stop sequence."""
        cut = min((i for i in (answer.find(s) for s in self.stop if s) if i >= 0), default=len(answer))
        return answer[:cut]

    def enforce(self, output: ModelOutput) -> ModelOutput:
        """Exclude what the tool choice forbids (the grammar already does; this is for outputs without one)."""
        bad: list[Malformed] = []
        calls = list(output.tool_calls)
        allowed = None if self.tool_choice == "auto" else {t for t in [self.only_tool] if t}
        kept: list[ToolCall] = []
        for position, call in enumerate(calls, start=1):
            if self.tool_choice == "none" or (allowed and call.name not in allowed):
                bad.append(Malformed("tool_calls", position, f"tool_choice {self.tool_choice!r} does not allow "
                                     f"calling {call.name!r}", call.name))
            elif call.name in self.hidden:
                bad.append(Malformed("tool_calls", position, f"{call.name!r} is not among this request's allowed "
                                     "tools", call.name))
            elif not self.parallel_tool_calls and kept:
                bad.append(Malformed("tool_calls", position, "parallel_tool_calls is false: one call per step",
                                     call.name))
            else:
                kept.append(call)
        message = output.assistant_message
        if self.required and message.content is not None:
            bad.append(Malformed("assistant_message", 1, f"tool_choice {self.tool_choice!r}: call a tool instead "
                                 "of answering"))
            message = MessageBlock()
        if not bad:
            return output
        return output.model_copy(update={"tool_calls": tuple(kept), "assistant_message": message,
                                         "malformed": (*output.malformed, *bad)})


def check_supported(options: RequestOptions, engine: Engine) -> None:
    """The one check of what a request asks its engine for: sampling the engine cannot set per request is refused
    (``UnsupportedOption``), never silently dropped."""
    refused = sorted(options.sampling.given() - engine.capabilities.sampling)
    if refused:
        raise UnsupportedOption(f"the {engine.name} engine cannot honour {', '.join(refused)} per request", refused[0])
