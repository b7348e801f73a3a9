"""``flowstate bench isolation``: what prefix-cache isolation between tenants costs in prefill, on vLLM's own
scheduler and prefix cache (``bench capacity``'s simulation: vLLM's v1 ``Scheduler`` and KV-cache manager in
process, block hashes of real token ids, no forward pass).

N tenants × M sessions, all at once, each session T calls. Every prompt opens with the deployment's system prompt —
FlowState's own for the hotel demo, as a server with a constraining engine renders it, S tokens in the model's chat
template — then the session's own turns: each call's prompt is the previous one's and G new tokens, each output O
tokens. Per isolation setting — ``off`` (no salt: everyone shares the cache), ``tenant`` (the tenant's salt, as
``--cache-isolation tenant`` sends it), ``session`` — the rows give the prefix-cache hit rate, the tokens computed,
and what isolation adds over ``off``: in all, per tenant, and in system prompts (vLLM folds the salt into the first
block's hash, so each partition prefills the system prompt once and keeps its own copy of its blocks).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from engine.base import Capabilities, Engine, Generation, Message
from flowstate.bench.capacity import Budget, ScheduledCall, Simulation, Tokenizer
from flowstate.bench.table import table

MODES = ("off", "tenant", "session")


def system_prompt() -> str:
    """FlowState's system prompt for the hotel demo's tools and policy, as a server with a constraining engine sends
    it (the standard protocol limits)."""
    from flowstate.config import AgentConfig
    from flowstate.demo import hotel
    from flowstate.memory.state import FLOWSTATE

    agent = AgentConfig(_Constraining(), strategy=FLOWSTATE, tools=hotel.TOOLS, policy=hotel.POLICY)
    return agent.system_prompt()


class _Constraining(Engine):
    """What a server renders prompts for: an engine that decodes under grammars (no model: nothing is generated)."""

    name = "constraining"
    capabilities = Capabilities(grammar=True)

    def generate(self, messages: Sequence[Message], **_: Any) -> Generation:
        raise NotImplementedError("rendering only")

    def count_tokens(self, text: str) -> int:
        return len(text.split())


def sessions(system: list[int], tenants: int, per_tenant: int, turns: int, growth: int, output: int,
             vocab: int, mode: str, seed: int = 0) -> list[list[ScheduledCall]]:
    """Each tenant's sessions, their calls salted as ``mode`` says; session content drawn from ``vocab`` token ids
    (distinct per session, the same in every mode: only the salts differ)."""
    out = []
    for t in range(tenants):
        for s in range(per_tenant):
            rng = random.Random(f"{seed}/{t}/{s}")
            salt = None if mode == "off" else f"tenant-{t}" if mode == "tenant" else f"session-{t}-{s}"
            ids, calls = list(system), []
            for _ in range(turns):
                ids = ids + [rng.randrange(1000, vocab) for _ in range(growth)]
                calls.append(ScheduledCall(list(ids), output, salt=salt))
            out.append(calls)
    return out


def bench_isolation(model_dir: str, tenants: Sequence[int], per_tenant: int, turns: int, growth: int, output: int,
                    progress: Callable[[str], None] = lambda _: None) -> tuple[int, list[dict[str, Any]]]:
    """(S, rows): for each tenant count, each isolation mode on a fresh scheduler whose KV cache holds everything
    (what isolation costs in compute, not what it evicts)."""
    tokenize = Tokenizer(model_dir)
    system = tokenize._ids([Message("system", system_prompt())], False)
    vocab = len(tokenize._tok)
    rows = []
    for n in tenants:
        need = n * per_tenant * (len(system) + turns * (growth + output)) + n * len(system)
        simulation = Simulation(model_dir, Budget(kv_tokens=(need * 5 // 4 // 16 + 1) * 16))
        base: dict[str, Any] = {}
        for mode in MODES:
            progress(f"{n} tenants × {per_tenant} sessions, isolation {mode}")
            ran = simulation.run(sessions(system, n, per_tenant, turns, growth, output, vocab, mode))
            base = base or ran
            extra = ran["computed_tokens"] - base["computed_tokens"]
            rows.append({"tenants": n, "sessions": n * per_tenant, "isolation": mode, "calls": ran["calls"],
                         "computed_tokens": ran["computed_tokens"], "prefix_hit_rate": ran["prefix_hit_rate"],
                         "extra_tokens": extra, "extra_per_tenant": round(extra / n),
                         "extra_share": round(extra / base["computed_tokens"], 3),
                         "preemptions": ran["preemptions"]})
    return len(system), rows


def render_table(system: int, rows: list[dict[str, Any]]) -> str:
    head = ["tenants", "sessions", "isolation", "calls", "tokens computed", "prefix-cache hit rate",
            "extra tokens over off", "extra per tenant", "extra share", "preemptions"]
    keys = ["tenants", "sessions", "isolation", "calls", "computed_tokens", "prefix_hit_rate", "extra_tokens",
            "extra_per_tenant", "extra_share", "preemptions"]
    return (f"System prompt: {system} tokens (FlowState, the hotel demo's tools and policy)\n\n"
            + table(head, [{h: r[k] for h, k in zip(head, keys, strict=True)} for r in rows]))
