"""``flowstate bench decode``: constrained-decoding cost on one engine, side by side in one run.

The prompts are the eight model calls of the hotel case (replayed through the real loop with the
shipped script, so every Active State is the one the loop builds). Each prompt is decoded three
ways — no grammar, the static protocol grammar, the per-step id-aware grammar — and the table
reports decode tokens/s, time to first token, grammar build/compile time and the share of outputs
that parse.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.base import Engine, Generation, Message
from engine.scripted import ScriptedEngine
from flowstate.agent import Agent
from flowstate.constrain import GrammarMode
from flowstate.errors import ProtocolError
from flowstate.loop import LoopConfig
from flowstate.parse import parse_output
from flowstate.protocol import block_schemas
from flowstate.repository import Repository
from grammars.check import validate
from grammars.four_blocks import protocol_grammar


class _Recorder:
    """Replays the hotel script while recording each call's prompt and per-step grammar."""

    name = "recorder"
    supports_grammar = True

    def __init__(self, inner: ScriptedEngine) -> None:
        self.inner = inner
        self.calls: list[tuple[list[Message], str | None]] = []

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None) -> Generation:
        self.calls.append((list(messages), grammar))
        return self.inner.generate(messages)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


def hotel_calls() -> tuple[list[tuple[list[Message], str | None]], str]:
    """The hotel case's prompts with their per-step grammars, and the static grammar."""
    from flowstate.demo import hotel

    recorder = _Recorder(ScriptedEngine.from_file(hotel.script_path()))
    with Repository.open(":memory:") as repo:
        agent = Agent(recorder, repository=repo, session="bench", tools=hotel.TOOLS, task_policy=hotel.POLICY,
                      config=LoopConfig(grammar=GrammarMode.STEP))
        for query in hotel.QUERIES:
            agent.run(query)
    return recorder.calls, protocol_grammar(block_schemas(), hotel.TOOLS.specs())


@dataclass
class ModeResult:
    mode: str
    calls: int = 0
    parsed: int = 0
    completion_tokens: int = 0
    decode_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    grammar_ms: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "calls": self.calls,
            "parsed_share": round(self.parsed / self.calls, 3) if self.calls else 0.0,
            "completion_tokens": self.completion_tokens,
            "decode_tok_s": round(self.completion_tokens / self.decode_s, 2) if self.decode_s else 0.0,
            "ttft_mean_s": round(statistics.fmean(self.ttft_s), 3) if self.ttft_s else 0.0,
            "grammar_ms_mean": round(statistics.fmean(self.grammar_ms), 2) if self.grammar_ms else 0.0,
        }


def bench_decode(
    engine: Engine, *, calls: int | None = None, max_tokens: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Decode the hotel prompts under each grammar mode, interleaved call by call."""
    recorded, static = hotel_calls()
    recorded = recorded[:calls] if calls else recorded
    results = {m: ModeResult(m) for m in ("none", "static", "step")}
    for messages, step_grammar in recorded:
        for mode, result in results.items():
            started = time.perf_counter()
            grammar = {"none": None, "static": static, "step": step_grammar}[mode]
            if grammar is not None:
                validate(grammar)  # compile once with llguidance, as an engine would
                result.grammar_ms.append((time.perf_counter() - started) * 1000)
            gen = engine.generate(messages, grammar=grammar, max_tokens=max_tokens)
            result.calls += 1
            result.completion_tokens += gen.usage.completion_tokens
            result.decode_s += gen.usage.decode_s
            result.ttft_s.append(gen.usage.ttft_s)
            try:
                parse_output(gen.text)
                result.parsed += 1
            except ProtocolError:
                pass
            if progress is not None:
                progress(f"call {result.calls}/{len(recorded)} {mode}: {gen.usage.completion_tokens} tokens")
    return [r.row() for r in results.values()]


def render_table(rows: list[dict[str, Any]]) -> str:
    head = ["mode", "calls", "parsed_share", "completion_tokens", "decode_tok_s", "ttft_mean_s", "grammar_ms_mean"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(r[h]) for h in head) + " |" for r in rows]
    return "\n".join(lines)
