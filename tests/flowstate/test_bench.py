"""The decode benchmark's harness: every hotel prompt decoded under each grammar mode, counted right."""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.base import Generation, Message, Usage
from flowstate.bench import bench_decode, hotel_calls, render_table
from flowstate.demo import hotel
from grammars.check import accepts


class Replay:
    """Answers each prompt with the hotel script's output for it (and a broken one without a grammar)."""

    name = "replay"
    supports_grammar = True

    def __init__(self) -> None:
        self.outputs = [json.loads(line)["text"] for line in hotel.script_path().read_text().splitlines()]
        self.seen: list[str | None] = []

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None) -> Generation:
        self.seen.append(grammar)
        text = self.outputs[(len(self.seen) - 1) // 3]
        if grammar is None:
            text = "Sure, here you go: " + text
        return Generation(text, Usage(prompt_tokens=100, completion_tokens=50, ttft_s=0.1, decode_s=0.5))

    def count_tokens(self, text: str) -> int:
        return len(text.split())


def test_hotel_calls_carry_the_per_step_grammars() -> None:
    calls, static = hotel_calls()
    assert len(calls) == 8
    outputs = [json.loads(line)["text"] for line in hotel.script_path().read_text().splitlines()]
    for (_, grammar), text in zip(calls, outputs):
        assert grammar is not None and grammar != static
        assert accepts(grammar, text)  # the scripted model's outputs fit each step's id-aware grammar


def test_bench_rows() -> None:
    engine = Replay()
    rows = {r["mode"]: r for r in bench_decode(engine)}
    assert [g is None for g in engine.seen[:3]] == [True, False, False]
    assert rows["none"]["parsed_share"] == 0.0 and rows["static"]["parsed_share"] == 1.0 and rows["step"]["parsed_share"] == 1.0
    assert rows["step"]["calls"] == 8 and rows["step"]["decode_tok_s"] == 100.0
    assert rows["none"]["grammar_ms_mean"] == 0.0 and rows["step"]["grammar_ms_mean"] > 0
    assert render_table(list(rows.values())).count("\n") == 4
