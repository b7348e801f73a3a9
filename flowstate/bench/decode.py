"""``flowstate bench decode``: constrained-decoding cost of one or more engines, side by side in one run.

The prompts are the eight model calls of the hotel case (replayed through the real loop with the
shipped script, so every Active State is the one the loop builds), under the protocol limits each
engine runs with (compact for the embedded model). Each prompt is decoded three ways — no grammar,
the static protocol grammar, the per-step id-aware grammar — by every engine in turn, call by call,
so machine noise falls on all of them alike. The table reports, per engine and mode: decode
tokens/s (output tokens over decode time, forced tokens included; and its ratio to the same engine without a
grammar), the share of output tokens the grammar forced (appended in one pass by engines that fast-forward),
seconds per call (prefill and decode), prefill tokens/s over the prompt
tokens that were not cached, the cached share, time to first token, grammar build/compile time,
the share of outputs that parse, and how many were cut at the token budget. An engine that drafts (``llamacpp``'s
``speculate=lookup:K``, ``vllm``'s ``speculate=ngram:K``; ``--speculate``) adds the tokens it drafted and kept, the
completion tokens each forward pass produced beside the forced ones, and how its outputs compare with the same
engine's without drafting (the share of calls whose text is the same, and where the first that differs parts from it).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from engine.base import Engine, Generation, Message
from flowstate.agent import Agent
from flowstate.bench.table import table
from flowstate.config import LoopConfig
from flowstate.constrain import GrammarMode, Grammars
from flowstate.errors import ProtocolError
from flowstate.limits import Limits, for_engine
from flowstate.parse import parse_output
from flowstate.store.repository import Repository
from grammars.check import validate

MODES = ("none", "static", "step")


def hotel_calls(limits: Limits) -> tuple[list[tuple[list[Message], str | None]], str]:
    """The hotel case's prompts with their per-step grammars under ``limits``, and the static grammar."""
    import engine as engines  # the hotel case's recorded outputs, replayed; each call's grammar is recorded
    from flowstate.demo import hotel

    engine: Any = engines.load("scripted", script=hotel.script_path(), grammar=True, record=True)  # prompts, calls
    with Repository.open(":memory:") as repo:
        agent = Agent(engine, repository=repo, session="bench", tools=hotel.TOOLS, task_policy=hotel.POLICY,
                      config=LoopConfig(grammar=GrammarMode.STEP, limits=limits))
        for query in hotel.QUERIES:
            agent.run(query)
    static = Grammars(hotel.TOOLS.specs(), GrammarMode.STATIC, limits=limits).static
    assert static is not None
    return [(prompt, call["grammar"]) for prompt, call in zip(engine.prompts, engine.calls, strict=True)], static


@dataclass
class ModeResult:
    engine: str
    mode: str
    limits: str
    calls: int = 0
    parsed: int = 0
    truncated: int = 0
    completion_tokens: int = 0
    forced_tokens: int = 0  # of them, appended without a decode step (engines that fast-forward)
    decode_s: float = 0.0
    mask_s: float = 0.0  # of decode_s, the grammar's token masks (engines that measure it)
    prefilled: int = 0  # prompt tokens not served from the cache
    prompt_tokens: int = 0
    cached_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    grammar_ms: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    def add(self, gen: Generation, limits: Limits) -> None:
        u = gen.usage
        self.calls += 1
        self.completion_tokens += u.completion_tokens
        self.forced_tokens += u.forced_tokens
        self.drafted_tokens += u.drafted_tokens
        self.accepted_tokens += u.accepted_tokens
        self.texts.append(gen.text)
        self.decode_s += u.decode_s
        self.mask_s += u.mask_s
        self.prompt_tokens += u.prompt_tokens
        self.cached_tokens += u.cached_tokens
        self.prefilled += u.prompt_tokens - u.cached_tokens
        self.ttft_s.append(u.ttft_s)
        self.truncated += gen.truncated
        try:
            parse_output(gen.text, limits=limits)
            self.parsed += 1
        except ProtocolError:
            pass

    @property
    def decode_tok_s(self) -> float:
        return self.completion_tokens / self.decode_s if self.decode_s else 0.0

    def compared(self, other: ModeResult | None) -> dict[str, Any]:
        """Drafting's figures, and how this engine's outputs compare with ``other``'s (the same engine undrafted)."""
        if not self.drafted_tokens:
            return {}
        sampled = self.completion_tokens - self.forced_tokens  # each from a forward pass or a kept draft
        parted = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))
                  for x, y in zip(self.texts, other.texts if other else [], strict=False) if x != y]
        return {"drafted": self.drafted_tokens, "kept_share": round(self.accepted_tokens / self.drafted_tokens, 3),
                "tokens_per_pass": round(sampled / (sampled - self.accepted_tokens), 2)
                if sampled > self.accepted_tokens else None,
                "same_text": f"{len(self.texts) - len(parted)}/{len(self.texts)}" if other else None,
                "parts_at_char": ",".join(map(str, parted)) or None}

    def row(self, plain: ModeResult | None) -> dict[str, Any]:
        ttft = sum(self.ttft_s)
        return {
            "engine": self.engine,
            "mode": self.mode,
            "limits": self.limits,
            "calls": self.calls,
            "parsed_share": round(self.parsed / self.calls, 3) if self.calls else 0.0,
            "truncated": self.truncated,
            "completion_tokens": self.completion_tokens,
            "forced_share": round(self.forced_tokens / self.completion_tokens, 3) if self.completion_tokens else 0.0,
            "decode_tok_s": round(self.decode_tok_s, 2),
            # one mask per sampled token (forced tokens are appended without one)
            "mask_ms_per_token": round(1000 * self.mask_s / sampled, 3) if (sampled := self.completion_tokens
                                                                              - self.forced_tokens) else 0.0,
            "mask_share": round(self.mask_s / self.decode_s, 3) if self.decode_s else 0.0,
            "s_per_call": round((ttft + self.decode_s) / self.calls, 2) if self.calls else 0.0,
            "vs_plain": round(self.decode_tok_s / plain.decode_tok_s, 3) if plain and plain.decode_tok_s else None,
            "prefill_tok_s": round(self.prefilled / ttft, 1) if ttft else 0.0,
            "cached_share": round(self.cached_tokens / self.prompt_tokens, 3) if self.prompt_tokens else 0.0,
            "ttft_mean_s": round(statistics.fmean(self.ttft_s), 3) if self.ttft_s else 0.0,
            "grammar_ms_mean": round(statistics.fmean(self.grammar_ms), 2) if self.grammar_ms else 0.0,
        }


def bench_decode(
    engines: Mapping[str, Engine], *, calls: int | None = None, max_tokens: int | None = None,
    progress: Callable[[str], None] | None = None, against: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Decode the hotel prompts under each grammar mode on each engine, interleaved call by call; ``against`` names,
    for an engine that drafts, the engine whose outputs its own are compared with."""
    plans = {}
    for name, engine in engines.items():
        limits = for_engine(engine)
        recorded, static = hotel_calls(limits)
        plans[name] = (limits, recorded[:calls] if calls else recorded, static)
    results = {(name, m): ModeResult(name, m, plans[name][0].name) for name in engines for m in MODES}
    for i in range(max(len(p[1]) for p in plans.values())):
        for name, engine in engines.items():
            limits, recorded, static = plans[name]
            if i >= len(recorded):
                continue
            messages, step_grammar = recorded[i]
            for mode in MODES:
                result = results[(name, mode)]
                grammar = {"none": None, "static": static, "step": step_grammar}[mode]
                if grammar is not None:
                    started = time.perf_counter()
                    validate(grammar)  # compile once with llguidance, as an engine would
                    result.grammar_ms.append((time.perf_counter() - started) * 1000)
                result.add(engine.generate(messages, grammar=grammar, max_tokens=max_tokens), limits)
                if progress is not None:
                    progress(f"{name} call {result.calls}/{len(recorded)} {mode}: "
                             f"{result.completion_tokens} tokens so far")
    against = against or {}
    return [{**results[(name, m)].row(results[(name, "none")] if m != "none" else None),
             **results[(name, m)].compared(results.get((against.get(name, ""), m)))}
            for name in engines for m in MODES]


HEAD = ["engine", "mode", "limits", "calls", "parsed_share", "truncated", "completion_tokens", "forced_share",
        "decode_tok_s", "mask_ms_per_token", "mask_share", "vs_plain", "s_per_call", "prefill_tok_s", "cached_share",
        "ttft_mean_s", "grammar_ms_mean"]
DRAFTING = ["drafted", "kept_share", "tokens_per_pass", "same_text", "parts_at_char"]


def render_table(rows: list[dict[str, Any]]) -> str:
    if not any("drafted" in r for r in rows):
        return table(HEAD, rows, none="")
    return table(HEAD + DRAFTING, [{**dict.fromkeys(DRAFTING), **r} for r in rows], none="")
