"""``flowstate bench index``: the per-call prompt against the number of earlier requests k, flat index and bounded.

One session of ``requests`` requests of a suite that has no depth cap (hotel: each request books or keeps a
room from what earlier ones found; reasoning: each computes from earlier results), run through the real loop
under a reference policy with the paper's flat index (``flowstate``) and with the bounded one
(``flowstate-paged:B``) side by side. Per strategy: the largest prompt of the calls of request k at chosen k,
the largest of the session, the calls over a prompt budget, success per request, and the session's tokens
(uncached: what a perfect prefix cache over the previous call would not serve).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowstate.config import LoopConfig
from flowstate.eval.policies import Policy, PolicyEngine
from flowstate.eval.rows import calls_of
from flowstate.eval.runner import run_task, token_counter
from flowstate.eval.suites import Spec, generate
from flowstate.memory import get
from flowstate.store.repository import Repository

MARKS = (1, 10, 100, 250, 500, 1000, 2000, 5000)


def run(requests: int, budget: int, prompt_budget: int, suite: str = "hotel", policy: str = "oracle",
        tokens: str = "words", seed: int = 0) -> list[dict[str, Any]]:
    """One row per strategy (flat, then bounded) for one session of ``requests`` requests."""
    task = generate(suite, 1, Spec(requests, seed))[0]
    count = token_counter(tokens)
    rows = []
    for name in ("flowstate", f"flowstate-paged:{budget}"):
        strategy = get(name)
        engine = PolicyEngine(Policy(task, strategy, memory=True, realistic=policy == "realistic"), count)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as folder, Repository.open(Path(folder) / "memory.db") as repo:
            row = run_task(task, strategy, engine, repo, LoopConfig(max_steps=16), "bench")
        largest = [max(c.prompt_tokens for c in calls_of([s])) for s in row.subtasks]
        calls = calls_of(row.subtasks)
        rows.append({
            "strategy": name, "requests": requests, "suite": suite, "policy": policy, "tokens": tokens,
            "prompt_at": {k: largest[k - 1] for k in MARKS if k <= requests},
            "largest_prompt": max(largest), "over_budget": sum(c.prompt_tokens > prompt_budget for c in calls),
            "calls": len(calls), "solved": sum(s.correct for s in row.subtasks),
            "total": sum(c.prompt_tokens + c.completion_tokens for c in calls),
            "uncached": sum(c.prompt_tokens - c.cached_tokens for c in calls),
            "seconds": round(time.perf_counter() - started, 1),
        })
    return rows


def render(rows: Sequence[dict[str, Any]], prompt_budget: int) -> str:
    marks = list(rows[0]["prompt_at"])
    head = ["strategy", *(f"k={k}" for k in marks), "largest", f"calls > {prompt_budget:,}", "solved",
            "calls", "tokens", "uncached"]
    lines = [f"One {rows[0]['suite']} session of {rows[0]['requests']} requests, {rows[0]['policy']} policy, "
             f"{rows[0]['tokens']} tokens: the largest prompt of request k's calls.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["strategy"], *(f"{r['prompt_at'][k]:,}" for k in marks), f"{r['largest_prompt']:,}",
                 str(r["over_budget"]), f"{r['solved']}/{r['requests']}", str(r["calls"]), f"{r['total']:,}",
                 f"{r['uncached']:,}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
