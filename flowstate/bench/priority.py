"""``flowstate bench priority``: what priority by kind buys an interactive turn while background work keeps a real
engine busy — priorities off and on side by side, one engine, one run.

The engine is loaded once. In each phase ``background`` threads keep background calls going (each up to
``max_tokens`` long, a prompt of its own) and one client makes ``interactive`` calls one after another, a pause
between them; off, every call goes at priority 0 (the engine takes them as they come), on, interactive calls at
``Priorities().interactive`` and background ones at ``Priorities().background``. An interactive call's time to first
token is taken from the moment it is made to its first streamed text — the wait for the engine included, which is
what its user waits (the engine's own ``ttft_s`` starts when the engine takes the call). Rows: interactive TTFT
p50/p90/max, and background calls finished a minute (what priority costs the background work, if anything).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from engine.base import Engine, Message
from engine.priority import Priorities
from flowstate.bench.table import table
from flowstate.eval.metrics import percentile

SYSTEM = ("You are the assistant of a travel agency. Answer the customer's question in one short sentence, using "
          "only what you know of their booking; if you do not know, say so and offer to look it up.")


def _phase(engine: Engine, on: bool, background: int, interactive: int, max_tokens: int,
           pause_s: float, progress: Callable[[str], None]) -> dict[str, Any]:
    p = Priorities()
    low, high = (p.background, p.interactive) if on else (0, 0)
    stop, finished, lock = threading.Event(), [0], threading.Lock()

    def worker(w: int) -> None:
        n = 0
        while not stop.is_set():
            text = f"Background job {w}.{n}: write a detailed report on every booking of customer {w * 97 + n}."
            engine.generate([Message("system", SYSTEM), Message("user", text)], max_tokens=max_tokens, priority=low,
                            affinity=f"background-{w}")
            n += 1
            with lock:
                finished[0] += 1

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(background)]
    for t in threads:
        t.start()
    time.sleep(pause_s * 2)  # the engine busy, calls waiting
    began, waits = time.monotonic(), []
    for i in range(interactive):
        first: list[float] = []
        made = time.perf_counter()
        engine.generate([Message("system", SYSTEM), Message("user", f"Customer {i}: is my flight on time?")],
                        max_tokens=8, priority=high, affinity=f"interactive-{i}",
                        on_text=lambda _piece: first.append(time.perf_counter()) if not first else None)
        waits.append((first[0] if first else time.perf_counter()) - made)
        progress(f"priorities {'on' if on else 'off'}: interactive call {i + 1}/{interactive}: "
                 f"first token after {waits[-1]:.2f} s")
        time.sleep(pause_s)
    elapsed = time.monotonic() - began
    with lock:
        done = finished[0]
    stop.set()
    for t in threads:
        t.join(600)
    return {"priorities": "on" if on else "off", "interactive": interactive, "background": background,
            "ttft_p50_s": round(percentile(waits, 50), 3), "ttft_p90_s": round(percentile(waits, 90), 3),
            "ttft_max_s": round(max(waits), 3), "background_per_min": round(done * 60 / elapsed, 1)}


def bench_priority(engine: Engine, background: int, interactive: int, max_tokens: int, pause_s: float,
                   progress: Callable[[str], None] = lambda _: None) -> list[dict[str, Any]]:
    """Priorities off, then on, on ``engine``."""
    if not engine.capabilities.priority:
        raise ValueError(f"the {engine.name} engine takes no priority: nothing to compare (vllm: scheduling=priority; "
                         "openai: a vLLM server started with --scheduling-policy priority)")
    return [_phase(engine, on, background, interactive, max_tokens, pause_s, progress) for on in (False, True)]


def render_table(rows: list[dict[str, Any]], label: str) -> str:
    head = ["priorities", "interactive calls", "TTFT p50 s", "TTFT p90 s", "TTFT max s", "background calls a minute"]
    keys = ["priorities", "interactive", "ttft_p50_s", "ttft_p90_s", "ttft_max_s", "background_per_min"]
    return (f"Interactive calls' time to first token while {rows[0]['background']} threads keep background calls "
            f"going on {label}\n\n" + table(head, [{h: r[k] for h, k in zip(head, keys, strict=True)} for r in rows]))
