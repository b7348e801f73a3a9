"""The decode benchmark's harness: every hotel prompt decoded under each grammar mode, counted right."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.base import Capabilities, Engine, Generation, Message, Usage
from flowstate.bench.decode import bench_decode, hotel_calls, render_table
from flowstate.demo import hotel
from grammars.check import accepts


class Replay(Engine):
    """Answers each prompt with the hotel script's output for it (and a broken one without a grammar)."""

    name = "replay"

    def __init__(self, embedded: bool = False, cut: bool = False) -> None:
        self.cut = cut
        self.capabilities = Capabilities(grammar=True, embedded=embedded)
        self.outputs = [json.loads(line)["text"] for line in hotel.script_path().read_text().splitlines()]
        self.seen: list[str | None] = []

    def generate(self, messages: Sequence[Message], *, grammar: str | None = None, max_tokens: int | None = None,
                 **_: Any) -> Generation:
        self.seen.append(grammar)
        text = self.outputs[(len(self.seen) - 1) // 3]
        if grammar is None:
            text = "Sure, here you go: " + text
        if self.cut and grammar is not None:
            return Generation(text[:40], Usage(prompt_tokens=100, cached_tokens=60, completion_tokens=50, ttft_s=0.1,
                                               decode_s=1.0), finish_reason="length")
        return Generation(text, Usage(prompt_tokens=100, cached_tokens=60, completion_tokens=50, ttft_s=0.1,
                                      decode_s=0.5))

    def count_tokens(self, text: str) -> int:
        return len(text.split())


def test_hotel_calls_carry_the_per_step_grammars() -> None:
    from flowstate.limits import COMPACT, STANDARD

    assert hotel_calls(COMPACT)[1] != hotel_calls(STANDARD)[1]  # the grammars follow the profile
    calls, static = hotel_calls(STANDARD)
    assert len(calls) == 8
    outputs = [json.loads(line)["text"] for line in hotel.script_path().read_text().splitlines()]
    for (_, grammar), text in zip(calls, outputs):
        assert grammar is not None and grammar != static
        assert accepts(grammar, text)  # the scripted model's outputs fit each step's id-aware grammar


def test_bench_rows_side_by_side() -> None:
    good, cut = Replay(), Replay(embedded=True, cut=True)
    table = bench_decode({"good": good, "cut": cut})
    rows = {(r["engine"], r["mode"]): r for r in table}
    assert [g is None for g in good.seen[:3]] == [True, False, False]
    assert len(good.seen) == len(cut.seen) == 24  # every prompt, three modes, on each engine
    g = {m: rows[("good", m)] for m in ("none", "static", "step")}
    assert g["none"]["parsed_share"] == 0.0 and g["static"]["parsed_share"] == 1.0 and g["step"]["parsed_share"] == 1.0
    assert g["step"]["calls"] == 8 and g["step"]["decode_tok_s"] == 100.0 and g["step"]["vs_plain"] == 1.0
    assert g["none"]["vs_plain"] is None and g["none"]["grammar_ms_mean"] == 0.0 and g["step"]["grammar_ms_mean"] > 0
    assert (g["step"]["prefill_tok_s"] == 400.0 and g["step"]["cached_share"] == 0.6
            and g["step"]["limits"] == "standard")
    c = rows[("cut", "step")]
    assert c["truncated"] == 8 and c["parsed_share"] == 0.0 and c["vs_plain"] == 0.5 and c["limits"] == "compact"
    assert render_table(table).count("\n") == 7
